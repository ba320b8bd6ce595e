//! Who may do what to an inode: the permission rules of a local Linux file system
//! (`fs/namei.c`, `fs/attr.c`, `fs/xattr.c`), as pure functions of the caller and the
//! attributes involved. The server applies them to the user each request names, so a
//! client that skips its kernel's checks (or speaks the wire itself) gets no more than
//! that user would get on a local disk.
//!
//! Each refusal is the error Linux gives: a missing mode bit is `PermissionDenied`
//! (EACCES), an operation reserved to the owner or root is `NotPermitted` (EPERM), and
//! so is whatever an inode's flags forbid (`chattr +i`, `+a`: root included).

use super::acl::Acl;
use crate::error::MetaError;
use proto::meta::Caller;
use proto::{FileKind, InodeFlags, SetAttr, TimeSet};
use std::sync::Arc;

/// Read permission (the `r` bit).
pub const R: u32 = 4;
/// Write permission (the `w` bit).
pub const W: u32 = 2;
/// Execute or search permission (the `x` bit).
pub const X: u32 = 1;

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_ISVTX: u32 = 0o1000;

/// What the rules look at of an inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mode {
    /// The inode's kind.
    pub kind: FileKind,
    /// Permission bits with setuid, setgid and sticky (`0o7777`).
    pub perm: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Its POSIX access ACL, if it has one that says more than the mode.
    pub acl: Option<Arc<Acl>>,
    /// Its attribute flags (immutable, append only).
    pub flags: InodeFlags,
}

/// Whether `c` has every access in `want` (`R | W | X`) to `m` (`generic_permission`):
/// the owner's bits for the owner; for anyone else the file's ACL if it has one and
/// the mode's group bits are not all clear ([`Acl::permits`]), else the group's bits for a member of the file's group and the
/// others' otherwise. Root has every access, but execute on a non-directory only if
/// some execute bit is set.
pub fn may(c: &Caller, m: &Mode, want: u32) -> bool {
    if c.is_root() {
        let exec_of_file = want & X != 0 && m.kind != FileKind::Directory;
        return !exec_of_file || m.perm & 0o111 != 0;
    }
    if c.uid == m.uid {
        return (m.perm >> 6) & 7 & want == want;
    }
    // As Linux (`acl_permission_check`): an ACL counts only while the mode's group
    // bits (its mask) grant something; a chmod to no group bits leaves the others'.
    if let Some(acl) = m.acl.as_ref().filter(|_| m.perm & 0o070 != 0) {
        return acl.permits(c, m.gid, want);
    }
    let bits = if c.in_group(m.gid) {
        m.perm >> 3
    } else {
        m.perm
    };
    bits & 7 & want == want
}

/// `PermissionDenied` unless [`may`]; `what` names the access for the message. Write
/// access to an immutable inode is `NotPermitted` for everyone (`inode_permission`).
pub fn check(c: &Caller, m: &Mode, want: u32, what: &str) -> Result<(), MetaError> {
    if want & W != 0 && m.flags.immutable {
        return Err(flagged(&format!("{what}: it is immutable")));
    }
    if may(c, m, want) {
        return Ok(());
    }
    Err(MetaError::PermissionDenied(format!(
        "uid {} may not {what} (mode {:o}, owner {}:{})",
        c.uid, m.perm, m.uid, m.gid
    )))
}

/// Whether `c` owns `m` or is root (`inode_owner_or_capable`).
pub fn owns(c: &Caller, m: &Mode) -> bool {
    c.is_root() || c.uid == m.uid
}

/// May `c` add a name to directory `dir` (`may_create`): write and search on it.
pub fn may_create(c: &Caller, dir: &Mode) -> Result<(), MetaError> {
    check(c, dir, W | X, "add a name to the directory")
}

/// May `c` make a special file of `kind` (`vfs_mknod`): a block or character device
/// node only as root (`CAP_MKNOD`, which no other user has), else EPERM; a FIFO or a
/// socket anyone who may add the name.
pub fn may_mknod(c: &Caller, kind: FileKind) -> Result<(), MetaError> {
    let device = matches!(kind, FileKind::BlockDevice | FileKind::CharDevice);
    if device && !c.is_root() {
        return Err(MetaError::NotPermitted(format!(
            "uid {} may not make a device node (only root may)",
            c.uid
        )));
    }
    Ok(())
}

/// May `c` remove (or rename away) the name of `victim` from `dir` (`may_delete`):
/// write and search on the directory (EACCES), not from an append-only directory, then,
/// in a sticky directory, only the owner of the directory or of the victim, or root,
/// and never an immutable or append-only victim (EPERM).
pub fn may_delete(c: &Caller, dir: &Mode, victim: &Mode) -> Result<(), MetaError> {
    check(c, dir, W | X, "remove a name from the directory")?;
    if dir.flags.append {
        return Err(flagged("remove a name from an append-only directory"));
    }
    if dir.perm & S_ISVTX != 0 && !owns(c, dir) && !owns(c, victim) {
        return Err(MetaError::NotPermitted(format!(
            "uid {} may not remove a name of uid {} from a sticky directory of uid {}",
            c.uid, victim.uid, dir.uid
        )));
    }
    kept(victim, "remove or replace its name")
}

/// `NotPermitted` for a change an inode's flags forbid.
fn flagged(what: &str) -> MetaError {
    MetaError::NotPermitted(format!("may not {what}"))
}

/// `NotPermitted` if `m` is immutable or append only: what neither may undergo (its
/// name removed, a hard link to it, an extended attribute changed).
fn kept(m: &Mode, what: &str) -> Result<(), MetaError> {
    match (m.flags.immutable, m.flags.append) {
        (true, _) => Err(flagged(&format!("{what}: it is immutable"))),
        (_, true) => Err(flagged(&format!("{what}: it is append only"))),
        _ => Ok(()),
    }
}

/// May `m` get another hard link (`vfs_link`): not if immutable or append only, a rule
/// of the inode that the caller's kernel cannot apply itself (it does not know the
/// flags).
pub fn check_linkable(m: &Mode) -> Result<(), MetaError> {
    kept(m, "link the file")
}

/// May `c` make a hard link to `m` (`may_linkat` with `fs.protected_hardlinks`, the
/// default of every distribution): the owner, root, or a caller who may read and
/// write a regular file that is neither setuid nor setgid-executable.
pub fn may_link(c: &Caller, m: &Mode) -> Result<(), MetaError> {
    let safe = m.kind == FileKind::Regular
        && m.perm & S_ISUID == 0
        && m.perm & (S_ISGID | 0o010) != (S_ISGID | 0o010);
    if owns(c, m) || (safe && may(c, m, R | W)) {
        return Ok(());
    }
    Err(MetaError::NotPermitted(format!(
        "uid {} may not link a file of uid {}",
        c.uid, m.uid
    )))
}

/// What a `setattr` may change, given what the caller holds besides mode bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The caller's connection has the file open for writing: a truncation through it
    /// needs no write bit (`ftruncate` on a descriptor opened for writing).
    pub write_session: bool,
}

/// Checks a `setattr` of `m` by `c` (`setattr_prepare`, `do_truncate`, `utimes`): a
/// truncation needs write permission, a chown root (or the owner keeping the owner),
/// a chgrp the owner moving to a group it is in, a chmod the owner, explicit times
/// the owner, times set to now the owner or write permission. See [`chmod_mode`]
/// for the setgid bit a chmod may not keep.
pub fn check_setattr(c: &Caller, m: &Mode, set: &SetAttr, held: Held) -> Result<(), MetaError> {
    let explicit = |t: Option<TimeSet>| matches!(t, Some(TimeSet::At(_)));
    if set.size.is_some() && !held.write_session {
        check(c, m, W, "truncate the file")?;
    }
    check_setattr_flags(m, set)?;
    let denied = |what: &str| {
        Err(MetaError::NotPermitted(format!(
            "uid {} may not {what} of a file of uid {}",
            c.uid, m.uid
        )))
    };
    if let Some(uid) = set.uid {
        let keeps_own = c.uid == m.uid && uid == m.uid;
        if !(c.is_root() || keeps_own) {
            return denied("change the owner");
        }
    }
    if let Some(gid) = set.gid {
        let owner_to_own_group = c.uid == m.uid && (gid == m.gid || c.in_group(gid));
        if !(c.is_root() || owner_to_own_group) {
            return denied("change the group");
        }
    }
    if let Some(perm) = set.perm {
        // The kernel drops setuid and setgid itself before a write by someone else
        // (`file_remove_privs`, no ownership needed): a change that only clears them
        // is allowed to whoever may write the file.
        let writer_kills = only_kills(m.perm, perm) && may(c, m, W);
        if !(owns(c, m) || writer_kills) {
            return denied("change the mode");
        }
    }
    if explicit(set.atime) || explicit(set.mtime) {
        if !owns(c, m) {
            return denied("set the times");
        }
    } else if (set.atime.is_some() || set.mtime.is_some()) && !owns(c, m) {
        check(c, m, W, "set the times to now")?;
    }
    Ok(())
}

/// What an inode's flags refuse of a setattr (`ext4_setattr`, `notify_change`,
/// `do_truncate`): an immutable inode takes no change at all; an append-only one no
/// truncation, chmod, chown or explicit times, only times set to now, and a mode change
/// that only clears setuid and setgid (what the kernel sends before a write, as
/// `file_remove_privs`, which `notify_change` lets through).
fn check_setattr_flags(m: &Mode, set: &SetAttr) -> Result<(), MetaError> {
    if m.flags.immutable && *set != SetAttr::default() {
        return Err(flagged("change the attributes: it is immutable"));
    }
    if !m.flags.append {
        return Ok(());
    }
    let explicit = |t: Option<TimeSet>| matches!(t, Some(TimeSet::At(_)));
    // Clearing a bit that is set: the kernel sends nothing else before a write.
    let kills_only = set
        .perm
        .is_none_or(|p| only_kills(m.perm, p) && m.perm & !p & (S_ISUID | S_ISGID) != 0);
    let forbidden = set.size.is_some()
        || !kills_only
        || set.uid.is_some()
        || set.gid.is_some()
        || explicit(set.atime)
        || explicit(set.mtime);
    if forbidden {
        return Err(flagged(
            "truncate, chmod, chown or set the times: it is append only",
        ));
    }
    Ok(())
}

/// Whether a chmod from `old` to `new` only clears setuid and setgid.
fn only_kills(old: u32, new: u32) -> bool {
    let (new, kills) = (new & 0o7777, S_ISUID | S_ISGID);
    new & !old == 0 && (old & !new) & !kills == 0
}

/// May `c` commit writes to `m` without a session opened for writing (a length and
/// mtime, as `Commit` and a release's commit carry): write permission, and not to a
/// flagged inode (only an open for writing made before the flag may still commit).
pub fn check_commit(c: &Caller, m: &Mode) -> Result<(), MetaError> {
    kept(m, "commit writes without an open for writing")?;
    check(c, m, W, "commit writes to the file")
}

/// The mode a chmod to `perm` by `c` stores: setgid dropped when `c` is neither root
/// nor in the file's group (`setattr_prepare`), so nobody makes a file run with a
/// group they are not in.
pub fn chmod_mode(c: &Caller, gid: u32, perm: u32) -> u32 {
    if c.is_root() || c.in_group(gid) {
        perm
    } else {
        perm & !S_ISGID
    }
}

/// The mode a change of owner or group (`set`, which changes no mode) leaves on `m`
/// (`chown_common`, `setattr_should_drop_sgid`): a non-directory loses setuid, and
/// setgid when it is group-executable or `c` is neither root nor in the file's group;
/// `None` when that changes nothing. A mount's kernel sends that mode itself with the
/// chown; a client without one (the library API) relies on this.
pub fn chown_mode(c: &Caller, m: &Mode, set: &SetAttr) -> Option<u32> {
    if (set.uid.is_none() && set.gid.is_none()) || set.perm.is_some() {
        return None;
    }
    if m.kind == FileKind::Directory {
        return None;
    }
    let mut kill = S_ISUID;
    if m.perm & S_ISGID != 0 && (m.perm & 0o010 != 0 || !(c.is_root() || c.in_group(m.gid))) {
        kill |= S_ISGID;
    }
    (m.perm & kill != 0).then_some(m.perm & !kill)
}

/// The mode a new non-directory of group `gid` made by `c` keeps (`mode_strip_sgid`):
/// a group-executable setgid file in a group `c` is not in (given by a setgid
/// directory) loses setgid, so nobody makes a program that runs with a group they
/// are not in.
pub fn new_file_mode(c: &Caller, gid: u32, perm: u32) -> u32 {
    if perm & 0o010 != 0 {
        chmod_mode(c, gid, perm)
    } else {
        perm
    }
}

/// How an extended attribute is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrAccess {
    /// `getxattr`.
    Read,
    /// `setxattr`.
    Write,
    /// `removexattr`.
    Remove,
}

/// Checks an access to extended attribute `name` of `m` by `c` (`xattr_permission`,
/// and the capability check of `security.*` writes): a POSIX ACL is read by anyone and
/// set by the owner or root (not on a symlink); `trusted.*` is root's only
/// (EPERM to write, ENODATA to read, as if absent); `security.*` is written by root
/// only and read by anyone, except that whoever may write a file may remove its
/// `security.capability`; `user.*` lives on regular files and directories only, needs
/// read or write permission, and in a sticky directory is written by its owner.
///
/// The exception is the kernel's: a write, truncation or fallocate of a file with
/// capabilities removes them first (`file_remove_privs`), as the writer, with no check
/// of its own; on a mount that removal arrives here as the writer's `removexattr`. An
/// explicit `removexattr` of it needs `CAP_SETFCAP`, which the caller's kernel checks
/// before it sends one.
pub fn check_xattr(
    c: &Caller,
    m: &Mode,
    name: &[u8],
    access: XattrAccess,
) -> Result<(), MetaError> {
    // An append-only file's writer too (`file_remove_privs` removes it without
    // `xattr_permission`'s flag rule); an immutable file takes no write.
    if access == XattrAccess::Remove
        && name == proto::CAPABILITY_XATTR
        && m.kind == FileKind::Regular
        && !m.flags.immutable
        && (owns(c, m) || may(c, m, W))
    {
        return Ok(());
    }
    if access != XattrAccess::Read {
        // `xattr_permission`: before any other rule.
        kept(m, "change its extended attributes")?;
    }
    let write = access != XattrAccess::Read;
    let not_permitted = || {
        Err(MetaError::NotPermitted(format!(
            "uid {} may not change this attribute",
            c.uid
        )))
    };
    let absent = || Err(MetaError::NoData("no such attribute".into()));
    if name == proto::ACL_ACCESS_XATTR || name == proto::ACL_DEFAULT_XATTR {
        // Anyone may read a file's ACLs; only its owner or root set them (`vfs_set_acl`).
        if m.kind == FileKind::Symlink {
            return Err(MetaError::NotSupported("a symlink has no ACL".into()));
        }
        return if write && !owns(c, m) {
            not_permitted()
        } else {
            Ok(())
        };
    }
    if name.starts_with(b"trusted.") {
        return match (c.is_root(), write) {
            (true, _) => Ok(()),
            (false, true) => not_permitted(),
            (false, false) => absent(),
        };
    }
    if name.starts_with(b"security.") {
        return if write && !c.is_root() {
            not_permitted()
        } else {
            Ok(())
        };
    }
    if !matches!(m.kind, FileKind::Regular | FileKind::Directory) {
        return if write { not_permitted() } else { absent() };
    }
    if write && m.kind == FileKind::Directory && m.perm & S_ISVTX != 0 && !owns(c, m) {
        return not_permitted();
    }
    let (want, what) = if write {
        (W, "write attributes")
    } else {
        (R, "read attributes")
    };
    check(c, m, want, what)
}

/// May `c` set `m`'s flags to `flags` (`vfs_fileattr_set`, `ext4_ioctl_setflags`): the
/// owner or root; setting or clearing `immutable` or `append` only root
/// (`CAP_LINUX_IMMUTABLE`); and while the inode stays immutable nothing else changes.
pub fn check_setflags(c: &Caller, m: &Mode, flags: InodeFlags) -> Result<(), MetaError> {
    if !owns(c, m) {
        return Err(MetaError::NotPermitted(format!(
            "uid {} may not set the flags of a file of uid {}",
            c.uid, m.uid
        )));
    }
    if flags != m.flags && !c.is_root() {
        return Err(MetaError::NotPermitted(format!(
            "uid {} may not set or clear the immutable or append-only flag (only root may)",
            c.uid
        )));
    }
    if m.flags.immutable && flags.immutable && flags != m.flags {
        return Err(flagged(
            "change the flags of an immutable file but immutable",
        ));
    }
    Ok(())
}

/// Whether `c` sees attribute `name` in a listing: `trusted.*` is hidden from all but
/// root (the listing itself needs no permission).
pub fn lists_xattr(c: &Caller, name: &[u8]) -> bool {
    c.is_root() || !name.starts_with(b"trusted.")
}

#[cfg(test)]
#[path = "perm_tests.rs"]
mod tests;
