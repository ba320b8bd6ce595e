//! The permission checks each file-system request runs before its change: the records
//! the rules of [`super::perm`] look at, read for the caller the request names.
//!
//! A check reads the records, then the request's method reads them again under the
//! mutation lock, so a `chmod` or `rename` landing between the two is not seen by the
//! check (a local file system holds the directory's lock across both). `create`
//! checks under the lock, with the records it changes (`Namespace::create_as`), and
//! so do `setattr` and xattr changes (`Namespace::commit_and_setattr_as`,
//! `setxattr_as`, `removexattr_as`: no check here) and a link's rule again after its
//! early check (`link_as`). A
//! check that finds the name it is about missing (a remove) or present (an add)
//! answers so itself, as of its read: a method that then found otherwise must not
//! act without the check that applies to what it found.

use super::acl::{self, Acl};
use super::names::check_name;
use super::perm::{self, Mode, XattrAccess, R, W, X};
use super::records::{decode, InodeRecord};
use super::txn::{Reads, StoreReads};
use super::{keys, ConnId, Namespace};
use crate::error::MetaError;
use proto::meta::{Caller, OpenAccess, RenameMode};
use proto::{FileKind, InodeId, SessionId};
use std::sync::Arc;

impl InodeRecord {
    /// What the permission rules look at, but for an ACL and the flags ([`mode_of`]
    /// reads those too).
    pub(super) fn mode(&self) -> Mode {
        Mode {
            kind: self.kind,
            perm: self.perm,
            uid: self.uid,
            gid: self.gid,
            acl: None,
            flags: proto::InodeFlags::default(),
        }
    }
}

/// What the permission rules look at of `ino` (record `rec`), with its access ACL and
/// its flags. Only an inode with extended attributes can have either, so most checks
/// read nothing more.
pub(super) fn mode_of(
    r: &(impl Reads + ?Sized),
    ino: InodeId,
    rec: &InodeRecord,
) -> Result<Mode, MetaError> {
    let mut m = rec.mode();
    if rec.xattr_count > 0 && rec.kind != FileKind::Symlink {
        m.acl = stored_acl(r, ino, acl::ACCESS)?.map(Arc::new);
        m.flags = super::flags::stored_flags(r, ino, rec)?;
    }
    Ok(m)
}

/// The ACL stored as attribute `name` (`acl::ACCESS` or `acl::DEFAULT`) of `ino`.
pub(super) fn stored_acl(
    r: &(impl Reads + ?Sized),
    ino: InodeId,
    name: &[u8],
) -> Result<Option<Acl>, MetaError> {
    let Some(v) = r.raw(&keys::xattr(ino, name))? else {
        return Ok(None);
    };
    let bytes: Vec<u8> = decode(&v, "ACL")?;
    // What was stored passed the same parse, so an error here is damage.
    Acl::parse(&bytes).map_err(|e| MetaError::Corrupt(format!("{ino}: {e}")))
}

/// What an open asks: its access, `O_TRUNC` and `O_APPEND`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OpenHow {
    pub(super) access: OpenAccess,
    pub(super) truncate: bool,
    pub(super) append: bool,
}

impl OpenHow {
    /// What the open of `owner` asks, not truncating (a create's truncation of an
    /// existing file is the client's setattr, checked as one).
    pub(super) fn of(owner: &super::SessionOwner) -> OpenHow {
        OpenHow {
            access: owner.access,
            truncate: false,
            append: owner.append,
        }
    }

    /// A plain open for reading.
    pub(super) fn read() -> OpenHow {
        OpenHow {
            access: OpenAccess::Read,
            truncate: false,
            append: false,
        }
    }
}

/// Checks an open `how` (`truncate` needs write) of an inode whose rules are `m`; an
/// append-only file opens for writing only with `O_APPEND` and never truncating
/// (`may_open`).
pub(super) fn check_open(c: &Caller, m: &Mode, how: OpenHow) -> Result<(), MetaError> {
    let OpenHow {
        access,
        truncate,
        append,
    } = how;
    let want = match access {
        OpenAccess::Read => R,
        OpenAccess::Write => W,
        OpenAccess::ReadWrite => R | W,
        OpenAccess::Exec => X,
    };
    let want = if truncate { want | W } else { want };
    // As Linux: a directory opens for reading only (a writable open of one would get
    // a writable grant for chunks that belong to no file).
    if m.kind == FileKind::Directory && (access.writes() || truncate) {
        return Err(MetaError::IsADirectory(
            "a directory opens for reading only".into(),
        ));
    }
    perm::check(c, m, want, "open the file so")?;
    if m.flags.append && (truncate || (access.writes() && !append)) {
        return Err(MetaError::NotPermitted(
            "an append-only file opens for writing only with O_APPEND, never truncating".into(),
        ));
    }
    Ok(())
}

/// The rules of directory `dir`.
fn dir_mode(r: &StoreReads<'_>, dir: InodeId) -> Result<Mode, MetaError> {
    mode_of(r, dir, &r.dir(dir)?)
}

impl Namespace {
    fn mode_of(&self, ino: InodeId) -> Result<Mode, MetaError> {
        let r = self.reads();
        mode_of(&r, ino, &r.inode(ino)?)
    }

    /// Search permission on directory `dir` (a lookup in it).
    pub(super) fn may_search(&self, c: &Caller, dir: InodeId) -> Result<(), MetaError> {
        let m = dir_mode(&self.reads(), dir)?;
        perm::check(c, &m, X, "search the directory")
    }

    /// Read permission on directory `dir` (a listing).
    pub(super) fn may_list(&self, c: &Caller, dir: InodeId) -> Result<(), MetaError> {
        let m = dir_mode(&self.reads(), dir)?;
        perm::check(c, &m, R, "list the directory")
    }

    /// Adding `name` to `dir` (mkdir, mknod, symlink, link). A malformed name is refused
    /// first, as a local path walk refuses it before any permission check; then, as
    /// Linux's `filename_create` and `may_create` order them: search (EACCES), a name
    /// that exists (EEXIST, even where the caller could not write: `mkdir -p` of an
    /// existing directory relies on it, and before the device and link rules too),
    /// then write. The name's existence is answered here, as of this read: a method that
    /// found it gone later must not skip the write check.
    pub(super) fn may_add(&self, c: &Caller, dir: InodeId, name: &[u8]) -> Result<(), MetaError> {
        self.may_add_then(c, (dir, name), |_| Ok(()))
    }

    /// [`Self::may_add`] with `rule` checked after EEXIST and before write on the
    /// directory, where Linux checks an operation's own rule (`may_linkat`).
    fn may_add_then(
        &self,
        c: &Caller,
        (dir, name): (InodeId, &[u8]),
        rule: impl FnOnce(&StoreReads<'_>) -> Result<(), MetaError>,
    ) -> Result<(), MetaError> {
        check_name(name)?;
        let r = self.reads();
        let m = dir_mode(&r, dir)?;
        perm::check(c, &m, X, "search the directory")?;
        super::entries::ensure_absent(&r, dir, name)?;
        rule(&r)?;
        perm::may_create(c, &m)
    }

    /// An unnamed file in `dir` (`O_TMPFILE`): as a create of a new name, write and
    /// search on the directory.
    pub(super) fn may_make_tmpfile(&self, c: &Caller, dir: InodeId) -> Result<(), MetaError> {
        let m = dir_mode(&self.reads(), dir)?;
        perm::may_create(c, &m)
    }

    /// Removing `name` from `dir` (unlink, rmdir): a malformed name (EINVAL), search
    /// (EACCES), a missing name (`NotFound`, answered here as of this read: a name that
    /// appeared before the method ran is not removed without the checks below), then
    /// write and the sticky rule.
    pub(super) fn may_remove(
        &self,
        c: &Caller,
        dir: InodeId,
        name: &[u8],
    ) -> Result<(), MetaError> {
        check_name(name)?;
        let r = self.reads();
        let d = dir_mode(&r, dir)?;
        perm::check(c, &d, X, "search the directory")?;
        let entry = r.entry(dir, name)?;
        let victim_ino = InodeId(entry.ino);
        let Some(victim) = r.try_inode(victim_ino)? else {
            return Ok(());
        };
        perm::may_delete(c, &d, &mode_of(&r, victim_ino, &victim)?)
    }

    /// A hard link of `ino` into `dir` as `name`; the rule of hard links to others'
    /// files only if the caller's kernel did not apply its own (`kernel_checked`). In
    /// Linux's order: a malformed name, search (EACCES), an existing name (EEXIST), the
    /// rule (`may_linkat`, EPERM), then write on the directory (`may_create`).
    pub(super) fn may_link(
        &self,
        c: &Caller,
        ino: InodeId,
        (dir, name): (InodeId, &[u8]),
        kernel_checked: bool,
    ) -> Result<(), MetaError> {
        self.may_add_then(c, (dir, name), |r| {
            if kernel_checked {
                return Ok(());
            }
            perm::may_link(c, &mode_of(r, ino, &r.inode(ino)?)?)
        })?;
        // After write on the directory, as `vfs_link` checks them; the kernel applied
        // its hard-link rule, but it does not know the flags.
        perm::check_linkable(&self.mode_of(ino)?)
    }

    /// A rename of `name` in `dir` to `new_name` in `new_dir`: the source's name is
    /// removed, the target's replaced (or added), and a directory moved to another
    /// parent needs write on itself (its `..` changes).
    pub(super) fn may_rename(
        &self,
        c: &Caller,
        (dir, name): (InodeId, &[u8]),
        (new_dir, new_name): (InodeId, &[u8]),
        mode: RenameMode,
    ) -> Result<(), MetaError> {
        self.may_remove(c, dir, name)?;
        let r = self.reads();
        let target = r.dirent(new_dir, new_name)?;
        // A target that goes meanwhile is added, not replaced: write and search on its
        // directory (`may_add`'s EEXIST is no answer for a rename, which replaces).
        let add = || -> Result<(), MetaError> {
            check_name(new_name)?;
            perm::may_create(c, &dir_mode(&r, new_dir)?)
        };
        match target {
            Some(_) => match self.may_remove(c, new_dir, new_name) {
                Err(MetaError::NotFound(_)) => add()?,
                other => other?,
            },
            None => add()?,
        }
        if dir == new_dir {
            return Ok(());
        }
        let moved_dir = |entry: Option<super::records::DirentRecord>| -> Result<(), MetaError> {
            match entry {
                Some(e) if e.kind == FileKind::Directory => {
                    perm::check(c, &self.mode_of(InodeId(e.ino))?, W, "move the directory")
                }
                _ => Ok(()),
            }
        };
        moved_dir(r.dirent(dir, name)?)?;
        if mode == RenameMode::Exchange {
            moved_dir(target)?;
        }
        Ok(())
    }

    /// An open of `ino`.
    pub(super) fn may_open(&self, c: &Caller, ino: InodeId, how: OpenHow) -> Result<(), MetaError> {
        check_open(c, &self.mode_of(ino)?, how)
    }

    /// A length commit or an append to `ino`: a write session of this connection on
    /// the file, or write permission (a commit outlives nothing: the writer had
    /// the file open when it wrote).
    pub(super) fn may_commit(
        &self,
        c: &Caller,
        ino: InodeId,
        conn: ConnId,
    ) -> Result<(), MetaError> {
        // A session opened for writing before the file was flagged still commits what
        // it wrote (README, "Not yet").
        if self.writes(ino, conn) {
            return Ok(());
        }
        perm::check_commit(c, &self.mode_of(ino)?)
    }

    /// An extended attribute access.
    pub(super) fn may_xattr(
        &self,
        c: &Caller,
        ino: InodeId,
        name: &[u8],
        access: XattrAccess,
    ) -> Result<(), MetaError> {
        perm::check_xattr(c, &self.mode_of(ino)?, name, access)
    }

    /// Whether connection `conn` holds a session that may write `ino`.
    fn writes(&self, ino: InodeId, conn: ConnId) -> bool {
        self.holds(ino, conn, true)
    }

    /// Whether connection `conn` holds a session on `ino` (a writing one if `write`).
    fn holds(&self, ino: InodeId, conn: ConnId, write: bool) -> bool {
        self.state.lock().holds(ino, conn, write)
    }

    /// A session named by a release or a tail cut: only its own connection's.
    /// Another connection's is answered as if it did not exist (`Stale`), as session
    /// ids are easy to guess. A release carrying a length commit (`commit`) needs a
    /// session opened for writing, or write permission.
    pub(super) fn may_end(
        &self,
        c: &Caller,
        session: SessionId,
        conn: ConnId,
        commit: bool,
    ) -> Result<(), MetaError> {
        let s = match self.state.lock().sessions.get(&session) {
            Some(s) if s.conn != conn => return Err(MetaError::Stale(format!("no {session}"))),
            Some(s) => *s,
            None => return Ok(()),
        };
        // The commit is the file's, shared by this client's handles: a write session
        // of the same connection on the file may send it with any handle's release.
        if !commit || s.write || self.writes(s.ino, conn) {
            return Ok(());
        }
        // A directory removed while open has no inode left: the release skips it.
        let r = self.reads();
        match r.try_inode(s.ino)? {
            Some(rec) => perm::check_commit(c, &mode_of(&r, s.ino, &rec)?),
            None => Ok(()),
        }
    }

    /// The sessions of `sessions` that connection `conn` may end ([`Self::may_end`]);
    /// the others are skipped as a `ReleaseMany` skips sessions already gone.
    pub(super) fn own_sessions(&self, sessions: &[SessionId], conn: ConnId) -> Vec<SessionId> {
        let st = self.state.lock();
        let theirs = |s: &SessionId| st.sessions.get(s).is_some_and(|x| x.conn != conn);
        sessions.iter().copied().filter(|s| !theirs(s)).collect()
    }

    /// Taking a lock on `ino`: the file must be open on this connection, as a lock is
    /// taken on an open descriptor (`fcntl`, `flock`); without one, EBADF's code.
    pub(super) fn may_lock(&self, ino: InodeId, conn: ConnId) -> Result<(), MetaError> {
        if self.holds(ino, conn, false) {
            return Ok(());
        }
        Err(MetaError::Stale(format!(
            "{ino} is not open on this connection"
        )))
    }
}
