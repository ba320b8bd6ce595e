//! Pools of registered segment buffers, one for readahead and one for buffered writes.
//!
//! A segment buffer holds one aligned `segment_bytes` range of a file. Buffers are
//! registered on first use, so a mount that never streams never touches the memory, and
//! reused after: a buffer goes back to its pool when its last holder drops it. The number
//! of buffers out at once is bounded by the pool's byte budget.

use crate::error::Result;
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use transport::{Endpoint, MemoryRegion};

/// Registered buffers of one size with a bound on how many are out at once.
pub(crate) struct SegPool {
    ep: Endpoint,
    seg_bytes: usize,
    /// Buffers registered earlier and not in use.
    free: Mutex<Vec<MemoryRegion>>,
    /// One permit per buffer that may be out at once.
    permits: Arc<Semaphore>,
    /// How many permits there are.
    count: usize,
}

/// A buffer taken from a [`SegPool`]; it goes back when dropped.
pub(crate) struct SegBuf {
    mr: Option<MemoryRegion>,
    pool: Arc<SegPool>,
    _permit: OwnedSemaphorePermit,
}

impl SegPool {
    /// A pool of buffers of `seg_bytes` each, at most `budget_bytes` of them out at once
    /// (rounded down to whole buffers).
    pub(crate) fn new(ep: Endpoint, seg_bytes: usize, budget_bytes: u64) -> Arc<SegPool> {
        let count = (budget_bytes / seg_bytes as u64) as usize;
        Arc::new(SegPool {
            ep,
            seg_bytes,
            free: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(count)),
            count,
        })
    }

    /// Bytes of the buffers out now (for the metrics).
    pub(crate) fn in_use_bytes(&self) -> u64 {
        let out = self.count.saturating_sub(self.permits.available_permits());
        (out * self.seg_bytes) as u64
    }

    /// Size of each buffer, in bytes.
    pub(crate) fn seg_bytes(&self) -> usize {
        self.seg_bytes
    }

    /// A buffer if one is free now; `Ok(None)` when the budget is used up.
    pub(crate) fn try_take(self: &Arc<Self>) -> Result<Option<SegBuf>> {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => self.with_permit(permit).map(Some),
            Err(TryAcquireError::NoPermits) | Err(TryAcquireError::Closed) => Ok(None),
        }
    }

    /// A buffer, waiting for one to come back while the budget is used up.
    pub(crate) async fn take(self: &Arc<Self>) -> Result<SegBuf> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("a segment pool's semaphore is never closed");
        self.with_permit(permit)
    }

    fn with_permit(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Result<SegBuf> {
        let reused = self.free.lock().pop();
        let mr = match reused {
            Some(mr) => mr,
            None => self.ep.register(self.seg_bytes)?,
        };
        Ok(SegBuf {
            mr: Some(mr),
            pool: self.clone(),
            _permit: permit,
        })
    }
}

impl SegBuf {
    /// The registered memory.
    pub(crate) fn mr(&self) -> &MemoryRegion {
        self.mr
            .as_ref()
            .expect("a segment buffer holds its region until dropped")
    }
}

impl Drop for SegBuf {
    fn drop(&mut self) {
        if let Some(mr) = self.mr.take() {
            self.pool.free.lock().push(mr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use transport::{Backend, TransportConfig};

    fn endpoint() -> Endpoint {
        Endpoint::new(Backend::Mem, TransportConfig::default(), 1).unwrap()
    }

    #[tokio::test]
    async fn the_budget_bounds_the_buffers_out_and_dropped_ones_are_reused() {
        let pool = SegPool::new(endpoint(), 64 << 10, 2 * (64 << 10) + 100);
        let a = pool.try_take().unwrap().expect("first buffer");
        let b = pool.try_take().unwrap().expect("second buffer");
        assert!(pool.try_take().unwrap().is_none(), "two fit the budget");
        let addr = a.mr().addr();
        drop(a);
        let c = pool.take().await.unwrap();
        assert_eq!(c.mr().addr(), addr, "the returned buffer is reused");
        drop((b, c));
    }
}
