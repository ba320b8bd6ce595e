//! Registered memory.

use parking_lot::{Mutex, MutexGuard};
use proto::MrKey;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

static NEXT_LKEY: AtomicU32 = AtomicU32::new(1);

/// A buffer registered with the transport: its address stays fixed for its life, so a
/// peer may read or write a granted slice of it at any time.
///
/// Dropping the last clone deregisters it: every grant onto it stops working at once.
#[derive(Clone)]
pub struct MemoryRegion {
    pub(crate) inner: Arc<MrInner>,
}

pub(crate) struct MrInner {
    pub(crate) buf: Mutex<Box<[u8]>>,
    pub(crate) addr: u64,
    pub(crate) len: usize,
    pub(crate) lkey: MrKey,
}

impl MemoryRegion {
    /// Allocates and registers `len` zeroed bytes.
    pub(crate) fn new(len: usize) -> MemoryRegion {
        let buf = vec![0u8; len].into_boxed_slice();
        let addr = buf.as_ptr() as u64;
        MemoryRegion {
            inner: Arc::new(MrInner {
                buf: Mutex::new(buf),
                addr,
                len,
                lkey: MrKey(NEXT_LKEY.fetch_add(1, Ordering::Relaxed)),
            }),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Start address, as a peer sees it in a [`crate::RemoteBuf`].
    pub fn addr(&self) -> u64 {
        self.inner.addr
    }

    /// The local key (names the region in local work requests).
    pub fn lkey(&self) -> MrKey {
        self.inner.lkey
    }

    /// Locks the bytes for the application. A one-sided operation on the region waits
    /// while the lock is held, so hold it briefly and never across an `.await`.
    pub fn lock(&self) -> MutexGuard<'_, Box<[u8]>> {
        self.inner.buf.lock()
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.inner.addr))
            .field("len", &self.inner.len)
            .field("lkey", &self.inner.lkey)
            .finish()
    }
}
