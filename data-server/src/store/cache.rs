//! A bounded cache of open chunk files, least recently used out.
//!
//! A large chunk is read in many requests; without the cache each one would look up the
//! path, open the file, and read and check its header again. An entry holds only what
//! never changes while the file exists (the descriptor and the geometry of its header);
//! the length is read with `fstat` on every use. An entry is valid only while its file is
//! the one at the chunk's path, so the store drops it, under the chunk's exclusive lock,
//! before removing the file: a later write then creates and caches a new file instead of
//! writing into the removed one.

use super::format::Geometry;
use parking_lot::Mutex;
use proto::ChunkId;
use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;

/// Chunk files the store keeps open at most (two descriptors each: buffered and
/// `O_DIRECT`), well under the usual limit of 1024 descriptors per process.
pub(crate) const MAX_OPEN_CHUNK_FILES: usize = 256;

/// A chunk file's descriptors: the read-write one, and the `O_DIRECT` one if any.
pub(crate) type Fds = (Arc<File>, Option<Arc<File>>);

/// The cache. Every operation takes one short lock; opening a file, the slow part of a
/// miss, happens outside it.
pub(crate) struct OpenFiles {
    limit: usize,
    inner: Mutex<Inner>,
}

struct Inner {
    /// Counts uses; an entry's `used` is the count at its last use.
    clock: u64,
    map: HashMap<ChunkId, Cached>,
}

struct Cached {
    fds: Fds,
    geo: Geometry,
    used: u64,
}

impl OpenFiles {
    /// An empty cache holding at most `limit` files (0 disables it).
    pub fn new(limit: usize) -> OpenFiles {
        OpenFiles {
            limit,
            inner: Mutex::new(Inner {
                clock: 0,
                map: HashMap::with_capacity(limit),
            }),
        }
    }

    /// The open file of `chunk` and its geometry, if cached.
    pub fn get(&self, chunk: ChunkId) -> Option<(Fds, Geometry)> {
        let mut inner = self.inner.lock();
        inner.clock += 1;
        let now = inner.clock;
        let cached = inner.map.get_mut(&chunk)?;
        cached.used = now;
        Some((cached.fds.clone(), cached.geo))
    }

    /// Caches the open file of `chunk`, evicting the least recently used one when full.
    pub fn insert(&self, chunk: ChunkId, fds: Fds, geo: Geometry) {
        if self.limit == 0 {
            return;
        }
        let mut inner = self.inner.lock();
        inner.clock += 1;
        let used = inner.clock;
        let mut evicted = None;
        if inner.map.len() >= self.limit && !inner.map.contains_key(&chunk) {
            // A scan of at most `limit` entries, only on a miss, which costs an open anyway.
            let oldest = inner
                .map
                .iter()
                .min_by_key(|(_, c)| c.used)
                .map(|(&k, _)| k);
            evicted = oldest.and_then(|k| inner.map.remove(&k));
        }
        inner.map.insert(chunk, Cached { fds, geo, used });
        drop(inner);
        // Closed outside the lock: a close can be slow on some file systems.
        drop(evicted);
    }

    /// Forgets `chunk`'s file; call before removing the file.
    pub fn remove(&self, chunk: ChunkId) {
        let removed = self.inner.lock().map.remove(&chunk);
        drop(removed);
    }

    /// Number of cached files.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner.lock().map.len()
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
