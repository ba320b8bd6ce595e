//! When the request a thread serves arrived, for stores whose reads wait on the network.
//!
//! A namespace change holds the namespace's lock across its reads. On etcd a read is
//! retried for `retry_for_ms` while the cluster does not answer (no quorum), and the
//! requests queued behind the lock would each wait that long in turn: the fourth would
//! fail after four windows. So the server notes each request's arrival
//! ([`for_request`]), and while etcd is silent (a call's retries ran out unanswered,
//! none answered since) the store counts a read's window from there
//! ([`request_started`]): a request's reads fail about `retry_for_ms` after it arrived,
//! however long it queued. A healthy etcd bounds nothing, so a long request (a check of
//! a large namespace) is never cut. Commits are not bounded so: a group commit is
//! shared by many requests, runs outside the lock and has a window of its own.

use std::cell::Cell;
use std::time::Instant;

thread_local! {
    static STARTED: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Runs `f`, the work of a request that arrived at `started`, on this thread.
pub fn for_request<T>(started: Instant, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Instant>);
    impl Drop for Restore {
        fn drop(&mut self) {
            STARTED.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(STARTED.with(|s| s.replace(Some(started))));
    f()
}

/// When the request this thread serves arrived, inside [`for_request`].
pub fn request_started() -> Option<Instant> {
    STARTED.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_request_start_is_seen_inside_and_restored_after() {
        assert_eq!(request_started(), None);
        let outer = Instant::now();
        let inner = outer + Duration::from_millis(5);
        for_request(outer, || {
            assert_eq!(request_started(), Some(outer));
            for_request(inner, || assert_eq!(request_started(), Some(inner)));
            assert_eq!(request_started(), Some(outer));
        });
        assert_eq!(request_started(), None);
    }
}
