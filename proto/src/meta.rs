//! Messages between clients (and data servers) and the metadata server.
//!
//! Requests come in three subsystems, each its own module and enum: the file-system
//! calls of clients ([`fs`]), the cluster calls of data servers ([`cluster`]) and the
//! calls of administration tools ([`admin`]); [`MetaRequest`] is the envelope over the
//! three. Each request type names its reply type ([`crate::rpc::Rpc`]). Names are raw
//! bytes: Unix names need not be UTF-8.

pub mod admin;
pub mod cluster;
mod effects;
pub mod fs;

pub use admin::AdminRequest;
pub use cluster::ClusterRequest;
#[doc(hidden)]
pub use effects::one_of_each;
pub use fs::FsRequest;

use crate::attr::{Attr, FileKind, Layout, Timestamp};
use crate::ids::{ChainId, ClientId, InodeId, NodeId};
use crate::runs::ChunkRuns;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How long a call to a data server (a client's, or a chain member's forward to its
/// successor) runs before its caller starts watching whether that server is still up in
/// the map: most calls end sooner, and watching costs map reads.
pub const WATCH_AFTER: Duration = Duration::from_secs(1);

/// How often a caller watching a data server looks at the map again (see
/// [`ClusterMap::is_up`]).
pub const WATCH_EVERY: Duration = Duration::from_millis(200);

/// Most supplementary groups one [`Caller`] names. Linux allows 65536; NFS's AUTH_SYS
/// carries 16. A client whose process has more sends the first `MAX_GROUPS` (the server
/// may then refuse what the kernel allowed through a group further down the list); a
/// request naming more is malformed and refused at decode.
pub const MAX_GROUPS: usize = 64;

/// Who asks: the user a file-system call is made for. Every [`fs`] request carries one
/// in its envelope ([`FsCall`]); the metadata server checks permissions for it and gives
/// it new inodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    /// Effective (file system) user id of the calling process.
    pub uid: u32,
    /// Effective (file system) group id of the calling process.
    pub gid: u32,
    /// Its supplementary groups, at most [`MAX_GROUPS`].
    pub groups: Groups,
    /// Its umask: the permission bits taken away from what a create, mkdir or mknod
    /// makes, unless the directory has a default ACL, which gives the bits instead
    /// (POSIX's rule; so the request's bits come unmasked).
    pub umask: u32,
}

/// The uid and gid of `nobody` on Linux, what a caller that names nobody is taken for.
pub const NOBODY_ID: u32 = 65534;

impl Caller {
    /// The superuser, with no supplementary groups.
    pub const ROOT: Caller = Caller::new(0, 0);
    /// `nobody`: whom a request that names no caller is made for (see [`FsCall`]).
    pub const NOBODY: Caller = Caller::new(NOBODY_ID, NOBODY_ID);

    /// `uid` and `gid` with no supplementary groups.
    pub const fn new(uid: u32, gid: u32) -> Caller {
        Caller {
            uid,
            gid,
            groups: Groups(Vec::new()),
            umask: 0,
        }
    }

    /// `uid`, `gid` and the first [`MAX_GROUPS`] of `groups` (see there).
    pub fn with_groups(uid: u32, gid: u32, groups: impl IntoIterator<Item = u32>) -> Caller {
        Caller {
            uid,
            gid,
            groups: Groups(groups.into_iter().take(MAX_GROUPS).collect()),
            umask: 0,
        }
    }

    /// Whether the caller is the superuser.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// The caller with umask `umask` (its permission bits).
    pub fn with_umask(mut self, umask: u32) -> Caller {
        self.umask = umask & 0o777;
        self
    }

    /// Whether `gid` is the caller's group or one of its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.0.contains(&gid)
    }

    /// The caller with uid and gid 0 mapped to [`NOBODY_ID`] and group 0 dropped from
    /// its supplementary groups (root squash, as NFS exports do).
    pub fn squashed(self) -> Caller {
        let squash = |id: u32| if id == 0 { NOBODY_ID } else { id };
        Caller {
            uid: squash(self.uid),
            gid: squash(self.gid),
            groups: Groups(self.groups.0.into_iter().filter(|&g| g != 0).collect()),
            umask: self.umask,
        }
    }
}

/// A caller's supplementary groups: at most [`MAX_GROUPS`], checked when decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<u32>", into = "Vec<u32>")]
pub struct Groups(Vec<u32>);

impl Groups {
    /// The groups.
    pub fn as_slice(&self) -> &[u32] {
        &self.0
    }
}

/// A [`Groups`] list longer than [`MAX_GROUPS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManyGroups(pub usize);

impl std::fmt::Display for TooManyGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} supplementary groups (at most {MAX_GROUPS})", self.0)
    }
}

impl TryFrom<Vec<u32>> for Groups {
    type Error = TooManyGroups;
    fn try_from(v: Vec<u32>) -> Result<Groups, TooManyGroups> {
        if v.len() > MAX_GROUPS {
            return Err(TooManyGroups(v.len()));
        }
        Ok(Groups(v))
    }
}

impl From<Groups> for Vec<u32> {
    fn from(g: Groups) -> Vec<u32> {
        g.0
    }
}

/// What an open asks to do with the file: its `O_ACCMODE`, or execution (`execve`
/// opens with `__FMODE_EXEC`, which needs the execute bit instead of the read bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpenAccess {
    /// `O_RDONLY`.
    Read,
    /// `O_WRONLY`.
    Write,
    /// `O_RDWR`.
    ReadWrite,
    /// An open to execute the file.
    Exec,
}

impl OpenAccess {
    /// Whether the open may write the file.
    pub fn writes(self) -> bool {
        matches!(self, OpenAccess::Write | OpenAccess::ReadWrite)
    }
}

/// What `rename` does when the target name exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RenameMode {
    /// Replace the target atomically (plain `rename(2)`).
    Replace,
    /// Fail with `AlreadyExists` (`RENAME_NOREPLACE`).
    NoReplace,
    /// Swap source and target atomically (`RENAME_EXCHANGE`).
    Exchange,
    /// As `Replace`, and leave a whiteout (a character device 0/0) at the source name
    /// in the same change (`RENAME_WHITEOUT`, for an overlay's upper layer).
    Whiteout,
    /// As `NoReplace`, and leave a whiteout at the source name
    /// (`RENAME_WHITEOUT | RENAME_NOREPLACE`).
    WhiteoutNoReplace,
}

impl RenameMode {
    /// Whether the rename leaves a whiteout at the source name.
    pub fn whiteout(self) -> bool {
        matches!(self, RenameMode::Whiteout | RenameMode::WhiteoutNoReplace)
    }
}

/// What `setxattr` does when the attribute exists or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum XattrMode {
    /// Create or replace.
    Upsert,
    /// Fail with `AlreadyExists` if it exists (`XATTR_CREATE`).
    Create,
    /// Fail with `NoData` if it does not exist (`XATTR_REPLACE`).
    Replace,
    /// Both flags (`XATTR_CREATE | XATTR_REPLACE`): it must exist and must not, so it
    /// fails either way, as on ext4 (`AlreadyExists` or `NoData`), after the permission
    /// checks; an ACL, whose flags are ignored, is set.
    Neither,
}

impl XattrMode {
    /// The mode `setxattr(2)`'s `flags` ask for (`XATTR_CREATE` is 1, `XATTR_REPLACE`
    /// 2, as in Linux); `None` for any other bit, which is EINVAL.
    pub fn from_flags(flags: i32) -> Option<XattrMode> {
        Some(match flags {
            0 => XattrMode::Upsert,
            1 => XattrMode::Create,
            2 => XattrMode::Replace,
            3 => XattrMode::Neither,
            _ => return None,
        })
    }
}

/// The length and modification time a writer reports at close and fsync, and which
/// chunks its writes since its last commit filled or punched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    /// End of the highest byte written through the session; the server keeps the maximum
    /// of this and the current length.
    pub size: u64,
    /// Time of the last write.
    pub mtime: Timestamp,
    /// Chunks written (at most [`crate::runs::MAX_COMMIT_RUNS`] runs): they hold data.
    pub wrote: ChunkRuns,
    /// Chunks a punched hole or zeroed range covered whole, and not written after
    /// (at most [`crate::runs::MAX_COMMIT_RUNS`] runs): they hold none. Disjoint from
    /// `wrote`.
    pub punched: ChunkRuns,
}

impl Commit {
    /// A commit of a length and mtime alone, no chunk written or punched.
    pub fn length(size: u64, mtime: Timestamp) -> Commit {
        Commit {
            size,
            mtime,
            wrote: ChunkRuns::default(),
            punched: ChunkRuns::default(),
        }
    }
}

/// One entry returned by [`fs::ReadDir`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// The entry's name.
    pub name: Vec<u8>,
    /// The inode it names.
    pub ino: InodeId,
    /// The inode's kind.
    pub kind: FileKind,
    /// Its attributes, when asked for (`plus`).
    pub attr: Option<Attr>,
}

/// Whether a data server's heartbeat lease is current.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeState {
    /// Heartbeats arrive within the lease.
    Up,
    /// The lease ran out: the server is out of every chain until it comes back.
    Down,
}

/// A data server as the cluster map lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The server's id.
    pub node: NodeId,
    /// Address its transport listens on (`host:port`).
    pub addr: String,
    /// Whether its heartbeat lease is current.
    pub state: NodeState,
}

impl NodeInfo {
    /// Whether the server's lease is current.
    pub fn alive(&self) -> bool {
        self.state == NodeState::Up
    }
}

/// What one member of a replication chain may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemberState {
    /// Holds every committed version: takes writes and serves reads.
    Serving,
    /// Being brought up to date from a serving member: takes writes (at the end of the
    /// chain), serves no reads.
    Syncing,
    /// Down: neither writes nor reads reach it; it resyncs when it comes back.
    Offline,
}

/// One member of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The data server.
    pub node: NodeId,
    /// What it may do in this chain.
    pub state: MemberState,
}

/// A replication chain: its members in chain order (the head first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainInfo {
    /// The chain.
    pub chain: ChainId,
    /// Its members, head first.
    pub members: Vec<Member>,
}

impl ChainInfo {
    /// The members a file asking for `replicas` copies uses: the first `replicas`.
    pub fn used(&self, replicas: u8) -> &[Member] {
        &self.members[..self.members.len().min(usize::from(replicas.max(1)))]
    }

    /// Who takes a write of a file asking for `replicas` copies, in chain order: the
    /// serving members, then the syncing ones (so a syncing member is always a tail).
    pub fn write_order(&self, replicas: u8) -> Vec<NodeId> {
        let used = self.used(replicas);
        let serving = used.iter().filter(|m| m.state == MemberState::Serving);
        let syncing = used.iter().filter(|m| m.state == MemberState::Syncing);
        serving.chain(syncing).map(|m| m.node).collect()
    }

    /// Who may serve a read of a file asking for `replicas` copies.
    pub fn readers(&self, replicas: u8) -> Vec<NodeId> {
        self.used(replicas)
            .iter()
            .filter(|m| m.state == MemberState::Serving)
            .map(|m| m.node)
            .collect()
    }
}

/// The cluster map: data servers, chains, and the version that changes with either.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Bumped by every change of a server's state or a chain's membership.
    pub version: u64,
    /// Every data server ever registered.
    pub nodes: Vec<NodeInfo>,
    /// Every chain.
    pub chains: Vec<ChainInfo>,
}

impl ClusterMap {
    /// The chain `chain`, if the map knows it.
    pub fn chain(&self, chain: ChainId) -> Option<&ChainInfo> {
        self.chains.iter().find(|c| c.chain == chain)
    }

    /// Whether every chain has a serving member: every file can be read and written,
    /// though some copies may still be resyncing (see [`ClusterMap::healthy`]).
    pub fn usable(&self) -> bool {
        !self.chains.is_empty()
            && self
                .chains
                .iter()
                .all(|c| c.members.iter().any(|m| m.state == MemberState::Serving))
    }

    /// Whether every chain has `min(replicas, servers up)` members, all serving.
    pub fn healthy(&self, replicas: u8) -> bool {
        let up = self.nodes.iter().filter(|n| n.alive()).count();
        let want = up.min(usize::from(replicas));
        !self.chains.is_empty()
            && self.chains.iter().all(|c| {
                c.members.len() >= want && c.members.iter().all(|m| m.state == MemberState::Serving)
            })
    }

    /// Whether the map lists data server `node` with a current lease. A server that
    /// hangs keeps its connections open: a call to it is given up once this turns
    /// false, looked at every [`WATCH_EVERY`] after [`WATCH_AFTER`], by the client and
    /// by a chain member forwarding to its successor alike.
    pub fn is_up(&self, node: NodeId) -> bool {
        self.nodes.iter().any(|n| n.node == node && n.alive())
    }

    /// The address of data server `node`.
    pub fn addr(&self, node: NodeId) -> Option<&str> {
        self.nodes
            .iter()
            .find(|n| n.node == node)
            .map(|n| n.addr.as_str())
    }
}

/// What a data server reports about bringing its chains up to date.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncReport {
    /// Map version at which the finished pass started.
    pub pass_version: u64,
    /// Chains that pass found (and left) identical to a serving member.
    pub synced: Vec<ChainId>,
    /// Chunks the resync pass under way (or the last one) has compared so far.
    pub checked: u64,
    /// Chunks that pass has copied so far.
    pub copied: u64,
}

/// The cluster's health, as `tessera status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The map.
    pub map: ClusterMap,
    /// Copies each chain should have (the configured replication factor, capped by the
    /// number of data servers).
    pub target_replicas: u8,
    /// Chunks whose chain has fewer serving members than the file asks for.
    pub under_replicated_chunks: u64,
    /// Chunks counted over every file.
    pub chunks: u64,
    /// Resyncs under way.
    pub resync: Vec<ResyncProgress>,
    /// Each DOWN server still in some chain, and the milliseconds until it leaves its
    /// chains for good (`replace_after_ms` after its lease ran out) and another server
    /// takes its place.
    pub replaced_in_ms: Vec<(NodeId, u64)>,
}

/// How far one data server's resync has come, as `tessera status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncProgress {
    /// The resyncing server.
    pub node: NodeId,
    /// Chunks its current pass has compared with a serving copy.
    pub compared: u64,
    /// Chunks that pass has copied.
    pub copied: u64,
    /// Chunks of the chains it resyncs (what a whole pass compares), as the metadata
    /// counts them from the files' lengths.
    pub total: u64,
}

/// A regular file and its layout, as `tessera fsck` walks them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileLayout {
    /// The file.
    pub ino: InodeId,
    /// Its length.
    pub size: u64,
    /// Where its chunks live.
    pub layout: Layout,
}

/// A deletion the metadata server asks one data server to carry out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GcTask {
    /// Remove every chunk of this inode (the file is gone).
    DeleteFile(InodeId),
}

/// What a byte-range lock does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockKind {
    /// A shared lock (`F_RDLCK`, `LOCK_SH`).
    Read,
    /// An exclusive lock (`F_WRLCK`, `LOCK_EX`).
    Write,
    /// Removes the owner's locks in the range (`F_UNLCK`).
    Unlock,
}

/// A byte-range lock (`fcntl`) or a whole-file lock (`flock`), as held or asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LockSpec {
    /// The kernel's lock owner (a process's file table for `fcntl`, an open file for
    /// `flock`), unique within one client.
    pub owner: u64,
    /// The process that holds or asks, for `F_GETLK` answers.
    pub pid: u32,
    /// First byte covered.
    pub start: u64,
    /// Last byte covered, inclusive (`u64::MAX`: to the end of the file and beyond).
    pub end: u64,
    /// Shared, exclusive, or unlock.
    pub kind: LockKind,
}

/// Applies `want` to the locks of one file `held`, POSIX style, for the owner whose
/// locks `mine` picks: that owner's locks inside `want`'s range go, the parts of them
/// sticking out stay, and `want` itself is added unless it is an unlock; other owners'
/// locks are kept as they are. `spec` reaches an item's range. The metadata server's
/// lock table and a client's record of its own locks both use it.
///
/// The order is Linux's, which `F_GETLK` answers show (the first conflicting lock in
/// it is the one reported): each owner's locks stay together, by start, where the
/// owner's first lock was (a new owner's at the end), and a lock that touches or
/// overlaps one of the same owner and kind becomes one lock with it when all else of
/// the two is equal too (the pid; on the server the connection and server taken
/// through): Linux merges without looking at the pid, which differs within one owner
/// only for processes that share their file table.
pub fn set_lock_range<T: Copy + PartialEq>(
    held: Vec<T>,
    want: &LockSpec,
    mine: impl Fn(&T) -> bool,
    spec: impl Fn(&mut T) -> &mut LockSpec,
    new: impl FnOnce() -> T,
) -> Vec<T> {
    let range = |mut h: T| *spec(&mut h);
    let overlaps = |a: &LockSpec| a.start <= want.end && want.start <= a.end;
    let mut kept = Vec::with_capacity(held.len() + 2);
    let mut own = Vec::new();
    let mut at = None;
    for h in held {
        if !mine(&h) {
            kept.push(h);
            continue;
        }
        at.get_or_insert(kept.len());
        let s = range(h);
        if !overlaps(&s) {
            own.push(h);
            continue;
        }
        if s.start < want.start {
            let mut left = h;
            spec(&mut left).end = want.start - 1;
            own.push(left);
        }
        if s.end > want.end {
            let mut right = h;
            spec(&mut right).start = want.end + 1;
            own.push(right);
        }
    }
    if want.kind != LockKind::Unlock {
        own.push(new());
    }
    own.sort_by_key(|h| range(*h).start);
    let mut merged: Vec<T> = Vec::with_capacity(own.len());
    for h in own {
        if let Some(last) = merged.last_mut() {
            let (l, s) = (range(*last), range(h));
            // The same lock but for its range (kind, pid, holder), reaching `h`'s start.
            let mut moved = *last;
            *spec(&mut moved) = LockSpec {
                start: s.start,
                end: s.end,
                ..l
            };
            if moved == h && l.end.checked_add(1).is_some_and(|next| next >= s.start) {
                spec(last).end = l.end.max(s.end);
                continue;
            }
        }
        merged.push(h);
    }
    let at = at.unwrap_or(kept.len());
    kept.splice(at..at, merged);
    kept
}

/// Most sessions one [`fs::ReleaseMany`] ends.
pub const MAX_RELEASES: usize = 1024;

/// Most sessions one [`fs::Resume`] takes back: its reply carries a grant for each
/// (about 130 bytes with a long key name), well within the default 128 KiB message.
pub const MAX_RESUMES: usize = 256;

/// A request to the metadata server, as it travels: one variant per subsystem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaRequest {
    /// A file-system call of a client, and whom it is made for.
    Fs(FsCall),
    /// A cluster call of a data server.
    Cluster(ClusterRequest),
    /// A call of an administration tool.
    Admin(AdminRequest),
}

impl MetaRequest {
    /// Every request type's name, of every subsystem (the label values of a request
    /// metric: a bounded set).
    pub fn names() -> Vec<&'static str> {
        FsRequest::NAMES
            .iter()
            .chain(ClusterRequest::NAMES)
            .chain(AdminRequest::NAMES)
            .copied()
            .collect()
    }

    /// The request's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            MetaRequest::Fs(c) => c.req.name(),
            MetaRequest::Cluster(r) => r.name(),
            MetaRequest::Admin(r) => r.name(),
        }
    }
}

/// A file-system call as it travels: the request and the user it is made for. The
/// caller travels in the envelope, so that every call names one and the server checks
/// every call in one place, whatever its type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsCall {
    /// Whom the call is made for.
    pub caller: Caller,
    /// The call.
    pub req: FsRequest,
    /// A change's id, on every change that is not idempotent ([`crate::Rpc::IDEMPOTENT`]),
    /// and on a length commit or attribute change of a client that takes early replies
    /// ([`OpId::early`]): the server applies a change once however often it arrives
    /// (see [`OpId`]).
    pub op: Option<OpId>,
}

/// Change records a metadata server keeps per client, and so the most changes with an
/// id ([`OpId`]) one client has in flight at a time: a change's record is in slot
/// `seq % OP_SLOTS`, and no change still in flight shares its slot.
pub const OP_SLOTS: u64 = 64;

/// Names one change of one client, so that the change is applied once however often
/// it is sent: a client whose metadata server died or stopped answering under a change
/// sends it again (to the same server, or to the one that took over), and the server
/// answers a change it applied already with the reply it recorded then, in the same
/// engine transaction as the change itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpId {
    /// The client, from its `Hello`.
    pub client: ClientId,
    /// The client's count of its changes, from 1; each change has its own.
    pub seq: u64,
    /// Sent before, with no answer: the server looks for a record of it.
    pub retry: bool,
    /// The client takes an early reply ([`ReplyTail::pending`]): it keeps the change
    /// until a reply says the server's log holds it, and sends it again (with
    /// `retry`) to a server that restarted before then.
    pub early: bool,
    /// On a change sent again after an early reply that made an inode: that inode's
    /// number, which the change makes again (a restarted server keeps the numbers it
    /// may have handed out early free for this).
    pub made: Option<InodeId>,
}

impl OpId {
    /// A change's id, sent for the first time, taking no early reply.
    pub fn new(client: ClientId, seq: u64) -> OpId {
        OpId {
            client,
            seq,
            retry: false,
            early: false,
            made: None,
        }
    }
}

/// Most changes a metadata server answers early to one client before their log write
/// (see [`ReplyTail`]); beyond, its replies wait for the log. Well below
/// [`OP_SLOTS`], so that changes kept for a replay leave the window room.
pub const MAX_EARLY: u64 = 16;

/// What a metadata server appends to its answer to a file-system call, after the
/// answer's own bytes: how far its log is durable, and whether this answer came before
/// its change was (an early reply). A client that takes early replies
/// ([`OpId::early`]) keeps each change answered early until a tail of the same `run`
/// says `durable` reached it, and sends the ones it still keeps again to a server
/// that restarted, before anything else; [`fs::Settle`] waits for them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyTail {
    /// Drawn by the server at its start: log positions of another run are not
    /// comparable (a crash may have lost the last ones, which the next run hands out
    /// again).
    pub run: u64,
    /// Every change the server staged up to this log position is durable.
    pub durable: u64,
    /// This answer's change was staged at this log position and is not yet durable.
    pub pending: Option<u64>,
    /// The inode this answer's change made (a create, mkdir, mknod or symlink).
    pub made: Option<InodeId>,
}

impl ReplyTail {
    /// The answer's bytes with the tail after them.
    pub fn append_to(&self, mut answer: Vec<u8>) -> Vec<u8> {
        crate::codec::append(&mut answer, self);
        answer
    }
}

/// A file-system request wrapped without naming its caller is made for
/// [`Caller::NOBODY`], never for root: a sender that forgets
/// [`crate::Request::with_caller`] gets less, not more.
impl From<FsRequest> for MetaRequest {
    fn from(req: FsRequest) -> MetaRequest {
        MetaRequest::Fs(FsCall {
            caller: Caller::NOBODY,
            req,
            op: None,
        })
    }
}

impl From<ClusterRequest> for MetaRequest {
    fn from(r: ClusterRequest) -> MetaRequest {
        MetaRequest::Cluster(r)
    }
}

impl From<AdminRequest> for MetaRequest {
    fn from(r: AdminRequest) -> MetaRequest {
        MetaRequest::Admin(r)
    }
}

/// What one request did to a directory, read in the same step as the change: its ctime
/// just before and its attributes just after. A directory's ctime moves forward at every
/// change (the server never gives it the same value twice), so a client that knew every
/// name in the directory at ctime `before` knows them all after its own change too, and
/// one that knew them at another ctime learns that someone else changed the directory
/// meanwhile. NFSv4 hands its clients `change_info4` for the same purpose.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirChange {
    /// The directory's ctime just before the change (equal to `after.ctime` when the
    /// request changed nothing in it, as a create that opened an existing file).
    pub before: Timestamp,
    /// The directory's attributes just after.
    pub after: Attr,
}

impl DirChange {
    /// Whether the request changed the directory (a create that opened an existing
    /// file did not).
    pub fn changed(&self) -> bool {
        self.before != self.after.ctime
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lk(owner: u64, kind: LockKind, start: u64, end: u64) -> LockSpec {
        LockSpec {
            owner,
            pid: owner as u32,
            start,
            end,
            kind,
        }
    }

    /// Guards against lock tables whose order or pieces differ from Linux's (F_GETLK
    /// reports the first conflicting lock of that order): one owner's locks together by
    /// start where its first lock was, touching or overlapping locks of one kind merged,
    /// a new owner's at the end, unlocks splitting.
    #[test]
    fn lock_ranges_keep_linux_order_and_merge_touching_locks() {
        use LockKind::{Read, Unlock, Write};
        let set = |held: Vec<LockSpec>, want: LockSpec| {
            set_lock_range(held, &want, |l| l.owner == want.owner, |l| l, || want)
        };
        let mut t = set(vec![], lk(1, Write, 10, 14));
        t = set(t, lk(1, Read, 1, 5));
        assert_eq!(t, vec![lk(1, Read, 1, 5), lk(1, Write, 10, 14)]);
        t = set(t, lk(2, Read, 100, 100));
        t = set(t, lk(1, Read, 6, 9));
        t = set(t, lk(1, Write, 15, 19));
        assert_eq!(
            t,
            vec![
                lk(1, Read, 1, 9),
                lk(1, Write, 10, 19),
                lk(2, Read, 100, 100)
            ]
        );
        // Overlapping locks of one kind join; another kind inside splits.
        t = set(t, lk(1, Read, 3, 12));
        assert_eq!(
            t,
            vec![
                lk(1, Read, 1, 12),
                lk(1, Write, 13, 19),
                lk(2, Read, 100, 100)
            ]
        );
        t = set(t, lk(1, Unlock, 5, 5));
        assert_eq!(
            t,
            vec![
                lk(1, Read, 1, 4),
                lk(1, Read, 6, 12),
                lk(1, Write, 13, 19),
                lk(2, Read, 100, 100)
            ]
        );
        // Another pid of the same owner is not merged into (the answer names the pid).
        let mut other_pid = lk(1, Read, 13, 13);
        other_pid.pid = 7;
        t = set(t, other_pid);
        assert_eq!(t[1], lk(1, Read, 6, 12));
        assert_eq!(t[2], other_pid);
        // A lock to the end of the file does not overflow when merged.
        t = set(t, lk(2, Read, 101, u64::MAX));
        assert_eq!(t.last(), Some(&lk(2, Read, 100, u64::MAX)));
        assert!(set(t, lk(1, Unlock, 0, u64::MAX))
            .iter()
            .all(|l| l.owner == 2));
    }

    /// Guards against a wire client naming an unbounded list of groups.
    #[test]
    fn a_caller_with_too_many_groups_is_refused_at_decode() {
        let call = |n: u32| {
            let mut c = Caller::new(1000, 1000);
            c.groups = Groups((0..n).collect());
            MetaRequest::Fs(FsCall {
                caller: c,
                req: FsRequest::StatFs(fs::StatFs),
                op: None,
            })
        };
        let ok = crate::codec::encode(&call(MAX_GROUPS as u32), 1 << 20).unwrap();
        assert_eq!(crate::codec::decode::<MetaRequest>(&ok).unwrap(), call(64));
        let bad = crate::codec::encode(&call(MAX_GROUPS as u32 + 1), 1 << 20).unwrap();
        assert!(crate::codec::decode::<MetaRequest>(&bad).is_err());
        let many = Caller::with_groups(1, 1, 0..1000);
        assert_eq!(many.groups.as_slice().len(), MAX_GROUPS);
    }

    /// The fuzz target's committed seeds are messages of this protocol (a seed that no
    /// longer decodes starts the fuzzer at a refusal).
    #[test]
    fn the_committed_fuzz_seeds_decode() {
        let seeds: [(&str, &[u8]); 5] = [
            (
                "getattr",
                include_bytes!("../../fuzz/corpus/meta_request/getattr"),
            ),
            (
                "getmap",
                include_bytes!("../../fuzz/corpus/meta_request/getmap"),
            ),
            (
                "lookup",
                include_bytes!("../../fuzz/corpus/meta_request/lookup"),
            ),
            (
                "status",
                include_bytes!("../../fuzz/corpus/meta_request/status"),
            ),
            (
                "unlink-op",
                include_bytes!("../../fuzz/corpus/meta_request/unlink-op"),
            ),
        ];
        for (name, bytes) in seeds {
            let req = crate::codec::decode::<MetaRequest>(bytes);
            assert!(req.is_ok(), "{name}: {req:?}");
        }
        let unlink = crate::codec::decode::<MetaRequest>(seeds[4].1).unwrap();
        let MetaRequest::Fs(call) = unlink else {
            panic!("{unlink:?}")
        };
        let op = OpId {
            retry: true,
            ..OpId::new(ClientId(1), 1)
        };
        assert_eq!(call.op, Some(op));
    }

    #[test]
    fn squash_maps_root_to_nobody_and_keeps_others() {
        let c = Caller::with_groups(0, 0, [0, 5]).squashed();
        assert_eq!(
            (c.uid, c.gid, c.groups.as_slice()),
            (NOBODY_ID, NOBODY_ID, &[5][..])
        );
        assert_eq!(Caller::new(7, 8).squashed(), Caller::new(7, 8));
    }

    #[test]
    fn a_node_is_up_only_when_listed_with_a_current_lease() {
        let node = |n, state| NodeInfo {
            node: NodeId(n),
            addr: format!("127.0.0.1:{n}"),
            state,
        };
        let map = ClusterMap {
            version: 3,
            nodes: vec![node(1, NodeState::Up), node(2, NodeState::Down)],
            chains: vec![],
        };
        assert!(map.is_up(NodeId(1)));
        assert!(!map.is_up(NodeId(2)), "a lapsed lease is down");
        assert!(!map.is_up(NodeId(9)), "a node the map lacks is down");
        assert!(WATCH_EVERY < WATCH_AFTER, "a watch looks more than once");
    }

    #[test]
    fn a_map_with_a_resyncing_copy_is_usable_but_not_healthy() {
        let node = |n| NodeInfo {
            node: NodeId(n),
            addr: format!("127.0.0.1:{n}"),
            state: NodeState::Up,
        };
        let member = |n, state| Member {
            node: NodeId(n),
            state,
        };
        let chain = |members| ChainInfo {
            chain: ChainId(1),
            members,
        };
        let mut map = ClusterMap {
            version: 1,
            nodes: vec![node(1), node(2)],
            chains: vec![],
        };
        assert!(!map.usable() && !map.healthy(2));
        map.chains = vec![chain(vec![
            member(1, MemberState::Serving),
            member(2, MemberState::Serving),
        ])];
        assert!(map.usable() && map.healthy(2));
        map.chains[0].members[1].state = MemberState::Syncing;
        assert!(map.usable() && !map.healthy(2));
        map.chains[0].members[0].state = MemberState::Offline;
        assert!(!map.usable() && !map.healthy(2));
    }
}
