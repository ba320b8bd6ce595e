//! The clock behind every decision time drives on the metadata server: data server
//! leases, when a silent member leaves its chains, and the grace a broken connection's
//! sessions get. A seam, so that tests move time by hand instead of waiting for it.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Where the server reads the time for its leases and graces.
pub trait Clock: Send + Sync {
    /// The current instant; never earlier than one returned before.
    fn now(&self) -> Instant;
}

/// The monotonic system clock, what the server runs on.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to, for tests of time-driven decisions.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Instant>,
}

impl ManualClock {
    /// A clock standing at the current system instant.
    pub fn new() -> ManualClock {
        ManualClock {
            now: Mutex::new(Instant::now()),
        }
    }

    /// Moves the clock `by` forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock();
        *now += by;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = ManualClock::new();
        let t0 = c.now();
        assert_eq!(c.now(), t0, "no time passes by itself");
        c.advance(Duration::from_millis(250));
        assert_eq!(c.now() - t0, Duration::from_millis(250));
    }
}
