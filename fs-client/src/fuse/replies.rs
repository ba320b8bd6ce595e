//! What the callbacks in `ops.rs` share: replies with an errno, conversions between
//! fuser's types and Tessera's, and the attribute and entry replies.

use super::attr::fuse_attr;
use super::dir::Listed;
use super::{errno_of, Inner};
use crate::error::ClientError;
use crate::file::FileHandle;
use fuser::{
    Errno, FileHandle as Fh, Generation, INodeNo, LockOwner, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
};
use proto::meta::{LockKind, LockSpec, OpenAccess};
use proto::{Attr, FileKind, InodeId, TimeSet, Timestamp};
use std::time::Duration;
use tracing::debug;

/// Reply types that can carry an errno.
pub(super) trait Fail {
    fn fail(self, e: Errno);
}

macro_rules! impl_fail {
    ($($t:ty),*) => { $(impl Fail for $t { fn fail(self, e: Errno) { self.error(e) } })* };
}
impl_fail!(
    ReplyAttr,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyEmpty,
    ReplyEntry,
    ReplyIoctl,
    ReplyLock,
    ReplyLseek,
    ReplyOpen,
    ReplyStatfs,
    ReplyWrite,
    ReplyXattr
);

/// Sends `ok`'s reply on success, the mapped errno on failure.
pub(super) fn finish<R: Fail, T>(reply: R, r: Result<T, ClientError>, ok: impl FnOnce(R, T)) {
    match r {
        Ok(v) => ok(reply, v),
        Err(e) => {
            debug!(error = %e, "request failed");
            reply.fail(errno_of(&e))
        }
    }
}

/// Whether open flags allow writing (no read-around store while such an open lasts).
pub(super) fn writable(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY
}

/// What an open's `flags` say of its handle beyond the access checked: it writes (so
/// counts as a writer), or it leaves the access time (`O_NOATIME`). True when its first
/// read would have moved the access time but for `O_NOATIME`.
pub(super) async fn opened_with(fh: &FileHandle, flags: i32) -> bool {
    let skipped = flags & libc::O_NOATIME != 0 && fh.reads_move_atime();
    if skipped {
        fh.atime_settled();
    }
    if writable(flags) {
        fh.mark_writer().await;
    }
    skipped
}

/// The kernel's `__FMODE_EXEC`, set in the flags of an open made by `execve`.
const FMODE_EXEC: i32 = 0o40;

/// What an open with `flags` asks to do, for the server to check against the mode.
pub(super) fn open_access(flags: i32) -> OpenAccess {
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => OpenAccess::Write,
        libc::O_RDWR => OpenAccess::ReadWrite,
        // An exec needs the execute bit, not the read bit (a 0711 program runs).
        _ if flags & FMODE_EXEC != 0 => OpenAccess::Exec,
        _ => OpenAccess::Read,
    }
}

pub(super) fn ino(i: INodeNo) -> InodeId {
    InodeId(i.0)
}

/// The groups of the process behind `req` (its file system group and supplementary
/// groups), or `None` if it may keep setuid and setgid when it changes a file
/// (`CAP_FSETID`). Read from `/proc`; a process gone meanwhile counts as root does if
/// its uid is 0, and as a member of its own group only otherwise.
pub(super) fn unprivileged_groups(req: &Request) -> Option<Vec<u32>> {
    const CAP_FSETID_BIT: u64 = 1 << 4;
    let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", req.pid())) else {
        return (req.uid() != 0).then(|| vec![req.gid()]);
    };
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name));
    let caps = field("CapEff:").and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
    if caps.unwrap_or(0) & CAP_FSETID_BIT != 0 {
        return None;
    }
    // `Gid:` lists the real, effective, saved and file system groups.
    let fsgid = field("Gid:").and_then(|v| v.split_whitespace().nth(3)?.parse().ok());
    let mut groups: Vec<u32> = field("Groups:")
        .map(|v| {
            v.split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    groups.push(fsgid.unwrap_or(req.gid()));
    Some(groups)
}

pub(super) fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(Timestamp::from(t)),
    }
}

impl Inner {
    pub(super) fn entry(&self, reply: ReplyEntry, r: Result<Attr, ClientError>) {
        self.aged_entry(reply, r, Duration::ZERO)
    }

    /// [`Inner::entry`] for an answer the server gave `age` ago: the kernel trusts it
    /// for the rest of the entry TTL only.
    pub(super) fn aged_entry(
        &self,
        reply: ReplyEntry,
        r: Result<Attr, ClientError>,
        age: Duration,
    ) {
        let (ttl, blk) = (self.entry_ttl.saturating_sub(age), self.blksize);
        if let Ok(a) = &r {
            self.note_dir(a);
        }
        finish(reply, r, |reply, a| {
            reply.entry(&ttl, &fuse_attr(&a, blk), Generation(0))
        });
    }

    pub(super) fn attr(&self, reply: ReplyAttr, r: Result<Attr, ClientError>) {
        let (ttl, blk) = (self.attr_ttl, self.blksize);
        if let Ok(a) = &r {
            self.note_dir(a);
        }
        finish(reply, r, |reply, a| reply.attr(&ttl, &fuse_attr(&a, blk)));
    }

    /// Entries of open directory `fh` from `offset` on: at most `max`, with attributes if
    /// `plus`; `None` if `fh` is not an open directory.
    pub(super) async fn list(
        &self,
        i: INodeNo,
        fh: Fh,
        offset: u64,
        max: usize,
        plus: bool,
    ) -> Option<Result<Vec<Listed>, ClientError>> {
        let dir = self.dirs.lock().get(&fh.0).map(|d| d.handle.clone())?;
        let mut dir = dir.lock().await;
        let page = dir.entries_from(&self.client, offset, max, plus);
        // A listing from the top reads the directory: its atime moves as `relatime` says
        // (ext4 does this on every readdir; once per listing is what shows).
        Some(if offset == 0 {
            tokio::join!(page, self.client.accessed(ino(i))).0
        } else {
            page.await
        })
    }
}

/// Attributes for "." and ".." in a `readdirplus` reply, which the kernel skips.
pub(crate) fn dot_attr(ino: InodeId, kind: FileKind) -> Attr {
    Attr {
        xattr_count: 0,
        ino,
        kind,
        perm: 0o755,
        nlink: 2,
        uid: 0,
        gid: 0,
        rdev: 0,
        size: 0,
        atime: Timestamp::default(),
        mtime: Timestamp::default(),
        ctime: Timestamp::default(),
        blocks: 0,
    }
}

/// A lock request from the kernel's fields; `None` for an unknown type.
pub(super) fn lock_spec(
    owner: LockOwner,
    start: u64,
    end: u64,
    typ: i32,
    pid: u32,
) -> Option<LockSpec> {
    let kind = match typ {
        libc::F_RDLCK => LockKind::Read,
        libc::F_WRLCK => LockKind::Write,
        libc::F_UNLCK => LockKind::Unlock,
        _ => return None,
    };
    Some(LockSpec {
        owner: owner.0,
        pid,
        start,
        end,
        kind,
    })
}

pub(super) fn lock_type(kind: LockKind) -> i32 {
    match kind {
        LockKind::Read => libc::F_RDLCK,
        LockKind::Write => libc::F_WRLCK,
        LockKind::Unlock => libc::F_UNLCK,
    }
}

pub(super) fn xattr_reply(reply: ReplyXattr, size: u32, data: Vec<u8>) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if data.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(&data);
    }
}
