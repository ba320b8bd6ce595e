//! An inode's attribute flags (`chattr +i`, `+a`; [`proto::InodeFlags`]), stored as an
//! extended attribute under a name no client can send (it holds a NUL byte, which
//! every name from the wire is refused for): a file with flags is rare, the attribute
//! goes with its inode as the others do, and a store of an earlier build needs no
//! change. What the flags forbid is decided with the rest of the permission rules
//! (`perm`), which see them in [`super::perm::Mode`].

use super::perm;
use super::records::{decode, encode, InodeRecord};
use super::txn::Reads;
use super::{keys, now, Namespace};
use crate::error::MetaError;
use proto::meta::Caller;
use proto::{Attr, FileKind, InodeFlags, InodeId};

/// The attribute that holds the flags: hidden from listings, out of clients' reach.
pub(super) const FLAGS_NAME: &[u8] = b"\0flags";

/// The flags of `ino` (record `rec`). Only an inode with extended attributes can have
/// any, so most calls read nothing.
pub(super) fn stored_flags(
    r: &(impl Reads + ?Sized),
    ino: InodeId,
    rec: &InodeRecord,
) -> Result<InodeFlags, MetaError> {
    if rec.xattr_count == 0 || !takes_flags(rec.kind) {
        return Ok(InodeFlags::default());
    }
    match r.raw(&keys::xattr(ino, FLAGS_NAME))? {
        Some(v) => decode(&v, "inode flags"),
        None => Ok(InodeFlags::default()),
    }
}

/// Whether an inode of `kind` carries flags: the kernel asks for them only of regular
/// files and directories (it opens the inode to ask).
fn takes_flags(kind: FileKind) -> bool {
    matches!(kind, FileKind::Regular | FileKind::Directory)
}

impl Namespace {
    /// The flags of `ino`.
    pub fn getflags(&self, ino: InodeId) -> Result<InodeFlags, MetaError> {
        let r = self.reads();
        let rec = r.inode(ino)?;
        stored_flags(&r, ino, &rec)
    }

    /// Sets the flags of `ino` to `flags` for `caller` (`None`: unchecked), checked under
    /// the lock ([`perm::check_setflags`]); the change time moves, as `chattr`'s does on
    /// ext4. Answers the attributes.
    pub fn setflags_as(
        &self,
        ino: InodeId,
        flags: InodeFlags,
        caller: Option<&Caller>,
    ) -> Result<Attr, MetaError> {
        self.mutate(|txn, _| {
            let mut rec = txn.inode(ino)?;
            if !takes_flags(rec.kind) {
                return Err(MetaError::NotSupported(format!(
                    "{ino} is a {:?}: only regular files and directories have flags",
                    rec.kind
                )));
            }
            let key = keys::xattr(ino, FLAGS_NAME);
            if let Some(c) = caller {
                let m = super::access::mode_of(txn, ino, &rec)?;
                perm::check_setflags(c, &m, flags)?;
            }
            let exists = txn.raw(&key)?.is_some();
            match (flags.is_empty(), exists) {
                (true, true) => {
                    txn.delete(key);
                    rec.xattr_count = rec.xattr_count.saturating_sub(1);
                }
                (true, false) => {}
                (false, _) => {
                    if !exists {
                        rec.xattr_count += 1;
                    }
                    txn.put(key, encode(&flags)?);
                }
            }
            rec.changed_at(now());
            txn.put_inode(ino, &rec)?;
            txn.attr_of(ino, &rec)
        })
    }
}
