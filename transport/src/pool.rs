//! A pool of registered I/O buffers, reused rather than allocated per request.

use crate::{Endpoint, MemoryRegion, TransportError};
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Fixed-size registered buffers; taking one waits while all are in use, which bounds
/// the bytes a client has in flight.
pub struct BufferPool {
    free: Mutex<Vec<MemoryRegion>>,
    permits: Arc<Semaphore>,
    buffer_bytes: usize,
}

/// A buffer taken from the pool; it goes back when dropped.
pub struct PooledBuf<'a> {
    mr: Option<MemoryRegion>,
    pool: &'a BufferPool,
    _permit: OwnedSemaphorePermit,
}

impl BufferPool {
    /// Registers `count` buffers of `buffer_bytes` each.
    pub fn new(ep: &Endpoint, count: usize, buffer_bytes: usize) -> Result<Self, TransportError> {
        let free = (0..count)
            .map(|_| ep.register(buffer_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BufferPool {
            free: Mutex::new(free),
            permits: Arc::new(Semaphore::new(count)),
            buffer_bytes,
        })
    }

    /// Size of each buffer.
    pub fn buffer_bytes(&self) -> usize {
        self.buffer_bytes
    }

    /// Takes a buffer, waiting for one to come back if all are in use.
    pub async fn take(&self) -> PooledBuf<'_> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the pool's semaphore is never closed");
        let mr = self.free.lock().pop();
        PooledBuf {
            mr,
            pool: self,
            _permit: permit,
        }
    }
}

impl PooledBuf<'_> {
    /// The registered memory.
    pub fn mr(&self) -> &MemoryRegion {
        self.mr
            .as_ref()
            .expect("a permit always comes with a buffer")
    }
}

impl Drop for PooledBuf<'_> {
    fn drop(&mut self) {
        if let Some(mr) = self.mr.take() {
            self.pool.free.lock().push(mr);
        }
    }
}
