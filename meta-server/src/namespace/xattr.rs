//! Extended attributes, one key per attribute under `X`+ino.

use super::names::{check_xattr_name, check_xattr_value};
use super::records::{decode, encode};
use super::txn::{Reads, StoreReads};
use super::{keys, now, Namespace, MAX_XATTRS_PER_INODE};
use crate::error::{show, MetaError};
use proto::meta::XattrMode;
use proto::InodeId;

impl Namespace {
    /// The value of extended attribute `name` of `ino`.
    pub fn getxattr(&self, ino: InodeId, name: &[u8]) -> Result<Vec<u8>, MetaError> {
        check_xattr_name(name)?;
        let r = StoreReads(&*self.store);
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
        check_xattr_name(name)?;
        check_xattr_value(value)?;
        super::dirlayout::check(name, value)?;
        self.mutate(|txn, _| {
            let mut rec = txn.inode(ino)?;
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
            if !exists {
                if rec.xattr_count >= MAX_XATTRS_PER_INODE {
                    return Err(MetaError::NoSpace(format!(
                        "{ino} has {MAX_XATTRS_PER_INODE} extended attributes, the limit"
                    )));
                }
                rec.xattr_count += 1;
            }
            rec.changed_at(now());
            txn.put(key, encode(&value)?);
            txn.put_inode(ino, &rec)
        })
    }

    /// The names of every extended attribute of `ino`, in key (byte) order.
    pub fn listxattr(&self, ino: InodeId) -> Result<Vec<Vec<u8>>, MetaError> {
        let r = StoreReads(&*self.store);
        r.inode(ino)?;
        let prefix = keys::xattr_prefix(ino);
        let limit = MAX_XATTRS_PER_INODE as usize;
        let rows = self
            .store
            .scan(&prefix, &keys::prefix_end(&prefix), limit)?;
        Ok(rows
            .into_iter()
            .map(|(k, _)| k[prefix.len()..].to_vec())
            .collect())
    }

    /// Removes extended attribute `name` of `ino`.
    pub fn removexattr(&self, ino: InodeId, name: &[u8]) -> Result<(), MetaError> {
        check_xattr_name(name)?;
        self.mutate(|txn, _| {
            let mut rec = txn.inode(ino)?;
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
