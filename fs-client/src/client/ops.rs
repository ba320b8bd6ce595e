//! The ids of this client's changes (`proto::meta::OpId`): a count, and a window that
//! keeps the changes in flight within [`OP_SLOTS`] counts of each other. The server
//! keeps a change's record in slot `count % OP_SLOTS`: a change may start only once
//! the change `OP_SLOTS` counts before it has ended, so that no two changes in flight
//! share a slot (one's record would overwrite the other's).

use proto::meta::OP_SLOTS;
use std::collections::BTreeSet;

/// Whether the change counted `next` may start while the lowest count still in
/// flight is `lowest`.
fn may_start(next: u64, lowest: Option<u64>) -> bool {
    lowest.is_none_or(|low| next - low < OP_SLOTS)
}

/// The counts handed out and those still in flight.
#[derive(Default)]
struct Counts {
    last: u64,
    in_flight: BTreeSet<u64>,
}

/// Hands out change counts within the window.
#[derive(Default)]
pub(crate) struct OpWindow {
    counts: parking_lot::Mutex<Counts>,
    freed: tokio::sync::Notify,
}

/// A change's count, in flight until dropped.
pub(crate) struct OpTicket<'a> {
    window: &'a OpWindow,
    /// The change's count (from 1).
    pub(crate) seq: u64,
}

impl Drop for OpTicket<'_> {
    fn drop(&mut self) {
        self.window.counts.lock().in_flight.remove(&self.seq);
        self.window.freed.notify_waiters();
    }
}

impl OpWindow {
    /// The next count, once the change [`OP_SLOTS`] counts before it has ended.
    pub(crate) async fn enter(&self) -> OpTicket<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so that a ticket dropped between the
            // check and the wait still wakes this one.
            freed.as_mut().enable();
            {
                let mut c = self.counts.lock();
                let next = c.last + 1;
                if may_start(next, c.in_flight.first().copied()) {
                    c.last = next;
                    c.in_flight.insert(next);
                    return OpTicket {
                        window: self,
                        seq: next,
                    };
                }
            }
            freed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_waits_for_the_one_a_window_before_it() {
        assert!(may_start(1, None));
        assert!(may_start(OP_SLOTS, Some(1)));
        assert!(!may_start(OP_SLOTS + 1, Some(1)));
        assert!(may_start(OP_SLOTS + 1, Some(2)));
    }

    #[tokio::test]
    async fn tickets_stay_within_the_window_and_free_it_when_dropped() {
        let w = std::sync::Arc::new(OpWindow::default());
        let mut held = Vec::new();
        for _ in 0..OP_SLOTS {
            held.push(w.enter().await);
        }
        assert_eq!(held.last().map(|t| t.seq), Some(OP_SLOTS));
        // The next waits while count 1 is in flight, though later ones end.
        let w2 = w.clone();
        let next = tokio::spawn(async move { w2.enter().await.seq });
        let last = held.pop();
        drop(last);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!next.is_finished());
        held.remove(0);
        let seq = tokio::time::timeout(std::time::Duration::from_secs(5), next)
            .await
            .expect("the window freed")
            .expect("task");
        assert_eq!(seq, OP_SLOTS + 1);
    }
}
