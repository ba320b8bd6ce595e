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
    pub(crate) buf: Mutex<AlignedBuf>,
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
        let r = Self::with_hw(len, |_| Ok::<_, std::convert::Infallible>(None));
        match r {
            Ok(mr) => mr,
            Err(never) => match never {},
        }
    }

    /// Allocates `len` zeroed bytes, registering them with `register` first (with a
    /// device, if any).
    pub(crate) fn with_hw<E>(
        len: usize,
        register: impl FnOnce(&mut [u8]) -> Result<Option<HwMr>, E>,
    ) -> Result<MemoryRegion, E> {
        let mut buf = AlignedBuf::zeroed(len);
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
    pub fn lock(&self) -> MutexGuard<'_, AlignedBuf> {
        self.inner.buf.lock()
    }
}

/// Where a region's bytes start: a page boundary, so that a data server can read a file
/// with `O_DIRECT` straight into a region (the disk's DMA fills it; no copy by the CPU).
pub const REGION_ALIGN_BYTES: usize = 4096;

/// Zeroed bytes starting at a multiple of [`REGION_ALIGN_BYTES`]; derefs to exactly the
/// requested length. Over-allocates by less than one page instead of using a custom
/// allocation layout, so that no unsafe code is needed.
pub struct AlignedBuf {
    raw: Box<[u8]>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes starting on a page boundary (also for tests of code that reads
    /// into regions).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + REGION_ALIGN_BYTES - 1].into_boxed_slice();
        let start =
            (raw.as_ptr() as usize).next_multiple_of(REGION_ALIGN_BYTES) - raw.as_ptr() as usize;
        AlignedBuf { raw, start, len }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_start_on_a_page_and_have_their_length() {
        for len in [0, 1, 4095, 4096, 65_536, (1 << 20) + 7] {
            let mr = MemoryRegion::new(len);
            assert_eq!(mr.len(), len);
            assert_eq!(mr.addr() % REGION_ALIGN_BYTES as u64, 0, "len {len}");
            let bytes = mr.lock();
            assert_eq!(bytes.len(), len);
            assert_eq!(bytes.as_ptr() as u64, mr.addr());
            assert!(bytes.iter().all(|&b| b == 0));
        }
    }
}
