//! The chunk store: file chunks as checksummed files on local disk.
//!
//! The on-disk format (the directory tree, a chunk file's header, table and data) is
//! described in [`mod@format`].
//!
//! # Updates and crashes
//!
//! A write (one range, or several separate ranges of the chunk stored as one write)
//! changes the blocks it touches in three steps, each finished before the next starts:
//!
//! 1. *intent*: one `pwrite` of the entries from its first block to its last. A block
//!    that holds data gets *pending*, with the crc of the version it holds (a partially
//!    covered block is read and verified first; writing into a corrupt block is refused)
//!    and the crc of its new version. A block without data gets *pending first*. The
//!    entries of blocks between separate ranges are written as they were read, under
//!    the chunk's lock: the same bytes, so a crash leaves them as they were.
//! 2. the data, with `pwrite`. A partially covered block that holds data is merged (once,
//!    however many ranges share it) and written from the first new byte to the last,
//!    the unchanged bytes between them as they were; one without data is written whole
//!    up to the chunk's end, over any stray bytes a crash left there.
//! 3. *done*: one `pwrite` of the same entries, now *stable* with the new crc.
//!
//! A truncation that cuts the file goes the same way: (1) the block holding the new end
//! becomes pending (its old crc, and the crc of its bytes cut at the new end) and the
//! entries past it become unwritten, (2) `ftruncate`, (3) the boundary entry becomes
//! stable. It then fsyncs the file (see below). A crash before step 2 leaves the boundary
//! block whole and the blocks past it reading as their old bytes or as zeros: the
//! truncation had not returned, and its retry completes it.
//!
//! A kill -9 leaves the page cache as the completed steps made it, plus a prefix of the
//! step under way (a `pwrite` copies page by page and stops at a fatal signal). Entries
//! are 16-byte aligned and never straddle a page, so each one is old or new, and:
//!
//! - a crash during step 1 or before step 2: each block reads as its old version (its old
//!   entry and its intent entry both accept it); the retried request succeeds;
//! - during step 2, for a block whose bytes were all stored: its new version (the intent
//!   entry accepts it); the retried request succeeds;
//! - during step 2, in the middle of a block: that block holds neither version and reads
//!   as corrupt (pending first: as zeros, its only old version); a partial write into it is
//!   refused, a write of the whole block succeeds;
//! - after step 2: the new version (the intent and the done entry accept it); the retried
//!   request succeeds.
//!
//! So the bytes of a block that a write does not cover survive a crash of any step but
//! one: a data `pwrite` interrupted in the middle of that very block. Version 3's blocks
//! are a page up to 4 MiB chunks, and Linux stops a buffered `pwrite` that a `kill -9`
//! cuts short between pages (in practice: a copy cut short by a fault on the source can
//! still end inside one), so there a kill does not tear a block; larger blocks (and
//! version 2 files' 64 KiB ones) would need a crc per page or the written range in the
//! entry.
//!
//! Which version a block holds is decided by its bytes, never assumed from an entry an
//! interrupted update left pending: a write (also one covering a whole block) reads such a
//! block to learn whether its bytes match the old or the new crc, and keeps that one as
//! the old crc of its own intent entry. A stable entry's bytes are known to match it
//! (step 3 follows step 2), so overwriting a whole stable block reads nothing. Reads leave
//! pending entries as they are (they hold only a shared lock); the next write to the block
//! settles it.
//!
//! Power loss is weaker than a kill -9: until an fsync the kernel writes table and data
//! pages back in any order, so a block changed since the last fsync may read as corrupt
//! afterwards (never as wrong bytes). Blocks not changed since their last fsync are not
//! affected. Closing that gap would need an fsync between steps 1 and 2.
//!
//! Nothing here is durable until [`ChunkStore::fsync`]; `truncate_file` syncs itself
//! because a truncation lost in a crash would bring old bytes back past the end of the
//! file.
//!
//! Space accounting: a chunk file is charged its header and table plus, for each written
//! block, its bytes up to the chunk's length rounded up to 4 KiB. It is recomputed from
//! the files at [`ChunkStore::open`], unless [`ChunkStore::close`] saved it at a clean
//! shutdown.
//!
//! Chunk files stay open between requests, the least recently used closed first: 256
//! in a bare store, as many as a server's descriptor limit leaves room for up to 8,192
//! ([`ChunkStore::keep_open`], `cache.rs`); a chunk's file is dropped from that cache
//! before it is removed.

mod cache;
mod chunk;
pub(crate) mod dirs;
pub mod format;
#[doc(hidden)]
pub mod fuzzing;
mod holes;
mod io;
mod node_id;
mod removed;
mod saved_usage;

use crate::error::{DataError, IoContext};
use cache::OpenFiles;
pub use cache::{open_files_for, DEFAULT_OPEN_CHUNK_FILES, MAX_OPEN_CHUNK_FILES};
use chunk::{measure, ChunkFile, Opened, WritePlan, DIRECT_MIN_CHUNK_BYTES};
use dirs::{DirKey, DirtyDirs, MAX_DIRTY_DIRS};
use format::{bucket_of, chunk_path, chunks_root, inode_dir, Geometry};
pub use io::StoreIo;
use io::{Found, IoOp};
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use proto::{ChunkId, InodeId, NodeId};
use removed::Removed;
pub use replica::list_order;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

mod replica;
mod scan;
pub use replica::{Fill, ReplicaFields, Stamp, Versioned};
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_crash;
#[cfg(test)]
mod tests_damage;

/// Number of lock stripes: chunks hash onto them, so different chunks rarely wait on
/// each other, while the lock table stays a fixed size however many chunks exist.
const LOCK_STRIPES: usize = 256;

/// Disk usage of a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Bytes this store may use.
    pub capacity_bytes: u64,
    /// Bytes charged to the chunks it holds (see the module docs).
    pub used_bytes: u64,
    /// Chunk files it holds.
    pub chunks: u64,
}

/// The chunks of one data server, under one directory. `Send + Sync`: share it in an
/// `Arc`; every method is synchronous file I/O, to be called where blocking is allowed.
pub struct ChunkStore {
    dir: PathBuf,
    root: PathBuf,
    capacity_bytes: u64,
    used_bytes: AtomicU64,
    chunks: AtomicU64,
    /// Readers of a chunk share its stripe; writers, truncation and removal exclude.
    stripes: Box<[RwLock<()>]>,
    dirty: DirtyDirs,
    /// Chunk files kept open between requests.
    files: OpenFiles,
    /// Whether chunk files get an `O_DIRECT` descriptor (see [`ChunkFile::direct`]);
    /// turned off for good when the file system refuses one.
    direct_io: AtomicBool,
    /// Bytes read stay in the page cache (`direct_io = false`); otherwise this server
    /// caches no chunk data, small chunks included.
    keep_read_pages: AtomicBool,
    /// Bytes of the disk that writes leave free (see `DataConfig::disk_reserve_bytes`).
    disk_reserve: u64,
    /// Set by [`ChunkStore::close`]: changes are refused from then on.
    closed: AtomicBool,
    node_id_lock: Mutex<()>,
    /// Files whose chunks were deleted here, the latest 65,536 (`removed.rs`). Inode numbers
    /// are never reused, so a copy a resync or repair fetched before the deletion must
    /// not be installed after it (it would stay, space no deletion frees, until a
    /// sweep). Taken by [`ChunkStore::delete_file`] and around an install's writes.
    removed: Mutex<Removed>,
    /// Counts operations and checksum failures (see `io.rs`); `None`: nothing counted.
    io: Option<StoreIo>,
    /// Holds the flock on `<dir>/LOCK` until the store is dropped.
    _lock_file: File,
}

impl ChunkStore {
    /// Opens (creating if needed) the store in `dir`, allowed to use `capacity_bytes`.
    /// Recounts the space the existing chunks use; fails with [`DataError::Locked`] if
    /// another store has `dir` open.
    pub fn open(dir: &Path, capacity_bytes: u64) -> Result<ChunkStore, DataError> {
        scan::create_dir_durably(dir)?;
        let lock_path = dir.join("LOCK");
        let lock_file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .ctx(|| format!("open {}", lock_path.display()))?;
        match lock_file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(DataError::Locked {
                    path: dir.to_owned(),
                })
            }
            Err(fs::TryLockError::Error(e)) => {
                return Err(DataError::io(format!("lock {}", lock_path.display()), e))
            }
        }
        let root = chunks_root(dir);
        scan::create_tree(dir, &root)?;
        scan::migrate_tree(dir, &root)?;
        node_id::remove_stale_tmp(dir)?;
        let (used_bytes, chunks) = match saved_usage::take(dir)? {
            Some(saved) => (saved.used_bytes, saved.chunks),
            None => scan::count_usage(&root)?,
        };
        tracing::info!(dir = %dir.display(), used_bytes, chunks, capacity_bytes,
            "chunk store open");
        Ok(ChunkStore {
            dir: dir.to_owned(),
            dirty: DirtyDirs::new(&root, MAX_DIRTY_DIRS),
            root,
            capacity_bytes,
            used_bytes: AtomicU64::new(used_bytes),
            chunks: AtomicU64::new(chunks),
            stripes: (0..LOCK_STRIPES).map(|_| RwLock::new(())).collect(),
            files: OpenFiles::new(DEFAULT_OPEN_CHUNK_FILES),
            direct_io: AtomicBool::new(true),
            keep_read_pages: AtomicBool::new(false),
            disk_reserve: 0,
            closed: AtomicBool::new(false),
            node_id_lock: Mutex::new(()),
            removed: Mutex::new(Removed::default()),
            io: None,
            _lock_file: lock_file,
        })
    }

    /// Leaves `bytes` of the disk free: a write that needs more room fails with
    /// [`DataError::NoSpace`] (0, the default of a bare store: no check).
    pub fn disk_reserve(mut self, bytes: u64) -> ChunkStore {
        self.disk_reserve = bytes;
        self
    }

    /// Keeps up to `limit` chunk files open between requests (0: none), in place of the
    /// bare store's 256; call before any request.
    pub fn keep_open(mut self, limit: usize) -> ChunkStore {
        self.files = OpenFiles::new(limit);
        self
    }

    /// Turns `O_DIRECT` for whole-block runs on (the default) or off; off also keeps the
    /// bytes read in the page cache.
    pub fn direct_io(self, on: bool) -> ChunkStore {
        self.direct_io.store(on, Ordering::Relaxed);
        self.keep_read_pages.store(!on, Ordering::Relaxed);
        self
    }

    /// Fills `buf` with bytes `[offset, offset + buf.len())` of the chunk. Holes, bytes
    /// past the chunk's end and a missing chunk read as zeros. Every stored block touched
    /// is verified; on a mismatch the result is [`DataError::Corrupt`] naming the chunk
    /// and block, and `buf` is zeroed so that no unverified byte can leak.
    pub fn read(
        &self,
        chunk: ChunkId,
        chunk_size: u32,
        offset: u32,
        buf: &mut [u8],
    ) -> Result<(), DataError> {
        let n = buf.len() as u64;
        let result = self.counted(IoOp::Read, n, || {
            self.read_checked(chunk, chunk_size, offset, buf)
        });
        let result = self.noted(Found::Read, result);
        if result.is_err() {
            buf.fill(0);
        }
        result
    }

    fn read_checked(
        &self,
        chunk: ChunkId,
        chunk_size: u32,
        offset: u32,
        buf: &mut [u8],
    ) -> Result<(), DataError> {
        let geo = Geometry::new(chunk_size)?;
        geo.check_range(chunk, offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let _shared = self.read_lock(chunk);
        match self.open_chunk(chunk)? {
            Opened::Missing | Opened::Empty(_) => {
                buf.fill(0);
                Ok(())
            }
            Opened::Chunk(cf) => {
                cf.check_chunk_size(chunk_size)?;
                cf.read(u64::from(offset), buf)?;
                // The client's kernel caches what it reads; a second copy in this
                // server's page cache only crowds the memory (a data set read once
                // through a mount filled it with both copies, and reclaiming them ran
                // the read at half speed). Runs read with O_DIRECT leave no pages; this
                // is for small chunks, read through the page cache.
                if !self.keep_read_pages.load(Ordering::Relaxed) {
                    cf.forget_read(u64::from(offset), buf.len());
                }
                Ok(())
            }
        }
    }

    /// Bytes stored in the chunk (0 for a missing chunk); bytes past it read as zeros.
    pub fn chunk_len(&self, chunk: ChunkId) -> Result<u64, DataError> {
        let _shared = self.read_lock(chunk);
        Ok(match self.open_chunk(chunk)? {
            Opened::Missing | Opened::Empty(_) => 0,
            Opened::Chunk(cf) => cf.data_len,
        })
    }

    /// Stores `data` at `offset` of the chunk, creating its file and directory as needed.
    /// Not durable until [`ChunkStore::fsync`]. Fails with [`DataError::NoSpace`] if the
    /// space charged would pass the capacity, or the disk is full.
    pub fn write(
        &self,
        chunk: ChunkId,
        chunk_size: u32,
        offset: u32,
        data: &[u8],
    ) -> Result<(), DataError> {
        let _excl = self.write_lock(chunk);
        self.write_locked(chunk, chunk_size, &[(offset, data)])
    }

    /// Stores `ranges` (`(offset, bytes)`, in ascending order, not overlapping) as one
    /// write, as [`ChunkStore::write`] stores one: the table is read and written once
    /// and a block that several ranges share is read and written once. The chunk's
    /// stripe is held exclusively by the caller.
    fn write_locked(
        &self,
        chunk: ChunkId,
        chunk_size: u32,
        ranges: &[(u32, &[u8])],
    ) -> Result<(), DataError> {
        let n = ranges.iter().map(|r| r.1.len() as u64).sum();
        let r = self.counted(IoOp::Write, n, || {
            self.store_locked(chunk, chunk_size, ranges)
        });
        self.noted(Found::Write, r)
    }

    /// The write of [`ChunkStore::write_locked`], uncounted.
    fn store_locked(
        &self,
        chunk: ChunkId,
        chunk_size: u32,
        ranges: &[(u32, &[u8])],
    ) -> Result<(), DataError> {
        let geo = Geometry::new(chunk_size)?;
        let mut next_free = 0u64;
        for &(offset, data) in ranges {
            geo.check_range(chunk, offset, data.len())?;
            if u64::from(offset) < next_free {
                return Err(DataError::InvalidArgument(format!(
                    "{chunk}: write ranges overlap or are out of order at {offset}"
                )));
            }
            next_free = u64::from(offset) + data.len() as u64;
        }
        let ranges: Vec<(u64, &[u8])> = ranges
            .iter()
            .filter(|r| !r.1.is_empty())
            .map(|&(at, data)| (u64::from(at), data))
            .collect();
        if ranges.is_empty() {
            return Ok(());
        }
        self.check_open()?;
        let path = chunk_path(&self.root, chunk);
        let (existing, empty) = match self.open_chunk(chunk)? {
            Opened::Missing => (None, None),
            Opened::Empty(f) => (None, Some(f)),
            Opened::Chunk(cf) => {
                cf.check_chunk_size(chunk_size)?;
                (Some(cf), None)
            }
        };
        let plan = ChunkFile::plan_write(existing.as_ref(), geo, &ranges)?;
        self.reserve(
            chunk,
            plan.accounted_after.saturating_sub(plan.accounted_before),
        )?;
        let created = existing.is_none() && empty.is_none();
        let stored = match existing {
            Some(mut cf) => cf.apply_write(&plan, &ranges),
            None => self.create_and_write(chunk, geo, empty, &plan, &ranges),
        };
        match stored {
            Ok(()) if created => {
                self.chunks.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Ok(()) => Ok(()),
            Err(e) => {
                self.undo_write(chunk, &path, created, &plan);
                Err(e)
            }
        }
    }

    /// Makes the chunk's file (or initialises an empty one a crash left) and writes.
    fn create_and_write(
        &self,
        chunk: ChunkId,
        geo: Geometry,
        empty: Option<File>,
        plan: &WritePlan,
        ranges: &[(u64, &[u8])],
    ) -> Result<(), DataError> {
        let path = chunk_path(&self.root, chunk);
        let file = match empty {
            Some(f) => f,
            None => self.create_chunk_file(chunk, &path)?,
        };
        // Also for a leftover empty file: its directory entry may not be durable yet.
        self.dirty.mark(DirKey::holding(chunk))?;
        let mut cf = ChunkFile::init(file, &path, chunk, geo)?;
        self.attach_direct(&mut cf, plan.new_len);
        cf.apply_write(plan, ranges)?;
        self.files.insert(chunk, cf.fds(), geo);
        Ok(())
    }

    /// Opens the chunk's file, read-write, from the cache of open files if it is there;
    /// a chunk file opened here is cached. Call with the chunk's lock held (either mode).
    fn open_chunk(&self, chunk: ChunkId) -> Result<Opened, DataError> {
        let path = chunk_path(&self.root, chunk);
        if let Some((fds, geo)) = self.files.get(chunk) {
            let mut cf = ChunkFile::reopen(fds, path, chunk, geo)?;
            // A small chunk that has grown since it was cached.
            let len = cf.data_len;
            if self.attach_direct(&mut cf, len) {
                self.files.insert(chunk, cf.fds(), cf.geo);
            }
            return Ok(Opened::Chunk(cf));
        }
        let mut opened = ChunkFile::open(&path, chunk, true)?;
        if let Opened::Chunk(cf) = &mut opened {
            let len = cf.data_len;
            self.attach_direct(cf, len);
            self.files.insert(chunk, cf.fds(), cf.geo);
        }
        Ok(opened)
    }

    /// Gives a chunk file holding `len` bytes its `O_DIRECT` descriptor if it has none,
    /// `direct_io` is on and the chunk is large enough to use it: a small file's chunk
    /// would only pay a second open (on each member of a chain, for every small file
    /// created or first read). True if it got one.
    fn attach_direct(&self, cf: &mut ChunkFile, len: u64) -> bool {
        let on = self.direct_io.load(Ordering::Relaxed);
        if !on || cf.direct.is_some() || len <= DIRECT_MIN_CHUNK_BYTES {
            return false;
        }
        if !cf.open_direct() {
            self.direct_io.store(false, Ordering::Relaxed);
        }
        cf.direct.is_some()
    }

    /// Creates the chunk's (empty) file and, if needed, its inode directory (not for a
    /// first chunk, which lies in the bucket).
    fn create_chunk_file(&self, chunk: ChunkId, path: &Path) -> Result<File, DataError> {
        let dir = inode_dir(&self.root, chunk.inode);
        let what = || format!("create {}", path.display());
        let mut attempts = 0;
        loop {
            if chunk.index > 0 {
                match fs::create_dir(&dir) {
                    Ok(()) => self.dirty.mark(DirKey::Bucket(bucket_of(chunk.inode)))?,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(DataError::io(what(), e)),
                }
            }
            let opened = File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path);
            match opened {
                Ok(f) => return Ok(f),
                // A concurrent delete_file of the inode removed the directory in between
                // (chunks after the first: chunk 0 needs no directory of its own).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && attempts < 3 => {
                    attempts += 1;
                }
                Err(e) => return Err(DataError::io(what(), e)),
            }
        }
    }

    /// After a failed write: drop a file this write created, and charge what the chunk
    /// really holds now instead of what the write planned.
    fn undo_write(&self, chunk: ChunkId, path: &Path, created: bool, plan: &WritePlan) {
        if created {
            self.files.remove(chunk);
            // The directory stays marked dirty: other new chunks may share it.
            if fs::remove_file(path).is_err() && path.exists() {
                self.chunks.fetch_add(1, Ordering::Relaxed);
            }
        }
        match measure(path, chunk) {
            Ok(actual) => self.adjust(plan.accounted_after, actual),
            // Keep the planned charge: over-counting only refuses writes early.
            Err(e) => tracing::warn!(%chunk, error = %e, "cannot re-measure chunk"),
        }
    }

    /// Cuts the file to `size` bytes: chunks starting at or past `size` are removed and
    /// the chunk holding byte `size - 1` is cut, so bytes past the end read as zeros even
    /// after the file grows again. Durable on return.
    pub fn truncate_file(
        &self,
        inode: InodeId,
        size: u64,
        chunk_size: u32,
    ) -> Result<(), DataError> {
        let geo = Geometry::new(chunk_size)?;
        let cs = u64::from(chunk_size);
        let indexes = scan::list_chunks(&self.root, inode)?;
        // The boundary chunk first: if it refuses the chunk size, nothing is removed yet.
        if let Some(last) = size.checked_sub(1).map(|end| end / cs) {
            let keep = size - last * cs;
            if keep < cs && indexes.contains(&last) {
                self.cut_chunk(ChunkId { inode, index: last }, geo, keep)?;
            }
        }
        let mut removed = std::collections::BTreeSet::new();
        for index in indexes {
            // A chunk whose start does not fit in a u64 lies past any size.
            if index.checked_mul(cs).is_none_or(|start| start >= size) {
                let chunk = ChunkId { inode, index };
                if self.remove_chunk(chunk)? {
                    removed.insert(DirKey::holding(chunk));
                }
            }
        }
        // The removals are durable once the directories that named the files are.
        for key in removed {
            self.dirty.sync(key, true)?;
        }
        Ok(())
    }

    /// Cuts one chunk to `keep` bytes and syncs it.
    fn cut_chunk(&self, chunk: ChunkId, geo: Geometry, keep: u64) -> Result<(), DataError> {
        let _excl = self.write_lock(chunk);
        self.check_open()?;
        let path = chunk_path(&self.root, chunk);
        let Opened::Chunk(mut cf) = self.open_chunk(chunk)? else {
            return Ok(());
        };
        cf.check_chunk_size(geo.chunk_size)?;
        let (before, after) = cf.truncate(keep)?;
        self.adjust(before, after);
        cf.file
            .sync_data()
            .ctx(|| format!("fsync {}", path.display()))
    }

    /// Removes one chunk file; returns whether there was one.
    fn remove_chunk(&self, chunk: ChunkId) -> Result<bool, DataError> {
        let _excl = self.write_lock(chunk);
        self.check_open()?;
        let path = chunk_path(&self.root, chunk);
        let charged = measure(&path, chunk)?;
        // Under the exclusive lock, so no reader caches the file again before it goes.
        self.files.remove(chunk);
        match fs::remove_file(&path) {
            Ok(()) => {
                self.adjust(charged, 0);
                self.chunks.fetch_sub(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(DataError::io(format!("remove {}", path.display()), e)),
        }
    }

    /// Removes every chunk of the file. Deleting a file that has no chunks here is not
    /// an error. Not synced: inode numbers are never reused, so a chunk a crash brings
    /// back is never read, only space to collect.
    pub fn delete_file(&self, inode: InodeId) -> Result<(), DataError> {
        // Held through the deletion: an install under way finishes first (and its chunk
        // is listed below), a later one sees the file gone.
        let mut removed = self.removed.lock();
        removed.insert(inode);
        let mut first_removed = false;
        for index in scan::list_chunks(&self.root, inode)? {
            first_removed |= self.remove_chunk(ChunkId { inode, index })? && index == 0;
        }
        if first_removed {
            self.dirty.mark(DirKey::Bucket(bucket_of(inode)))?;
        }
        let dir = inode_dir(&self.root, inode);
        match fs::remove_dir(&dir) {
            Ok(()) => {
                self.dirty.forget(DirKey::Inode(inode));
                self.dirty.mark(DirKey::Bucket(bucket_of(inode)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
                // A write raced the delete, or a stray file: keep what is there.
                tracing::warn!(%inode, dir = %dir.display(), "inode directory not empty");
                Ok(())
            }
            Err(e) => Err(DataError::io(format!("remove {}", dir.display()), e)),
        }
    }

    /// Runs `install` unless `inode`'s chunks were deleted here (then it is a copy of a
    /// removed file: nothing is written); no deletion of the file runs meanwhile.
    pub(crate) fn unless_removed(
        &self,
        inode: InodeId,
        install: impl FnOnce() -> Result<(), DataError>,
    ) -> Result<(), DataError> {
        let removed = self.removed.lock();
        if removed.set.contains(&inode) {
            tracing::debug!(%inode, "not installing a copy of a deleted file's chunk");
            return Ok(());
        }
        install()
    }

    /// Puts the data of these chunks, and the directory entries that lead to them, on
    /// stable storage. Chunks that do not exist are skipped.
    pub fn fsync(&self, chunks: &[ChunkId]) -> Result<(), DataError> {
        self.counted(IoOp::Fsync, 0, || self.sync_chunks(chunks))
    }

    /// The syncs of [`ChunkStore::fsync`], uncounted.
    fn sync_chunks(&self, chunks: &[ChunkId]) -> Result<(), DataError> {
        let mut list = chunks.to_vec();
        list.sort_unstable();
        list.dedup();
        for &chunk in &list {
            let path = chunk_path(&self.root, chunk);
            let file = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(DataError::io(format!("open {}", path.display()), e)),
            };
            file.sync_data()
                .ctx(|| format!("fsync {}", path.display()))?;
        }
        // Children before parents: a directory entry must not outlive what it names.
        let mut inodes: Vec<InodeId> = list.iter().map(|c| c.inode).collect();
        inodes.dedup();
        for &inode in &inodes {
            self.dirty.sync(DirKey::Inode(inode), false)?;
        }
        let mut buckets: Vec<u8> = inodes.iter().map(|&i| bucket_of(i)).collect();
        buckets.sort_unstable();
        buckets.dedup();
        for b in buckets {
            self.dirty.sync(DirKey::Bucket(b), false)?;
        }
        Ok(())
    }

    /// Ends the store's changes and saves its usage for the next [`ChunkStore::open`],
    /// which then need not count every chunk. Changes under way finish first; later ones
    /// fail with [`DataError::Closed`]. Reads still work. Syncs the file system first
    /// (a clean shutdown writes back what it holds), so it can take a while.
    pub fn close(&self) -> Result<(), DataError> {
        self.closed.store(true, Ordering::SeqCst);
        // Every change holds its chunk's stripe exclusively and checks the flag under
        // it: once each stripe has been taken here, none is under way or can start.
        for stripe in self.stripes.iter() {
            drop(stripe.write());
        }
        let saved = saved_usage::Saved {
            used_bytes: self.used_bytes.load(Ordering::SeqCst),
            chunks: self.chunks.load(Ordering::SeqCst),
        };
        saved_usage::save(&self.dir, saved)?;
        tracing::info!(dir = %self.dir.display(), used_bytes = saved.used_bytes,
            chunks = saved.chunks, "chunk store closed, usage saved");
        Ok(())
    }

    /// Refuses a change once [`ChunkStore::close`] began; call it under the chunk's
    /// exclusive stripe lock, which is what makes the refusal and the close agree.
    pub(super) fn check_open(&self) -> Result<(), DataError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(DataError::Closed {
                path: self.dir.clone(),
            });
        }
        Ok(())
    }

    /// Capacity, bytes charged to chunks, and the number of chunk files.
    pub fn usage(&self) -> Result<Usage, DataError> {
        Ok(Usage {
            capacity_bytes: self.capacity_bytes,
            used_bytes: self.used_bytes.load(Ordering::Relaxed),
            chunks: self.chunks.load(Ordering::Relaxed),
        })
    }

    /// Capacity and bytes used as the cluster should see them (`statfs`): the capacity
    /// is cut to what the disk can still take, less the reserve, so a disk filled by
    /// something else shows as full.
    pub fn reported_usage(&self) -> Result<(u64, u64), DataError> {
        let used = self.used_bytes.load(Ordering::Relaxed);
        let (_, avail) = transport::disk_space(&self.dir)
            .map_err(|e| DataError::io(format!("statvfs of {}", self.dir.display()), e))?;
        let room = self
            .capacity_bytes
            .saturating_sub(used)
            .min(avail.saturating_sub(self.disk_reserve));
        Ok((used + room, used))
    }

    /// The node id saved by [`ChunkStore::save_node_id`], if any.
    pub fn load_node_id(&self) -> Result<Option<NodeId>, DataError> {
        let _one = self.node_id_lock.lock();
        node_id::load(&self.dir)
    }

    /// Saves the node id durably (temporary file, fsync, rename, fsync of the directory).
    pub fn save_node_id(&self, node: NodeId) -> Result<(), DataError> {
        let _one = self.node_id_lock.lock();
        node_id::save(&self.dir, node)
    }

    /// Charges `bytes` more, unless that passes the capacity or eats into the disk's
    /// reserve.
    fn reserve(&self, chunk: ChunkId, bytes: u64) -> Result<(), DataError> {
        if bytes > 0 && self.disk_reserve > 0 {
            // One statvfs per growing write: a few microseconds beside the write. A
            // failed statvfs does not stop writes (the write itself reports a full disk).
            if let Ok((_, avail)) = transport::disk_space(&self.dir) {
                if avail < bytes.saturating_add(self.disk_reserve) {
                    return Err(DataError::NoSpace(format!(
                        "{chunk}: the disk under {} has {avail} bytes free, and {} are kept \
                         free for the metadata store and deletions",
                        self.dir.display(),
                        self.disk_reserve
                    )));
                }
            }
        }
        let cap = self.capacity_bytes;
        self.used_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&n| n <= cap)
            })
            .map(|_| ())
            .map_err(|used| {
                DataError::NoSpace(format!(
                    "{chunk}: the write needs {bytes} more bytes, {used} of {cap} are in use"
                ))
            })
    }

    /// Replaces a charge of `from` bytes by one of `to` bytes, without a capacity check.
    fn adjust(&self, from: u64, to: u64) {
        let _ = self
            .used_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                Some(used.saturating_sub(from).saturating_add(to))
            });
    }

    fn stripe(&self, chunk: ChunkId) -> &RwLock<()> {
        // Fibonacci hashing: the top byte of the product depends on every input bit.
        let key = chunk.inode.0 ^ chunk.index.rotate_left(32);
        let i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize;
        &self.stripes[i % LOCK_STRIPES]
    }

    fn read_lock(&self, chunk: ChunkId) -> RwLockReadGuard<'_, ()> {
        self.stripe(chunk).read()
    }

    fn write_lock(&self, chunk: ChunkId) -> RwLockWriteGuard<'_, ()> {
        self.stripe(chunk).write()
    }
}

/// Paths used by the tests to reach into the files.
#[cfg(test)]
impl ChunkStore {
    fn chunk_file_path(&self, chunk: ChunkId) -> PathBuf {
        chunk_path(&self.root, chunk)
    }

    fn inode_path(&self, inode: InodeId) -> PathBuf {
        inode_dir(&self.root, inode)
    }

    fn dirty_dirs(&self) -> usize {
        self.dirty.len()
    }

    fn open_files(&self) -> usize {
        self.files.len()
    }
}

// The network layer shares one store between threads.
const _: fn() = || {
    fn is<T: Send + Sync>() {}
    is::<ChunkStore>();
};
