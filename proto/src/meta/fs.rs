//! The file-system calls a client makes to the metadata server ([`FsRequest`]), each
//! with its reply type.

use super::{DirChange, DirEntry, LockSpec, MetaRequest, OpenAccess, RenameMode, XattrMode};
use crate::attr::{Attr, FileKind, InodeFlags, Layout, Timestamp};
use crate::grant::Grant;
use crate::ids::{ClientId, InodeId, SessionId};
use serde::{Deserialize, Serialize};

crate::rpc_requests! {
    /// A file-system call of a client.
    pub enum FsRequest => MetaRequest {
        Hello => ClientId, "hello", idempotent: true;
        Lookup => Attr, "lookup", idempotent: true;
        GetAttr => Attr, "getattr", idempotent: true;
        SetAttr => Attr, "setattr", idempotent: true;
        Create => Opened, "create", idempotent: false;
        TmpFile => Opened, "tmpfile", idempotent: false;
        MkNod => Made, "mknod", idempotent: false;
        Mkdir => Made, "mkdir", idempotent: false;
        Symlink => Made, "symlink", idempotent: false;
        Readlink => Vec<u8>, "readlink", idempotent: true;
        Link => Made, "link", idempotent: false;
        Unlink => Unlinked, "unlink", idempotent: false;
        Rmdir => DirChange, "rmdir", idempotent: false;
        Rename => (), "rename", idempotent: false;
        ReadDir => DirPage, "readdir", idempotent: true;
        StatFs => FsStats, "statfs", idempotent: true;
        Open => Opened, "open", idempotent: true;
        Commit => Attr, "commit", idempotent: true;
        Release => (), "release", idempotent: false;
        TailCut => (), "tail_cut", idempotent: true;
        // Sessions of a lost connection ended with it; a retry finds them gone.
        ReleaseMany => (), "release_many", idempotent: true;
        GetXattr => Vec<u8>, "getxattr", idempotent: true;
        SetXattr => (), "setxattr", idempotent: true;
        ListXattr => Vec<Vec<u8>>, "listxattr", idempotent: true;
        RemoveXattr => (), "removexattr", idempotent: false;
        Append => u64, "append", idempotent: false;
        Accessed => Attr, "accessed", idempotent: true;
        SetLock => (), "setlock", idempotent: true;
        GetLock => Option<LockSpec>, "getlock", idempotent: true;
        ReleaseLocks => (), "release_locks", idempotent: true;
        // Moving sessions to the connection it arrives on, again, changes nothing.
        Resume => Resumed, "resume", idempotent: true;
        MyCaps => crate::auth::Caps, "my_caps", idempotent: true;
        Regrant => Option<Grant>, "regrant", idempotent: true;
        LookupParent => Attr, "lookup_parent", idempotent: true;
        OpenAt => OpenedAt, "open_at", idempotent: true;
        GetFlags => InodeFlags, "getflags", idempotent: true;
        SetFlags => Attr, "setflags", idempotent: true;
        // Waits, and says the client sent again what it kept: twice is as once.
        Settle => u64, "settle", idempotent: true;
    }
}

/// A client introduces itself and gets an id for its sessions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Free-form description for logs (host, mount point).
    pub name: String,
}

/// Finds `name` in directory `parent`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lookup {
    /// The directory.
    pub parent: InodeId,
    /// The name to find.
    pub name: Vec<u8>,
}

/// Reads an inode's attributes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetAttr {
    /// The inode.
    pub ino: InodeId,
}

/// Changes attributes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    /// The inode.
    pub ino: InodeId,
    /// What to change.
    pub set: crate::attr::SetAttr,
    /// A length commit of this client's writes to the file, applied first in the
    /// same change (the client has sent the bytes): a `utime`, `chown` or `chmod`
    /// right after writes (`tar x`, `cp -a`) needs one durable change, not two.
    pub commit: Option<super::Commit>,
}

/// Creates a regular file (or opens an existing one unless `exclusive`) and opens it.
/// New inodes (here and in [`MkNod`], [`Mkdir`], [`Symlink`]) belong to the call's
/// caller ([`super::FsCall`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Create {
    /// The directory.
    pub parent: InodeId,
    /// The new name.
    pub name: Vec<u8>,
    /// Permission bits.
    pub perm: u32,
    /// Fail with `AlreadyExists` if the name exists (`O_EXCL`).
    pub exclusive: bool,
    /// What the open asks to do (checked against an existing file's mode; a new file
    /// is opened whatever its mode, as `open(O_CREAT)` does).
    pub access: OpenAccess,
    /// `O_APPEND`: an append-only file opens for writing only so.
    pub append: bool,
    /// The session's client.
    pub client: ClientId,
}

/// Makes an unnamed regular file (`O_TMPFILE`) with `parent`'s layout and opens it. It
/// has no link: it goes when its last session ends, unless a [`Link`] names it first,
/// which only a `linkable` one allows (`O_TMPFILE` without `O_EXCL`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TmpFile {
    /// The directory it is made in (for its permission check and its layout).
    pub parent: InodeId,
    /// Permission bits.
    pub perm: u32,
    /// Whether a [`Link`] may give it a name.
    pub linkable: bool,
    /// What the open asks to do.
    pub access: OpenAccess,
    /// The session's client.
    pub client: ClientId,
}

/// Creates a special file: FIFO, socket or device node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MkNod {
    /// The directory.
    pub parent: InodeId,
    /// The new name.
    pub name: Vec<u8>,
    /// The kind (not `Regular`, `Directory` or `Symlink`).
    pub kind: FileKind,
    /// Permission bits.
    pub perm: u32,
    /// Device number for device nodes.
    pub rdev: u32,
}

/// Creates a directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mkdir {
    /// The parent directory.
    pub parent: InodeId,
    /// The new name.
    pub name: Vec<u8>,
    /// Permission bits.
    pub perm: u32,
}

/// Creates a symbolic link.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Symlink {
    /// The directory.
    pub parent: InodeId,
    /// The new name.
    pub name: Vec<u8>,
    /// What the link points to.
    pub target: Vec<u8>,
}

/// Reads a symlink's target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readlink {
    /// The symlink.
    pub ino: InodeId,
}

/// Adds a hard link to an existing non-directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// The inode to link.
    pub ino: InodeId,
    /// Directory of the new name.
    pub new_parent: InodeId,
    /// The new name.
    pub new_name: Vec<u8>,
    /// The caller's kernel applied its own hard-link rule already (a mount: the
    /// `fs.protected_hardlinks` setting of its machine, which may be off), so the
    /// server applies only the directory's permissions; a client without a kernel in
    /// between (the library) leaves it false and the server applies the rule.
    pub kernel_checked: bool,
}

/// Removes a non-directory name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unlink {
    /// The directory.
    pub parent: InodeId,
    /// The name.
    pub name: Vec<u8>,
}

/// What an unlink did: the directory's change, and the file whose name went, with the
/// links it has left. A client whose kernel reaches a file with none left through a
/// descriptor knows it removed the name itself (see the mount's `open`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unlinked {
    /// The directory's change.
    pub parent: DirChange,
    /// The file whose name went.
    pub ino: InodeId,
    /// Its links left (0: gone, or kept only by the sessions that have it open).
    pub nlink: u32,
}

/// Removes an empty directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rmdir {
    /// The parent directory.
    pub parent: InodeId,
    /// The name.
    pub name: Vec<u8>,
}

/// Renames atomically.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rename {
    /// Directory of the source.
    pub parent: InodeId,
    /// Source name.
    pub name: Vec<u8>,
    /// Directory of the target.
    pub new_parent: InodeId,
    /// Target name.
    pub new_name: Vec<u8>,
    /// What to do with an existing target.
    pub mode: RenameMode,
}

/// Lists a directory, a page at a time, in name order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadDir {
    /// The directory.
    pub ino: InodeId,
    /// Resume strictly after this name (the stable cursor); `None` starts at the top.
    pub after: Option<Vec<u8>>,
    /// Most entries to return (the server may return fewer to fit the message).
    pub max_entries: u32,
    /// Include each entry's attributes (readdirplus).
    pub plus: bool,
}

/// File system totals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatFs;

/// Opens an existing inode and starts a session on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Open {
    /// The inode.
    pub ino: InodeId,
    /// The session's client.
    pub client: ClientId,
    /// Cut the file to zero length (`O_TRUNC`); the client has emptied its chunks.
    pub truncate: bool,
    /// What the open asks to do, checked against the file's mode.
    pub access: OpenAccess,
    /// `O_APPEND`: an append-only file opens for writing only so.
    pub append: bool,
}

/// Records a writer's length and mtime (at close and fsync); durable before the reply,
/// unless answered early to a client that keeps it ([`super::ReplyTail`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    /// The file.
    pub ino: InodeId,
    /// What was written.
    pub commit: super::Commit,
}

/// Ends a session; frees the file if it was unlinked and this was its last session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    /// The session.
    pub session: SessionId,
    /// A final length commit, applied before the session ends.
    pub commit: Option<super::Commit>,
}

/// Says that the session's client has cut the file's chunks at its committed length
/// on every member of its chains, as an open's `cut_tail` asked (see
/// [`Opened`]): the server forgets that a writer vanished there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TailCut {
    /// The file.
    pub ino: InodeId,
    /// The session whose open was given the cut.
    pub session: SessionId,
}

/// Ends several sessions that carry no commit (closes batched by the client); a
/// session already gone is skipped. At most [`super::MAX_RELEASES`] per call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseMany {
    /// The sessions.
    pub sessions: Vec<SessionId>,
}

/// Reads one extended attribute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetXattr {
    /// The inode.
    pub ino: InodeId,
    /// Full name with namespace (`user.foo`).
    pub name: Vec<u8>,
}

/// Sets one extended attribute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetXattr {
    /// The inode.
    pub ino: InodeId,
    /// Full name with namespace.
    pub name: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// Create, replace or either.
    pub mode: XattrMode,
}

/// Lists extended attribute names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListXattr {
    /// The inode.
    pub ino: InodeId,
}

/// Removes one extended attribute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveXattr {
    /// The inode.
    pub ino: InodeId,
    /// Full name with namespace.
    pub name: Vec<u8>,
}

/// Reserves `len` bytes at the end of a file for an `O_APPEND` write: the file grows by
/// `len` at once (durably) and the reply names where the bytes go, so appenders on
/// different clients never overwrite each other.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Append {
    /// The file.
    pub ino: InodeId,
    /// Bytes to append.
    pub len: u64,
}

/// A read happened: moves the access time to now if `relatime` asks for it (older
/// than the last change, or a day old), or always if `strict`; the change time does
/// not move.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accessed {
    /// The file or directory read.
    pub ino: InodeId,
    /// The mount's `strictatime`: every access moves the access time.
    pub strict: bool,
}

/// Takes or releases a lock; a conflicting lock held by another owner is `WouldBlock`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetLock {
    /// The file.
    pub ino: InodeId,
    /// The asking client.
    pub client: ClientId,
    /// The lock.
    pub lock: LockSpec,
    /// A lock the client held before its metadata server restarted (or a standby took
    /// over) and takes back: a server in its lock grace refuses every other lock.
    pub reclaim: bool,
    /// The caller waits for the lock (`F_SETLKW`, asked again while refused): the
    /// server notes the wait, and refuses with `Deadlock` a wait that would close a
    /// cycle of waits. Not for `flock(2)` locks, which Linux never finds deadlocked.
    pub waits: bool,
}

/// Finds a lock of another owner that conflicts with `lock` (`F_GETLK`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetLock {
    /// The file.
    pub ino: InodeId,
    /// The asking client.
    pub client: ClientId,
    /// The lock that would be asked for.
    pub lock: LockSpec,
}

/// Drops every lock `owner` of `client` holds on the file (close, or the last close
/// of an open file that held a `flock`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseLocks {
    /// The file.
    pub ino: InodeId,
    /// The client.
    pub client: ClientId,
    /// The kernel's lock owner.
    pub owner: u64,
}

/// Sent by a client first on a new connection after its previous one broke: its
/// open sessions (and locks) move to this connection, instead of ending when the
/// server gives up on the broken one. At most [`super::MAX_RESUMES`] sessions per call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    /// The client, from its `Hello`.
    pub client: ClientId,
    /// The sessions the client still has open.
    pub sessions: Vec<OpenSession>,
}

/// One open session a client takes back with [`Resume`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenSession {
    /// The session.
    pub session: SessionId,
    /// Its file.
    pub ino: InodeId,
    /// It was opened for writing: a server that restarted since (and so forgot the
    /// open's mode) opens it for writing again if the caller may still write the file.
    pub writes: bool,
    /// The grant the open was given, whatever its expiry (none without keys): sealed
    /// by the cluster, it shows a server that restarted since that this key reached
    /// the file inside its scope (a scoped key reaches a file by number only after
    /// reaching it by a name inside, which a restart forgets).
    pub grant: Option<crate::grant::Grant>,
}

/// The reply to [`Resume`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    /// The sessions the server no longer has (ended, or not to be opened again).
    pub lost: Vec<SessionId>,
    /// A new grant for each session taken back (of the mode the server kept or gave
    /// it), so that a file opened for writing stays writable once the grant held
    /// before runs out; empty where the cluster runs without keys.
    pub grants: Vec<(SessionId, Grant)>,
}

/// Asks for the capabilities of the key this connection authenticated with (a mount
/// with a read-only key mounts `ro`). Answered from the connection, not the namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MyCaps;

/// Waits until every change the server answered early to `client` (see
/// [`super::ReplyTail`]) is durable: a client sends it for `fsync`, and for changes
/// it has kept a second or more. To a server that restarted, the client first sends
/// again every change it keeps, then this: the server serves other clients once each
/// client that took early replies before the restart has settled, or after its
/// `replay_grace_ms`. Answers the server's run ([`super::ReplyTail::run`]): what it
/// settled are the changes answered early by that run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settle {
    /// The client (from its `Hello`).
    pub client: ClientId,
}

/// An open session: the reply to [`Create`] and [`Open`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opened {
    /// The file's attributes after the open (and truncation).
    pub attr: Attr,
    /// The new session; the client ends it with [`Release`].
    pub session: SessionId,
    /// Where the file's chunks live (an empty stripe for non-regular files).
    pub layout: Layout,
    /// After a create, the directory's change (its times moved): the kernel asks
    /// for its attributes before the next change in that directory, and the client
    /// answers from this copy instead of asking again; a client that knows every
    /// name in the directory keeps knowing them (see [`DirChange`]). Unchanged when
    /// the create opened an existing file rather than made one
    /// ([`DirChange::changed`]).
    pub parent: Option<DirChange>,
    /// A client that held the file open went away without closing it: bytes it
    /// wrote past the committed length may lie on the data servers, where a later
    /// truncation upwards or a write past the end would show them instead of zeros.
    /// The opener cuts the chunks at `attr.size` before anything else, then sends
    /// [`TailCut`]; meanwhile other opens of the file are answered `Busy`. Only given
    /// when no other session has the file open (their writes past the end may be
    /// in flight).
    pub cut_tail: bool,
    /// The grant data servers ask for with every chunk request of the file, sealed by
    /// the metadata server (`None` for non-regular files and where the cluster runs
    /// without keys). Renewed with [`Regrant`] before it runs out.
    pub grant: Option<Grant>,
    /// With `cut_tail`, a grant for that cut alone (reads, and a truncation to
    /// `attr.size`), short-lived and never renewed: an open for reading gets a read
    /// `grant` even when it must cut first.
    pub cut_grant: Option<Grant>,
}

/// A new grant for an open session's file, as the open gave (the same mode, a new
/// expiry): served while the session is open and the client's key is not revoked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Regrant {
    /// The session.
    pub session: SessionId,
}

/// The parent of directory `dir` (the root's is itself): what the kernel asks for when
/// it turns a file handle of a directory into a path (`open_by_handle_at`, an NFS
/// export), a lookup of ".." that a name lookup refuses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupParent {
    /// The directory.
    pub dir: InodeId,
}

/// Finds `name` in directory `parent` and, if it names a regular file, opens it: a
/// [`Lookup`] and an [`Open`] in one call, for a library client that opens by path
/// (a data loader opens, reads and closes thousands of files, and each call it saves
/// is a round trip per file). What is not a regular file (a directory, a symbolic
/// link, a device) is only looked up: the client follows or refuses it as before.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenAt {
    /// The directory.
    pub parent: InodeId,
    /// The name to open.
    pub name: Vec<u8>,
    /// The session's client.
    pub client: ClientId,
    /// What the open asks to do, checked against the file's mode (no `O_TRUNC`: a
    /// truncating open goes through [`Open`]).
    pub access: OpenAccess,
    /// The caller reads the file as soon as it is open: the access time moves as an
    /// [`Accessed`] with this `strict` would move it, in the same call. `None` for an
    /// open that may never read (an open for writing only, a `noatime` client).
    pub accessed: Option<bool>,
    /// `O_APPEND`: an append-only file opens for writing only so.
    pub append: bool,
}

/// The reply to [`OpenAt`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpenedAt {
    /// A regular file, opened (boxed: an open's reply is four times a lookup's).
    Opened(Box<Opened>),
    /// Not a regular file: its attributes, nothing opened.
    Found(Attr),
}

impl OpenedAt {
    /// The attributes of what the name led to.
    pub fn attr(&self) -> &Attr {
        match self {
            OpenedAt::Opened(o) => &o.attr,
            OpenedAt::Found(a) => a,
        }
    }
}

/// A new name: its inode's attributes and its directory's change, for the same
/// reasons as [`Opened::parent`] (the reply to mkdir, mknod, symlink and link).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Made {
    /// The attributes of the inode the new name points to.
    pub attr: Attr,
    /// The directory before and after the new name.
    pub parent: DirChange,
}

/// A page of a directory listing: the reply to [`ReadDir`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirPage {
    /// Entries in name order, all after the cursor.
    pub entries: Vec<DirEntry>,
    /// No entries follow the last one.
    pub done: bool,
    /// When this page is the whole listing (asked from the top, nothing follows) and
    /// the directory did not change while it was read: the directory's ctime, at
    /// which these are all its names (see [`DirChange`]).
    pub complete_at: Option<Timestamp>,
}

/// File system totals: the reply to [`StatFs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsStats {
    /// Bytes of capacity over all data servers.
    pub total_bytes: u64,
    /// Bytes free over all data servers.
    pub free_bytes: u64,
    /// Inodes in use.
    pub files: u64,
}

/// Reads an inode's attribute flags (`lsattr`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetFlags {
    /// The inode.
    pub ino: InodeId,
}

/// Sets an inode's attribute flags (`chattr`): the owner or root, and only root sets
/// or clears `immutable` and `append` (`CAP_LINUX_IMMUTABLE`). Answers the attributes
/// (the change time moved).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetFlags {
    /// The inode: a regular file or a directory.
    pub ino: InodeId,
    /// The flags it is to have.
    pub flags: InodeFlags,
}
