//! Directory durability: which directories changed since they were last fsynced.
//!
//! Creating a chunk file changes its inode directory (its bucket, for a first chunk);
//! creating or removing an inode directory changes its bucket. A chunk is durable only
//! once those entries are on disk too, so `fsync` of a chunk also fsyncs the directories
//! this tracker marked dirty.

use super::format::{bucket_dir, bucket_of, inode_dir};
use crate::error::{DataError, IoContext};
use parking_lot::Mutex;
use proto::{ChunkId, InodeId};
use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Dirty directories remembered before the tracker flushes the whole file system instead.
pub(crate) const MAX_DIRTY_DIRS: usize = 65_536;

/// A directory of the chunk tree. Ordered children first (inode directories before
/// buckets), the order in which syncs must go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum DirKey {
    /// The directory holding one inode's chunk files.
    Inode(InodeId),
    /// One of the 256 bucket directories holding inode directories.
    Bucket(u8),
}

impl DirKey {
    /// The directory whose entry names `chunk`'s file: the bucket for a first chunk, the
    /// inode directory for the others (see `format::chunk_path`).
    pub(crate) fn holding(chunk: ChunkId) -> DirKey {
        if chunk.index == 0 {
            DirKey::Bucket(bucket_of(chunk.inode))
        } else {
            DirKey::Inode(chunk.inode)
        }
    }
}

/// The set of directories whose entries may not be on stable storage yet.
pub(crate) struct DirtyDirs {
    root: PathBuf,
    limit: usize,
    // One lock for the whole set: it is touched only when a file or directory is created
    // or removed and on fsync, never on a plain read or overwrite.
    set: Mutex<HashSet<DirKey>>,
    /// Held by a sync of a directory across its fsync (by the key's hash), so that a
    /// second sync of it, finding the mark gone, returns only once the first's fsync
    /// is done.
    syncing: Box<[Mutex<()>]>,
}

/// Locks a sync of one directory waits on (see `DirtyDirs::syncing`).
const SYNC_STRIPES: usize = 64;

impl DirtyDirs {
    /// A tracker for the chunk tree at `root`, remembering at most `limit` directories.
    pub fn new(root: &Path, limit: usize) -> DirtyDirs {
        DirtyDirs {
            root: root.to_owned(),
            limit,
            set: Mutex::new(HashSet::new()),
            syncing: (0..SYNC_STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    /// The directory `key` names.
    pub fn path(&self, key: DirKey) -> PathBuf {
        match key {
            DirKey::Inode(inode) => inode_dir(&self.root, inode),
            DirKey::Bucket(b) => bucket_dir(&self.root, b),
        }
    }

    /// Notes that `key`'s entries changed. Millions of files written without an fsync
    /// would grow the set without bound, so at the limit the whole file system is synced
    /// (`syncfs`) and the set starts empty.
    pub fn mark(&self, key: DirKey) -> Result<(), DataError> {
        let mut set = self.set.lock();
        if set.len() >= self.limit && !set.contains(&key) {
            // The lock stays held: a directory marked during the sync must not be
            // forgotten by the `clear` below.
            syncfs(&self.root)?;
            set.clear();
        }
        set.insert(key);
        Ok(())
    }

    /// Drops `key` without syncing it (its directory was removed).
    pub fn forget(&self, key: DirKey) {
        self.set.lock().remove(&key);
    }

    /// Fsyncs `key`'s directory if it is marked dirty; with `force`, in any case.
    pub fn sync(&self, key: DirKey, force: bool) -> Result<(), DataError> {
        let stripe = match key {
            DirKey::Inode(inode) => inode.0 as usize,
            DirKey::Bucket(b) => usize::from(b),
        };
        let _one_at_a_time = self.syncing[stripe % SYNC_STRIPES].lock();
        // Removing before the fsync is safe: any change marked after the removal happens
        // after the fsync starts and is marked again.
        let was_dirty = self.set.lock().remove(&key);
        if !(was_dirty || force) {
            return Ok(());
        }
        let result = fsync_dir(&self.path(key));
        if result.is_err() && was_dirty {
            self.set.lock().insert(key);
        }
        result
    }

    /// Number of directories marked dirty.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.set.lock().len()
    }
}

/// Makes a directory's entries durable.
pub(crate) fn fsync_dir(path: &Path) -> Result<(), DataError> {
    let what = || format!("fsync directory {}", path.display());
    File::open(path).ctx(what)?.sync_all().ctx(what)
}

/// Writes `bytes` to `dir/name` durably and atomically: into `dir/tmp_name` first,
/// fsynced, renamed over `name`, then the directory fsynced, so a crash leaves the old
/// file or the new one (and perhaps the temporary file, for the caller to remove).
pub(crate) fn save_atomically(
    dir: &Path,
    name: &str,
    tmp_name: &str,
    bytes: &[u8],
) -> Result<(), DataError> {
    let (tmp, path) = (dir.join(tmp_name), dir.join(name));
    let what = || format!("save {}", path.display());
    let mut f = File::create(&tmp).ctx(what)?;
    f.write_all(bytes).ctx(what)?;
    f.sync_all().ctx(what)?;
    std::fs::rename(&tmp, &path).ctx(what)?;
    fsync_dir(dir)
}

/// Removes `path` if it exists.
pub(crate) fn remove_if_present(path: &Path) -> Result<(), DataError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(DataError::io(format!("remove {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

/// Flushes every dirty page and inode of the file system holding `path`.
pub(crate) fn syncfs(path: &Path) -> Result<(), DataError> {
    let what = || format!("syncfs {}", path.display());
    let dir = File::open(path).ctx(what)?;
    // SAFETY: `dir` is an open descriptor for the duration of the call.
    let rc = unsafe { libc::syncfs(dir.as_raw_fd()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).ctx(what);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_synced_once_and_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(bucket_dir(tmp.path(), 1)).unwrap();
        let dirty = DirtyDirs::new(tmp.path(), 2);
        dirty.mark(DirKey::Bucket(1)).unwrap();
        dirty.mark(DirKey::Bucket(1)).unwrap();
        assert_eq!(dirty.len(), 1);
        dirty.sync(DirKey::Bucket(1), false).unwrap();
        assert_eq!(dirty.len(), 0);
        // Not dirty and not forced: nothing to open, so a missing directory is no error.
        dirty.sync(DirKey::Bucket(9), false).unwrap();
        assert!(dirty.sync(DirKey::Bucket(9), true).is_err());
        // Past the limit the file system is synced and the set starts over.
        for ino in 0..3 {
            dirty.mark(DirKey::Inode(InodeId(ino))).unwrap();
        }
        assert_eq!(dirty.len(), 1);
        dirty.forget(DirKey::Inode(InodeId(2)));
        assert_eq!(dirty.len(), 0);
    }

    #[test]
    fn a_failed_sync_keeps_the_mark() {
        let tmp = tempfile::tempdir().unwrap();
        let dirty = DirtyDirs::new(tmp.path(), MAX_DIRTY_DIRS);
        dirty.mark(DirKey::Bucket(3)).unwrap();
        assert!(
            dirty.sync(DirKey::Bucket(3), false).is_err(),
            "directory does not exist"
        );
        assert_eq!(dirty.len(), 1);
    }
}
