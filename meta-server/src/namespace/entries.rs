//! Names in directories: lookup, the creation of directories, special files and
//! symlinks, hard links, unlink and rmdir, and the link counting they share with rename.

use super::keys;
use super::names::{check_name, check_target};
use super::opens;
use super::records::{DirentRecord, InodeRecord};
use super::txn::{Reads, Txn};
use super::{now, Made, Namespace, State, MAX_LINKS};
use crate::error::{show, MetaError};
use proto::meta::fs::Unlinked;
use proto::meta::{Caller, DirChange};
use proto::{Attr, FileKind, InodeId, NodeId, Timestamp};

/// Reads of a name and its inode a lookup makes at most, when the inode the name
/// gave is gone by the second read (see [`Namespace::lookup`]).
const LOOKUP_TRIES: usize = 8;

impl Namespace {
    /// Finds `name` in directory `parent` and returns its attributes.
    pub fn lookup(&self, parent: InodeId, name: &[u8]) -> Result<Attr, MetaError> {
        check_name(name)?;
        self.reads().dir(parent)?;
        // The name and its inode are two reads, and on an embedded store a rename over
        // the name may land between them: it frees the inode read first while the name
        // stays (with another inode). NotFound then fits no moment, so the name is read
        // again. An unlink removes both at once: the name is gone. (A shared engine's
        // reads are of one moment: there a second try reads afresh too.)
        for _ in 0..LOOKUP_TRIES {
            let r = self.reads();
            let ino = InodeId(r.entry(parent, name)?.ino);
            if let Some(rec) = r.try_inode(ino)? {
                return r.attr_of(ino, &rec);
            }
        }
        Err(MetaError::NotFound(format!(
            "{} in {parent}: its inode is gone at each of {LOOKUP_TRIES} reads",
            show(name)
        )))
    }

    /// The attributes of directory `dir`'s parent (the root's is the root).
    pub fn lookup_parent(&self, dir: InodeId) -> Result<Attr, MetaError> {
        let r = self.reads();
        let parent = InodeId(r.dir(dir)?.parent);
        Ok(r.inode(parent)?.attr(parent))
    }

    /// The attributes of `ino`.
    pub fn getattr(&self, ino: InodeId) -> Result<Attr, MetaError> {
        let r = self.reads();
        let rec = r.inode(ino)?;
        r.attr_of(ino, &rec)
    }

    /// Creates directory `name` in `parent`; returns it and the directory's change.
    pub fn mkdir(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u32,
        caller: Caller,
    ) -> Result<Made, MetaError> {
        check_name(name)?;
        let now = now();
        let mut rec = InodeRecord::new(FileKind::Directory, perm, caller.uid, caller.gid, now);
        rec.nlink = 2;
        rec.parent = parent.0;
        let umask = caller.umask;
        self.mutate_answering(|txn, _| make_node(txn, (parent, name), rec, umask))
    }

    /// Creates a FIFO, socket or device node `name` in `parent`; returns it and the
    /// directory's change.
    pub fn mknod(
        &self,
        parent: InodeId,
        name: &[u8],
        kind: FileKind,
        perm: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<Made, MetaError> {
        let rdev = match kind {
            FileKind::Fifo | FileKind::Socket => 0,
            FileKind::CharDevice | FileKind::BlockDevice => rdev,
            FileKind::Regular | FileKind::Directory | FileKind::Symlink => {
                return Err(MetaError::InvalidArgument(format!("mknod of a {kind:?}")));
            }
        };
        check_name(name)?;
        let mut rec = InodeRecord::new(kind, perm, caller.uid, caller.gid, now());
        rec.rdev = rdev;
        let umask = caller.umask;
        self.mutate_answering(|txn, _| make_node(txn, (parent, name), rec, umask))
    }

    /// Creates symlink `name` in `parent` pointing to `target`; returns it and the
    /// directory's change.
    pub fn symlink(
        &self,
        parent: InodeId,
        name: &[u8],
        target: &[u8],
        caller: Caller,
    ) -> Result<Made, MetaError> {
        check_name(name)?;
        check_target(target)?;
        let mut rec = InodeRecord::new(FileKind::Symlink, 0o777, caller.uid, caller.gid, now());
        rec.target = target.to_vec();
        rec.size = target.len() as u64;
        self.mutate_answering(|txn, _| make_node(txn, (parent, name), rec, 0))
    }

    /// The target of symlink `ino`.
    pub fn readlink(&self, ino: InodeId) -> Result<Vec<u8>, MetaError> {
        let rec = self.reads().inode(ino)?;
        if rec.kind != FileKind::Symlink {
            return Err(MetaError::InvalidArgument(format!(
                "{ino} is not a symlink"
            )));
        }
        Ok(rec.target)
    }

    /// Adds the hard link `new_name` in `new_parent` to non-directory `ino`; returns
    /// the inode and the directory's change.
    pub fn link(
        &self,
        ino: InodeId,
        new_parent: InodeId,
        new_name: &[u8],
    ) -> Result<Made, MetaError> {
        self.link_as(ino, (new_parent, new_name), None)
    }

    /// [`Self::link`], with the hard-link rule for `caller` (`perm::may_link`: given
    /// when its kernel did not apply its own) checked on the file's record under the
    /// lock, so that a chmod or chown landing after the request's early check is not
    /// missed.
    pub(super) fn link_as(
        &self,
        ino: InodeId,
        (new_parent, new_name): (InodeId, &[u8]),
        caller: Option<&Caller>,
    ) -> Result<Made, MetaError> {
        check_name(new_name)?;
        let made = self.mutate_answering(|txn, st| {
            let now = now();
            let before = txn.dir(new_parent)?.ctime;
            let mut rec = txn.inode(ino)?;
            // As Linux orders them: an existing name (`filename_create`), the rule
            // (`may_linkat`), then what `vfs_link` refuses.
            ensure_absent(txn, new_parent, new_name)?;
            let m = super::access::mode_of(txn, ino, &rec)?;
            if let Some(c) = caller {
                super::perm::may_link(c, &m)?;
            }
            // The caller's kernel does not know the flags: checked whoever asks.
            super::perm::check_linkable(&m)?;
            if rec.is_dir() {
                return Err(MetaError::NotPermitted(format!(
                    "hard link to directory {ino}"
                )));
            }
            if rec.nlink == 0 && !(st.linkable.contains(&ino) && st.is_open(ino)) {
                // Unlinked while open: Linux refuses to bring such a file back (ENOENT),
                // except an open `O_TMPFILE` made without `O_EXCL` (`tmpfile`).
                return Err(MetaError::NotFound(format!("{ino} has been unlinked")));
            }
            if rec.nlink == 0 {
                txn.delete(keys::orphan(ino));
            }
            if rec.nlink >= MAX_LINKS {
                return Err(MetaError::TooManyLinks(format!(
                    "{ino} has {} links",
                    rec.nlink
                )));
            }
            let after = add_entry(txn, new_parent, new_name, ino, rec.kind, now)?;
            rec.nlink += 1;
            rec.changed_at(now);
            txn.put_inode(ino, &rec)?;
            Ok(Made {
                attr: txn.attr_of(ino, &rec)?,
                parent: DirChange {
                    before,
                    after: after.attr(new_parent),
                },
            })
        })?;
        // Linked once, a tmpfile is a file like any other (Linux clears `I_LINKABLE`).
        self.state.lock().linkable.remove(&ino);
        Ok(made)
    }

    /// Removes non-directory entry `name` from `parent`; returns the directory's change
    /// and the file's links left.
    pub fn unlink(&self, parent: InodeId, name: &[u8]) -> Result<Unlinked, MetaError> {
        check_name(name)?;
        self.mutate_answering(|txn, st| {
            let now = now();
            let before = txn.dir(parent)?.ctime;
            let d = txn.entry(parent, name)?;
            if d.kind == FileKind::Directory {
                return Err(MetaError::IsADirectory(format!("unlink of {}", show(name))));
            }
            let after = remove_entry(txn, parent, name, d.kind, now)?.attr(parent);
            let nlink = drop_link(txn, st, InodeId(d.ino), now)?;
            Ok(Unlinked {
                parent: DirChange { before, after },
                ino: InodeId(d.ino),
                nlink,
            })
        })
    }

    /// Removes empty directory `name` from `parent`; returns the directory's change.
    pub fn rmdir(&self, parent: InodeId, name: &[u8]) -> Result<DirChange, MetaError> {
        check_name(name)?;
        self.mutate_answering(|txn, st| {
            let now = now();
            let before = txn.dir(parent)?.ctime;
            let d = txn.entry(parent, name)?;
            let ino = InodeId(d.ino);
            if d.kind != FileKind::Directory {
                return Err(MetaError::NotADirectory(format!("rmdir of {}", show(name))));
            }
            if ino == InodeId::ROOT {
                return Err(MetaError::Busy("rmdir of the root directory".into()));
            }
            if !is_empty_dir(txn, ino)? {
                return Err(MetaError::NotEmpty(format!("rmdir of {}", show(name))));
            }
            let after = remove_entry(txn, parent, name, d.kind, now)?.attr(parent);
            drop_link(txn, st, ino, now)?;
            Ok(DirChange { before, after })
        })
    }
}

/// Creates inode `rec` under `name` in `parent`.
fn make_node(
    txn: &mut Txn<'_>,
    (parent, name): (InodeId, &[u8]),
    mut rec: InodeRecord,
    umask: u32,
) -> Result<Made, MetaError> {
    let parent_rec = txn.dir(parent)?;
    ensure_absent(txn, parent, name)?;
    inherit_setgid(&parent_rec, &mut rec);
    if rec.is_dir() && parent_rec.nlink >= u32::MAX - 1 {
        return Err(MetaError::TooManyLinks(format!(
            "{parent} has too many subdirectories"
        )));
    }
    let ino = txn.alloc_inode()?;
    super::xattr::inherit_acls(txn, (parent, &parent_rec), (ino, &mut rec), umask)?;
    if rec.is_dir() {
        super::dirlayout::inherit(txn, parent, ino, &mut rec)?;
    }
    txn.put_inode(ino, &rec)?;
    let after = add_entry(txn, parent, name, ino, rec.kind, rec.ctime)?;
    Ok(Made {
        attr: rec.attr(ino),
        parent: DirChange {
            before: parent_rec.ctime,
            after: after.attr(parent),
        },
    })
}

/// The setgid bit of a directory's mode.
const S_ISGID: u32 = 0o2000;

/// A new inode in a setgid directory takes the directory's group, and a new directory
/// there keeps the bit, as ext4 does (the kernel leaves both to the file system; it has
/// already dropped setgid from the mode of a file made by a non-member). Without this,
/// files in a shared project directory get the creator's group and others lose access.
pub(super) fn inherit_setgid(parent: &InodeRecord, rec: &mut InodeRecord) {
    if parent.perm & S_ISGID != 0 {
        rec.gid = parent.gid;
        if rec.is_dir() {
            rec.perm |= S_ISGID;
        }
    }
}

/// `AlreadyExists` if `parent` has an entry `name`.
pub(super) fn ensure_absent(r: &impl Reads, parent: InodeId, name: &[u8]) -> Result<(), MetaError> {
    match r.dirent(parent, name)? {
        Some(_) => Err(MetaError::AlreadyExists(format!(
            "{} in {parent}",
            show(name)
        ))),
        None => Ok(()),
    }
}

/// Whether directory `ino` has no entries.
pub(super) fn is_empty_dir(txn: &Txn<'_>, ino: InodeId) -> Result<bool, MetaError> {
    // The directory's record first: on a shared engine its revision is what stands for
    // the scan (every change of its entries writes it), and a record read only after
    // the scan could already include an entry the scan missed.
    txn.inode(ino)?;
    let prefix = keys::dirent_prefix(ino);
    Ok(txn.scan(&prefix, &keys::prefix_end(&prefix), 1)?.is_empty())
}

/// Writes entry `name` -> `ino` into `parent` and updates the parent: times, and the
/// `..` link a new subdirectory adds. Returns the parent's new record.
pub(super) fn add_entry(
    txn: &mut Txn<'_>,
    parent: InodeId,
    name: &[u8],
    ino: InodeId,
    kind: FileKind,
    now: Timestamp,
) -> Result<InodeRecord, MetaError> {
    txn.put_dirent(parent, name, &DirentRecord { ino: ino.0, kind })?;
    txn.update_inode(parent, |p| {
        p.mtime = now;
        p.changed_at(now);
        if kind == FileKind::Directory {
            p.nlink += 1;
        }
    })
}

/// Deletes entry `name` from `parent` and updates the parent, the reverse of
/// [`add_entry`]; returns the parent's new record.
pub(super) fn remove_entry(
    txn: &mut Txn<'_>,
    parent: InodeId,
    name: &[u8],
    kind: FileKind,
    now: Timestamp,
) -> Result<InodeRecord, MetaError> {
    txn.delete(keys::dirent(parent, name));
    txn.update_inode(parent, |p| {
        p.mtime = now;
        p.changed_at(now);
        if kind == FileKind::Directory {
            p.nlink = p.nlink.saturating_sub(1);
        }
    })
}

/// Drops one link of `ino`, whose entry the caller has removed.
///
/// A directory (empty, as the caller checked) goes at once. Another inode loses one
/// link; at zero it goes too, unless a session has it open: then it stays, marked as an
/// orphan, until the last session ends (or the next start, when no session survives).
/// Returns the links left.
pub(super) fn drop_link(
    txn: &mut Txn<'_>,
    st: &State,
    ino: InodeId,
    now: Timestamp,
) -> Result<u32, MetaError> {
    let mut rec = txn.inode(ino)?;
    if !rec.is_dir() {
        rec.nlink = rec.nlink.saturating_sub(1);
        rec.changed_at(now);
        if rec.nlink > 0 || opens::open_anywhere(txn, st, ino)? {
            txn.put_inode(ino, &rec)?;
            if rec.nlink == 0 {
                txn.put(keys::orphan(ino), super::records::encode(&())?);
            }
            return Ok(rec.nlink);
        }
    }
    delete_inode(txn, ino, &rec)?;
    Ok(0)
}

/// Deletes inode `ino` with its xattrs and marks, and queues the deletion of a regular
/// file's chunks on every member of its chains, unless it can have none: an empty
/// file that no vanished client had open (`T` mark). Chunks a rarer path still left
/// (a writer that died while the metadata server was down, an empty file given space
/// with `fallocate`'s `KEEP_SIZE`) go with the data servers' sweep (every 5 minutes),
/// which drops chunks of inodes that no longer exist.
pub(super) fn delete_inode(
    txn: &mut Txn<'_>,
    ino: InodeId,
    rec: &InodeRecord,
) -> Result<(), MetaError> {
    let may_hold_chunks = rec.size > 0 || txn.raw(&keys::tail(ino))?.is_some();
    txn.delete(keys::inode(ino));
    txn.delete(keys::orphan(ino));
    txn.delete(keys::tail(ino));
    if txn.is_shared() {
        // A directory removed while open goes with its sessions' names (their closes
        // find no key, and free nothing), and a file with its locks.
        txn.delete(keys::openers(ino));
        txn.delete(keys::locks(ino));
    }
    if rec.kind == FileKind::Regular {
        txn.delete(keys::held(ino));
    }
    let prefix = keys::xattr_prefix(ino);
    // xattr_count bounds the scan; the slack guards against a count gone wrong.
    let limit = rec.xattr_count as usize + super::MAX_XATTRS_PER_INODE as usize;
    for (k, _) in txn.scan(&prefix, &keys::prefix_end(&prefix), limit)? {
        txn.delete(k);
    }
    if let Some(layout) = rec.layout.as_ref().filter(|_| may_hold_chunks) {
        let gc_mark = super::records::encode(&())?;
        let mut nodes = std::collections::BTreeSet::new();
        for &chain in &layout.chains {
            if let Some(v) = txn.raw(&keys::chain(proto::ChainId(chain)))? {
                let c: super::records::ChainRecord = super::records::decode(&v, "chain record")?;
                nodes.extend(c.members.iter().map(|m| m.node));
            }
        }
        for node in nodes {
            txn.put(keys::gc(NodeId(node), ino), gc_mark.clone());
        }
    }
    txn.count_freed()?;
    Ok(())
}
