//! Reads: through the readahead cache while a handle reads sequentially, straight into
//! a pooled buffer otherwise.
//!
//! Rules that keep cached bytes correct, all decided under the file's `io` lock:
//! - a read whose segment has buffered writes sends them and waits first (the bytes on
//!   the data servers are then the newest), and no fetch starts for such a segment;
//! - a write drops the cached segment it lands in (see `write.rs`), so a segment fetched
//!   before the write is never served after it;
//! - a segment fetched while the file was shorter is not used for bytes past what it
//!   holds;
//! - a new open that finds the file changed on the server drops the whole cache
//!   (`FileState::opened`), and so do truncation and hole punching.

use super::read_plan::{self, Fetcher, SegView, Step};
use super::readahead::{Advice, RaParams};
use super::write::WriteSeg;
use super::{FileHandle, FileState, IoState};
use crate::client::Client;
use crate::error::{ClientError, Result};
use crate::segpool::SegBuf;
use futures::stream::{FuturesOrdered, StreamExt};
use proto::WireError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::watch;
use transport::{MemoryRegion, PooledBuf};

/// Buffer-sized windows of one large `Client::read_into` kept in flight at once (each
/// holds one buffer of the I/O pool while it runs, so the pool bounds it too). A cold
/// large read is then spread over several chunk files on each data server at once: a
/// disk given one chunk's reads at a time waits at every chunk boundary, where the
/// kernel's readahead of the last file ends and the next file's has not begun.
const WINDOWS_IN_FLIGHT: usize = 32;

/// One aligned segment of a file, fetched (or being fetched) into a registered buffer.
pub(crate) struct CacheSeg {
    /// File offset of its first byte.
    start: u64,
    /// Bytes fetched: the segment, or less where the file ended when it was fetched.
    len: usize,
    buf: SegBuf,
    /// `None` while the fetch runs, then its outcome.
    done: watch::Sender<Option<std::result::Result<(), WireError>>>,
    /// Bytes served from it so far: once they reach `len` the kernel holds them all and
    /// the segment leaves the cache.
    served: AtomicUsize,
}

impl CacheSeg {
    /// Whether it holds file bytes `[offset, end)`.
    fn holds(&self, offset: u64, end: u64) -> bool {
        self.start <= offset && end <= self.start + self.len as u64
    }

    /// Removes this segment, index `k`, from `st`'s cache if it is still the one cached
    /// there (a write or a newer fetch may have replaced it).
    fn uncache(self: &Arc<Self>, st: &FileState, k: u64) {
        let mut io = st.io.lock();
        if io.cache.get(&k).is_some_and(|c| Arc::ptr_eq(c, self)) {
            io.cache.remove(&k);
        }
    }

    /// Waits until the fetch ends.
    async fn wait(&self) -> Result<()> {
        let mut rx = self.done.subscribe();
        let outcome = rx.wait_for(Option::is_some).await;
        match outcome.as_deref() {
            Ok(Some(Ok(()))) => Ok(()),
            Ok(Some(Err(e))) => Err(ClientError::Remote(e.clone())),
            // The sender lives in `self`: it cannot be gone while we wait on it.
            Ok(None) | Err(_) => Err(ClientError::Protocol("fetch abandoned".into())),
        }
    }
}

/// Bytes read, held where they landed; dropping it releases the buffer.
pub struct ReadBuf<'a> {
    held: Held<'a>,
    len: usize,
    /// Where the bytes start in a pooled buffer that holds more (read-around).
    skip: usize,
    /// The whole block a read-around fetched: its file offset, length in the pooled
    /// buffer, and the store gate's stamp taken before the read.
    around: Option<(u64, usize, u64)>,
}

enum Held<'a> {
    /// A buffer of the mount's I/O pool, bytes from its start.
    Pooled(PooledBuf<'a>),
    /// A cached segment, bytes from this offset in it.
    Segment(Arc<CacheSeg>, usize),
    /// Bytes assembled from several segments.
    Owned(Vec<u8>),
}

impl ReadBuf<'_> {
    /// Number of bytes read.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was read (end of file).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Runs `f` on the bytes, without copying them.
    pub fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match &self.held {
            Held::Pooled(buf) => f(&buf.mr().lock()[self.skip..self.skip + self.len]),
            Held::Segment(seg, at) => f(&seg.buf.mr().lock()[*at..*at + self.len]),
            Held::Owned(v) => f(&v[..self.len]),
        }
    }

    /// The bytes, copied.
    pub fn to_vec(&self) -> Vec<u8> {
        self.with(|b| b.to_vec())
    }

    /// For a read-around: the block's file offset, its bytes and the store gate's stamp
    /// (see `around.rs`), given to `f`.
    pub(crate) fn with_block<R>(&self, f: impl FnOnce(u64, &[u8], u64) -> R) -> Option<R> {
        match (&self.held, self.around) {
            (Held::Pooled(buf), Some((start, len, stamp))) => {
                Some(f(start, &buf.mr().lock()[..len], stamp))
            }
            _ => None,
        }
    }
}

/// Refuses a read of `len` bytes at `offset` that would end past the largest offset a
/// file has ([`proto::MAX_FILE_BYTES`]).
fn fits_file(offset: u64, len: usize) -> Result<()> {
    if proto::file_end(offset, len as u64).is_none() {
        return Err(ClientError::TooLarge(format!(
            "{len} bytes at offset {offset}"
        )));
    }
    Ok(())
}

/// A read of `len` bytes from a buffer at its start, nothing around it.
fn plain(held: Held<'_>, len: usize) -> ReadBuf<'_> {
    ReadBuf {
        held,
        len,
        skip: 0,
        around: None,
    }
}

impl SegView for IoState {
    type Seg = Arc<CacheSeg>;
    type Write = Arc<WriteSeg>;

    fn writes_in(
        &self,
        seg: u64,
        first: u64,
        last: u64,
        from: u64,
        to: u64,
    ) -> Vec<(Self::Write, bool)> {
        self.dirty
            .range(first..=last)
            .map(|(_, w)| (w.clone(), w.overlaps(seg, from, to)))
            .collect()
    }

    fn cached_holding(&self, k: u64, from: u64, to: u64) -> Option<Self::Seg> {
        self.cache.get(&k).filter(|c| c.holds(from, to)).cloned()
    }

    fn occupied(&self, k: u64) -> bool {
        self.dirty.contains_key(&k) || self.cache.contains_key(&k)
    }

    fn cached_in(&self, from: u64, to: u64) -> Vec<u64> {
        self.cache.range(from..to).map(|(k, _)| *k).collect()
    }
}

/// Records fetches into one file's cache, under its `io` lock (started after it).
struct Fetches<'a> {
    client: &'a Client,
    st: &'a Arc<FileState>,
    cache: &'a mut BTreeMap<u64, Arc<CacheSeg>>,
    size: u64,
    /// The fetches started, to be spawned once the file's lock is released.
    started: Vec<Fetch>,
}

/// A segment's fetch, started under the file's lock and spawned after it.
type Fetch = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl Fetcher for Fetches<'_> {
    type Seg = Arc<CacheSeg>;

    fn fetch(&mut self, k: u64) -> Result<Option<Arc<CacheSeg>>> {
        let started = self.client.start_fetch(self.st, self.cache, k, self.size)?;
        Ok(started.map(|(seg, fetch)| {
            self.started.push(fetch);
            seg
        }))
    }

    fn evict(&mut self, k: u64) {
        self.cache.remove(&k);
    }
}

impl Client {
    fn ra_params(&self) -> RaParams {
        RaParams {
            seg_bytes: self.data.read_pool.seg_bytes() as u64,
            max_bytes: self.config.readahead_max_bytes,
        }
    }

    /// Reads up to one I/O buffer of bytes at `offset`, stopping at the end of the file.
    /// The bytes stay in a registered buffer, so a FUSE reply copies them straight out.
    pub async fn read_buf(&self, fh: &FileHandle, offset: u64, len: usize) -> Result<ReadBuf<'_>> {
        self.read_buf_with(fh, offset, len, false).await
    }

    /// [`Client::read_buf`] for the kernel: with `around`, a small random read fetches
    /// the read-around block around it, for the page cache (see `around.rs`).
    pub(crate) async fn read_buf_with(
        &self,
        fh: &FileHandle,
        offset: u64,
        len: usize,
        around: bool,
    ) -> Result<ReadBuf<'_>> {
        // This mount's appends are part of what it reads.
        self.place_appends(&fh.state).await;
        let size = fh.state.size();
        let len = len.min(self.data.pool.buffer_bytes());
        let len = if offset >= size {
            0
        } else {
            len.min((size - offset) as usize)
        };
        let bytes = self.read_bytes(fh, offset, len, size, around);
        if fh.atime_due.swap(false, Ordering::Relaxed) {
            // The access time moves while the bytes travel, not before: both are done
            // when the read returns, so a stat after it sees the new atime.
            return tokio::join!(self.accessed(fh.ino()), bytes).1;
        }
        bytes.await
    }

    async fn read_bytes(
        &self,
        fh: &FileHandle,
        offset: u64,
        len: usize,
        size: u64,
        around: bool,
    ) -> Result<ReadBuf<'_>> {
        if len == 0 {
            return Ok(plain(Held::Owned(Vec::new()), 0));
        }
        let advice = fh
            .readahead
            .lock()
            .observe(offset, len as u64, self.ra_params());
        let window = advice.ahead;
        loop {
            match self.plan_read(&fh.state, offset, len, advice, size)? {
                Step::SendWrites(segs) => self.send_and_wait(&fh.state, &segs).await,
                Step::Serve(segs) => {
                    match self.serve_segments(&fh.state, &segs, offset, len).await {
                        Ok(buf) => return Ok(buf),
                        // A failed prefetch (a corrupt block somewhere in the segment, a
                        // lost connection) must not fail reads of good bytes: read the range.
                        Err(e) => {
                            tracing::debug!(error = %e, "segment fetch failed, reading directly");
                            self.ep.count_retry();
                            return self.read_direct(&fh.state, offset, len).await;
                        }
                    }
                }
                Step::Direct if around && window == 0 => {
                    return self.read_around(&fh.state, offset, len, size).await
                }
                Step::Direct | Step::Exact => {
                    return self.read_direct(&fh.state, offset, len).await
                }
            }
        }
    }

    /// Decides how to serve `[offset, offset + len)` as `advice` says (a pure
    /// decision, `read_plan::plan_read`) and records the fetches it needs under the
    /// file's `io` lock; they are spawned after it ([`crate::eager`]: a cold read's
    /// fetch leaves from this thread, before any worker wakes).
    fn plan_read(
        &self,
        st: &Arc<FileState>,
        offset: u64,
        len: usize,
        advice: Advice,
        size: u64,
    ) -> Result<Step<Arc<CacheSeg>, Arc<WriteSeg>>> {
        let seg = self.data.read_pool.seg_bytes() as u64;
        let (step, started) = {
            let mut io = st.io.lock();
            let plan = read_plan::plan_read(&*io, offset, len, advice, size, seg);
            if let Some(hit) = plan.readahead_hit() {
                self.ep.metrics().readahead(hit);
            }
            let mut fetches = Fetches {
                client: self,
                st,
                cache: &mut io.cache,
                size,
                started: Vec::new(),
            };
            let step = read_plan::apply(plan, &mut fetches);
            (step, fetches.started)
        };
        // Every fetch recorded is spawned, also when the plan failed after it: readers
        // of its segment wait for it.
        for fetch in started {
            if !crate::eager::spawn(&self.rt, fetch) {
                tracing::warn!(ino = %st.ino, "a segment's fetch panicked");
            }
        }
        step
    }

    /// Records a fetch of segment `k` into a buffer of the readahead pool in `cache`,
    /// and returns it with the work that fetches it (to be spawned); `None` when the
    /// pool has no buffer free.
    fn start_fetch(
        &self,
        st: &Arc<FileState>,
        cache: &mut std::collections::BTreeMap<u64, Arc<CacheSeg>>,
        k: u64,
        size: u64,
    ) -> Result<Option<(Arc<CacheSeg>, Fetch)>> {
        let seg = self.data.read_pool.seg_bytes() as u64;
        let start = k * seg;
        if start >= size {
            return Ok(None);
        }
        let Some(buf) = self.data.read_pool.try_take()? else {
            return Ok(None);
        };
        let len = (size - start).min(seg) as usize;
        let (done, _) = watch::channel(None);
        let c = Arc::new(CacheSeg {
            start,
            len,
            buf,
            done,
            served: AtomicUsize::new(0),
        });
        cache.insert(k, c.clone());
        let (client, st, fetch) = (self.arc(), st.clone(), c.clone());
        let work = Box::pin(async move {
            let r = client
                .data
                .transfer_range(&st, fetch.start, fetch.len, fetch.buf.mr(), 0, false)
                .await;
            if r.is_err() {
                // Forget it, so that a later read tries again.
                fetch.uncache(&st, k);
            }
            let outcome = r
                .map(drop)
                .map_err(|e| WireError::new(e.code(), e.to_string()));
            fetch.done.send_replace(Some(outcome));
        });
        Ok(Some((c, work)))
    }

    /// Waits for `segs` and returns `[offset, offset + len)` from them; a segment all
    /// of whose bytes are then served leaves `st`'s cache (a reply that holds it keeps
    /// it alive until sent).
    async fn serve_segments(
        &self,
        st: &FileState,
        segs: &[Arc<CacheSeg>],
        offset: u64,
        len: usize,
    ) -> Result<ReadBuf<'_>> {
        for s in segs {
            s.wait().await?;
        }
        let end = offset + len as u64;
        for s in segs {
            let here = end
                .min(s.start + s.len as u64)
                .saturating_sub(offset.max(s.start));
            let served = s.served.fetch_add(here as usize, Ordering::Relaxed) + here as usize;
            if served >= s.len {
                s.uncache(st, s.start / self.data.read_pool.seg_bytes() as u64);
            }
        }
        if let [only] = segs {
            let at = (offset - only.start) as usize;
            return Ok(plain(Held::Segment(only.clone(), at), len));
        }
        // A read across a segment boundary: one copy to make the bytes contiguous.
        let mut out = Vec::with_capacity(len);
        for s in segs {
            let from = offset.max(s.start);
            let to = end.min(s.start + s.len as u64);
            let r = (from - s.start) as usize..(to - s.start) as usize;
            out.extend_from_slice(&s.buf.mr().lock()[r]);
        }
        Ok(plain(Held::Owned(out), len))
    }

    /// Reads the block around `[offset, offset + len)` (up to the file's `size`) into a
    /// buffer of the I/O pool, or just the range when it cannot be read around.
    async fn read_around(
        &self,
        st: &FileState,
        offset: u64,
        len: usize,
        size: u64,
    ) -> Result<ReadBuf<'_>> {
        let unit = super::around::around_bytes(size, self.data.memory_bytes);
        let (Some(start), Some(stamp)) =
            (super::around::block_of(offset, len, unit), st.gate.stamp())
        else {
            return self.read_direct(st, offset, len).await;
        };
        let block_len = (size.min(start + unit) - start) as usize;
        let block = self.read_direct(st, start, block_len).await?;
        Ok(ReadBuf {
            len,
            skip: (offset - start) as usize,
            around: Some((start, block_len, stamp)),
            ..block
        })
    }

    /// Reads exactly `[offset, offset + len)` into a buffer of the I/O pool.
    async fn read_direct(&self, st: &FileState, offset: u64, len: usize) -> Result<ReadBuf<'_>> {
        let buf = self.data.pool.take().await;
        self.data
            .transfer_range(st, offset, len, buf.mr(), 0, false)
            .await?;
        Ok(plain(Held::Pooled(buf), len))
    }

    /// Reads up to `len` bytes at `offset` (fewer at the end of the file).
    pub async fn read(&self, fh: &FileHandle, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.place_appends(&fh.state).await;
        // No room past the end this client knows of: a read never goes beyond it.
        let known = fh.state.size().saturating_sub(offset);
        let mut out = vec![0; len.min(usize::try_from(known).unwrap_or(usize::MAX))];
        let n = self.read_into(fh, &mut out, offset).await?;
        out.truncate(n);
        Ok(out)
    }

    /// Reads into `buf` from `offset` until it is full or the file ends, one I/O buffer
    /// per read with `WINDOWS_IN_FLIGHT` of them at once (a large read is fetched from
    /// several data servers together), each copied straight into its part of `buf`.
    pub async fn read_into(&self, fh: &FileHandle, buf: &mut [u8], offset: u64) -> Result<usize> {
        fits_file(offset, buf.len())?;
        let step = self.data.pool.buffer_bytes();
        // Reads are made as earlier ones finish: a large buffer does not start them all.
        let mut cuts = super::windows(offset, buf.len(), step);
        let mut rest = buf;
        let mut in_flight = FuturesOrdered::new();
        let mut total = 0;
        loop {
            while in_flight.len() < WINDOWS_IN_FLIGHT {
                let Some((at, n)) = cuts.next() else {
                    break;
                };
                let (window, after) = std::mem::take(&mut rest).split_at_mut(n);
                rest = after;
                in_flight.push_back(self.read_window(fh, offset + at as u64, window));
            }
            let Some(done) = in_flight.next().await else {
                return Ok(total);
            };
            let (n, asked) = done?;
            total += n;
            if n < asked {
                // The end of the file: the windows after it read nothing.
                return Ok(total);
            }
        }
    }

    /// Reads into `mr` (memory the caller lent, [`transport::Endpoint::lend`]) from
    /// `offset` until it is full or the file ends: the data servers write the bytes
    /// straight into it, with no I/O buffer and no copy between, `WINDOWS_IN_FLIGHT`
    /// buffer-sized windows at once. `None`, nothing read, while this client holds
    /// writes to the file it has not sent: the caller reads through [`Client::read_into`]
    /// then, which sends the ones it covers first. The cache is neither used nor filled.
    pub async fn read_into_region(
        &self,
        fh: &FileHandle,
        mr: &MemoryRegion,
        offset: u64,
    ) -> Result<Option<usize>> {
        fits_file(offset, mr.len())?;
        self.place_appends(&fh.state).await;
        if !fh.state.io.lock().dirty.is_empty() {
            return Ok(None);
        }
        let size = fh.state.size();
        let len =
            usize::try_from(size.saturating_sub(offset)).map_or(mr.len(), |n| n.min(mr.len()));
        let step = self.data.pool.buffer_bytes();
        let windows = super::windows(offset, len, step).map(|(at, n)| async move {
            // A buffer of the I/O pool is held, unused, for each window: the pool's
            // size bounds this client's reads in flight, lent or not.
            let _turn = self.data.pool.take().await;
            self.data
                .transfer_range(&fh.state, offset + at as u64, n, mr, at, false)
                .await
        });
        let reads = async {
            let mut reads = futures::stream::iter(windows).buffered(WINDOWS_IN_FLIGHT);
            while let Some(done) = reads.next().await {
                done?;
            }
            Ok(Some(len))
        };
        // As `read_buf_with`: any read moves the access time, one at the end too.
        if fh.atime_due.swap(false, Ordering::Relaxed) {
            return tokio::join!(self.accessed(fh.ino()), reads).1;
        }
        reads.await
    }

    /// One buffer's read into `window`: the bytes read, and how many were asked.
    async fn read_window(
        &self,
        fh: &FileHandle,
        at: u64,
        window: &mut [u8],
    ) -> Result<(usize, usize)> {
        let bytes = self.read_buf(fh, at, window.len()).await?;
        let n = bytes.len();
        bytes.with(|b| window[..n].copy_from_slice(b));
        Ok((n, window.len()))
    }
}
