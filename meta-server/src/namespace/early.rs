//! Early replies: a client's create, mkdir, mknod, symlink, unlink, rmdir, length
//! commit (a written file's close) or attribute change (no truncation) answered before the log holds it, as CephFS's early replies are, when the client keeps the
//! change and sends it again to a server that restarted (`proto::meta::ReplyTail`).
//!
//! What makes a change answered early land as answered after a crash:
//! - **Only one client's changes are ever at risk at once.** A change is answered early
//!   only if every change staged before it and not yet durable is the same client's
//!   (`GroupCommit::early`), at most [`MAX_EARLY`] of them. A crash loses the newest
//!   changes: those answered early are then one client's, the oldest of what was
//!   lost, and nobody was answered after them.
//! - **The client is known after a crash.** Before its first early reply a client's
//!   mark (`Z` client) is made durable; a server that starts on an existing namespace
//!   with marks holds every request ([`Namespace::admit_early`]) until each marked
//!   client has sent again what it kept and settled (`Settle`), or for at most
//!   `replay_grace_ms`. So the changes land again in their order, before anything
//!   that could take their names.
//! - **Inode numbers come back.** Such a start moves the next inode number past
//!   [`REPLAY_GAP`] numbers, which only a change sent again may take: it names the
//!   number its early reply gave (`OpId::made`). The data servers' chunk files, named
//!   by inode, are never mistaken for another file's.
//! - **A change lands once.** Its record (`once`) is in the same batch as the change:
//!   a change the log held is answered from it, one it lost runs again.
//!
//! - **A commit lands as before.** A length commit or attribute change sent again
//!   comes before the client's sessions are resumed; nothing another client did to
//!   the file can lie between (that would have waited for the log, and so for the
//!   commit). Only one the file's mode alone allows, as read under the lock with the
//!   record it changes, is early (`files::may_commit_in`), so that it is allowed again.
//!
//! Only what a reply needs is early: a change that waits for another client's, a
//! create that opened an existing file, a commit with a session's right alone, a
//! truncation, a time set to "now" (a second run would set another), and every other
//! request wait for the log. A client that comes back after this start stopped
//! waiting for it has its lost changes refused ([`Namespace::sent_too_late`]).

use super::{keys, ConnId, Namespace};
use crate::error::MetaError;
use crate::kv::{KvStore, WriteBatch};
use parking_lot::{Mutex, RwLock};
use proto::meta::OpId;
use proto::{ClientId, InodeId};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use transport::PeerIdentity;

pub use proto::meta::MAX_EARLY;

/// Inode numbers a start on a namespace with marks keeps free for changes sent again:
/// every number an early reply may have given and a crash lost lies among them.
pub(crate) const REPLAY_GAP: u64 = 4 * MAX_EARLY;

/// How often a held request looks again whether the replays ended.
const GATE_POLL: Duration = Duration::from_millis(10);

thread_local! {
    /// The number a change sent again asks for (see [`wanting`]).
    static WANTED: Cell<Option<InodeId>> = const { Cell::new(None) };
    /// The inode the running request made last.
    static MADE: Cell<Option<InodeId>> = const { Cell::new(None) };
    /// Set while a change that may be answered early runs: its wait for the log is
    /// [`Namespace::run_early`]'s to decide.
    static ANSWERING_EARLY: Cell<bool> = const { Cell::new(false) };
    /// The running change asked to wait for the log (see [`wait_for_log`]).
    static WAITS: Cell<bool> = const { Cell::new(false) };
    /// Set while a change runs on the async worker that received it ([`on_worker`]).
    static ON_WORKER: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, a change that may be answered early, on the async worker that received
/// it: answered before the log's sync, such a change only takes locks and stages, and
/// even handing the worker's other tasks to another thread (as other requests do)
/// costs about as much as the change itself. A wait in it (for the log, or for a try
/// of the same change) goes through [`blocking`]. Only on a multi-threaded runtime's
/// worker.
pub(crate) fn on_worker<T>(f: impl FnOnce() -> T) -> T {
    crate::kv::with_local(&ON_WORKER, true, f)
}

/// Runs `wait`, which may block (a log write, another try of the same change): on an
/// async worker ([`on_worker`]) after handing the worker's other tasks to another
/// thread (`block_in_place`), so that they do not wait with it.
pub(super) fn blocking<T>(wait: impl FnOnce() -> T) -> T {
    if ON_WORKER.with(Cell::get) {
        tokio::task::block_in_place(wait)
    } else {
        wait()
    }
}

/// A read guard of `lock`, which its holder may keep across a log wait: taken at once
/// if free, else waited for through [`blocking`].
pub(super) fn read_lock<T>(lock: &RwLock<T>) -> parking_lot::RwLockReadGuard<'_, T> {
    match lock.try_read() {
        Some(g) => g,
        None => blocking(|| lock.read()),
    }
}

/// The running change is answered only once the log holds it, even where it could be
/// answered early (a commit that a resend could not make again).
pub(super) fn wait_for_log() {
    WAITS.with(|w| w.set(true));
}

/// Whether the running change may be answered early (see `once`).
pub(super) fn answering_early() -> bool {
    ANSWERING_EARLY.with(Cell::get)
}

/// The number `alloc_inode` gives instead of the next one: the one a change sent
/// again asks for, if any (taken once).
pub(super) fn take_wanted() -> Option<InodeId> {
    WANTED.with(|w| w.take())
}

/// Notes the inode the running request made (for its reply's tail).
pub(super) fn note_made(ino: InodeId) {
    MADE.with(|m| m.set(Some(ino)));
}

/// What the server keeps of early replies.
pub(crate) struct EarlyState {
    /// Drawn at start: the `run` of every reply tail.
    pub(crate) run: u64,
    /// Clients whose mark is durable, each with the connection it came on last. A
    /// change answered early runs under a read guard: a mark is never deleted between
    /// the check and the change's staging.
    marked: RwLock<HashMap<ClientId, ConnId>>,
    /// After a start with marks: the marked clients that have not settled yet, and
    /// until when requests wait for them. `None`: nobody waits.
    gate: Mutex<Option<(HashSet<ClientId>, Instant)>>,
    /// The numbers kept free for changes sent again: this start's, and those of
    /// earlier starts whose clients have not settled since (see [`REPLAY_GAP`]).
    replay: Vec<Range<u64>>,
    /// Marked clients this start stopped waiting for (their grace ended) and that have
    /// not settled since: a change of theirs sent again that the log did not hold is
    /// refused (see [`Namespace::sent_too_late`]), as others may have changed its
    /// names and files since. At most [`EXPIRED_KEPT`].
    expired: Mutex<HashSet<ClientId>>,
    /// Counts mark deletions: a client marked while one ran makes its mark again.
    unmarks: AtomicU64,
}

/// Most clients [`EarlyState::expired`] holds (a start after a crash rarely finds more
/// than a few marks; past this, the oldest knowledge is dropped whole).
const EXPIRED_KEPT: usize = 4096;

/// The numbers a start kept free for a marked client, as its mark's value holds them
/// until the client settles (a second crash before then must keep them too).
type Kept = Vec<(u64, u64)>;

/// The marks found in `store`, each with the numbers kept for it (read at start).
pub(crate) fn marks_in(store: &dyn KvStore) -> Result<Vec<(ClientId, Kept)>, MetaError> {
    let prefix = keys::early_mark_prefix();
    let end = keys::prefix_end(&prefix);
    let found = store.scan(&prefix, &end, usize::MAX)?;
    let mut marks = Vec::new();
    for (k, v) in found {
        let Some(client) = keys::u64_at(&k, 1).map(ClientId) else {
            continue;
        };
        let kept: Kept = if v.is_empty() {
            Vec::new()
        } else {
            super::records::decode(&v, "early-reply mark")?
        };
        marks.push((client, kept));
    }
    Ok(marks)
}

impl EarlyState {
    /// The state of a start that found `marks` and kept `fresh` free for them; writes
    /// the numbers kept into every mark (durably, before anything is served).
    pub(crate) fn open(
        store: &dyn KvStore,
        marks: Vec<(ClientId, Kept)>,
        fresh: Range<u64>,
        grace: Duration,
    ) -> Result<Self, MetaError> {
        let mut replay: Vec<Range<u64>> = Vec::new();
        let mut batch = WriteBatch::new();
        for (client, kept) in &marks {
            let mut kept = kept.clone();
            if !fresh.is_empty() {
                kept.push((fresh.start, fresh.end));
            }
            replay.extend(kept.iter().map(|&(a, b)| a..b));
            if grace.is_zero() {
                // Nobody is waited for: nothing will be sent again.
                batch.delete(keys::early_mark(*client));
            } else {
                batch.put(keys::early_mark(*client), super::records::encode(&kept)?);
            }
        }
        if !batch.is_empty() {
            store.commit(batch)?;
        }
        let (clients, expired): (Vec<ClientId>, HashSet<ClientId>) = if grace.is_zero() {
            (Vec::new(), marks.iter().map(|(c, _)| *c).collect())
        } else {
            (marks.iter().map(|(c, _)| *c).collect(), HashSet::new())
        };
        let gate = (!clients.is_empty())
            .then(|| (clients.iter().copied().collect(), Instant::now() + grace));
        Ok(EarlyState {
            run: rand::random::<u64>() | 1,
            // No connection yet: none of this start's closes may unmark them.
            marked: RwLock::new(clients.into_iter().map(|c| (c, ConnId(u64::MAX))).collect()),
            gate: Mutex::new(gate),
            replay,
            expired: Mutex::new(expired),
            unmarks: AtomicU64::new(0),
        })
    }
}

/// Sets the thread's state of a change that may be answered early, and clears it
/// however the change ends (a panic too: the thread serves on).
struct Running;

impl Running {
    fn start(wanted: Option<InodeId>) -> Running {
        WANTED.with(|w| w.set(wanted));
        MADE.with(|m| m.set(None));
        WAITS.with(|w| w.set(false));
        ANSWERING_EARLY.with(|a| a.set(true));
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        WANTED.with(|w| w.set(None));
        WAITS.with(|w| w.set(false));
        ANSWERING_EARLY.with(|a| a.set(false));
    }
}

/// What the caller of a request may learn of its change (see `Namespace::handle`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Answered {
    /// The change's log position, when it was answered before the log held it.
    pub(crate) pending: Option<u64>,
    /// The inode it made.
    pub(crate) made: Option<InodeId>,
}

/// Whom a request comes from, for the gate (see [`Namespace::admit_early`]).
pub(crate) enum Knock {
    /// A change sent again, or a `Settle`, by this client.
    Replay(ClientId),
    /// Anything that reads or changes the namespace.
    Other,
    /// What never meets a change sent again (a data server's beat, the map).
    Free,
}

impl Namespace {
    /// Whether a request may be served now: after a start with marks, only the marked
    /// clients' replays and settles are, until every one has settled or the grace
    /// ended. Waits (asynchronously) until it may.
    pub(crate) async fn admit_early(&self, knock: Knock) {
        loop {
            {
                let mut gate = self.early.gate.lock();
                let Some((waiting, until)) = gate.as_mut() else {
                    return;
                };
                if Instant::now() >= *until {
                    let gone: Vec<ClientId> = waiting.drain().collect();
                    *gate = None;
                    drop(gate);
                    {
                        let mut expired = self.early.expired.lock();
                        if expired.len() + gone.len() > EXPIRED_KEPT {
                            expired.clear();
                        }
                        expired.extend(gone.iter().copied());
                    }
                    tracing::warn!(
                        clients = gone.len(),
                        "clients that took early replies before this start did not come back \
                         within replay_grace_ms: what they kept is lost with them"
                    );
                    let mut m = self.early.marked.write();
                    self.unmark(&mut m, &gone);
                    return;
                }
                match knock {
                    Knock::Free => return,
                    Knock::Replay(c) if waiting.contains(&c) => return,
                    _ => {}
                }
            }
            tokio::time::sleep(GATE_POLL).await;
        }
    }

    /// Runs `run`, a change of the client named by `op` (from `who`) that takes early
    /// replies; `makes`: an early reply needs it to have made an inode. Returns what
    /// `run` returned, and what the caller may learn of the change.
    pub(crate) fn run_early<T>(
        &self,
        op: OpId,
        conn: ConnId,
        who: Option<&PeerIdentity>,
        makes: bool,
        run: impl FnOnce() -> Result<T, MetaError>,
    ) -> (Result<T, MetaError>, Answered) {
        let client = op.client;
        let mut marked = read_lock(&self.early.marked);
        if !marked.contains_key(&client) {
            drop(marked);
            // Another key's client id is refused before it is marked (`once` checks
            // every change of a marked one).
            if let Err(e) = self.may_name_client(client, who) {
                return (Err(e), Answered::default());
            }
            // The mark is durable before the first early reply: its own sync, once,
            // made before the marks' lock so that early changes do not wait for it.
            let unmarks = self.early.unmarks.load(Ordering::Acquire);
            let mut made = blocking(|| self.mark(client));
            let mut w = blocking(|| self.early.marked.write());
            if made.is_ok()
                && !w.contains_key(&client)
                && self.early.unmarks.load(Ordering::Acquire) != unmarks
            {
                // A mark was deleted meanwhile, maybe this one's key: made again under
                // the lock (rare).
                made = blocking(|| self.mark(client));
            }
            if let Err(e) = made {
                drop(w);
                tracing::warn!(error = %e, client = client.0, "marking a client for early replies failed");
                return (
                    blocking(|| run().and_then(|r| self.wait_pending().map(|()| r))),
                    Answered::default(),
                );
            }
            w.entry(client).or_insert(conn);
            marked = parking_lot::RwLockWriteGuard::downgrade(w);
        }
        let wanted = op
            .made
            .filter(|ino| op.retry && self.early.replay.iter().any(|r| r.contains(&ino.0)));
        let (r, waits) = {
            let _reset = Running::start(wanted);
            let r = crate::kv::staging_for(client.0, run);
            (r, WAITS.with(Cell::get))
        };
        let made = MADE.with(|m| m.take());
        let ticket = crate::kv::take_pending();
        let pending = match (ticket, &r) {
            (Some(t), Ok(_)) if waits || (makes && made.is_none()) => {
                blocking(|| self.store.wait(t)).err()
            }
            (Some(t), Ok(_)) => match self.group.early(t, client.0, MAX_EARLY) {
                crate::kv::Early::Pending => {
                    drop(marked);
                    return (
                        r,
                        Answered {
                            pending: Some(t),
                            made,
                        },
                    );
                }
                crate::kv::Early::Durable => None,
                crate::kv::Early::Wait => blocking(|| self.store.wait(t)).err(),
            },
            (Some(t), Err(_)) => {
                let _ = blocking(|| self.store.wait(t));
                None
            }
            (None, _) => None,
        };
        match pending {
            Some(e) => (Err(e.into()), Answered::default()),
            None => (
                r,
                Answered {
                    pending: None,
                    made,
                },
            ),
        }
    }

    /// Waits until every change staged so far is durable, and, after a start with
    /// marks, notes that `client` sent again what it kept.
    pub(crate) fn settle(
        &self,
        client: ClientId,
        conn: ConnId,
        who: Option<&PeerIdentity>,
    ) -> Result<u64, MetaError> {
        self.may_name_client(client, who)?;
        self.group.settle()?;
        let moved = self
            .early
            .marked
            .read()
            .get(&client)
            .is_some_and(|c| *c != conn);
        if moved {
            if let Some(c) = self.early.marked.write().get_mut(&client) {
                *c = conn;
            }
        }
        self.early.expired.lock().remove(&client);
        let mut gate = self.early.gate.lock();
        if let Some((waiting, _)) = gate.as_mut() {
            if waiting.remove(&client) {
                // What it sent again is durable: the numbers kept for it are free.
                let mut batch = WriteBatch::new();
                batch.put(keys::early_mark(client), Vec::new());
                if let Err(e) = crate::kv::lazily_within(|| self.store.stage(batch)) {
                    tracing::warn!(error = %e, "clearing an early-reply mark's numbers failed");
                }
                if waiting.is_empty() {
                    *gate = None;
                    tracing::info!(
                        "every client that took early replies before this start settled"
                    );
                }
            }
        }
        Ok(self.early.run)
    }

    /// Refuses change `op` sent again (one answered early by a server that crashed,
    /// which the log did not hold) when this start stopped waiting for its client
    /// before it came back: others may have taken its names or changed its files
    /// since, and running it now would undo what they did. Its client counts it lost.
    pub(super) fn sent_too_late(&self, op: OpId) -> Result<(), MetaError> {
        if op.retry && op.early && self.early.expired.lock().contains(&op.client) {
            return Err(MetaError::Stale(format!(
                "change {} of {} was answered early by a server that crashed, and sent \
                 again after this one stopped waiting for its client \
                 (namespace.replay_grace_ms): not applied over what others did since",
                op.seq, op.client
            )));
        }
        Ok(())
    }

    /// Forgets the marks of the clients that came on `conn` (it closed: a client that
    /// lives on marks itself again at its next change).
    pub(crate) fn unmark_conn(&self, conn: ConnId) {
        let mut m = self.early.marked.write();
        let gone: Vec<ClientId> = m
            .iter()
            .filter(|(_, c)| **c == conn)
            .map(|(client, _)| *client)
            .collect();
        self.unmark(&mut m, &gone);
    }

    /// The tail of an answer to a client that takes early replies.
    pub(crate) fn reply_tail(&self, answered: Answered) -> proto::meta::ReplyTail {
        proto::meta::ReplyTail {
            run: self.early.run,
            durable: self.group.durable(),
            pending: answered.pending,
            made: answered.made.filter(|_| answered.pending.is_some()),
        }
    }

    /// Forgets every mark, as the server stops in order (its connections closed, and
    /// everything staged logged before the store closes).
    /// Clients still awaited after a crash keep theirs (and the numbers kept for them).
    pub fn forget_early_marks(&self) {
        let waiting: HashSet<ClientId> = match self.early.gate.lock().as_ref() {
            Some((waiting, _)) => waiting.clone(),
            None => HashSet::new(),
        };
        let mut m = self.early.marked.write();
        match marks_in(&*self.store) {
            Ok(marks) => {
                let clients: Vec<ClientId> = marks
                    .into_iter()
                    .map(|(c, _)| c)
                    .filter(|c| !waiting.contains(c))
                    .collect();
                self.unmark(&mut m, &clients);
            }
            Err(e) => tracing::warn!(error = %e, "reading early-reply marks at stop failed"),
        }
    }

    /// Makes `client`'s mark durable.
    fn mark(&self, client: ClientId) -> Result<(), MetaError> {
        let mut batch = WriteBatch::new();
        batch.put(keys::early_mark(client), Vec::new());
        Ok(self.store.commit(batch)?)
    }

    /// Deletes marks, lazily (one left behind only makes a later start wait longer),
    /// under the write guard of `marked`: no change of theirs is being answered early.
    fn unmark(&self, marked: &mut HashMap<ClientId, ConnId>, clients: &[ClientId]) {
        if clients.is_empty() {
            return;
        }
        self.early.unmarks.fetch_add(1, Ordering::Release);
        let mut batch = WriteBatch::new();
        for c in clients {
            marked.remove(c);
            batch.delete(keys::early_mark(*c));
        }
        let staged = crate::kv::lazily_within(|| self.store.stage(batch));
        if let Err(e) = staged {
            tracing::warn!(error = %e, "forgetting early-reply marks failed");
        }
    }
}
