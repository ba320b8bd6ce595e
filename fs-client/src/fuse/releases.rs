//! Lock releases in flight, per inode.
//!
//! The kernel sends `RELEASE` (the last close of an open file) in the background: `close`
//! returns before the mount has dropped the file's OFD locks. A lock request of this
//! mount read after that release waits here until the release has reached the metadata
//! server, so a process that closed its last descriptor and then asks through another
//! one (`F_OFD_GETLK`, `F_OFD_SETLK`) never sees its own lock still held.

use parking_lot::Mutex;
use proto::InodeId;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::Notify;

/// The releases of locks this mount has been asked for and not finished, by inode.
#[derive(Default)]
pub(super) struct Releases {
    pending: Mutex<HashMap<InodeId, usize>>,
    done: Notify,
}

/// One release in flight; it ends when dropped, whatever the release's outcome.
pub(super) struct Releasing {
    releases: Arc<Releases>,
    ino: InodeId,
}

impl Releases {
    /// Records a release of `ino`'s locks; called where the kernel's request is
    /// dispatched, before any later request is.
    pub(super) fn start(self: &Arc<Self>, ino: InodeId) -> Releasing {
        *self.pending.lock().entry(ino).or_default() += 1;
        Releasing {
            releases: self.clone(),
            ino,
        }
    }

    /// Waits until no release of `ino`'s locks is in flight.
    pub(super) async fn settled(&self, ino: InodeId) {
        loop {
            let done = self.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if !self.pending.lock().contains_key(&ino) {
                return;
            }
            done.await;
        }
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        let mut pending = self.releases.pending.lock();
        if let Some(n) = pending.get_mut(&self.ino) {
            *n -= 1;
            if *n == 0 {
                pending.remove(&self.ino);
            }
        }
        drop(pending);
        self.releases.done.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_lock_call_waits_for_the_release_before_it() {
        let r = Arc::new(Releases::default());
        let (a, b) = (InodeId(7), InodeId(8));
        let first = r.start(a);
        let second = r.start(a);
        // Another inode's calls do not wait.
        r.settled(b).await;
        let waiter = tokio::spawn({
            let r = r.clone();
            async move { r.settled(a).await }
        });
        drop(first);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one release of a is still in flight");
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken when the last release ends")
            .expect("waiter");
    }
}
