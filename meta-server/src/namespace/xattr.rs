//! Extended attributes, one key per attribute under `X`+ino.

use super::names::{check_xattr_name, check_xattr_value};
use super::perm;
use super::records::{decode, encode, InodeRecord};
use super::txn::Reads;
use super::txn::Txn;
use super::{keys, now, Namespace, MAX_XATTRS_PER_INODE};
use super::{MAX_XATTR_NAMES_BYTES, MAX_XATTR_TOTAL_BYTES};
use crate::error::{show, MetaError};
use proto::meta::{Caller, XattrMode};
use proto::{InodeId, SetAttr};

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
                perm::check_xattr(c, &rec.mode(), name, perm::XattrAccess::Write)?;
            }
            super::dirlayout::check(name, value)?;
            let key = keys::xattr(ino, name);
            let exists = txn.raw(&key)?.is_some();
            match (mode, exists) {
                (XattrMode::Create, true) => {
                    return Err(MetaError::AlreadyExists(format!("{} on {ino}", show(name))));
                }
                (XattrMode::Replace, false) => {
                    return Err(MetaError::NoData(format!("{} on {ino}", show(name))));
                }
                _ => {}
            }
            check_room(txn, ino, name, value)?;
            if !exists {
                rec.xattr_count += 1;
            }
            rec.changed_at(now());
            txn.put(key, encode(&value)?);
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
                perm::check_xattr(c, &rec.mode(), name, perm::XattrAccess::Remove)?;
            }
            let key = keys::xattr(ino, name);
            if txn.raw(&key)?.is_none() {
                return Err(MetaError::NoData(format!("{} on {ino}", show(name))));
            }
            txn.delete(key);
            rec.xattr_count = rec.xattr_count.saturating_sub(1);
            rec.changed_at(now());
            txn.put_inode(ino, &rec)
        })
    }
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
    if chown && !rec.is_dir() && rec.xattr_count > 0 {
        let key = keys::xattr(ino, proto::CAPABILITY_XATTR);
        if txn.raw(&key)?.is_some() {
            txn.delete(key);
            rec.xattr_count = rec.xattr_count.saturating_sub(1);
        }
    }
    Ok(())
}
