//! Extended attributes, one key per attribute under `X`+ino; POSIX ACLs among them
//! (`acl.rs`), whose changes also change the mode and pass on to new inodes.

use super::access::stored_acl;
use super::acl::{self, Acl};
use super::names::{check_xattr_name, check_xattr_value};
use super::perm;
use super::records::{decode, encode, InodeRecord};
use super::txn::Reads;
use super::txn::Txn;
use super::{keys, now, Namespace, MAX_XATTRS_PER_INODE};
use super::{MAX_XATTR_NAMES_BYTES, MAX_XATTR_TOTAL_BYTES};
use crate::error::{show, MetaError};
use proto::meta::{Caller, XattrMode};
use proto::{FileKind, InodeId, SetAttr};

fn is_acl(name: &[u8]) -> bool {
    name == acl::ACCESS || name == acl::DEFAULT
}

impl Namespace {
    /// The value of extended attribute `name` of `ino`.
    pub fn getxattr(&self, ino: InodeId, name: &[u8]) -> Result<Vec<u8>, MetaError> {
        check_xattr_name(name)?;
        let r = self.reads();
        r.inode(ino)?;
        match r.raw(&keys::xattr(ino, name))? {
            Some(v) => decode(&v, "xattr value"),
            None => Err(MetaError::NoData(format!("{} on {ino}", show(name)))),
        }
    }

    /// Sets extended attribute `name` of `ino` to `value`, as `mode` allows.
    pub fn setxattr(
        &self,
        ino: InodeId,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<(), MetaError> {
        self.setxattr_as(ino, (name, value), mode, None)
    }

    /// [`Self::setxattr`] for `caller` (`None`: unchecked), whose permission is checked
    /// on the record it changes, under the lock (so a chmod or chown landing while the
    /// request waits is not missed).
    pub(super) fn setxattr_as(
        &self,
        ino: InodeId,
        (name, value): (&[u8], &[u8]),
        mode: XattrMode,
        caller: Option<&Caller>,
    ) -> Result<(), MetaError> {
        check_xattr_name(name)?;
        check_xattr_value(value)?;
        self.mutate(|txn, _| {
            let mut rec = txn.inode(ino)?;
            if let Some(c) = caller {
                let m = super::access::mode_of(txn, ino, &rec)?;
                perm::check_xattr(c, &m, name, perm::XattrAccess::Write)?;
            }
            if is_acl(name) {
                return set_acl(txn, (ino, &mut rec), (name, value), caller);
            }
            super::dirlayout::check(name, value)?;
            let key = keys::xattr(ino, name);
            let exists = txn.raw(&key)?.is_some();
            match (mode, exists) {
                (XattrMode::Create | XattrMode::Neither, true) => {
                    return Err(MetaError::AlreadyExists(format!("{} on {ino}", show(name))));
                }
                (XattrMode::Replace | XattrMode::Neither, false) => {
                    return Err(MetaError::NoData(format!("{} on {ino}", show(name))));
                }
                _ => {}
            }
            check_room(txn, ino, name, value)?;
            put_xattr(txn, (ino, &mut rec), (name, value), exists)?;
            rec.changed_at(now());
            txn.put_inode(ino, &rec)
        })
    }

    /// The names of every extended attribute of `ino`, in key (byte) order.
    pub fn listxattr(&self, ino: InodeId) -> Result<Vec<Vec<u8>>, MetaError> {
        let r = self.reads();
        r.inode(ino)?;
        let prefix = keys::xattr_prefix(ino);
        let limit = MAX_XATTRS_PER_INODE as usize;
        let rows = r.scan(&prefix, &keys::prefix_end(&prefix), limit)?;
        Ok(rows
            .into_iter()
            .map(|(k, _)| k[prefix.len()..].to_vec())
            // The flags are kept as an attribute, but are none (`flags`).
            .filter(|name| name != super::flags::FLAGS_NAME)
            .collect())
    }

    /// Removes extended attribute `name` of `ino`.
    pub fn removexattr(&self, ino: InodeId, name: &[u8]) -> Result<(), MetaError> {
        self.removexattr_as(ino, name, None)
    }

    /// [`Self::removexattr`] for `caller` (`None`: unchecked), checked under the lock as
    /// [`Self::setxattr_as`] is.
    pub(super) fn removexattr_as(
        &self,
        ino: InodeId,
        name: &[u8],
        caller: Option<&Caller>,
    ) -> Result<(), MetaError> {
        check_xattr_name(name)?;
        self.mutate_answering(|txn, _| {
            let mut rec = txn.inode(ino)?;
            if let Some(c) = caller {
                let m = super::access::mode_of(txn, ino, &rec)?;
                perm::check_xattr(c, &m, name, perm::XattrAccess::Remove)?;
            }
            if txn.raw(&keys::xattr(ino, name))?.is_none() {
                // Removing an ACL a file does not have succeeds, as on ext4 (`setfacl
                // -b`, `-k`).
                if is_acl(name) {
                    return Ok(());
                }
                return Err(MetaError::NoData(format!("{} on {ino}", show(name))));
            }
            delete_xattr(txn, (ino, &mut rec), name);
            rec.changed_at(now());
            txn.put_inode(ino, &rec)
        })
    }
}

/// Stores `value` as attribute `name` of `ino` (record `rec`, which counts it if it
/// did not `exist`): every place that adds an attribute keeps the count this way.
pub(super) fn put_xattr(
    txn: &mut Txn<'_>,
    (ino, rec): (InodeId, &mut InodeRecord),
    (name, value): (&[u8], &[u8]),
    exists: bool,
) -> Result<(), MetaError> {
    if !exists {
        rec.xattr_count += 1;
    }
    txn.put(keys::xattr(ino, name), encode(&value)?);
    Ok(())
}

/// Removes attribute `name` of `ino`, which exists, from the store and `rec`'s count.
pub(super) fn delete_xattr(
    txn: &mut Txn<'_>,
    (ino, rec): (InodeId, &mut InodeRecord),
    name: &[u8],
) {
    txn.delete(keys::xattr(ino, name));
    rec.xattr_count = rec.xattr_count.saturating_sub(1);
}

/// Refuses with ENOSPC a `value` for `name` that would take `ino`'s extended attributes
/// past [`MAX_XATTR_NAMES_BYTES`] or [`MAX_XATTR_TOTAL_BYTES`] (what the attribute holds
/// now, if it exists, is replaced). The sums come from a scan of the inode's attributes,
/// at most [`MAX_XATTRS_PER_INODE`] of them, so no stored record carries them.
fn check_room(txn: &Txn<'_>, ino: InodeId, name: &[u8], value: &[u8]) -> Result<(), MetaError> {
    let prefix = keys::xattr_prefix(ino);
    let rows = txn.scan(
        &prefix,
        &keys::prefix_end(&prefix),
        MAX_XATTRS_PER_INODE as usize,
    )?;
    let (mut names, mut total) = (name.len() + 1, name.len() + 1 + value.len());
    for (k, v) in rows {
        let other = &k[prefix.len()..];
        if other == name {
            continue;
        }
        names += other.len() + 1;
        total += other.len() + 1 + stored_value_len(&v)?;
    }
    if names > MAX_XATTR_NAMES_BYTES || total > MAX_XATTR_TOTAL_BYTES {
        return Err(MetaError::NoSpace(format!(
            "{ino}: extended attributes of {names} bytes of names and {total} in all, the \
             limits are {MAX_XATTR_NAMES_BYTES} and {MAX_XATTR_TOTAL_BYTES}"
        )));
    }
    Ok(())
}

/// The length of a stored value without decoding (copying) it: the record's version
/// byte, then postcard's varint length of the bytes, then the bytes.
fn stored_value_len(stored: &[u8]) -> Result<usize, MetaError> {
    let body = stored.get(1..).unwrap_or_default();
    let mut len = 0usize;
    for (i, &b) in body.iter().enumerate().take(10) {
        len |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(len);
        }
    }
    Err(MetaError::Corrupt("xattr value: bad length".into()))
}

/// What a chown by `c` does to `rec` besides its owner and group (`chown_common`): the
/// mode bits [`perm::chown_mode`] drops, and a non-directory's file capabilities
/// (`ATTR_KILL_PRIV`). Nothing when `set` changes no owner or group, or sets the mode.
pub(super) fn chown_effects(
    txn: &mut Txn<'_>,
    ino: InodeId,
    rec: &mut InodeRecord,
    c: &Caller,
    set: &SetAttr,
) -> Result<(), MetaError> {
    if let Some(perm) = perm::chown_mode(c, &rec.mode(), set) {
        rec.perm = perm;
    }
    let chown = (set.uid.is_some() || set.gid.is_some()) && set.perm.is_none();
    let caps = proto::CAPABILITY_XATTR;
    if chown && !rec.is_dir() && rec.xattr_count > 0 && txn.raw(&keys::xattr(ino, caps))?.is_some()
    {
        delete_xattr(txn, (ino, rec), caps);
    }
    Ok(())
}

/// Sets ACL attribute `name` of `ino` (`rec`, its permission checked) to `value`, as
/// Linux's `set_posix_acl` does (which takes no create or replace flag): an empty
/// value, or a list of no entries, removes it; an access ACL sets the mode's bits
/// (`posix_acl_update_mode`: setgid dropped for a caller neither root nor in the
/// file's group) and is kept only if it says more than they do; a default ACL is a
/// directory's only (removing one from anything else does nothing).
fn set_acl(
    txn: &mut Txn<'_>,
    (ino, rec): (InodeId, &mut InodeRecord),
    (name, value): (&[u8], &[u8]),
    caller: Option<&Caller>,
) -> Result<(), MetaError> {
    let mut keep = match value {
        [] => None,
        bytes => Acl::parse(bytes)?,
    };
    let removal = keep.is_none();
    if name == acl::DEFAULT && !rec.is_dir() {
        if removal {
            return Ok(());
        }
        return Err(MetaError::PermissionDenied(format!(
            "{ino} is a {:?}: only a directory has a default ACL",
            rec.kind
        )));
    }
    let exists = txn.raw(&keys::xattr(ino, name))?.is_some();
    if name == acl::ACCESS {
        if let Some(a) = &keep {
            let (perm, extended) = a.mode(rec.perm);
            // Setgid goes for a setter outside the group, as at a chmod.
            rec.perm = caller.map_or(perm, |c| perm::chmod_mode(c, rec.gid, perm));
            if !extended {
                keep = None;
            }
        }
    }
    match keep {
        Some(a) => {
            let bytes = a.to_bytes();
            check_room(txn, ino, name, &bytes)?;
            put_xattr(txn, (ino, rec), (name, &bytes), exists)?;
        }
        None if exists => delete_xattr(txn, (ino, rec), name),
        // Nothing there, nothing kept: no change (ext4 leaves even the ctime).
        None if removal => return Ok(()),
        None => {}
    }
    rec.changed_at(now());
    txn.put_inode(ino, rec)
}

/// A chmod of `ino` to `rec`'s new mode changes its access ACL too
/// (`posix_acl_chmod`): the owner's, the mask's and the others' entries.
pub(super) fn chmod_acl(
    txn: &mut Txn<'_>,
    ino: InodeId,
    rec: &InodeRecord,
) -> Result<(), MetaError> {
    if rec.xattr_count == 0 || rec.kind == FileKind::Symlink {
        return Ok(());
    }
    if let Some(mut a) = stored_acl(txn, ino, acl::ACCESS)? {
        a.chmod(rec.perm);
        txn.put(keys::xattr(ino, acl::ACCESS), encode(&a.to_bytes())?);
    }
    Ok(())
}

/// The mode bits and ACLs a new inode `ino` (`rec`, not yet stored, with the bits the
/// caller asked for) gets in directory `parent` (`parent_rec`) for a caller with
/// `umask` (`posix_acl_create`): with a default ACL there, the default limited by the
/// bits asked for, and a directory takes the default as its own too; without one, the
/// bits less the umask. A symlink keeps its 0o777.
pub(super) fn inherit_acls(
    txn: &mut Txn<'_>,
    (parent, parent_rec): (InodeId, &InodeRecord),
    (ino, rec): (InodeId, &mut InodeRecord),
    umask: u32,
) -> Result<(), MetaError> {
    if rec.kind == FileKind::Symlink {
        return Ok(());
    }
    let default = match parent_rec.xattr_count {
        0 => None,
        _ => stored_acl(txn, parent, acl::DEFAULT)?,
    };
    let Some(default) = default else {
        rec.perm &= !(umask & 0o777);
        return Ok(());
    };
    let (perm, access) = default.create(rec.perm);
    rec.perm = perm;
    if let Some(a) = access {
        put_xattr(txn, (ino, rec), (acl::ACCESS, &a.to_bytes()), false)?;
    }
    if rec.is_dir() {
        put_xattr(txn, (ino, rec), (acl::DEFAULT, &default.to_bytes()), false)?;
    }
    Ok(())
}
