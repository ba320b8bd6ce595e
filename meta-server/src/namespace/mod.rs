//! The namespace: inodes, directory entries, attributes, xattrs, links, file layouts,
//! open-file sessions and data server membership, on a [`KvStore`].
//!
//! Every mutation runs under one mutex and ends in one durable [`crate::kv::WriteBatch`]
//! committed before the method returns, so a reply is never sent for a change that a
//! crash could take back, and no two mutations interleave. Reads go to the store without
//! the mutex: each key read is consistent, and the store orders commits.

mod access;
pub mod acl;
mod check;
mod clients;
mod deadlock;
mod early;
pub use clients::{ClientRecord, RevocationRecord, StoredClient, MAX_CLIENT_KEYS, MAX_REVOCATIONS};
pub(crate) use early::{on_worker, Knock};
mod dirlayout;
mod entries;
mod handlers;
mod held;
mod registry;
pub use handlers::Handle;
mod faults;
mod files;
mod flags;
mod gauges;
mod keys;
mod leader;
mod locks;
mod membership;
mod names;
mod once;
mod opens;
mod shared_locks;
pub use once::OP_SLOTS;
pub mod perm;
mod readdir;
pub(crate) mod records;
mod rename;
mod resume;
pub mod scope;
mod space;
mod sweep;
mod tmpfile;
mod txn;
mod xattr;

#[cfg(test)]
mod tests;

use crate::clock::{Clock, SystemClock};
use crate::config::NamespaceConfig;
use crate::error::MetaError;
use crate::kv::{take_pending, GroupCommit, KvError, KvStore, TxnStore};
use parking_lot::Mutex;
use proto::meta::{Caller, ClusterMap};
use proto::{ClientId, InodeId, SessionId, Timestamp, WireError};
use records::{decode, encode, InodeRecord, Superblock, FORMAT_VERSION};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport::PeerIdentity;
use txn::Txn;

pub use files::SessionOwner;
pub use gauges::Gauges;
pub use resume::Resumption;

/// Most entries one `ReadDir` returns, whatever the client asks for.
pub const MAX_READDIR_ENTRIES: u32 = 1024;
/// Encoded size of the entries of one `ReadDir` page, so the reply fits a 128 KiB message.
pub const READDIR_BUDGET_BYTES: usize = 48 << 10;
/// Most hard links to one inode (as ext4).
pub const MAX_LINKS: u32 = 65_000;
/// Most bytes of the names of one inode's extended attributes, each counted with the
/// NUL that ends it in `listxattr(2)`'s list: Linux's `XATTR_LIST_MAX`, so every list
/// fits what the kernel passes on, and `ListXattr` fits one message.
pub const MAX_XATTR_NAMES_BYTES: usize = 65_536;
/// Most bytes of one inode's extended attributes, names (as above) and values together;
/// a value alone is at most `proto::MAX_XATTR_VALUE_BYTES` (64 KiB, as Linux).
pub const MAX_XATTR_TOTAL_BYTES: usize = 1 << 20;
/// Most extended attributes on one inode, implied by [`MAX_XATTR_NAMES_BYTES`] (a name
/// has at least one byte and its NUL); bounds the scans of an inode's attributes.
pub const MAX_XATTRS_PER_INODE: u32 = (MAX_XATTR_NAMES_BYTES / 2) as u32;
/// Most data servers the cluster may have.
pub const MAX_NODES: usize = 1024;
/// Most pending deletions returned to one heartbeat.
pub const MAX_GC_TASKS_PER_HEARTBEAT: usize = 256;
/// Done deletions forgotten per commit: a heartbeat's may be more than one etcd
/// transaction takes (128 writes), and they need no atomicity (one left behind is only
/// handed out again).
pub const GC_DONE_PER_COMMIT: usize = 64;
/// Longest data server address accepted, in bytes.
pub const MAX_ADDR_BYTES: usize = 256;
/// Session and client ids reserved per superblock write; see [`Namespace::open`].
const ID_BLOCK: u64 = 1 << 20;
/// Times a request runs on a shared engine when each try conflicts with another
/// server's change (see [`Namespace::open_shared`]); each try reads again.
pub const CONFLICT_RETRIES: u32 = 64;

/// The connection a request came in on, as the network layer numbers them.
///
/// Sessions belong to the connection that opened them: when it closes, they end.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct ConnId(pub u64);

/// Where a request comes from: its connection and the user it is made for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The connection it arrived on.
    pub conn: ConnId,
    /// Whom a file-system call is made for (permissions are checked for it). Cluster
    /// and admin calls name nobody: their handlers look at no permission.
    pub caller: Caller,
    /// The key the connection authenticated with (`None` on a cluster without keys):
    /// the owner of the client ids it gets at `Hello` (see `registry`).
    pub who: Option<Arc<PeerIdentity>>,
    /// A change's id (see `once`): applied once however often it arrives.
    pub op: Option<proto::meta::OpId>,
}

/// Tests that call handlers directly act as root on connection `conn`.
#[cfg(test)]
impl From<ConnId> for Origin {
    fn from(conn: ConnId) -> Origin {
        Origin {
            conn,
            caller: Caller::ROOT,
            who: None,
            op: None,
        }
    }
}

pub use proto::meta::fs::{DirPage, FsStats, Made, Opened};

/// An open-file session, kept in this server's memory (on a shared engine its id is
/// also named in the file's `P` key, see `opens`); a client resumes it after a restart
/// (`resume`).
#[derive(Clone, Copy, Debug)]
struct Session {
    ino: InodeId,
    conn: ConnId,
    /// Kept for logs: which mount opened it.
    client: ClientId,
    /// Opened for writing: a truncation or length commit through its connection
    /// needs no write bit (see `access`).
    write: bool,
}

/// What the mutation mutex guards.
struct State {
    /// The superblock as committed.
    sb: Superblock,
    sessions: HashMap<SessionId, Session>,
    /// Number of sessions per inode, so unlink can tell "still open" in O(1).
    open_counts: HashMap<InodeId, u32>,
    /// Files whose chunks a client is cutting after another vanished with them open
    /// (a `T` key), and the session that was given the cut; other opens wait.
    cutting: HashMap<InodeId, SessionId>,
    /// Broken connections whose sessions wait for their client to resume, and until
    /// when (see `resume`).
    detached: HashMap<ConnId, Instant>,
    /// The first session id of this start: lower ones were handed out before it.
    boot_floor: u64,
    next_session: u64,
    /// The end of the block of session ids this server reserved last (see
    /// `files::reserve_session`): on a shared engine other servers reserve theirs
    /// above it, so the superblock's ceiling is not this server's.
    session_end: u64,
    next_client: u64,
    /// The end of the block of client ids this server reserved last.
    client_end: u64,
    /// On a shared engine: this server's block of inode numbers and its shard of the
    /// inode count (see `txn`).
    shared: txn::SharedCounters,
    /// The first client id of this start: lower ones were handed out before it.
    client_floor: u64,
    /// The key each client id was given to or first named by (see `registry`).
    owners: BTreeMap<ClientId, Arc<str>>,
    /// Unnamed files (`O_TMPFILE` without `O_EXCL`) that a link may still name; only
    /// open ones count (see `tmpfile`).
    linkable: HashSet<InodeId>,
}

impl State {
    fn is_open(&self, ino: InodeId) -> bool {
        self.open_counts.get(&ino).is_some_and(|&n| n > 0)
    }

    /// Whether connection `conn` holds a session on `ino` (a writing one if `write`).
    fn holds(&self, ino: InodeId, conn: ConnId, write: bool) -> bool {
        self.is_open(ino)
            && self
                .sessions
                .values()
                .any(|s| s.ino == ino && s.conn == conn && (s.write || !write))
    }
}

/// The metadata server's namespace over a key-value store.
pub struct Namespace {
    /// The store behind group commit: reads see staged changes.
    store: Arc<dyn KvStore>,
    /// Set on a shared engine (see [`Namespace::open_shared`]): every mutation is a
    /// checked transaction on it, and nothing is staged.
    checked: Option<Arc<dyn TxnStore>>,
    group: Arc<GroupCommit>,
    config: NamespaceConfig,
    state: Mutex<State>,
    /// Where leases and graces read the time (see `clock`).
    clock: Arc<dyn Clock>,
    /// Last heartbeat of each data server, and the beats being handled; in memory
    /// because liveness after a restart must be earned again. Taken after `members`,
    /// never before, and never held across a store call.
    liveness: Mutex<membership::Liveness>,
    /// Chains and member states (see `membership`). Taken before `state`, never after.
    members: Mutex<membership::Members>,
    /// The last map built, for readers that must not wait for `members`.
    map: parking_lot::RwLock<Arc<ClusterMap>>,
    /// Locks of every client (in memory; see `locks`).
    locks: Mutex<locks::LockTable>,
    /// Until when new locks are refused while clients take back the ones they held
    /// before this server started (`lock_grace_ms`); `None` on a new namespace.
    lock_grace_until: Option<Instant>,
    /// Refuses new records while the store's disk is short of room (see `space`).
    disk: space::DiskGuard,
    /// Set when the server stops: the connections it closes then are not clients that
    /// vanished (see `connection_closed`).
    stopping: std::sync::atomic::AtomicBool,
    /// Seals the grants opens, creates and renewals hand out; unset on a server
    /// without keys (see `crate::grants`).
    pub(crate) granter: std::sync::OnceLock<Arc<crate::grants::Granter>>,
    /// The log of requests failed for this server's own faults.
    faults: faults::FaultLog,
    /// Changes running, and those that arrived lately (see `once`).
    ops: once::Ops,
    /// On a shared engine: this server's live key, held while the namespace lives
    /// (see `sweep`), and what it remembers of the other servers'.
    live: Option<crate::kv::LiveKey>,
    sweeper: Mutex<sweep::Sweeper>,
    /// On a shared engine: whether this server leads (see `leader`).
    leading: std::sync::atomic::AtomicBool,
    /// Early replies: the marked clients, and the replays after a start (see `early`).
    early: early::EarlyState,
}

/// The server's clock, for every time stamp the server sets.
fn now() -> Timestamp {
    Timestamp::now()
}

impl Namespace {
    /// Opens the namespace on `store`: formats an empty store (root directory and
    /// superblock), checks the format version of an existing one, and purges orphans.
    pub fn open(store: Arc<dyn KvStore>, config: NamespaceConfig) -> Result<Namespace, MetaError> {
        Namespace::open_with_clock(store, config, Arc::new(SystemClock))
    }

    /// [`Namespace::open`] with leases and graces measured on `clock` (a test's
    /// [`crate::ManualClock`] moves them without waiting).
    pub fn open_with_clock(
        store: Arc<dyn KvStore>,
        config: NamespaceConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Namespace, MetaError> {
        Namespace::open_inner(store, None, config, clock)
    }

    /// Opens the namespace on an engine that other metadata servers write at the same
    /// time (issue 24: several servers on one etcd prefix). Every mutation is a checked
    /// transaction (see `txn`): it reads with revisions, commits only if nothing it read
    /// moved, and runs again when something did (`handle`), so two servers never both
    /// win a create of one name or a rename race. Commits go straight to the engine
    /// (no group commit: a group's conflict would fail every change in it).
    ///
    /// Which sessions have a file open is kept in the engine (`opens`), so an unlink on
    /// one server keeps a file open through another. Not yet shared between the servers
    /// (the next steps of issue 24): locks, membership and the data servers' liveness
    /// stay in each server's memory.
    pub fn open_shared(
        engine: Arc<dyn TxnStore>,
        config: NamespaceConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Namespace, MetaError> {
        let store: Arc<dyn KvStore> = engine.clone();
        Namespace::open_inner(store, Some(engine), config, clock)
    }

    fn open_inner(
        store: Arc<dyn KvStore>,
        checked: Option<Arc<dyn TxnStore>>,
        config: NamespaceConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Namespace, MetaError> {
        config.validate()?;
        let group = Arc::new(match checked {
            Some(_) => GroupCommit::direct(store),
            None => GroupCommit::new(store),
        });
        let store: Arc<dyn KvStore> = group.clone();
        let (sb, existed) = load_or_format(&*store, checked.as_deref())?;
        let lock_grace = Duration::from_millis(config.lock_grace_ms);
        // On a shared engine locks are kept in the engine: none was lost by this start.
        let lock_grace_until = (existed && !lock_grace.is_zero() && checked.is_none())
            .then(|| clock.now() + lock_grace);
        // Sessions and client ids live in memory, but a client may still hold one from
        // before a restart. Ids come from a block reserved in the superblock above every
        // block used before, so an old id is answered `Stale` instead of being taken for
        // someone else's session; one write per million ids keeps opens write-free.
        // Clients that took early replies may keep changes a crash lost: their inode
        // numbers stay free for them (see `early`).
        let marks = match checked {
            Some(_) => Vec::new(),
            None => early::marks_in(&*store)?,
        };
        let gap = if marks.is_empty() {
            0
        } else {
            early::REPLAY_GAP
        };
        let grace = Duration::from_millis(config.replay_grace_ms);
        if !marks.is_empty() && !grace.is_zero() {
            tracing::info!(
                clients = marks.len(),
                grace_ms = config.replay_grace_ms,
                "clients took early replies before this start: requests wait until they \
                 have sent again what they kept"
            );
        }
        // The numbers are written into the marks before the superblock moves past
        // them: a crash in between keeps them twice, never not at all.
        let fresh = sb.next_inode..sb.next_inode + gap;
        let early = early::EarlyState::open(&*store, marks, fresh, grace)?;
        let (sb, next_session, next_client) =
            reserve_id_blocks(&*store, checked.as_deref(), sb, gap)?;
        // On a shared engine the server's id is the first session id of its start:
        // unique among servers and starts, as the blocks are.
        let live = match &checked {
            Some(engine) => Some((next_session, hold_live(&**engine, next_session)?)),
            None => None,
        };
        let ns = Namespace {
            store,
            checked,
            group,
            config,
            state: Mutex::new(State {
                sb,
                sessions: HashMap::new(),
                open_counts: HashMap::new(),
                cutting: HashMap::new(),
                detached: HashMap::new(),
                boot_floor: next_session,
                next_session,
                session_end: next_session + ID_BLOCK,
                next_client,
                client_end: next_client + ID_BLOCK,
                shared: txn::SharedCounters {
                    inodes: 0..0,
                    shard: rand::random_range(0..txn::COUNT_SHARDS),
                    me: live.as_ref().map(|(id, key)| txn::Holder {
                        id: *id,
                        live: key.revision,
                    }),
                },
                client_floor: next_client,
                owners: BTreeMap::new(),
                linkable: HashSet::new(),
            }),
            clock,
            liveness: Mutex::new(membership::Liveness::default()),
            members: Mutex::new(membership::Members::default()),
            map: parking_lot::RwLock::new(Arc::new(ClusterMap::default())),
            locks: Mutex::new(locks::LockTable::default()),
            lock_grace_until,
            disk: space::DiskGuard::default(),
            stopping: std::sync::atomic::AtomicBool::new(false),
            granter: std::sync::OnceLock::new(),
            faults: faults::FaultLog::default(),
            ops: once::Ops::default(),
            live: live.map(|(_, key)| key),
            sweeper: Mutex::new(sweep::Sweeper::default()),
            leading: std::sync::atomic::AtomicBool::new(false),
            early,
        };
        // On a shared engine another server may hold an orphan open (its `P` key says
        // so): none is purged at start there; the sessions of dead servers end
        // through `sweep`, which frees their orphans.
        if ns.checked.is_none() {
            ns.purge_orphans()?;
        }
        if ns.checked.is_some() {
            ns.campaign()?;
        }
        ns.reconcile()?;
        ns.wait_pending()?;
        tracing::info!(engine = ns.store.engine(), "namespace open");
        Ok(ns)
    }

    /// Guards the disk holding the store, in `dir` (see `space`): requests that add
    /// records fail with ENOSPC while less than `disk_reserve_bytes` is free there.
    pub fn with_disk_guard(mut self, dir: std::path::PathBuf) -> Namespace {
        self.disk = space::DiskGuard::new(dir, self.config.disk_reserve_bytes);
        self
    }

    /// Hands out grants with `granter` from now on (a server with keys, once its key
    /// table is loaded from this namespace).
    pub fn set_granter(&self, granter: Arc<crate::grants::Granter>) {
        let _ = self.granter.set(granter);
    }

    /// The configuration the namespace runs with.
    pub fn config(&self) -> &NamespaceConfig {
        &self.config
    }

    /// Answers one request that arrived on connection `conn`, in a tracing span that
    /// names the operation and the id it is about. Every change is durable before
    /// this returns.
    pub fn handle<R: Handle>(&self, req: R, at: impl Into<Origin>) -> Result<R::Reply, WireError> {
        self.handle_answered(req, at.into(), false).0
    }

    /// [`Namespace::handle`]; with `early`, a change of a client that takes early
    /// replies may return before the log holds it (see `early`), and the second value
    /// says so.
    pub(crate) fn handle_answered<R: Handle>(
        &self,
        req: R,
        at: Origin,
        early: bool,
    ) -> (Result<R::Reply, WireError>, early::Answered) {
        let (conn, uid) = (at.conn, at.caller.uid);
        let span =
            tracing::debug_span!("meta", op = R::NAME, id = req.span_id(), conn = conn.0, uid);
        let _entered = span.enter();
        // A ticket a request that panicked after staging left on this thread is not
        // this request's to wait for or report.
        let _ = crate::kv::take_pending();
        // Store reads count their retry window from here (see `kv::deadline`).
        let arrived = std::time::Instant::now();
        let run = |req: R| crate::kv::deadline::for_request(arrived, || self.run_checked(req, &at));
        // A change sent again after an early reply was answered: it is not refused
        // for room (it may have been lost with the server's last writes).
        let resent = at
            .op
            .is_some_and(|op| op.retry && op.early && op.made.is_some());
        if R::ADDS_RECORDS && !resent {
            if let Err(e) = self.disk.check() {
                tracing::debug!(error = %e, "refused: disk short of room");
                return (Err(e.into()), early::Answered::default());
            }
        }
        let mut answered = early::Answered::default();
        // An access time is written lazily, as a local file system writes it back with
        // the inode some time later: the reply does not wait for the sync, and the batch
        // goes with the next group someone waits for, or alone after `LAZY_DELAY` (a
        // crash before may lose it, nothing else).
        let result = if R::LAZY {
            let r = crate::kv::lazily(|| run(req));
            let _ = take_pending();
            r
        } else {
            match at.op {
                // Answered before the log holds it, if the client keeps it (`early`).
                Some(op) if R::EARLY && early && op.early && self.answers_early() => {
                    let who = at.who.as_deref();
                    let (r, a) =
                        self.run_early(op, conn, who, R::MAKES, || self.once(op, &at, req, run));
                    answered = a;
                    r
                }
                // Durable before the reply: wait for the group holding this request's
                // changes, now that the namespace lock is free for the next request to
                // stage its own. A request that failed may have staged changes before
                // it did (they are visible already): it waits for them too, as nobody
                // else would.
                op => {
                    let r = match op {
                        // A change that is not idempotent is applied once (see `once`),
                        // and so is one sent with an id to be answered early (a commit,
                        // an attribute change): a retry after a timeout then never
                        // lands after a later change.
                        Some(op) if !R::IDEMPOTENT || R::EARLY => self.once(op, &at, req, run),
                        _ => run(req),
                    };
                    let durable = self.wait_pending();
                    r.and_then(|r| durable.map(|()| r))
                }
            }
        };
        match &result {
            // The operator's to see: the client gets only EIO.
            Err(e) if e.is_server_fault() => self.faults.note(R::NAME, e),
            Err(e) => tracing::debug!(error = %e, "request failed"),
            Ok(_) => {}
        }
        (result.map_err(Into::into), answered)
    }

    /// Runs `req`; on a shared engine again (reading afresh) while its change conflicts
    /// with another server's and nothing of it has landed yet, at most
    /// [`CONFLICT_RETRIES`] times, the later tries after a short random pause so that
    /// two servers racing for one key do not keep meeting.
    fn run_checked<R: Handle>(&self, req: R, at: &Origin) -> Result<R::Reply, MetaError> {
        if self.checked.is_none() {
            return req.run(self, at);
        }
        txn::rerunnable(req.runs_again_alike(), || {
            self.retry_conflicts(R::NAME, || req.clone().run(self, at))
        })
    }

    /// Runs `f` (a change that reads afresh each time) again while it conflicts on a
    /// shared engine; once elsewhere. For changes that do not come as requests (the
    /// administrator's key calls) and, through `run_checked`, for those that do.
    pub(crate) fn retry_conflicts<T>(
        &self,
        what: &str,
        f: impl FnMut() -> Result<T, MetaError>,
    ) -> Result<T, MetaError> {
        retry_on_conflict(self.checked.is_some(), what, f)
    }

    /// Refuses a new lock while clients take back the locks they held before this
    /// server started (see `lock_grace_ms`): `WouldBlock`, which a waiting locker waits
    /// out and `F_SETLK` reports as EAGAIN, as a lock held by another would be.
    pub(crate) fn check_lock_grace(&self) -> Result<(), MetaError> {
        match self.lock_grace_until {
            Some(until) if self.clock.now() < until => Err(MetaError::WouldBlock(
                "the metadata server started on an existing namespace moments ago: locks \
                 held before are being taken back by their clients"
                    .into(),
            )),
            _ => Ok(()),
        }
    }

    /// Waits until every change made so far is durable (requests wait for their own
    /// changes by themselves; this is for tools and tests that look at the store).
    pub fn sync(&self) -> Result<(), MetaError> {
        Ok(self.group.sync()?)
    }

    /// Whether the store's reads are local and brief (not etcd's network round trips):
    /// the server runs point reads on its async workers only then.
    pub fn reads_are_local(&self) -> bool {
        self.store.reads_are_local()
    }

    /// Whether this server answers changes early (see `early`): configured so, and
    /// not on a shared engine.
    pub(crate) fn answers_early(&self) -> bool {
        self.config.early_replies && self.checked.is_none()
    }

    /// Waits until what this thread staged is durable.
    fn wait_pending(&self) -> Result<(), MetaError> {
        match take_pending() {
            Some(t) => Ok(self.store.wait(t)?),
            None => Ok(()),
        }
    }

    /// Stages `txn` and records the superblock it leaves, under the held state lock.
    fn commit_txn(st: &mut State, txn: Txn<'_>) -> Result<(), MetaError> {
        let counters = txn.counters();
        match txn.commit() {
            Ok(sb) => {
                if let Some(sb) = sb {
                    st.sb = sb;
                }
            }
            // A conflict wrote nothing: the block's numbers are still free. Any other
            // failure may have landed unanswered (etcd's "may have been applied"), and
            // so may a commit settled as not landed (`txn::settle`) later: the rest of
            // the block is given up, rather than a number handed out twice.
            Err(e @ MetaError::Store(KvError::Conflict { .. })) if !txn::last_unanswered() => {
                return Err(e)
            }
            Err(e) => {
                st.shared.inodes = 0..0;
                // Nor is the next session id used again: an open that landed
                // unanswered named it in its file's `P` key.
                st.next_session += 1;
                return Err(e);
            }
        }
        // Only a transaction that committed used up inode numbers of the block.
        if let Some(c) = counters {
            st.shared = c;
        }
        Ok(())
    }

    /// The number of inodes: the superblock's count plus the shards servers on a shared
    /// engine counted in (read always: a namespace written shared and then opened alone,
    /// after `migrate`, keeps its shards, and the sum stays right).
    fn inode_count(&self, sb: &Superblock) -> Result<u64, MetaError> {
        let prefix = keys::inode_count_prefix();
        let end = keys::prefix_end(&prefix);
        let mut total = i128::from(sb.inode_count);
        for (_, v) in self
            .store
            .scan(&prefix, &end, usize::from(txn::COUNT_SHARDS) + 1)?
        {
            let n: i64 = decode(&v, "inode count")?;
            total += i128::from(n);
        }
        Ok(u64::try_from(total.max(0)).unwrap_or(u64::MAX))
    }

    /// Reads that change nothing: on a shared engine all at one moment.
    pub(crate) fn reads(&self) -> txn::StoreReads<'_> {
        txn::StoreReads::new(&*self.store, self.checked.as_deref())
    }

    /// A new transaction under the held state lock: checked on a shared engine.
    fn begin(&self, st: &State) -> Txn<'_> {
        match &self.checked {
            Some(engine) => Txn::checked(&*self.store, &**engine, &st.shared),
            None => Txn::new(&*self.store, &st.sb),
        }
    }

    /// [`Namespace::mutate`] for a change whose request answers `f`'s result as it is:
    /// the answer goes into the change's mark (`once::answer_with_mark`), so that it
    /// lands with the change.
    fn mutate_answering<T: serde::Serialize>(
        &self,
        f: impl FnOnce(&mut Txn<'_>, &State) -> Result<T, MetaError>,
    ) -> Result<T, MetaError> {
        self.mutate(|txn, st| {
            let out = f(txn, st)?;
            once::answer_with_mark(&out)?;
            Ok(out)
        })
    }

    /// Runs a mutation that needs no in-memory change beyond the superblock.
    fn mutate<T>(
        &self,
        f: impl FnOnce(&mut Txn<'_>, &State) -> Result<T, MetaError>,
    ) -> Result<T, MetaError> {
        let mut st = self.state.lock();
        let mut txn = self.begin(&st);
        let out = match f(&mut txn, &st) {
            Ok(out) => out,
            // A refusal is an answer too (see `Txn::check_reads`); a store's failure
            // is not one to check.
            Err(e @ MetaError::Store(_)) => return Err(e),
            Err(e) => {
                txn.check_reads()?;
                return Err(e);
            }
        };
        Self::commit_txn(&mut st, txn)?;
        Ok(out)
    }
}

/// What a server's live key says of it, for an operator reading the engine.
#[derive(serde::Serialize)]
struct LiveRecord {
    pid: u32,
    host: String,
    started: Timestamp,
}

/// Puts this server's live key (`keys::server(id)`) on the shared `engine`.
fn hold_live(engine: &dyn TxnStore, id: u64) -> Result<crate::kv::LiveKey, MetaError> {
    let record = LiveRecord {
        pid: std::process::id(),
        host: hostname(),
        started: now(),
    };
    let key = engine.hold_live(&keys::server(id), &records::encode(&record)?)?;
    tracing::info!(server = id, "live key held on the shared engine");
    Ok(key)
}

/// This machine's name, for the live key (empty if unknown).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

/// Reserves a block of session ids and one of client ids above every block handed out
/// before (on a shared engine, by any server): the superblock after, and the first id
/// of each block.
fn reserve_id_blocks(
    store: &dyn KvStore,
    checked: Option<&dyn TxnStore>,
    sb: Superblock,
    inode_gap: u64,
) -> Result<(Superblock, u64, u64), MetaError> {
    // Servers starting together race for the superblock: the loser reads it again.
    retry_on_conflict(checked.is_some(), "reserving id blocks at start", || {
        let mut txn = match checked {
            Some(engine) => Txn::checked(store, engine, &txn::SharedCounters::default()),
            None => Txn::new(store, &sb),
        };
        let sb = txn.sb()?;
        let (next_session, next_client) = (sb.session_ceiling, sb.client_ceiling);
        sb.session_ceiling += ID_BLOCK;
        sb.client_ceiling += ID_BLOCK;
        sb.next_inode += inode_gap;
        let sb = txn
            .commit()?
            .ok_or_else(|| MetaError::Corrupt("superblock missing".into()))?;
        Ok((sb, next_session, next_client))
    })
}

/// [`Namespace::retry_conflicts`]: runs `f` once, or on a `shared` engine again while it
/// conflicts and nothing of it landed, at most [`CONFLICT_RETRIES`] times; then a
/// clear error the client may retry (`Unavailable`, not `Busy`, which it reads as a
/// file being cut).
fn retry_on_conflict<T>(
    shared: bool,
    what: &str,
    mut f: impl FnMut() -> Result<T, MetaError>,
) -> Result<T, MetaError> {
    if !shared {
        return f();
    }
    for attempt in 0..CONFLICT_RETRIES {
        txn::reset_committed();
        match f() {
            // This server's own live key is gone (it stalled past its lease): others
            // may be ending its sessions, and it may give none; no try will do.
            Err(MetaError::Store(KvError::Conflict { key, .. })) if keys::is_server(&key) => {
                return Err(MetaError::Store(KvError::Unavailable {
                    engine: "shared",
                    message: format!(
                        "{what}: this metadata server's live key is gone from the engine \
                         (its lease ran out): it must restart to serve again"
                    ),
                }));
            }
            // A conflict on the change's own record is another server's try of the
            // same change landing: `once` answers as that try did, never again.
            Err(MetaError::Store(KvError::Conflict { key, .. }))
                if !txn::committed() && !once::is_record(&key) =>
            {
                tracing::debug!(attempt, key = %crate::kv::Escaped(&key), "conflict: running again");
                if attempt > 0 {
                    let most = 1u64 << attempt.min(5);
                    std::thread::sleep(Duration::from_millis(rand::random_range(0..=most)));
                }
            }
            r => return r,
        }
    }
    Err(MetaError::Store(KvError::Unavailable {
        engine: "shared",
        message: format!(
            "{what}: still conflicting with other metadata servers' changes after \
             {CONFLICT_RETRIES} tries; nothing of it was written"
        ),
    }))
}

/// Reads the superblock, or formats an empty store: root directory plus superblock.
/// The superblock, and whether the store held a namespace already (`false`: formatted
/// now). On a shared engine the format holds only if no other server formatted first.
fn load_or_format(
    store: &dyn KvStore,
    checked: Option<&dyn TxnStore>,
) -> Result<(Superblock, bool), MetaError> {
    if let Some(bytes) = store.get(&keys::superblock())? {
        // The first byte of every record is the format version: check it before decoding,
        // so a store from another format reports its version instead of garbage.
        let found = u32::from(bytes.first().copied().unwrap_or(0));
        if found != FORMAT_VERSION {
            return Err(MetaError::FormatVersion {
                found,
                expected: FORMAT_VERSION,
            });
        }
        let sb: Superblock = decode(&bytes, "superblock")?;
        if sb.format_version != FORMAT_VERSION {
            let found = sb.format_version;
            return Err(MetaError::FormatVersion {
                found,
                expected: FORMAT_VERSION,
            });
        }
        return Ok((sb, true));
    }
    // Formatting over existing keys would silently drop a namespace whose superblock was
    // lost: refuse instead.
    if !store.scan(&[], &[0xff; 2], 1)?.is_empty() {
        return Err(MetaError::Corrupt(
            "store has keys but no superblock".into(),
        ));
    }
    let now = now();
    let mut root = InodeRecord::new(proto::FileKind::Directory, 0o755, 0, 0, now);
    root.nlink = 2;
    root.parent = InodeId::ROOT.0;
    let sb = Superblock::initial();
    let mut batch = crate::kv::WriteBatch::new();
    batch.put(keys::inode(InodeId::ROOT), encode(&root)?);
    batch.put(keys::superblock(), encode(&sb)?);
    match checked {
        Some(engine) => {
            let absent = [crate::kv::ReadCheck {
                key: keys::superblock(),
                revision: None,
            }];
            match engine.commit_if(&absent, batch) {
                Ok(()) => {}
                // Another server formatted it meanwhile: use theirs.
                Err(KvError::Conflict { .. }) => return load_or_format(store, None),
                Err(e) => return Err(e.into()),
            }
        }
        None => store.commit(batch)?,
    }
    tracing::info!("formatted an empty metadata store");
    Ok((sb, false))
}
