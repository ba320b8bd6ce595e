//! Per-chunk locks held across network calls (a chain write holds its chunk's lock until
//! the successor answered). One lock per chunk in use, never shared between chunks: two
//! chunks sharing a lock on every server could deadlock two chains writing them in
//! opposite orders.

use parking_lot::Mutex;
use proto::ChunkId;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// The locks of the chunks in use.
#[derive(Default)]
pub(crate) struct ChunkLocks {
    map: Mutex<HashMap<ChunkId, Arc<RwLock<()>>>>,
}

// The guards are held only to be dropped.
#[allow(dead_code)]
enum Held {
    Read(OwnedRwLockReadGuard<()>),
    Write(OwnedRwLockWriteGuard<()>),
}

/// A held chunk lock; the table forgets the lock when its last user drops it.
pub(crate) struct ChunkGuard<'a> {
    held: Option<Held>,
    locks: &'a ChunkLocks,
    chunk: ChunkId,
}

impl ChunkLocks {
    fn lock_of(&self, chunk: ChunkId) -> Arc<RwLock<()>> {
        self.map.lock().entry(chunk).or_default().clone()
    }

    /// Shared: reads.
    pub(crate) async fn read(&self, chunk: ChunkId) -> ChunkGuard<'_> {
        let g = self.lock_of(chunk).read_owned().await;
        ChunkGuard {
            held: Some(Held::Read(g)),
            locks: self,
            chunk,
        }
    }

    /// Exclusive: writes, copies, truncations.
    pub(crate) async fn write(&self, chunk: ChunkId) -> ChunkGuard<'_> {
        let g = self.lock_of(chunk).write_owned().await;
        ChunkGuard {
            held: Some(Held::Write(g)),
            locks: self,
            chunk,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().len()
    }
}

impl Drop for ChunkGuard<'_> {
    fn drop(&mut self) {
        drop(self.held.take());
        let mut map = self.locks.map.lock();
        // Only the table holds it: nobody waits or holds it, so it can go.
        if map
            .get(&self.chunk)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            map.remove(&self.chunk);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::InodeId;

    #[tokio::test]
    async fn locks_exclude_and_are_forgotten() {
        let locks = ChunkLocks::default();
        let c = ChunkId {
            inode: InodeId(1),
            index: 0,
        };
        let w = locks.write(c).await;
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), locks.read(c));
        assert!(waiting.await.is_err(), "a read waits for the write");
        drop(w);
        {
            let _a = locks.read(c).await;
            let _b = locks.read(c).await;
            assert_eq!(locks.len(), 1);
        }
        assert_eq!(locks.len(), 0);
    }
}
