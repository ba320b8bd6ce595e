//! A pool of registered I/O buffers, reused rather than allocated per request.
//!
//! A buffer goes back to the pool only once the transport no longer holds it: an
//! operation that timed out may still be under way (over `tcp` the connection's reader
//! keeps writing a late response into the region until its frame ends, and a queued
//! write reads the region when the socket takes it). Handed out again meanwhile, the
//! buffer would take another request's bytes, or send them, so it waits aside, with its
//! permit, until the transport lets go.

use crate::{Endpoint, MemoryRegion, TransportError};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How often a taker waiting for a buffer, while some wait aside, looks whether the
/// transport has let go of one: such a buffer comes back with no wake-up of its own.
const HELD_RECHECK: Duration = Duration::from_millis(20);

/// Fixed-size registered buffers; taking one waits while all are in use, which bounds
/// the bytes a client has in flight.
pub struct BufferPool {
    free: Mutex<Vec<MemoryRegion>>,
    /// Buffers given back while the transport still held them; their permits are kept
    /// out of the semaphore until they rejoin `free`.
    held: Mutex<Vec<MemoryRegion>>,
    /// Told when a buffer goes to `held`: a taker already waiting on the semaphore then
    /// starts looking for it coming back.
    set_aside: tokio::sync::Notify,
    permits: Arc<Semaphore>,
    buffer_bytes: usize,
}

/// A buffer taken from the pool; it goes back when dropped.
pub struct PooledBuf<'a> {
    mr: Option<MemoryRegion>,
    pool: &'a BufferPool,
    permit: Option<OwnedSemaphorePermit>,
}

impl BufferPool {
    /// Registers `count` buffers of `buffer_bytes` each.
    pub fn new(ep: &Endpoint, count: usize, buffer_bytes: usize) -> Result<Self, TransportError> {
        let free = (0..count)
            .map(|_| ep.register(buffer_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BufferPool {
            free: Mutex::new(free),
            held: Mutex::new(Vec::new()),
            set_aside: tokio::sync::Notify::new(),
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
        let permit = loop {
            self.recover_held();
            let waiting = self.permits.clone().acquire_owned();
            tokio::pin!(waiting);
            let aside = self.set_aside.notified();
            tokio::pin!(aside);
            // Registered before `held` is looked at: a buffer set aside after the look
            // still wakes this taker.
            aside.as_mut().enable();
            let got = if self.held.lock().is_empty() {
                tokio::select! {
                    p = &mut waiting => Some(p),
                    () = &mut aside => None,
                }
            } else {
                tokio::time::timeout(HELD_RECHECK, &mut waiting).await.ok()
            };
            if let Some(permit) = got {
                break permit.expect("the pool's semaphore is never closed");
            }
        };
        let mr = self.free.lock().pop();
        PooledBuf {
            mr,
            pool: self,
            permit: Some(permit),
        }
    }

    /// Moves the buffers the transport has let go of from `held` back to `free`, with
    /// their permits.
    fn recover_held(&self) {
        let mut held = self.held.lock();
        if held.is_empty() {
            return;
        }
        let (back, still): (Vec<_>, Vec<_>) = held.drain(..).partition(|mr| !mr.is_shared());
        *held = still;
        drop(held);
        if !back.is_empty() {
            let n = back.len();
            self.free.lock().extend(back);
            self.permits.add_permits(n);
        }
    }

    /// Buffers waiting aside for the transport to let go of them.
    pub fn held(&self) -> usize {
        self.held.lock().len()
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
        let Some(mr) = self.mr.take() else {
            return;
        };
        if mr.is_shared() {
            // Its permit stays out until `recover_held` gives the buffer back.
            if let Some(p) = self.permit.take() {
                p.forget();
            }
            self.pool.held.lock().push(mr);
            self.pool.set_aside.notify_waiters();
        } else {
            self.pool.free.lock().push(mr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, TransportConfig};

    /// A taker already waiting when the only buffer is set aside (the transport still
    /// holds it) gets it once the transport lets go, with no other take to look.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_taker_gets_a_buffer_the_transport_lets_go_of() {
        let ep = Endpoint::new(Backend::Tcp, TransportConfig::default(), 1).unwrap();
        let pool = Arc::new(BufferPool::new(&ep, 1, 4096).unwrap());
        let buf = pool.take().await;
        let transport = buf.mr().clone();
        let waiting = {
            let pool = Arc::clone(&pool);
            tokio::spawn(async move { pool.take().await.mr().addr() })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let addr = buf.mr().addr();
        drop(buf);
        assert_eq!(pool.held(), 1, "set aside while the transport holds it");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "not handed out while held");
        drop(transport);
        let got = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting taker was never woken")
            .unwrap();
        assert_eq!(got, addr);
        assert_eq!(pool.held(), 0);
    }
}
