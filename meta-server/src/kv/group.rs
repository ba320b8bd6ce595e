//! Group commit: many concurrent mutations, one durable commit.
//!
//! Every mutation of the namespace must be durable before its reply, and a durable commit
//! costs about one fsync. [`GroupCommit`] lets a mutation *stage* its batch (every read
//! from then on sees it) and then wait, outside the namespace's lock, while one flusher
//! thread commits everything staged so far as one batch with one fsync. Under load the
//! cost of an fsync is shared by all the mutations that arrived during the previous one.
//!
//! Batches are committed in staging order, so a mutation that read another's staged
//! change is never durable without it.
//!
//! A batch staged inside [`lazily`] (an access time) waits for the next group that
//! someone waits for, or for [`LAZY_DELAY`], whichever comes first: nobody waits for
//! it, and a read-mostly load (a data set read once, each first read moving an access
//! time) would otherwise cost one synchronous log write per file.
//!
//! If a commit fails, the store refuses every later one: memory and disk may disagree
//! from then on, and only a restart (which reads the disk) is safe.

use super::{KvError, KvPair, KvStore, WriteBatch};
use parking_lot::{Condvar, Mutex};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest a lazily staged batch waits for company before it is committed alone; what
/// a crash may lose of lazy changes (ext4 writes its journal every 5 s).
pub const LAZY_DELAY: Duration = Duration::from_secs(1);

/// A [`KvStore`] whose commits are staged in memory and made durable in groups.
pub struct GroupCommit {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
}

struct Shared {
    inner: Arc<dyn KvStore>,
    state: Mutex<State>,
    /// Signals the flusher that something was staged (or that it must stop).
    staged: Condvar,
    /// Signals waiters that a group became durable (or failed).
    flushed: Condvar,
}

#[derive(Default)]
struct State {
    /// Staged values not yet known durable, with the sequence number that wrote them
    /// (`None`: deleted).
    overlay: BTreeMap<Vec<u8>, (u64, Option<Vec<u8>>)>,
    queue: Vec<WriteBatch>,
    /// Sequence number of the last staged batch.
    staged: u64,
    /// A batch in `queue` has a waiter (or `sync` was called): commit it now.
    eager: bool,
    /// When the oldest lazy batch in `queue` was staged.
    lazy_since: Option<Instant>,
    /// Every batch up to this sequence number is durable.
    durable: u64,
    /// Every batch up to this sequence number is visible in the inner store itself.
    applied: u64,
    failed: Option<String>,
    stop: bool,
}

thread_local! {
    /// The newest ticket staged by this thread and not yet waited for; see
    /// [`take_pending`].
    static PENDING: Cell<Option<u64>> = const { Cell::new(None) };
    /// Set while this thread stages batches nobody will wait for; see [`lazily`].
    static LAZY: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, whose staged batches nobody waits for: they are committed with the next
/// group someone waits for, or after [`LAZY_DELAY`].
pub fn lazily<T>(f: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            LAZY.with(|l| l.set(false));
        }
    }
    LAZY.with(|l| l.set(true));
    let _reset = Reset;
    f()
}

/// Takes the newest ticket this thread staged since the last call. The namespace stages
/// under its lock and waits for this ticket after releasing it, before replying.
pub fn take_pending() -> Option<u64> {
    PENDING.with(|p| p.take())
}

impl GroupCommit {
    /// Wraps `inner`, starting the flusher thread.
    pub fn new(inner: Arc<dyn KvStore>) -> GroupCommit {
        let shared = Arc::new(Shared {
            inner,
            state: Mutex::new(State::default()),
            staged: Condvar::new(),
            flushed: Condvar::new(),
        });
        let s = shared.clone();
        let flusher = std::thread::Builder::new()
            .name("meta-group-commit".into())
            .spawn(move || s.flush_loop())
            .expect("spawning the group-commit thread");
        GroupCommit {
            shared,
            flusher: Some(flusher),
        }
    }

    /// Waits until everything staged before this call is durable and visible in the
    /// inner store (tools and tests read it directly).
    pub fn sync(&self) -> Result<(), KvError> {
        let last = {
            let mut st = self.shared.state.lock();
            if !st.queue.is_empty() {
                st.eager = true;
            }
            st.staged
        };
        self.shared.staged.notify_one();
        self.wait_until(|st| st.applied >= last)
    }

    /// Waits until `done` holds; fails if a commit failed before it did.
    fn wait_until(&self, done: impl Fn(&State) -> bool) -> Result<(), KvError> {
        let mut st = self.shared.state.lock();
        while !done(&st) && st.failed.is_none() {
            self.shared.flushed.wait(&mut st);
        }
        match &st.failed {
            Some(why) if !done(&st) => Err(self.failed(why)),
            _ => Ok(()),
        }
    }

    fn failed(&self, why: &str) -> KvError {
        KvError::Engine {
            engine: self.shared.inner.engine(),
            message: format!("an earlier commit failed ({why}); restart the metadata server"),
        }
    }
}

impl Shared {
    fn flush_loop(&self) {
        loop {
            let (group, last) = {
                let mut st = self.state.lock();
                loop {
                    if st.queue.is_empty() {
                        if st.stop {
                            return;
                        }
                        self.staged.wait(&mut st);
                        continue;
                    }
                    if st.eager || st.stop {
                        break;
                    }
                    // Only lazy batches: wait for company, at most until the delay.
                    let waited = st.lazy_since.map_or(LAZY_DELAY, |t| t.elapsed());
                    if waited >= LAZY_DELAY {
                        break;
                    }
                    self.staged.wait_for(&mut st, LAZY_DELAY - waited);
                }
                st.eager = false;
                st.lazy_since = None;
                (std::mem::take(&mut st.queue), st.staged)
            };
            let mut merged = WriteBatch::new();
            for b in group {
                merged.extend(b);
            }
            // Waiters are released as soon as the group is durable; its values stay in
            // the overlay until the store's own reads see them.
            let result = self.inner.commit_early(merged, &mut || {
                self.state.lock().durable = last;
                self.flushed.notify_all();
            });
            let mut st = self.state.lock();
            match result {
                Ok(()) => {
                    st.durable = last;
                    st.applied = last;
                    st.overlay.retain(|_, (seq, _)| *seq > last);
                }
                Err(e) => {
                    tracing::error!(error = %e, "metadata commit failed; refusing further changes");
                    st.failed = Some(e.to_string());
                }
            }
            let failed = st.failed.is_some();
            drop(st);
            self.flushed.notify_all();
            if failed {
                return;
            }
        }
    }
}

impl KvStore for GroupCommit {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        if let Some((_, v)) = self.shared.state.lock().overlay.get(key) {
            return Ok(v.clone());
        }
        // Entries leave the overlay only after they are in the store: a miss here means
        // the store has the latest value.
        self.shared.inner.get(key)
    }

    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>, KvError> {
        if start >= end {
            return Ok(Vec::new());
        }
        let staged: Vec<(Vec<u8>, Option<Vec<u8>>)> = self
            .shared
            .state
            .lock()
            .overlay
            .range(start.to_vec()..end.to_vec())
            .map(|(k, (_, v))| (k.clone(), v.clone()))
            .collect();
        // Deletes in the overlay may hide store keys: ask for that many more.
        let deletes = staged.iter().filter(|(_, v)| v.is_none()).count();
        let base = self
            .shared
            .inner
            .scan(start, end, limit.saturating_add(deletes))?;
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = base.into_iter().collect();
        for (k, v) in staged {
            match v {
                Some(v) => merged.insert(k, v),
                None => merged.remove(&k),
            };
        }
        Ok(merged.into_iter().take(limit).collect())
    }

    fn commit(&self, batch: WriteBatch) -> Result<(), KvError> {
        match self.stage(batch)? {
            Some(t) => self.wait(t),
            None => Ok(()),
        }
    }

    fn stage(&self, batch: WriteBatch) -> Result<Option<u64>, KvError> {
        if batch.is_empty() {
            return Ok(None);
        }
        let mut st = self.shared.state.lock();
        if let Some(why) = &st.failed {
            return Err(self.failed(why));
        }
        st.staged += 1;
        let seq = st.staged;
        for op in batch.ops() {
            let (k, v) = op.key_value();
            st.overlay.insert(k.to_vec(), (seq, v.map(<[u8]>::to_vec)));
        }
        st.queue.push(batch);
        if LAZY.with(|l| l.get()) {
            st.lazy_since.get_or_insert_with(Instant::now);
        } else {
            st.eager = true;
        }
        drop(st);
        self.shared.staged.notify_one();
        PENDING.with(|p| p.set(Some(seq)));
        Ok(Some(seq))
    }

    fn wait(&self, ticket: u64) -> Result<(), KvError> {
        self.wait_until(|st| st.durable >= ticket)
    }

    fn engine(&self) -> &'static str {
        self.shared.inner.engine()
    }
}

impl Drop for GroupCommit {
    /// Makes everything staged durable before the store closes.
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.staged.notify_all();
        if let Some(f) = self.flusher.take() {
            let _ = f.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{open_store, StoreKind};

    fn put(k: &[u8], v: &[u8]) -> WriteBatch {
        let mut b = WriteBatch::new();
        b.put(k.to_vec(), v.to_vec());
        b
    }

    #[test]
    fn staged_writes_are_visible_at_once_and_durable_after_wait() {
        let dir = tempfile::tempdir().unwrap();
        let inner = open_store(StoreKind::Redb, dir.path()).unwrap();
        let g = GroupCommit::new(inner.clone());
        let t = g.stage(put(b"k1", b"v1")).unwrap().unwrap();
        assert_eq!(g.get(b"k1").unwrap(), Some(b"v1".to_vec()));
        let mut del = WriteBatch::new();
        del.delete(b"k1".to_vec());
        let t2 = g.stage(del).unwrap().unwrap();
        assert_eq!(
            g.get(b"k1").unwrap(),
            None,
            "a staged delete hides the value"
        );
        assert!(t2 > t);
        g.wait(t2).unwrap();
        g.sync().unwrap();
        assert_eq!(inner.get(b"k1").unwrap(), None);
        g.commit(put(b"k2", b"v2")).unwrap();
        g.sync().unwrap();
        assert_eq!(
            inner.get(b"k2").unwrap(),
            Some(b"v2".to_vec()),
            "commit is durable"
        );
    }

    #[test]
    fn concurrent_commits_share_flushes_and_all_land() {
        let dir = tempfile::tempdir().unwrap();
        let inner = open_store(StoreKind::Redb, dir.path()).unwrap();
        let g = Arc::new(GroupCommit::new(inner.clone()));
        let threads: Vec<_> = (0..8u32)
            .map(|t| {
                let g = g.clone();
                std::thread::spawn(move || {
                    for i in 0..50u32 {
                        let k = format!("k{t}-{i:03}");
                        g.commit(put(k.as_bytes(), b"x")).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Durable is not yet applied: the engine's own reads see a group a moment later.
        g.sync().unwrap();
        let all = inner.scan(b"k", b"l", 1000).unwrap();
        assert_eq!(all.len(), 400);
        let merged = g.scan(b"k0-", b"k0-\xff", 10).unwrap();
        assert_eq!(merged.len(), 10);
        assert_eq!(merged[0].0, b"k0-000".to_vec());
    }

    #[test]
    fn a_lazy_batch_goes_with_the_next_eager_one_or_alone_after_the_delay() {
        let dir = tempfile::tempdir().unwrap();
        let inner = open_store(StoreKind::Redb, dir.path()).unwrap();
        let g = GroupCommit::new(inner.clone());
        let durable = |g: &GroupCommit| g.shared.state.lock().durable;
        let lazy = lazily(|| g.stage(put(b"atime", b"1"))).unwrap().unwrap();
        assert_eq!(
            g.get(b"atime").unwrap(),
            Some(b"1".to_vec()),
            "visible at once"
        );
        assert!(durable(&g) < lazy, "a lazy batch alone waits");
        let eager = g.stage(put(b"name", b"2")).unwrap().unwrap();
        g.wait(eager).unwrap();
        assert!(durable(&g) >= lazy, "it went with the eager one, before it");
        // Alone, it is committed after the delay.
        let start = Instant::now();
        let alone = lazily(|| g.stage(put(b"atime", b"3"))).unwrap().unwrap();
        while durable(&g) < alone {
            assert!(start.elapsed() < 10 * LAZY_DELAY, "never committed");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            start.elapsed() >= LAZY_DELAY / 2,
            "committed without waiting"
        );
        // `sync` does not wait for the delay.
        let start = Instant::now();
        lazily(|| g.stage(put(b"atime", b"4"))).unwrap();
        g.sync().unwrap();
        assert!(start.elapsed() < LAZY_DELAY, "sync waited for the delay");
        assert_eq!(inner.get(b"atime").unwrap(), Some(b"4".to_vec()));
    }

    #[test]
    fn dropping_flushes_what_is_staged() {
        let dir = tempfile::tempdir().unwrap();
        let inner = open_store(StoreKind::Redb, dir.path()).unwrap();
        let g = GroupCommit::new(inner.clone());
        g.stage(put(b"late", b"1")).unwrap();
        drop(g);
        assert_eq!(inner.get(b"late").unwrap(), Some(b"1".to_vec()));
    }
}
