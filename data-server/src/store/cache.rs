//! A bounded cache of open chunk files, least recently used out.
//!
//! A large chunk is read in many requests; without the cache each one would look up the
//! path, open the file, and read and check its header again. An entry holds only what
//! never changes while the file exists (the descriptor and the geometry of its header);
//! the length is read with `fstat` on every use. An entry is valid only while its file is
//! the one at the chunk's path, so the store drops it, under the chunk's exclusive lock,
//! before removing the file: a later write then creates and caches a new file instead of
//! writing into the removed one.
//!
//! An open file also keeps its inode in the kernel's memory when the page cache is
//! dropped or reclaimed: a cold read of a cached chunk is one disk read of its bytes,
//! where one of an uncached chunk first reads its directory, its inode and its header,
//! each waiting for the one before. So a server keeps as many open as its descriptor
//! limit allows, up to [`MAX_OPEN_CHUNK_FILES`] ([`open_files_for`]).

use super::format::Geometry;
use lru::LruCache;
use parking_lot::Mutex;
use proto::ChunkId;
use std::fs::File;
use std::num::NonZeroUsize;
use std::sync::Arc;

/// Chunk files a store keeps open unless told otherwise ([`super::ChunkStore::keep_open`]):
/// two descriptors each (buffered and `O_DIRECT`), well under the usual soft limit of
/// 1024 descriptors per process.
pub const DEFAULT_OPEN_CHUNK_FILES: usize = 256;

/// The most chunk files a server keeps open, whatever its descriptor limit: 16,384
/// descriptors, a few tens of megabytes of kernel memory, the chunks of 32 GiB of data
/// at 4 MiB each.
pub const MAX_OPEN_CHUNK_FILES: usize = 8192;

/// Descriptors a data server holds besides its connections and its chunk files (the
/// store's lock, directories being synced, logs, the runtime's own, metrics).
const OTHER_DESCRIPTORS: u64 = 256;

/// How many chunk files a server whose process may hold `nofile` descriptors, and that
/// accepts up to `connections` connections, keeps open: what is left after those, two
/// descriptors per file, from [`DEFAULT_OPEN_CHUNK_FILES`] (kept even under a low limit,
/// as before) to [`MAX_OPEN_CHUNK_FILES`].
pub fn open_files_for(nofile: u64, connections: usize) -> usize {
    let left = nofile.saturating_sub((connections as u64).saturating_add(OTHER_DESCRIPTORS)) / 2;
    usize::try_from(left)
        .unwrap_or(usize::MAX)
        .clamp(DEFAULT_OPEN_CHUNK_FILES, MAX_OPEN_CHUNK_FILES)
}

/// A chunk file's descriptors: the read-write one, and the `O_DIRECT` one if any.
pub(crate) type Fds = (Arc<File>, Option<Arc<File>>);

/// The cache. Every operation takes one short lock; opening a file, the slow part of a
/// miss, happens outside it.
pub(crate) struct OpenFiles {
    /// `None` when the cache is off (a limit of 0).
    inner: Mutex<Option<LruCache<ChunkId, Cached>>>,
}

struct Cached {
    fds: Fds,
    geo: Geometry,
}

impl OpenFiles {
    /// An empty cache holding at most `limit` files (0 disables it).
    pub fn new(limit: usize) -> OpenFiles {
        OpenFiles {
            inner: Mutex::new(NonZeroUsize::new(limit).map(LruCache::new)),
        }
    }

    /// The open file of `chunk` and its geometry, if cached.
    pub fn get(&self, chunk: ChunkId) -> Option<(Fds, Geometry)> {
        let mut inner = self.inner.lock();
        let cached = inner.as_mut()?.get(&chunk)?;
        Some((cached.fds.clone(), cached.geo))
    }

    /// Caches the open file of `chunk`, evicting the least recently used one when full.
    pub fn insert(&self, chunk: ChunkId, fds: Fds, geo: Geometry) {
        let mut inner = self.inner.lock();
        let Some(cache) = inner.as_mut() else {
            return;
        };
        // The entry pushed out: the least recently used, or this chunk's earlier one.
        let evicted = cache.push(chunk, Cached { fds, geo });
        drop(inner);
        // Closed outside the lock: a close can be slow on some file systems.
        drop(evicted);
    }

    /// Forgets `chunk`'s file; call before removing the file.
    pub fn remove(&self, chunk: ChunkId) {
        let removed = self.inner.lock().as_mut().and_then(|c| c.pop(&chunk));
        drop(removed);
    }

    /// Number of cached files.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner.lock().as_ref().map_or(0, LruCache::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::InodeId;

    fn chunk(index: u64) -> ChunkId {
        ChunkId {
            inode: InodeId(1),
            index,
        }
    }

    #[test]
    fn the_files_kept_open_follow_the_descriptor_limit() {
        // The usual soft limit, not raised: as many as before.
        assert_eq!(open_files_for(1024, 1024), DEFAULT_OPEN_CHUNK_FILES);
        assert_eq!(open_files_for(0, 1024), DEFAULT_OPEN_CHUNK_FILES);
        // What is left after connections and the rest, two descriptors a file.
        assert_eq!(open_files_for(10_000, 1024), (10_000 - 1024 - 256) / 2);
        // systemd's LimitNOFILE of the packaged units, and no limit at all.
        assert_eq!(open_files_for(1 << 20, 1024), MAX_OPEN_CHUNK_FILES);
        assert_eq!(
            open_files_for(u64::MAX, usize::MAX),
            DEFAULT_OPEN_CHUNK_FILES
        );
        assert_eq!(open_files_for(u64::MAX, 0), MAX_OPEN_CHUNK_FILES);
    }

    #[test]
    fn evicts_the_least_recently_used_file() {
        let tmp = tempfile::tempfile().unwrap();
        let file = Arc::new(tmp);
        let geo = Geometry::new(1 << 20).unwrap();
        let cache = OpenFiles::new(2);
        let fds = || (Arc::clone(&file), None);
        cache.insert(chunk(0), fds(), geo);
        cache.insert(chunk(1), fds(), geo);
        assert!(
            cache.get(chunk(0)).is_some(),
            "chunk 0 is now the most recent"
        );
        cache.insert(chunk(2), fds(), geo);
        assert_eq!(cache.len(), 2);
        assert!(cache.get(chunk(1)).is_none());
        assert_eq!(cache.get(chunk(0)).unwrap().1, geo);
        // Inserting a cached chunk again evicts nothing.
        cache.insert(chunk(2), fds(), geo);
        assert!(cache.get(chunk(0)).is_some() && cache.get(chunk(2)).is_some());
        cache.remove(chunk(2));
        cache.remove(chunk(7));
        assert_eq!(cache.len(), 1);
        // Evicted and removed entries close their descriptors: only ours and chunk 0's.
        assert_eq!(Arc::strong_count(&file), 2);
        let off = OpenFiles::new(0);
        off.insert(chunk(0), (file, None), geo);
        assert_eq!(off.len(), 0);
    }
}
