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
    /// The device's registration (rdma); declared first so it is dropped, and the NIC's
    /// access revoked, before the bytes are freed.
    #[allow(dead_code)]
    pub(crate) hw: Option<HwMr>,
    pub(crate) buf: Mutex<Box<[u8]>>,
    pub(crate) addr: u64,
    pub(crate) len: usize,
    pub(crate) lkey: MrKey,
}

/// A registration with a device: its local key and the handle whose drop deregisters.
#[allow(dead_code)]
pub(crate) struct HwMr {
    pub(crate) lkey: u32,
    pub(crate) handle: Box<dyn std::any::Any + Send + Sync>,
}

impl MemoryRegion {
    /// Allocates and registers `len` zeroed bytes.
    pub(crate) fn new(len: usize) -> MemoryRegion {
        let r = Self::with_hw(vec![0u8; len].into_boxed_slice(), |_| {
            Ok::<_, std::convert::Infallible>(None)
        });
        match r {
            Ok(mr) => mr,
            Err(never) => match never {},
        }
    }

    /// Wraps `buf`, registering it with `register` first (with a device, if any).
    pub(crate) fn with_hw<E>(
        buf: Box<[u8]>,
        register: impl FnOnce(&mut [u8]) -> Result<Option<HwMr>, E>,
    ) -> Result<MemoryRegion, E> {
        let mut buf = buf;
        let hw = register(&mut buf)?;
        let addr = buf.as_ptr() as u64;
        let len = buf.len();
        let lkey = match &hw {
            Some(h) => MrKey(h.lkey),
            None => MrKey(NEXT_LKEY.fetch_add(1, Ordering::Relaxed)),
        };
        Ok(MemoryRegion {
            inner: Arc::new(MrInner {
                hw,
                buf: Mutex::new(buf),
                addr,
                len,
                lkey,
            }),
        })
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
