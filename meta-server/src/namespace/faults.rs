//! The log line of a request that failed for a fault of this server (its store
//! unavailable or failing, a damaged record): the client sees only EIO, the operator
//! needs the reason. A store that stays down fails every request, so after the first
//! line at most one is written per [`FAULT_LOG_EVERY`], with how many failed unlogged.

use crate::error::MetaError;
use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// At most one line per this long.
pub(crate) const FAULT_LOG_EVERY: Duration = Duration::from_secs(1);

/// When the last line was written, and the failures since that were not.
#[derive(Default)]
pub(crate) struct FaultLog {
    last: Mutex<Option<(Instant, u64)>>,
}

impl FaultLog {
    /// Logs `op`'s failure `e` unless a line was written less than [`FAULT_LOG_EVERY`]
    /// ago.
    pub(crate) fn note(&self, op: &'static str, e: &MetaError) {
        let due = due(&mut self.last.lock(), Instant::now());
        if let Some(unlogged) = due {
            tracing::warn!(op, error = %e, unlogged, "request failed");
        }
    }
}

/// Whether a failure at `now` gets a line: `Some(failures not logged since the last
/// line)` if it does. Counts it otherwise.
fn due(last: &mut Option<(Instant, u64)>, now: Instant) -> Option<u64> {
    match last {
        Some((at, unlogged)) if now.saturating_duration_since(*at) < FAULT_LOG_EVERY => {
            *unlogged += 1;
            None
        }
        _ => {
            let unlogged = last.map_or(0, |(_, n)| n);
            *last = Some((now, 0));
            Some(unlogged)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a log flooded by a store that stays down: one line a second, each
    /// saying how many failures it stands for.
    #[test]
    fn one_line_a_second_with_the_failures_between() {
        let t0 = Instant::now();
        let mut last = None;
        assert_eq!(due(&mut last, t0), Some(0), "the first is logged");
        for i in 1..=5 {
            assert_eq!(due(&mut last, t0 + Duration::from_millis(100 * i)), None);
        }
        assert_eq!(due(&mut last, t0 + FAULT_LOG_EVERY), Some(5));
        assert_eq!(due(&mut last, t0 + FAULT_LOG_EVERY), None);
        assert_eq!(due(&mut last, t0 + 3 * FAULT_LOG_EVERY), Some(1));
    }
}
