//! Credit-based flow control for SEND/RECV.
//!
//! Each side posts `window` receive buffers for the peer's data messages (calls, replies,
//! refusals) plus `update_slots` more for credit-only messages. A SEND needs a posted
//! receive buffer at the peer, so:
//! - a data message takes one credit; with none left it waits (it is never sent into a
//!   receive queue that may be empty, which would stall the queue pair on RNR retries);
//! - every data buffer the receiver reposts is a credit it owes back; every message it
//!   sends carries the credits owed so far (piggyback);
//! - when half a window is owed, a credit-only message returns them at once. It uses
//!   one of the `update_slots` buffers, not a data credit, so returning credits never
//!   waits for credits. Every message carries how many credit-only messages its sender
//!   has received, so each side knows which of its update slots are free again.
//!
//! The peer can never be starved: it only runs out after sending `window` messages,
//! and once we have reposted them we owe `window >= window / 2` credits and return them.

/// What a message carries for flow control.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreditInfo {
    /// Credits returned (receive buffers reposted since the last message).
    pub credits: u32,
    /// Credit-only messages received so far (wrapping).
    pub updates_seen: u32,
}

/// The peer broke flow control: it returned more credits than it could owe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreditError {
    /// Credits we would hold.
    pub would_hold: u64,
    /// The most we can hold.
    pub window: u32,
}

impl std::fmt::Display for CreditError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "peer returned credits for {} receive buffers, it has only {}",
            self.would_hold, self.window
        )
    }
}

/// One side's credit accounting.
#[derive(Clone, Debug)]
pub struct Credits {
    window: u32,
    update_slots: u32,
    /// Data messages we may still send.
    available: u32,
    /// Credits we owe the peer (data buffers reposted, not yet reported).
    owed: u32,
    updates_sent: u32,
    /// Our credit-only messages the peer has said it received.
    updates_acked: u32,
    updates_received: u32,
}

impl Credits {
    /// Accounting for `window` data buffers on each side and `update_slots` buffers
    /// for credit-only messages (both at least 1).
    pub fn new(window: u32, update_slots: u32) -> Credits {
        assert!(
            window >= 1 && update_slots >= 1,
            "credit windows must not be empty"
        );
        Credits {
            window,
            update_slots,
            available: window,
            owed: 0,
            updates_sent: 0,
            updates_acked: 0,
            updates_received: 0,
        }
    }

    /// Data messages we may send now.
    pub fn available(&self) -> u32 {
        self.available
    }

    /// Credits we owe the peer.
    pub fn owed(&self) -> u32 {
        self.owed
    }

    fn info(&mut self) -> CreditInfo {
        CreditInfo {
            credits: std::mem::take(&mut self.owed),
            updates_seen: self.updates_received,
        }
    }

    /// Takes a credit for a data message; `None` when none is left (wait for credits).
    pub fn take(&mut self) -> Option<CreditInfo> {
        self.available = self.available.checked_sub(1)?;
        Some(self.info())
    }

    /// A credit-only message, when enough is owed and an update slot at the peer is
    /// free.
    pub fn take_update(&mut self) -> Option<CreditInfo> {
        let in_flight = self.updates_sent.wrapping_sub(self.updates_acked);
        let due = self.owed > 0 && self.owed >= self.window.div_ceil(2);
        if !due || in_flight >= self.update_slots {
            return None;
        }
        self.updates_sent = self.updates_sent.wrapping_add(1);
        Some(self.info())
    }

    /// A message arrived carrying `info`; `credit_only` if it was a credit-only one.
    pub fn on_receive(&mut self, info: CreditInfo, credit_only: bool) -> Result<(), CreditError> {
        let would_hold = u64::from(self.available) + u64::from(info.credits);
        if would_hold > u64::from(self.window) {
            return Err(CreditError {
                would_hold,
                window: self.window,
            });
        }
        // Only move forward: an acknowledgement older than the one we have is stale.
        let ahead = info.updates_seen.wrapping_sub(self.updates_acked);
        let in_flight = self.updates_sent.wrapping_sub(self.updates_acked);
        if ahead <= in_flight {
            self.updates_acked = info.updates_seen;
        }
        self.available = would_hold as u32;
        if credit_only {
            self.updates_received = self.updates_received.wrapping_add(1);
        }
        Ok(())
    }

    /// We reposted the receive buffer of a data message: one more credit owed.
    pub fn reposted(&mut self) {
        self.owed = (self.owed + 1).min(self.window);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sending_stops_at_zero_and_resumes_when_credits_return() {
        let mut c = Credits::new(4, 1);
        for _ in 0..4 {
            assert!(c.take().is_some());
        }
        assert_eq!(c.take(), None, "no credit, no send");
        let back = CreditInfo {
            credits: 3,
            updates_seen: 0,
        };
        c.on_receive(back, false).unwrap();
        assert_eq!(c.available(), 3);
    }

    #[test]
    fn owed_credits_ride_on_the_next_message() {
        let mut c = Credits::new(8, 1);
        c.reposted();
        c.reposted();
        let info = c.take().unwrap();
        assert_eq!(info.credits, 2);
        assert_eq!(c.owed(), 0);
        assert_eq!(c.take().unwrap().credits, 0, "reported once");
    }

    /// Guards against a peer that returns more credits than it could owe.
    #[test]
    fn over_returned_credits_are_a_protocol_error() {
        let mut c = Credits::new(4, 1);
        let e = c
            .on_receive(
                CreditInfo {
                    credits: 1,
                    updates_seen: 0,
                },
                false,
            )
            .unwrap_err();
        assert_eq!((e.would_hold, e.window), (5, 4));
    }

    #[test]
    fn credit_updates_go_out_at_half_a_window_and_are_bounded_by_slots() {
        let mut c = Credits::new(8, 1);
        for _ in 0..3 {
            c.reposted();
        }
        assert_eq!(
            c.take_update(),
            None,
            "3 of 8 owed: wait for more or piggyback"
        );
        c.reposted();
        let u = c.take_update().expect("half a window owed");
        assert_eq!(u.credits, 4);
        for _ in 0..4 {
            c.reposted();
        }
        assert_eq!(c.take_update(), None, "the one update slot is still in use");
        // The peer's next message says it saw our update: the slot is free again.
        let ack = CreditInfo {
            credits: 0,
            updates_seen: 1,
        };
        c.on_receive(ack, false).unwrap();
        assert_eq!(c.take_update().map(|u| u.credits), Some(4));
    }

    /// Simulates two peers exchanging data until both are done, returning credits only
    /// through the rules above: nobody deadlocks and nobody exceeds a window.
    #[test]
    fn two_peers_never_deadlock() {
        let window = 4;
        let (mut a, mut b) = (Credits::new(window, 1), Credits::new(window, 1));
        type Queue = Vec<(CreditInfo, bool)>;
        let (mut to_b, mut to_a): (Queue, Queue) = (vec![], vec![]);
        let (mut a_left, mut b_left) = (1000, 10);
        for _round in 0..10_000 {
            if a_left == 0 && b_left == 0 {
                return;
            }
            for _ in 0..3 {
                if a_left > 0 {
                    if let Some(i) = a.take() {
                        to_b.push((i, false));
                        a_left -= 1;
                    }
                }
                if let Some(i) = a.take_update() {
                    to_b.push((i, true));
                }
            }
            if b_left > 0 {
                if let Some(i) = b.take() {
                    to_a.push((i, false));
                    b_left -= 1;
                }
            }
            if let Some(i) = b.take_update() {
                to_a.push((i, true));
            }
            for (i, upd) in to_b.drain(..) {
                b.on_receive(i, upd).unwrap();
                if !upd {
                    b.reposted();
                }
            }
            for (i, upd) in to_a.drain(..) {
                a.on_receive(i, upd).unwrap();
                if !upd {
                    a.reposted();
                }
            }
        }
        panic!("deadlock: a has {a_left} left, b has {b_left}");
    }
}
