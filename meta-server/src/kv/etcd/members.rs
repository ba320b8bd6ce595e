//! Which member of the etcd cluster the engine's calls go to: one at a time, as etcd's
//! own client does, moving on to the next member of the list when a call to this one
//! fails without etcd's answer or is not answered within its attempt.
//!
//! etcd-client's one channel balanced over every member keeps sending a share of the
//! calls to a member that is down; each fails its connection and is tried again after a
//! pause (`retry`), so with one of three members down every change cost several times
//! what it did (measured in CHANGELOG, issue 24). A client per member, and calls kept on
//! one that answers, cost nothing while all are up: a write goes through etcd's leader
//! whichever member receives it.

use super::retry::answered_by_etcd;
use etcd_client::{Client, ConnectOptions, KvClient};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tracing::warn;

/// The members, a client for each, and the one calls go to now.
pub(super) struct Members {
    urls: Vec<String>,
    clients: Vec<KvClient>,
    current: AtomicUsize,
    /// Times calls moved on to the next member (for the log and the tests).
    moves: AtomicUsize,
}

impl Members {
    /// A client for each of `urls` (connected on its first call: a member that is down
    /// now is tried when its turn comes), each call's reply at most `max_reply` bytes.
    pub(super) async fn connect(
        urls: &[String],
        options: &ConnectOptions,
        max_reply: usize,
    ) -> Result<Members, etcd_client::Error> {
        let mut clients = Vec::with_capacity(urls.len());
        for url in urls {
            let client = Client::connect([url], Some(options.clone())).await?;
            clients.push(client.kv_client().max_decoding_message_size(max_reply));
        }
        Ok(Members {
            urls: urls.to_vec(),
            clients,
            current: AtomicUsize::new(0),
            moves: AtomicUsize::new(0),
        })
    }

    /// Runs `call` with the client of the member calls go to now. If that call fails
    /// without etcd's answer, or is dropped before its answer (its attempt ran out of
    /// time), the next calls go to the next member.
    pub(super) fn call<T, F, Fut>(
        self: &Arc<Self>,
        call: F,
    ) -> impl Future<Output = Result<T, etcd_client::Error>> + use<T, F, Fut>
    where
        F: FnOnce(KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let index = self.current.load(Ordering::Relaxed) % self.clients.len();
        let unanswered = Unanswered {
            members: self.clone(),
            index,
            armed: true,
        };
        let reply = call(self.clients[index].clone());
        async move {
            // The whole guard moves in (not only its field), to drop with the call.
            let mut unanswered = unanswered;
            let r = reply.await;
            unanswered.armed = match &r {
                Ok(_) => false,
                Err(e) => !answered_by_etcd(e),
            };
            r
        }
    }

    /// Member `index` did not answer: calls go to the next one, unless another call
    /// moved them on already.
    fn move_on(&self, index: usize) {
        let next = (index + 1) % self.clients.len();
        if next != index
            && self
                .current
                .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let moves = self.moves.fetch_add(1, Ordering::Relaxed) + 1;
            warn!(from = %self.urls[index], to = %self.urls[next], moves,
                  "etcd member did not answer; calls go to the next member");
        }
    }
}

/// Moves calls on from member `index` when dropped armed: a call that ended without
/// etcd's answer, or never ended.
struct Unanswered {
    members: Arc<Members>,
    index: usize,
    armed: bool,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if self.armed {
            self.members.move_on(self.index);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::kv::etcd::local::LocalEtcd;
    use crate::kv::{EtcdStore, KvStore, ReadCheck, TxnStore, WriteBatch};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    /// A read and a conditional write of one key: what a namespace change does.
    fn change(store: &EtcdStore, i: usize) {
        let key = format!("k{}", i % 4).into_bytes();
        let now = store.get_versioned(&key).expect("read");
        let check = ReadCheck {
            key: key.clone(),
            revision: now.map(|v| v.revision),
        };
        let mut batch = WriteBatch::new();
        batch.put(key, i.to_string().into_bytes());
        store.commit_if(&[check], batch).expect("commit");
    }

    /// Guards against calls that keep going to a member that is down (each failing its
    /// connection and tried again after a pause: 8x the time of a change, measured
    /// with etcd-client's balanced channel): with every member up, calls stay on the
    /// first; with it killed, the first call that fails moves them on, and the next
    /// member that answers keeps them. Real etcd members on 127.0.0.1.
    #[test]
    fn calls_leave_a_member_that_is_down_and_stay_on_one_that_answers() {
        if !LocalEtcd::present_for_tests() {
            return;
        }
        let mut etcd = LocalEtcd::start(3).expect("3 etcd members");
        etcd.wait_ready().expect("etcd ready");
        let within = Duration::from_secs(30);
        etcd.wait_for_leader(within).expect("a leader");
        let store = EtcdStore::connect(&etcd.config()).expect("connect");
        for i in 0..20 {
            change(&store, i);
        }
        let (moves, current) = (&store.members.moves, &store.members.current);
        assert_eq!(moves.load(Ordering::Relaxed), 0, "moved with all up");
        assert_eq!(current.load(Ordering::Relaxed), 0);
        etcd.kill(0);
        etcd.wait_for_leader(within).expect("a new leader");
        for i in 0..100 {
            change(&store, i);
        }
        store.scan(b"k", b"l", 10).expect("scan");
        assert_ne!(current.load(Ordering::Relaxed), 0, "calls stay on the dead");
        // One move off the dead member; one more where the next one answered "no
        // leader" during the election.
        let moved = moves.load(Ordering::Relaxed);
        assert!((1..=2).contains(&moved), "{moved} moves");
    }
}
