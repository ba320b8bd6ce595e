//! Messages between clients (and data servers) and the metadata server.
//!
//! Every request is answered by one [`MetaResult`]. Names are raw bytes: Unix names need
//! not be UTF-8.

use crate::attr::{Attr, FileKind, Layout, SetAttr, Timestamp};
use crate::error::WireError;
use crate::ids::{ChainId, ClientId, InodeId, NodeId, SessionId};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How long a call to a data server (a client's, or a chain member's forward to its
/// successor) runs before its caller starts watching whether that server is still up in
/// the map: most calls end sooner, and watching costs map reads.
pub const WATCH_AFTER: Duration = Duration::from_secs(1);

/// How often a caller watching a data server looks at the map again (see
/// [`ClusterMap::is_up`]).
pub const WATCH_EVERY: Duration = Duration::from_millis(200);

/// Who asks: the owner given to new inodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    /// Effective user id of the calling process.
    pub uid: u32,
    /// Effective group id of the calling process.
    pub gid: u32,
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
}

/// The length and modification time a writer reports at close and fsync.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    /// End of the highest byte written through the session; the server keeps the maximum
    /// of this and the current length.
    pub size: u64,
    /// Time of the last write.
    pub mtime: Timestamp,
}

/// One entry returned by [`MetaRequest::ReadDir`].
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

/// Most sessions one [`MetaRequest::ReleaseMany`] ends.
pub const MAX_RELEASES: usize = 1024;

/// A request to the metadata server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaRequest {
    /// A client introduces itself and gets an id for its sessions.
    Hello {
        /// Free-form description for logs (host, mount point).
        name: String,
    },
    /// Finds `name` in directory `parent`.
    Lookup {
        /// The directory.
        parent: InodeId,
        /// The name to find.
        name: Vec<u8>,
    },
    /// Reads an inode's attributes.
    GetAttr {
        /// The inode.
        ino: InodeId,
    },
    /// Changes attributes.
    SetAttr {
        /// The inode.
        ino: InodeId,
        /// What to change.
        set: SetAttr,
        /// A length commit of this client's writes to the file, applied first in the
        /// same change (the client has sent the bytes): a `utime`, `chown` or `chmod`
        /// right after writes (`tar x`, `cp -a`) needs one durable change, not two.
        commit: Option<Commit>,
    },
    /// Creates a regular file (or opens an existing one unless `exclusive`) and opens it.
    Create {
        /// The directory.
        parent: InodeId,
        /// The new name.
        name: Vec<u8>,
        /// Permission bits.
        perm: u32,
        /// Owner of the new file.
        caller: Caller,
        /// Fail with `AlreadyExists` if the name exists (`O_EXCL`).
        exclusive: bool,
        /// The session's client.
        client: ClientId,
    },
    /// Creates a special file: FIFO, socket or device node.
    MkNod {
        /// The directory.
        parent: InodeId,
        /// The new name.
        name: Vec<u8>,
        /// The kind (not `Regular`, `Directory` or `Symlink`).
        kind: FileKind,
        /// Permission bits.
        perm: u32,
        /// Device number for device nodes.
        rdev: u32,
        /// Owner of the new node.
        caller: Caller,
    },
    /// Creates a directory.
    Mkdir {
        /// The parent directory.
        parent: InodeId,
        /// The new name.
        name: Vec<u8>,
        /// Permission bits.
        perm: u32,
        /// Owner of the new directory.
        caller: Caller,
    },
    /// Creates a symbolic link.
    Symlink {
        /// The directory.
        parent: InodeId,
        /// The new name.
        name: Vec<u8>,
        /// What the link points to.
        target: Vec<u8>,
        /// Owner of the link.
        caller: Caller,
    },
    /// Reads a symlink's target.
    Readlink {
        /// The symlink.
        ino: InodeId,
    },
    /// Adds a hard link to an existing non-directory.
    Link {
        /// The inode to link.
        ino: InodeId,
        /// Directory of the new name.
        new_parent: InodeId,
        /// The new name.
        new_name: Vec<u8>,
    },
    /// Removes a non-directory name.
    Unlink {
        /// The directory.
        parent: InodeId,
        /// The name.
        name: Vec<u8>,
    },
    /// Removes an empty directory.
    Rmdir {
        /// The parent directory.
        parent: InodeId,
        /// The name.
        name: Vec<u8>,
    },
    /// Renames atomically.
    Rename {
        /// Directory of the source.
        parent: InodeId,
        /// Source name.
        name: Vec<u8>,
        /// Directory of the target.
        new_parent: InodeId,
        /// Target name.
        new_name: Vec<u8>,
        /// What to do with an existing target.
        mode: RenameMode,
    },
    /// Lists a directory, a page at a time, in name order.
    ReadDir {
        /// The directory.
        ino: InodeId,
        /// Resume strictly after this name (the stable cursor); `None` starts at the top.
        after: Option<Vec<u8>>,
        /// Most entries to return (the server may return fewer to fit the message).
        max_entries: u32,
        /// Include each entry's attributes (readdirplus).
        plus: bool,
    },
    /// File system totals.
    StatFs,
    /// Opens an existing inode and starts a session on it.
    Open {
        /// The inode.
        ino: InodeId,
        /// The session's client.
        client: ClientId,
        /// Cut the file to zero length (`O_TRUNC`); the client has emptied its chunks.
        truncate: bool,
    },
    /// Records a writer's length and mtime (at close and fsync); durable before the reply.
    Commit {
        /// The file.
        ino: InodeId,
        /// What was written.
        commit: Commit,
    },
    /// Ends a session; frees the file if it was unlinked and this was its last session.
    Release {
        /// The session.
        session: SessionId,
        /// A final length commit, applied before the session ends.
        commit: Option<Commit>,
    },
    /// Says that the session's client has cut the file's chunks at its committed length
    /// on every member of its chains, as an open's `cut_tail` asked (see
    /// [`MetaReply::Opened`]): the server forgets that a writer vanished there.
    TailCut {
        /// The file.
        ino: InodeId,
        /// The session whose open was given the cut.
        session: SessionId,
    },
    /// Ends several sessions that carry no commit (closes batched by the client); a
    /// session already gone is skipped. At most [`MAX_RELEASES`] per call.
    ReleaseMany {
        /// The sessions.
        sessions: Vec<SessionId>,
    },
    /// Reads one extended attribute.
    GetXattr {
        /// The inode.
        ino: InodeId,
        /// Full name with namespace (`user.foo`).
        name: Vec<u8>,
    },
    /// Sets one extended attribute.
    SetXattr {
        /// The inode.
        ino: InodeId,
        /// Full name with namespace.
        name: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// Create, replace or either.
        mode: XattrMode,
    },
    /// Lists extended attribute names.
    ListXattr {
        /// The inode.
        ino: InodeId,
    },
    /// Removes one extended attribute.
    RemoveXattr {
        /// The inode.
        ino: InodeId,
        /// Full name with namespace.
        name: Vec<u8>,
    },
    /// Reserves `len` bytes at the end of a file for an `O_APPEND` write: the file grows by
    /// `len` at once (durably) and the reply names where the bytes go, so appenders on
    /// different clients never overwrite each other.
    Append {
        /// The file.
        ino: InodeId,
        /// Bytes to append.
        len: u64,
    },
    /// A read happened: moves the access time to now if `relatime` asks for it (older
    /// than the last change, or a day old), or always if `strict`; the change time does
    /// not move.
    Accessed {
        /// The file or directory read.
        ino: InodeId,
        /// The mount's `strictatime`: every access moves the access time.
        strict: bool,
    },
    /// Takes or releases a lock; a conflicting lock held by another owner is `WouldBlock`.
    SetLock {
        /// The file.
        ino: InodeId,
        /// The asking client.
        client: ClientId,
        /// The lock.
        lock: LockSpec,
    },
    /// Finds a lock of another owner that conflicts with `lock` (`F_GETLK`).
    GetLock {
        /// The file.
        ino: InodeId,
        /// The asking client.
        client: ClientId,
        /// The lock that would be asked for.
        lock: LockSpec,
    },
    /// Drops every lock `owner` of `client` holds on the file (close, or the last close
    /// of an open file that held a `flock`).
    ReleaseLocks {
        /// The file.
        ino: InodeId,
        /// The client.
        client: ClientId,
        /// The kernel's lock owner.
        owner: u64,
    },
    /// A data server announces itself (first start: `node` is `None`).
    RegisterData {
        /// The id it was given before, kept in its data directory.
        node: Option<NodeId>,
        /// Where its transport listens.
        addr: String,
        /// Bytes of disk it may use.
        capacity_bytes: u64,
        /// Bytes it uses.
        used_bytes: u64,
    },
    /// A data server's lease renewal, carrying the deletions it has finished.
    Heartbeat {
        /// The server.
        node: NodeId,
        /// Bytes of disk it may use.
        capacity_bytes: u64,
        /// Bytes it uses.
        used_bytes: u64,
        /// Deletions finished since the last heartbeat.
        done: Vec<GcTask>,
        /// The version of the cluster map the server knows.
        map_version: u64,
        /// How its resync goes.
        resync: ResyncReport,
    },
    /// The cluster map: data servers, chains and their states.
    ClusterMap,
    /// The map, the number of under-replicated chunks and the resyncs under way.
    Status,
    /// Up to `limit` regular files with an inode number above `after`, in order.
    ListFiles {
        /// Start after this inode.
        after: InodeId,
        /// At most this many files.
        limit: u32,
    },
    /// Checks the namespace's own consistency (entries, link counts, orphans); returns
    /// one line per problem found.
    CheckNamespace,
    /// Whether each of these inodes still exists (a data server looking for chunks no
    /// file points to).
    InodesExist {
        /// The inodes to check.
        inodes: Vec<InodeId>,
    },
    /// Sent by a client first on a new connection after its previous one broke: its
    /// open sessions (and locks) move to this connection, instead of ending when the
    /// server gives up on the broken one. At most [`MAX_RELEASES`] sessions per call.
    Resume {
        /// The client, from its `Hello`.
        client: ClientId,
        /// The sessions the client still has open, with their files.
        sessions: Vec<(SessionId, InodeId)>,
    },
}

/// A successful answer of the metadata server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaReply {
    /// Nothing to return.
    Unit,
    /// The welcome of a client.
    Welcome {
        /// The client's id for its sessions.
        client: ClientId,
    },
    /// An inode's attributes (lookup, getattr, setattr, commit).
    Attr(Attr),
    /// An open session (create, open).
    Opened {
        /// The file's attributes after the open (and truncation).
        attr: Attr,
        /// The new session.
        session: SessionId,
        /// Where the file's chunks live.
        layout: Layout,
        /// After a create, the directory's change (its times moved): the kernel asks
        /// for its attributes before the next change in that directory, and the client
        /// answers from this copy instead of asking again; a client that knows every
        /// name in the directory keeps knowing them (see [`DirChange`]).
        parent: Option<DirChange>,
        /// A client that held the file open went away without closing it: bytes it
        /// wrote past the committed length may lie on the data servers, where a later
        /// truncation upwards or a write past the end would show them instead of zeros.
        /// The opener cuts the chunks at `attr.size` before anything else, then sends
        /// `TailCut`; meanwhile other opens of the file are answered `Busy`. Only given
        /// when no other session has the file open (their writes past the end may be
        /// in flight).
        cut_tail: bool,
    },
    /// A symlink's target.
    Target(Vec<u8>),
    /// A page of a directory listing.
    Dir {
        /// Entries in name order.
        entries: Vec<DirEntry>,
        /// No entries follow the last one.
        done: bool,
        /// When this page is the whole listing (asked from the top, nothing follows) and
        /// the directory did not change while it was read: the directory's ctime, at
        /// which these are all its names (see [`DirChange`]).
        complete_at: Option<Timestamp>,
    },
    /// File system totals.
    StatFs {
        /// Bytes of capacity over all data servers.
        total_bytes: u64,
        /// Bytes free over all data servers.
        free_bytes: u64,
        /// Inodes in use.
        files: u64,
    },
    /// An extended attribute's value.
    Xattr(Vec<u8>),
    /// Extended attribute names.
    XattrNames(Vec<Vec<u8>>),
    /// A data server's id.
    Registered {
        /// The id to keep.
        node: NodeId,
    },
    /// The answer to a heartbeat: deletions to carry out, and the cluster map when the
    /// server's version is not the current one.
    Beat {
        /// Deletions for the heartbeating data server.
        gc: Vec<GcTask>,
        /// The current map, when the server's is older.
        map: Option<ClusterMap>,
    },
    /// Where an appended range starts.
    Offset(u64),
    /// A conflicting lock (`None`: the lock could be taken).
    Lock(Option<LockSpec>),
    /// The cluster map.
    Map(ClusterMap),
    /// The cluster's health.
    Status(ClusterStatus),
    /// Regular files and their layouts.
    Files {
        /// In inode order.
        files: Vec<FileLayout>,
        /// No files follow the last one.
        done: bool,
    },
    /// Problems found; empty when the namespace is consistent.
    Problems(Vec<String>),
    /// One answer per inode asked about, in order.
    Exist(Vec<bool>),
    /// An entry was removed (unlink, rmdir): the directory's change, for the same
    /// reasons as `Opened::parent`.
    Removed {
        /// The directory before and after the removal.
        parent: DirChange,
    },
    /// A name was made (mkdir, mknod, symlink, link): what it points to, and the
    /// directory's change, for the same reasons as `Opened::parent`.
    Made {
        /// The attributes of the inode the new name points to.
        attr: Attr,
        /// The directory before and after the new name.
        parent: DirChange,
    },
    /// What a `Resume` could not keep: sessions the server had already ended (the
    /// client stayed away longer than the grace), so another client may have cut what
    /// they wrote past the committed length.
    Resumed {
        /// The sessions lost.
        lost: Vec<SessionId>,
    },
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

/// The answer to every [`MetaRequest`].
pub type MetaResult = Result<MetaReply, WireError>;

#[cfg(test)]
mod tests {
    use super::*;

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
