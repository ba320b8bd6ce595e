//! Registered memory.

use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
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
    /// Allocates `len` zeroed bytes, with no device to register them with.
    pub(crate) fn new(len: usize) -> MemoryRegion {
        Self::plain(AlignedBuf::zeroed(len))
    }

    /// A region over `buf`'s bytes, with no device to register them with.
    pub(crate) fn plain(buf: AlignedBuf) -> MemoryRegion {
        match Self::over(buf, |_| Ok::<_, std::convert::Infallible>(None)) {
            Ok(mr) => mr,
            Err((never, _)) => match never {},
        }
    }

    /// A region over `buf`'s bytes, registered with `register` first; refused with the
    /// bytes given back.
    pub(crate) fn over<E>(
        mut buf: AlignedBuf,
        register: impl FnOnce(&mut [u8]) -> Result<Option<HwMr>, E>,
    ) -> Result<MemoryRegion, (E, AlignedBuf)> {
        let hw = match register(&mut buf) {
            Ok(hw) => hw,
            Err(e) => return Err((e, buf)),
        };
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

    /// Gives back the memory lent by [`crate::Endpoint::lend`], deregistered: refused
    /// (the region back) while another clone of the region lives (a transfer into it
    /// still under way), or when the region holds memory of another type or its own.
    pub fn reclaim<T: StableBytes>(self) -> Result<T, MemoryRegion> {
        if !self.inner.buf.lock().lends::<T>() {
            return Err(self);
        }
        let inner = Arc::try_unwrap(self.inner).map_err(|inner| MemoryRegion { inner })?;
        let MrInner { hw, buf, .. } = inner;
        // The device's access ends before the memory goes back to its owner.
        drop(hw);
        match buf.into_inner().into_lent() {
            Ok(t) => Ok(t),
            Err(_) => unreachable!("checked by `lends` above"),
        }
    }

    /// Whether another clone of the region lives: the transport's, while an operation on
    /// it is under way (a response being received into it, a write queued from it), or
    /// the application's own.
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
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
    pub fn lock(&self) -> MappedMutexGuard<'_, [u8]> {
        // The bytes only: the buffer itself (lent memory among it) stays the region's,
        // for as long as a device or a grant may reach it.
        MutexGuard::map(self.inner.buf.lock(), |b| &mut **b)
    }
}

/// Where a registered region's bytes start: a page boundary, so that a data server can
/// read a file with `O_DIRECT` straight into a region (the disk's DMA fills it; no copy
/// by the CPU). A lent region starts where its lender's memory does.
pub const REGION_ALIGN_BYTES: usize = 4096;

/// Memory that can be lent to a region ([`crate::Endpoint::lend`]): a peer may write
/// into it through a grant, and [`MemoryRegion::reclaim`] gives it back.
///
/// # Safety
/// `as_mut` and `as_ref` return the same bytes, at the same address, every time, for as
/// long as the value lives and is only used through them (a device is given that
/// address once, when the memory is registered, and writes to it afterwards).
pub unsafe trait StableBytes: AsRef<[u8]> + AsMut<[u8]> + Send + 'static {}

// SAFETY: a vector's buffer moves only when it grows or shrinks, which `as_ref` and
// `as_mut` never do.
unsafe impl StableBytes for Vec<u8> {}
// SAFETY: a boxed slice's bytes never move.
unsafe impl StableBytes for Box<[u8]> {}

/// What a lent region holds, seen without its type.
trait LentBytes: Send {
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
    fn is_a(&self) -> std::any::TypeId;
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any>;
}

impl<T: StableBytes> LentBytes for T {
    fn bytes(&self) -> &[u8] {
        self.as_ref()
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.as_mut()
    }
    fn is_a(&self) -> std::any::TypeId {
        std::any::TypeId::of::<T>()
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// A region's bytes: zeroed bytes starting at a multiple of [`REGION_ALIGN_BYTES`]
/// (what [`crate::Endpoint::register`] allocates), or memory a caller lent
/// ([`crate::Endpoint::lend`]), which starts wherever that memory does. Derefs to
/// exactly the region's length. Over-allocates by less than one page instead of using
/// a custom allocation layout, so that no unsafe code is needed.
pub struct AlignedBuf {
    storage: Storage,
}

enum Storage {
    Own {
        raw: Box<[u8]>,
        start: usize,
        len: usize,
    },
    Lent(Box<dyn LentBytes>),
}

impl AlignedBuf {
    /// `len` zeroed bytes starting on a page boundary (also for tests of code that reads
    /// into regions).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + REGION_ALIGN_BYTES - 1].into_boxed_slice();
        let start =
            (raw.as_ptr() as usize).next_multiple_of(REGION_ALIGN_BYTES) - raw.as_ptr() as usize;
        AlignedBuf {
            storage: Storage::Own { raw, start, len },
        }
    }

    /// `memory`'s bytes, where they are.
    pub(crate) fn lent<T: StableBytes>(memory: T) -> AlignedBuf {
        AlignedBuf {
            storage: Storage::Lent(Box::new(memory)),
        }
    }

    /// The lent memory, if it is a `T`; the bytes back otherwise.
    pub(crate) fn into_lent<T: StableBytes>(self) -> Result<T, AlignedBuf> {
        match self.storage {
            Storage::Lent(lent) if lent.is_a() == std::any::TypeId::of::<T>() => {
                match lent.into_any().downcast::<T>() {
                    Ok(t) => Ok(*t),
                    Err(_) => unreachable!("its type was checked just before"),
                }
            }
            storage => Err(AlignedBuf { storage }),
        }
    }

    /// Whether these are lent bytes of type `T`.
    fn lends<T: StableBytes>(&self) -> bool {
        match &self.storage {
            Storage::Lent(lent) => lent.is_a() == std::any::TypeId::of::<T>(),
            Storage::Own { .. } => false,
        }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.storage {
            Storage::Own { raw, start, len } => &raw[*start..*start + *len],
            Storage::Lent(lent) => lent.bytes(),
        }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Own { raw, start, len } => &mut raw[*start..*start + *len],
            Storage::Lent(lent) => lent.bytes_mut(),
        }
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
