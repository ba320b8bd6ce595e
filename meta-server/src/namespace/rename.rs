//! Rename in its three modes, as one batch: a crash never leaves half a rename.

use super::entries::{add_entry, drop_link, is_empty_dir, remove_entry};
use super::names::check_name;
use super::records::{DirentRecord, InodeRecord};
use super::txn::{Reads, Txn};
use super::{now, Namespace, State};
use crate::error::{show, MetaError};
use proto::meta::RenameMode;
use proto::{FileKind, InodeId, Timestamp};

/// Longest chain of parents walked before calling the tree corrupt (a cycle guard).
const MAX_DEPTH: usize = 1 << 16;

/// Both ends of a rename.
#[derive(Clone, Copy)]
struct Ends<'a> {
    parent: InodeId,
    name: &'a [u8],
    new_parent: InodeId,
    new_name: &'a [u8],
}

impl Namespace {
    /// Renames `name` in `parent` to `new_name` in `new_parent`, atomically.
    ///
    /// `Replace` unlinks an existing target (which must be of the same directory-ness,
    /// and empty if a directory), `NoReplace` refuses one, `Exchange` swaps the two.
    /// The whiteout modes leave a whiteout owned by root at the source name.
    pub fn rename(
        &self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
        mode: RenameMode,
    ) -> Result<(), MetaError> {
        self.rename_as((parent, name), (new_parent, new_name), mode, (0, 0))
    }

    /// [`Namespace::rename`], a whiteout being owned by `whiteout_owner` (uid, gid):
    /// the caller, as a local file system makes it.
    pub fn rename_as(
        &self,
        (parent, name): (InodeId, &[u8]),
        (new_parent, new_name): (InodeId, &[u8]),
        mode: RenameMode,
        whiteout_owner: (u32, u32),
    ) -> Result<(), MetaError> {
        check_name(name)?;
        check_name(new_name)?;
        let e = Ends {
            parent,
            name,
            new_parent,
            new_name,
        };
        self.mutate_answering(|txn, st| {
            txn.dir(parent)?;
            txn.dir(new_parent)?;
            let src = txn.entry(parent, name)?;
            if parent == new_parent && name == new_name {
                return Ok(());
            }
            let now = now();
            match (mode, txn.dirent(new_parent, new_name)?) {
                (RenameMode::NoReplace | RenameMode::WhiteoutNoReplace, Some(_)) => {
                    Err(MetaError::AlreadyExists(format!(
                        "rename target {} in {new_parent}",
                        show(new_name)
                    )))
                }
                (RenameMode::Exchange, None) => Err(MetaError::NotFound(format!(
                    "exchange target {} in {new_parent}",
                    show(new_name)
                ))),
                (RenameMode::Exchange, Some(dst)) => exchange(txn, e, src, dst, now),
                (RenameMode::Replace | RenameMode::Whiteout, Some(dst)) => {
                    replace(txn, st, e, src, dst, now)
                }
                (_, None) => move_entry(txn, e, src, now),
            }?;
            if mode.whiteout() {
                leave_whiteout(txn, e, whiteout_owner, now)?;
            }
            Ok(())
        })
    }
}

/// `InvalidArgument` if `start` is directory `dir` or lies below it: a directory cannot
/// move into its own subtree. Walks the parent pointers from `start` up to the root.
fn check_not_below(txn: &Txn<'_>, dir: InodeId, start: InodeId) -> Result<(), MetaError> {
    let mut cur = start;
    for _ in 0..MAX_DEPTH {
        if cur == dir {
            return Err(MetaError::InvalidArgument(format!(
                "cannot move directory {dir} into its own subtree ({start})"
            )));
        }
        if cur == InodeId::ROOT {
            return Ok(());
        }
        cur = InodeId(txn.dir(cur)?.parent);
    }
    Err(MetaError::Corrupt(format!(
        "no way from {start} up to the root"
    )))
}

/// Moves `src` to the free name `e.new_name`.
fn move_entry(
    txn: &mut Txn<'_>,
    e: Ends<'_>,
    src: DirentRecord,
    now: Timestamp,
) -> Result<(), MetaError> {
    let ino = InodeId(src.ino);
    let is_dir = src.kind == FileKind::Directory;
    if is_dir && e.parent != e.new_parent {
        check_not_below(txn, ino, e.new_parent)?;
    }
    // remove_entry and add_entry move the `..` link from the old parent's count to the
    // new one's; with one parent they cancel out.
    remove_entry(txn, e.parent, e.name, src.kind, now)?;
    add_entry(txn, e.new_parent, e.new_name, ino, src.kind, now)?;
    txn.update_inode(ino, |r| {
        r.changed_at(now);
        if is_dir {
            r.parent = e.new_parent.0;
        }
    })?;
    Ok(())
}

/// Moves `src` over the existing `dst`, which loses its link as in unlink or rmdir.
fn replace(
    txn: &mut Txn<'_>,
    st: &State,
    e: Ends<'_>,
    src: DirentRecord,
    dst: DirentRecord,
    now: Timestamp,
) -> Result<(), MetaError> {
    if src.ino == dst.ino {
        // Two links to one inode: POSIX says rename does nothing and succeeds.
        return Ok(());
    }
    let src_dir = src.kind == FileKind::Directory;
    if src_dir && e.parent != e.new_parent {
        check_not_below(txn, InodeId(src.ino), e.new_parent)?;
    }
    match (src_dir, dst.kind == FileKind::Directory) {
        (true, false) => {
            return Err(MetaError::NotADirectory(format!(
                "rename of a directory over non-directory {}",
                show(e.new_name)
            )));
        }
        (false, true) => {
            return Err(MetaError::IsADirectory(format!(
                "rename of a non-directory over directory {}",
                show(e.new_name)
            )));
        }
        (true, true) if !is_empty_dir(txn, InodeId(dst.ino))? => {
            return Err(MetaError::NotEmpty(format!(
                "rename target {}",
                show(e.new_name)
            )));
        }
        _ => {}
    }
    remove_entry(txn, e.new_parent, e.new_name, dst.kind, now)?;
    drop_link(txn, st, InodeId(dst.ino), now)?;
    move_entry(txn, e, src, now)
}

/// Puts a whiteout at the source name the rename just freed: a character device 0/0
/// with no permission bits (the kernel's `WHITEOUT_DEV`, `WHITEOUT_MODE`), which an
/// overlay file system reads as "deleted in this layer".
fn leave_whiteout(
    txn: &mut Txn<'_>,
    e: Ends<'_>,
    (uid, gid): (u32, u32),
    now: Timestamp,
) -> Result<(), MetaError> {
    let rec = InodeRecord::new(FileKind::CharDevice, 0, uid, gid, now);
    let ino = txn.alloc_inode()?;
    txn.put_inode(ino, &rec)?;
    add_entry(txn, e.parent, e.name, ino, FileKind::CharDevice, now)?;
    Ok(())
}

/// Swaps the entries `src` and `dst` (`RENAME_EXCHANGE`).
fn exchange(
    txn: &mut Txn<'_>,
    e: Ends<'_>,
    src: DirentRecord,
    dst: DirentRecord,
    now: Timestamp,
) -> Result<(), MetaError> {
    let moves_dirs = e.parent != e.new_parent;
    let src_dir = src.kind == FileKind::Directory;
    let dst_dir = dst.kind == FileKind::Directory;
    if moves_dirs && src_dir {
        check_not_below(txn, InodeId(src.ino), e.new_parent)?;
    }
    if moves_dirs && dst_dir {
        check_not_below(txn, InodeId(dst.ino), e.parent)?;
    }
    txn.put_dirent(e.parent, e.name, &dst)?;
    txn.put_dirent(e.new_parent, e.new_name, &src)?;
    // A directory that changes parent takes its `..` link along.
    let to_new = i64::from(moves_dirs && src_dir) - i64::from(moves_dirs && dst_dir);
    for (dir, delta) in [(e.parent, -to_new), (e.new_parent, to_new)] {
        txn.update_inode(dir, |p| {
            p.mtime = now;
            p.changed_at(now);
            p.nlink = (i64::from(p.nlink) + delta).clamp(0, i64::from(u32::MAX)) as u32;
        })?;
        if !moves_dirs {
            break;
        }
    }
    for (ino, new_parent) in [(src.ino, e.new_parent), (dst.ino, e.parent)] {
        txn.update_inode(InodeId(ino), |r| {
            r.changed_at(now);
            if r.is_dir() {
                r.parent = new_parent.0;
            }
        })?;
    }
    Ok(())
}
