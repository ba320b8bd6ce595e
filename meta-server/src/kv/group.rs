//! Group commit: many concurrent mutations, one durable commit.
//!
//! Every mutation of the namespace must be durable before its reply, and a durable commit
//! costs about one fsync. [`GroupCommit`] lets a mutation *stage* its batch (every read
//! from then on sees it) and then wait, outside the namespace's lock. The first waiter
//! that finds no commit under way commits everything staged so far as one group, on its
//! own thread (the leader); those that stage meanwhile wait for it and then one of them
//! leads the next group. Under load the cost of an fsync is shared by all the mutations
//! that arrived during the previous one, and alone a mutation pays no hand-off to another
//! thread and back (two thread wake-ups).
//!
//! A group is logged (durable, waiters answered) before the store's engine applies it;
//! the flusher thread applies it in the background, or the next leader does before
//! logging its own group. Until then its values stay in the overlay, which reads see.
//! Groups are logged and applied in staging order, by one thread at a time, so a
//! mutation that read another's staged change is never durable without it.
//!
//! A batch staged inside [`lazily`] (an access time) waits for the next group that
//! someone waits for, or for [`LAZY_DELAY`], whichever comes first: nobody waits for
//! it, and a read-mostly load (a data set read once, each first read moving an access
//! time) would otherwise cost one synchronous log write per file.
//!
//! If a commit fails, the store refuses every later one: memory and disk may disagree
//! from then on, and only a restart (which reads the disk) is safe. Except when the
//! store did not answer ([`KvError::Unavailable`]: etcd without a quorum, for longer than
//! its `retry_for_ms`): the group goes back to the head of the queue, still staged and
//! seen by reads, and the next commit (a waiter's, or the flusher's) tries it again.
//! Its waiters fail now, with a message saying the change will still be committed: a
//! group is whole puts and deletes, written by one server (the owner key fences the
//! store), so writing it again after an attempt that may have landed changes nothing,
//! and groups still land in staging order. Memory and store agree once it lands; a
//! server that stops first loses it, as it would lose any staged change.

use super::{KvError, KvPair, KvStore, WriteBatch};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::thread::{JoinHandle, LocalKey};
use std::time::{Duration, Instant};

/// Longest a lazily staged batch waits for company before it is committed alone; what
/// a crash may lose of lazy changes (ext4 writes its journal every 5 s).
pub const LAZY_DELAY: Duration = Duration::from_secs(1);

/// How long the flusher leaves a batch that is not lazy, but that nobody waits for,
/// before committing it alone; also how long it stays awake after work. Every stager
/// in the namespace waits for its batch: this only bounds what a missed wait would cost.
const ORPHAN_DELAY: Duration = Duration::from_millis(20);

/// How long the flusher waits before it tries a commit again that the store did not
/// answer (an etcd commit fails so only after its own retries, `retry_for_ms`).
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Told of every group made durable: how many batches (mutations) it held and how long
/// logging it took. Called once per group, on the committing thread (for metrics).
pub type GroupObserver = Box<dyn Fn(usize, Duration) + Send + Sync>;

/// A [`KvStore`] whose commits are staged in memory and made durable in groups.
pub struct GroupCommit {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
    /// Stages nothing: each batch is committed when staged (see [`GroupCommit::direct`]).
    direct: bool,
}

struct Shared {
    inner: Arc<dyn KvStore>,
    state: Mutex<State>,
    /// Signals the flusher: something to apply, a lazy batch to time, or stop.
    work: Condvar,
    /// Signals waiters that a group became durable (or failed), or that the commit
    /// under way ended.
    flushed: Condvar,
    observer: std::sync::OnceLock<GroupObserver>,
    /// Fault injection for the kill -9 tests ([`LOG_DELAY_ENV`]): every log write
    /// waits this long first.
    log_delay: Duration,
}

/// Environment variable that holds every log write back by this many milliseconds:
/// fault injection for the tests that kill a metadata server while changes it
/// answered early are not durable yet. Unset in production; a server that has it says
/// so in its log.
pub const LOG_DELAY_ENV: &str = "TESSERA_FAULT_LOG_DELAY_MS";

/// The delay [`LOG_DELAY_ENV`] asks for.
fn log_delay() -> Duration {
    let ms = std::env::var(LOG_DELAY_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        .min(60_000);
    if ms > 0 {
        tracing::warn!(
            delay_ms = ms,
            "fault injection: every metadata log write waits"
        );
    }
    Duration::from_millis(ms)
}

#[derive(Default)]
struct State {
    /// Staged values not yet applied by the inner store, with the sequence number that
    /// wrote them (`None`: deleted).
    overlay: BTreeMap<Vec<u8>, (u64, Option<Vec<u8>>)>,
    /// Staged batches not yet logged.
    queue: Vec<WriteBatch>,
    /// Groups logged but not yet applied by the inner store, oldest first, each with
    /// the sequence number of its last batch.
    logged: VecDeque<(WriteBatch, u64)>,
    /// Sequence number of the last staged batch.
    staged: u64,
    /// `queue` holds a batch that is not lazy.
    eager: bool,
    /// When the oldest batch in `queue` was staged.
    oldest: Option<Instant>,
    /// A thread is logging or applying: nobody else starts.
    busy: bool,
    /// The flusher sleeps until told: a stage tells it, so that it times the batch.
    flusher_idle: bool,
    /// Every batch up to this sequence number is durable.
    durable: u64,
    /// Every batch up to this sequence number is visible in the inner store itself.
    applied: u64,
    failed: Option<String>,
    /// Commits that failed because the store did not answer, so far; a waiter that sees
    /// this move while its batch is not durable fails (see the module docs).
    unanswered: u64,
    /// Why the last of them failed.
    unanswered_why: String,
    /// The last commit failed so: the flusher waits [`RETRY_PAUSE`] before the next.
    retrying: bool,
    /// Who staged each batch not yet durable that is not lazy, oldest first (see
    /// [`GroupCommit::early`]).
    owners: VecDeque<(u64, u64)>,
    /// A batch was answered early: the flusher logs the queue at once.
    urgent: bool,
    stop: bool,
}

/// Whether a staged change may be answered before it is durable
/// ([`GroupCommit::early`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Early {
    /// It is durable already.
    Durable,
    /// Not yet: the flusher logs it at once, and the reply may go now.
    Pending,
    /// Another owner's change not yet durable comes before it (or the owner has too
    /// many pending): the reply waits for the log.
    Wait,
}

thread_local! {
    /// The newest ticket staged by this thread and not yet waited for; see
    /// [`take_pending`].
    static PENDING: Cell<Option<u64>> = const { Cell::new(None) };
    /// Set while this thread stages batches nobody will wait for; see [`lazily`].
    static LAZY: Cell<bool> = const { Cell::new(false) };
    /// Who this thread stages for (see [`staging_for`]); 0: the server itself.
    static OWNER: Cell<u64> = const { Cell::new(0) };
}

/// Runs `f` with the thread's `cell` set to `value`, and sets back what it held after,
/// also when `f` panics (a blocking-pool or async worker thread serves on).
pub fn with_local<C: Copy + 'static, T>(
    cell: &'static LocalKey<Cell<C>>,
    value: C,
    f: impl FnOnce() -> T,
) -> T {
    struct Restore<C: Copy + 'static>(&'static LocalKey<Cell<C>>, C);
    impl<C: Copy + 'static> Drop for Restore<C> {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(cell, cell.with(|c| c.replace(value)));
    f()
}

/// Runs `f`, whose staged batches are `owner`'s (a client's id; 0 stands for the
/// server itself): see [`GroupCommit::early`].
pub fn staging_for<T>(owner: u64, f: impl FnOnce() -> T) -> T {
    with_local(&OWNER, owner, f)
}

/// Runs `f`, whose staged batches nobody waits for: they are committed with the next
/// group someone waits for, or after [`LAZY_DELAY`].
pub fn lazily<T>(f: impl FnOnce() -> T) -> T {
    with_local(&LAZY, true, f)
}

/// [`lazily`] inside a request whose own changes are waited for: what `f` stages is
/// not waited for, what the request staged before still is (a lazy batch's later
/// ticket would otherwise stand in for it, and the reply wait for both).
pub fn lazily_within<T>(f: impl FnOnce() -> T) -> T {
    let own = take_pending();
    let r = lazily(f);
    PENDING.with(|p| p.set(own));
    r
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
            work: Condvar::new(),
            flushed: Condvar::new(),
            observer: std::sync::OnceLock::new(),
            log_delay: log_delay(),
        });
        let s = shared.clone();
        let flusher = std::thread::Builder::new()
            .name("meta-group-commit".into())
            .spawn(move || s.flush_loop())
            .expect("spawning the group-commit thread");
        GroupCommit {
            shared,
            flusher: Some(flusher),
            direct: false,
        }
    }

    /// Wraps `inner` without grouping: a staged batch is committed at once, durable when
    /// `stage` returns, and nothing is ever waited for. For a store that other servers
    /// write too, where a group's conflict would fail every change in it and the
    /// changes are checked transactions that go straight to the engine anyway.
    pub fn direct(inner: Arc<dyn KvStore>) -> GroupCommit {
        GroupCommit {
            shared: Arc::new(Shared {
                inner,
                state: Mutex::new(State::default()),
                work: Condvar::new(),
                flushed: Condvar::new(),
                observer: std::sync::OnceLock::new(),
                log_delay: Duration::ZERO,
            }),
            flusher: None,
            direct: true,
        }
    }

    /// Sets the observer of every group from now on; a second one is ignored.
    pub fn observe(&self, observer: GroupObserver) {
        let _ = self.shared.observer.set(observer);
    }

    /// Waits until everything staged before this call is durable and visible in the
    /// inner store (tools and tests read it directly).
    pub fn sync(&self) -> Result<(), KvError> {
        let last = self.shared.state.lock().staged;
        self.wait_until(|st| st.applied >= last)
    }

    /// Waits until `done` holds, leading a commit whenever none is under way and there
    /// is something to log or apply; fails if a commit failed before `done` held.
    fn wait_until(&self, done: impl Fn(&State) -> bool) -> Result<(), KvError> {
        let mut st = self.shared.state.lock();
        let unanswered = st.unanswered;
        loop {
            if done(&st) {
                return Ok(());
            }
            if let Some(why) = &st.failed {
                return Err(self.failed(why));
            }
            if st.unanswered != unanswered {
                return Err(KvError::Unavailable {
                    engine: self.shared.inner.engine(),
                    message: format!(
                        "{}; the change stays staged and is committed once the store answers",
                        st.unanswered_why
                    ),
                });
            }
            if !st.busy && (!st.queue.is_empty() || !st.logged.is_empty()) {
                st = self.shared.commit_group(st, true);
            } else {
                self.shared.flushed.wait(&mut st);
            }
        }
    }

    /// Whether `owner`'s change staged as `ticket` may be answered before it is
    /// durable: only if every batch not yet durable up to it is `owner`'s own (or lazy),
    /// and at most `max` of them. Then a crash loses `owner`'s changes only, the
    /// newest first, and only changes nobody else was answered after: the owner sends
    /// them again, in order, and they land as they did. `Pending` also tells the
    /// flusher to log them at once.
    pub fn early(&self, ticket: u64, owner: u64, max: u64) -> Early {
        if self.direct {
            return Early::Durable;
        }
        let mut st = self.shared.state.lock();
        if st.durable >= ticket {
            return Early::Durable;
        }
        let ahead = st.owners.iter().take_while(|(seq, _)| *seq <= ticket);
        let mut mine = 0;
        for (_, o) in ahead {
            if *o != owner {
                return Early::Wait;
            }
            mine += 1;
        }
        if owner == 0 || mine > max || st.failed.is_some() {
            return Early::Wait;
        }
        st.urgent = true;
        drop(st);
        self.shared.work.notify_one();
        Early::Pending
    }

    /// Every batch up to this sequence number is durable.
    pub fn durable(&self) -> u64 {
        self.shared.state.lock().durable
    }

    /// Waits until everything staged before this call is durable (not also applied,
    /// as [`GroupCommit::sync`] waits).
    pub fn settle(&self) -> Result<(), KvError> {
        if self.direct {
            return Ok(());
        }
        let last = self.shared.state.lock().staged;
        self.wait_until(|st| st.durable >= last)
    }

    fn failed(&self, why: &str) -> KvError {
        KvError::Engine {
            engine: self.shared.inner.engine(),
            message: format!("an earlier commit failed ({why}); restart the metadata server"),
        }
    }
}

impl Shared {
    /// On the calling thread, with the lock held and no other thread busy: applies
    /// every logged group, then (if `log_queue`) logs the queue as one group. The lock
    /// is released while the store works and held again on return.
    fn commit_group<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        log_queue: bool,
    ) -> MutexGuard<'a, State> {
        st.busy = true;
        while let Some((batch, last)) = st.logged.pop_front() {
            drop(st);
            let result = self.inner.apply_logged(&batch);
            st = self.state.lock();
            match result {
                Ok(()) => st.mark_applied(last),
                Err(e) => st.fail(e),
            }
            if st.failed.is_some() {
                break;
            }
        }
        if log_queue && !st.queue.is_empty() && st.failed.is_none() {
            st.eager = false;
            st.urgent = false;
            st.oldest = None;
            let group = std::mem::take(&mut st.queue);
            let last = st.staged;
            drop(st);
            if !self.log_delay.is_zero() {
                std::thread::sleep(self.log_delay);
            }
            let started = Instant::now();
            let result = self.inner.log_group(&group);
            if let (Some(observe), true) = (self.observer.get(), result.is_ok()) {
                observe(group.len(), started.elapsed());
            }
            st = self.state.lock();
            match result {
                Ok(apply) => {
                    st.retrying = false;
                    st.durable = last;
                    while st.owners.front().is_some_and(|(seq, _)| *seq <= last) {
                        st.owners.pop_front();
                    }
                    if apply {
                        let mut merged = WriteBatch::new();
                        for b in group {
                            merged.extend(b);
                        }
                        st.logged.push_back((merged, last));
                    } else {
                        st.mark_applied(last);
                    }
                }
                Err(e @ KvError::Unavailable { .. }) if !st.stop => {
                    tracing::warn!(error = %e, batches = group.len(),
                        "metadata commit failed: the store did not answer; kept staged, tried again");
                    let mut again = group;
                    again.append(&mut st.queue);
                    st.queue = again;
                    st.eager = true;
                    // The flusher tries again after its delay if no waiter does first.
                    st.oldest = Some(Instant::now());
                    st.unanswered += 1;
                    st.unanswered_why = e.to_string();
                    st.retrying = true;
                }
                Err(e) => st.fail(e),
            }
        }
        st.busy = false;
        // Waiters of this group return, one of a later batch leads next, and the
        // flusher applies what was logged unless a leader does first.
        self.flushed.notify_all();
        if !st.logged.is_empty() || st.stop || st.urgent {
            self.work.notify_one();
        }
        st
    }

    /// Applies logged groups in the background and commits what no waiter does: lazy
    /// batches after [`LAZY_DELAY`], others nobody waited for after [`ORPHAN_DELAY`],
    /// and everything at the end.
    fn flush_loop(&self) {
        let mut st = self.state.lock();
        loop {
            if st.failed.is_some() {
                return;
            }
            if st.busy {
                // The committer tells it when it leaves something to apply; a lazy
                // batch staged meanwhile is looked at again in a moment.
                self.work.wait_for(&mut st, ORPHAN_DELAY);
                continue;
            }
            let delay = match (st.stop, st.eager) {
                (true, _) => Duration::ZERO,
                (false, true) if st.retrying => RETRY_PAUSE,
                (false, true) if st.urgent => Duration::ZERO,
                (false, true) => ORPHAN_DELAY,
                (false, false) => LAZY_DELAY,
            };
            let waited = st.oldest.map(|t| t.elapsed());
            let log_queue = waited.is_some_and(|w| w >= delay);
            if log_queue || !st.logged.is_empty() {
                st = self.commit_group(st, log_queue);
                continue;
            }
            match waited {
                Some(w) => {
                    self.work.wait_for(&mut st, delay - w);
                }
                None if st.stop => return,
                None => {
                    // Awake for a while after work, so that the stages of a busy
                    // moment need not wake it; then asleep until a stage does.
                    let quiet = self.work.wait_for(&mut st, ORPHAN_DELAY).timed_out();
                    if quiet && st.queue.is_empty() && st.logged.is_empty() && !st.stop {
                        st.flusher_idle = true;
                        self.work.wait(&mut st);
                        st.flusher_idle = false;
                    }
                }
            }
        }
    }
}

impl State {
    /// The inner store now has every batch up to `last`: the overlay lets go of them.
    fn mark_applied(&mut self, last: u64) {
        self.applied = last;
        self.overlay.retain(|_, (seq, _)| *seq > last);
    }

    fn fail(&mut self, e: KvError) {
        tracing::error!(error = %e, "metadata commit failed; refusing further changes");
        self.failed = Some(e.to_string());
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
        if self.direct {
            self.shared.inner.commit(batch)?;
            return Ok(None);
        }
        // A batch the engine would refuse fails here, for its caller only: in a group
        // it would fail the group, and the store with it.
        self.shared.inner.check_batch(&batch)?;
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
        st.oldest.get_or_insert_with(Instant::now);
        // A waiter commits its own batch: the flusher only has to time it, in case
        // nobody does, and is woken for that only when it sleeps without a timeout.
        let lazy = LAZY.with(|l| l.get());
        if !lazy {
            st.eager = true;
            st.owners.push_back((seq, OWNER.with(|o| o.get())));
        }
        let wake = lazy || st.flusher_idle;
        drop(st);
        if wake {
            self.shared.work.notify_one();
        }
        PENDING.with(|p| p.set(Some(seq)));
        Ok(Some(seq))
    }

    fn wait(&self, ticket: u64) -> Result<(), KvError> {
        // Nothing is staged here (a ticket this thread kept from another store's stage
        // is not this store's to wait for).
        if self.direct {
            return Ok(());
        }
        self.wait_until(|st| st.durable >= ticket)
    }

    fn check_batch(&self, batch: &WriteBatch) -> Result<(), KvError> {
        self.shared.inner.check_batch(batch)
    }

    fn reads_are_local(&self) -> bool {
        self.shared.inner.reads_are_local()
    }

    fn engine(&self) -> &'static str {
        self.shared.inner.engine()
    }
}

impl Drop for GroupCommit {
    /// Makes everything staged durable before the store closes.
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.work.notify_all();
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

    /// Guards against an open by name waiting for its access time's sync (`OpenAt`): the
    /// request's own ticket stays the one it waits for, or none if it staged nothing.
    #[test]
    fn a_lazy_change_within_a_request_leaves_it_its_own_ticket() {
        let dir = tempfile::tempdir().unwrap();
        let inner = open_store(StoreKind::Redb, dir.path()).unwrap();
        let g = GroupCommit::new(inner.clone());
        let _ = take_pending();
        let own = g.stage(put(b"session", b"1")).unwrap().unwrap();
        let lazy = lazily_within(|| g.stage(put(b"atime", b"1")))
            .unwrap()
            .unwrap();
        assert!(lazy > own);
        assert_eq!(
            take_pending(),
            Some(own),
            "the request waits for its own change"
        );
        lazily_within(|| g.stage(put(b"atime", b"2"))).unwrap();
        assert_eq!(
            take_pending(),
            None,
            "and for nothing when it staged nothing"
        );
    }

    #[test]
    fn a_batch_nobody_waits_for_is_committed_by_the_flusher() {
        let dir = tempfile::tempdir().unwrap();
        let inner = open_store(StoreKind::Redb, dir.path()).unwrap();
        let g = GroupCommit::new(inner.clone());
        // Polls `done` for at most 10 s.
        let eventually = |what: &str, done: &dyn Fn() -> bool| {
            let start = Instant::now();
            while !done() {
                assert!(start.elapsed() < Duration::from_secs(10), "{what}");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        // Let the flusher fall asleep without a timeout, as on an idle server.
        eventually("flusher never idle", &|| g.shared.state.lock().flusher_idle);
        let t = g.stage(put(b"orphan", b"1")).unwrap().unwrap();
        let _ = take_pending();
        eventually("never committed", &|| g.shared.state.lock().durable >= t);
        // Applied too, by the flusher: the engine itself has it.
        eventually("never applied", &|| inner.get(b"orphan").unwrap().is_some());
    }

    #[test]
    fn a_waiter_answered_before_the_apply_reads_its_own_change() {
        let dir = tempfile::tempdir().unwrap();
        let inner = open_store(StoreKind::Redb, dir.path()).unwrap();
        let g = GroupCommit::new(inner.clone());
        for i in 0..200u32 {
            let k = format!("k{i:03}");
            let t = g.stage(put(k.as_bytes(), b"v")).unwrap().unwrap();
            g.wait(t).unwrap();
            // Durable; applied by the inner store or not yet, reads see it either way.
            assert_eq!(g.get(k.as_bytes()).unwrap(), Some(b"v".to_vec()), "{k}");
            let seen = g.scan(b"k", b"l", 1000).unwrap().len();
            assert_eq!(seen, i as usize + 1);
        }
        g.sync().unwrap();
        assert_eq!(inner.scan(b"k", b"l", 1000).unwrap().len(), 200);
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

    /// A store that does not answer while `down` is set (an etcd without a quorum).
    struct Flaky {
        inner: Arc<dyn KvStore>,
        down: std::sync::atomic::AtomicBool,
    }

    impl KvStore for Flaky {
        fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
            self.inner.get(key)
        }
        fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>, KvError> {
            self.inner.scan(start, end, limit)
        }
        fn commit(&self, batch: WriteBatch) -> Result<(), KvError> {
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(KvError::Unavailable {
                    engine: "flaky",
                    message: "no quorum".into(),
                });
            }
            self.inner.commit(batch)
        }
        fn engine(&self) -> &'static str {
            "flaky"
        }
    }

    /// Guards against a metadata server that refuses every change until a restart once
    /// one commit found its store unavailable (etcd without a quorum for longer than its
    /// retries): the waiter of that commit fails, saying the change stays staged; the
    /// change stays visible, and lands with the next commit once the store answers.
    #[test]
    fn a_commit_the_store_did_not_answer_is_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let inner = open_store(StoreKind::Redb, dir.path()).unwrap();
        let flaky = Arc::new(Flaky {
            inner: inner.clone(),
            down: true.into(),
        });
        let g = GroupCommit::new(flaky.clone());
        let err = g.commit(put(b"a", b"1")).unwrap_err();
        assert!(matches!(err, KvError::Unavailable { .. }), "{err}");
        assert!(err.to_string().contains("stays staged"), "{err}");
        assert_eq!(g.get(b"a").unwrap(), Some(b"1".to_vec()), "still staged");
        assert_eq!(inner.get(b"a").unwrap(), None);
        flaky.down.store(false, std::sync::atomic::Ordering::SeqCst);
        g.commit(put(b"b", b"2")).unwrap();
        assert_eq!(inner.get(b"a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(inner.get(b"b").unwrap(), Some(b"2".to_vec()));
    }
}
