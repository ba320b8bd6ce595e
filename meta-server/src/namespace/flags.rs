//! An inode's attribute flags (`chattr +i`, `+a`; [`proto::InodeFlags`]), stored as an
//! extended attribute under a name no client can send (it holds a NUL byte, which
//! every name from the wire is refused for): a file with flags is rare, the attribute
//! goes with its inode as the others do, and a store of an earlier build needs no
//! change. What the flags forbid is decided with the rest of the permission rules
//! (`perm`), which see them in [`super::perm::Mode`].

use super::perm;
use super::records::{decode, InodeRecord};
use super::txn::Reads;
use super::xattr::{delete_xattr, put_xattr};
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
    let Some(v) = r.raw(&keys::xattr(ino, FLAGS_NAME))? else {
        return Ok(InodeFlags::default());
    };
    // Stored as any attribute's value (so the limits' sums read it as one): the
    // `FS_IOC_GETFLAGS` word, little-endian.
    let value: Vec<u8> = decode(&v, "inode flags")?;
    let word = <[u8; 4]>::try_from(value.as_slice())
        .map(u32::from_le_bytes)
        .map_err(|_| MetaError::Corrupt(format!("{ino}: flags of {} bytes", value.len())))?;
    InodeFlags::from_fs_flags(word)
        .map_err(|bits| MetaError::Corrupt(format!("{ino}: unknown flags {bits:#x}")))
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
            let word = flags.fs_flags().to_le_bytes();
            match (flags.is_empty(), exists) {
                (true, true) => delete_xattr(txn, (ino, &mut rec), FLAGS_NAME),
                (true, false) => {}
                (false, _) => put_xattr(txn, (ino, &mut rec), (FLAGS_NAME, &word), exists)?,
            }
            rec.changed_at(now());
            txn.put_inode(ino, &rec)?;
            txn.attr_of(ino, &rec)
        })
    }
}
