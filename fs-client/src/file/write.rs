//! Writes: copied into per-file segment buffers and acknowledged; segments go to the
//! data servers in the background, many at once, as large chunk writes.
//!
//! - A segment is sent when its last byte is written (a sequential writer filled it),
//!   when it holds too many separate ranges, when the file or the mount runs out of
//!   write-buffer room, and before anything that must see the bytes on the data
//!   servers: a read of its buffered bytes (a read beside them reads the servers'
//!   copy, uncached), flush (close), fsync, truncation, hole punching,
//!   the placement of `O_APPEND` writes (`append.rs`). Once sent, it is sealed: a later write to it waits until the
//!   transfer ended and starts a new segment, so two versions of the same bytes are
//!   never in flight at once and the newest always lands last.
//! - Writers of different segments share only the file's short `io` lock; each copies
//!   under its segment's own lock. Nothing is held across a network call.
//! - A failed transfer is counted in the file's state: each handle's writes fail with it
//!   until its next fsync or close (flush) reports it, once (as an errno through FUSE).

use super::extents::Extents;
use super::{check_range, FileHandle, FileState};
use crate::client::Client;
use crate::error::{ClientError, Result};
use crate::segpool::SegBuf;
use parking_lot::Mutex;
use proto::WireError;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long a writer waiting for write-buffer memory waits before it sends the
/// half-filled segments of all files again.
const MOUNT_FULL_RESEND: Duration = Duration::from_millis(20);

/// One aligned segment of a file with buffered bytes.
pub(crate) struct WriteSeg {
    index: u64,
    buf: SegBuf,
    state: Mutex<SegState>,
    /// Set once the segment was sent (or failed) and left the file's map.
    done: watch::Sender<bool>,
}

struct SegState {
    extents: Extents,
    /// Being sent: the bytes must not change any more.
    sealed: bool,
}

impl WriteSeg {
    /// Whether buffered bytes of this segment (of `seg_bytes`) lie in the file range
    /// `[from, to)`.
    pub(crate) fn overlaps(&self, seg_bytes: u64, from: u64, to: u64) -> bool {
        let start = self.index * seg_bytes;
        let (a, b) = (from.max(start), to.min(start + seg_bytes));
        a < b && (self.state.lock().extents).overlaps(&((a - start) as u32..(b - start) as u32))
    }

    async fn wait_done(&self) {
        let mut rx = self.done.subscribe();
        // The sender lives in `self`, so the wait ends only when the flag is set.
        let _ = rx.wait_for(|d| *d).await;
    }
}

/// What one attempt to buffer a piece of a write found.
enum Step {
    /// The bytes are in the buffer.
    Done,
    /// The segment is being sent: wait for it, then try again.
    WaitSent(Arc<WriteSeg>),
    /// The file has as many segments as its budget allows: send these, wait for any
    /// to finish, try again.
    FileFull(Vec<Arc<WriteSeg>>),
    /// The mount's write-buffer memory is in use.
    MountFull,
}

/// The part of a write that lands in one segment.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SegPiece {
    /// The segment's index in the file.
    seg: u64,
    /// Where the piece starts in the segment.
    in_seg: usize,
    /// The piece's bytes in the write's data.
    data: std::ops::Range<usize>,
}

/// Cuts a write of `len` bytes at `offset` at the boundaries of `seg_bytes` segments,
/// in file order.
fn seg_pieces(offset: u64, len: usize, seg_bytes: usize) -> impl Iterator<Item = SegPiece> {
    let seg = seg_bytes as u64;
    let mut done = 0;
    std::iter::from_fn(move || {
        if done >= len {
            return None;
        }
        let at = offset + done as u64;
        let (k, in_seg) = (at / seg, (at % seg) as usize);
        let n = (seg_bytes - in_seg).min(len - done);
        let piece = SegPiece {
            seg: k,
            in_seg,
            data: done..done + n,
        };
        done += n;
        Some(piece)
    })
}

/// Segments one file may hold buffered or in flight: `file_bytes` per handle open for
/// writing (`writers`, at least one), within the mount's `mount_bytes`, and at least
/// one. Sharded checkpoint savers write disjoint ranges of one file from several
/// processes: with one budget for all of them, writers of one file went slower than as
/// many writers of as many files.
fn segments_per_file(writers: u32, file_bytes: u64, mount_bytes: u64, seg_bytes: usize) -> usize {
    let bytes = file_bytes
        .saturating_mul(u64::from(writers.max(1)))
        .min(mount_bytes);
    (bytes / seg_bytes as u64).max(1) as usize
}

impl Client {
    /// Whether writes are buffered (else each goes to the data servers before returning).
    fn buffers_writes(&self) -> bool {
        self.config.write_buffer_file_bytes > 0
    }

    /// Segments file `st` may hold buffered or in flight (see [`segments_per_file`]).
    fn max_segments_per_file(&self, st: &FileState) -> usize {
        segments_per_file(
            st.gate.writers(),
            self.config.write_buffer_file_bytes,
            self.config.write_buffer_mount_bytes,
            self.data.write_pool.seg_bytes(),
        )
    }

    /// Writes `data` at `offset`. With write buffering (the default) the bytes are in
    /// this client's buffers when it returns, on their way to the data servers; a
    /// failure to store them is returned by a later write, flush, fsync or close.
    pub async fn write(&self, fh: &FileHandle, offset: u64, data: &[u8]) -> Result<usize> {
        let end = check_range(offset, data.len() as u64)?;
        fh.check_write_error()?;
        // Appends made before this write land before it (and one that failed fails it).
        self.place_appends(&fh.state).await;
        fh.check_write_error()?;
        if !self.buffers_writes() {
            return self.write_through(&fh.state, offset, data).await;
        }
        let seg = self.data.write_pool.seg_bytes();
        for p in seg_pieces(offset, data.len(), seg) {
            self.buffer_piece(&fh.state, p.seg, p.in_seg, &data[p.data])
                .await?;
        }
        fh.state.wrote(offset, end);
        Ok(data.len())
    }

    /// Buffers a write at once if that needs no waiting (room in the file's budget and
    /// the mount's, the segment not being sent) and it lies in one segment: then a FUSE
    /// write is answered on the thread that read it, with no copy besides the one into
    /// the buffer. `None`: use [`Client::write`].
    pub fn try_write_now(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
    ) -> Option<Result<usize>> {
        // A failure to report goes the slow way, through `Client::write`.
        if !self.buffers_writes() || data.is_empty() || fh.has_unreported_error() {
            return None;
        }
        // Appends made before this write must be placed first (see `append.rs`).
        if !fh.state.appends_idle() {
            return None;
        }
        let end = match check_range(offset, data.len() as u64) {
            Ok(end) => end,
            Err(e) => return Some(Err(e)),
        };
        let seg = self.data.write_pool.seg_bytes() as u64;
        if offset / seg != (end - 1) / seg {
            return None;
        }
        let in_seg = (offset % seg) as usize;
        match self.try_buffer(&fh.state, offset / seg, in_seg, data) {
            Ok(Step::Done) => {
                fh.state.wrote(offset, end);
                Some(Ok(data.len()))
            }
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Writes `data` at `offset` straight to the data servers (no buffering).
    pub(crate) async fn write_through(
        &self,
        st: &FileState,
        offset: u64,
        data: &[u8],
    ) -> Result<usize> {
        let end = check_range(offset, data.len() as u64)?;
        let step = self.data.pool.buffer_bytes();
        for o in (0..data.len()).step_by(step) {
            let part = &data[o..data.len().min(o + step)];
            let buf = self.data.pool.take().await;
            buf.mr().lock()[..part.len()].copy_from_slice(part);
            let at = offset + o as u64;
            let sent = self
                .data
                .transfer_range(st, at, part.len(), buf.mr(), 0, true)
                .await;
            // After the bytes are stored, so that no fetch can cache the old ones.
            st.drop_cache();
            st.stored(&sent?);
        }
        st.wrote(offset, end);
        Ok(data.len())
    }

    /// Copies `bytes` to offset `in_seg` of segment `k`, waiting for room as needed.
    async fn buffer_piece(
        &self,
        st: &Arc<FileState>,
        k: u64,
        in_seg: usize,
        bytes: &[u8],
    ) -> Result<()> {
        loop {
            let sent = st.sent.notified();
            tokio::pin!(sent);
            // Registered before looking, so a segment sent meanwhile still wakes us.
            sent.as_mut().enable();
            match self.try_buffer(st, k, in_seg, bytes)? {
                Step::Done => return Ok(()),
                Step::WaitSent(seg) => seg.wait_done().await,
                Step::FileFull(idle) => {
                    for seg in &idle {
                        self.send_segment(st, seg);
                    }
                    sent.await;
                }
                Step::MountFull => {
                    let buf = self.take_write_buffer().await?;
                    let mut io = st.io.lock();
                    if !io.dirty.contains_key(&k) && io.dirty.len() < self.max_segments_per_file(st)
                    {
                        io.dirty.insert(k, new_segment(k, buf));
                    }
                }
            }
        }
    }

    /// Waits for a buffer of the mount's write pool. Buffers may sit in half-filled
    /// segments of idle writers: those are sent first, or a writer here could wait for
    /// memory nobody will free. They are sent again on every tick of the wait, as a
    /// buffer that came back may have gone to another writer's new segment meanwhile.
    pub(super) async fn take_write_buffer(&self) -> Result<SegBuf> {
        loop {
            self.send_all_buffered();
            let wait = tokio::time::timeout(MOUNT_FULL_RESEND, self.data.write_pool.take());
            if let Ok(buf) = wait.await {
                return buf;
            }
        }
    }

    /// One attempt to buffer `bytes` at `in_seg` of segment `k`, without waiting.
    fn try_buffer(&self, st: &Arc<FileState>, k: u64, in_seg: usize, bytes: &[u8]) -> Result<Step> {
        let seg = {
            let mut io = st.io.lock();
            // Whatever was fetched of this segment is older than this write.
            io.cache.remove(&k);
            match io.dirty.get(&k) {
                Some(seg) => seg.clone(),
                None if io.dirty.len() >= self.max_segments_per_file(st) => {
                    let idle = io.dirty.values().filter(|s| !s.state.lock().sealed);
                    return Ok(Step::FileFull(idle.cloned().collect()));
                }
                None => match self.data.write_pool.try_take()? {
                    Some(buf) => {
                        let seg = new_segment(k, buf);
                        io.dirty.insert(k, seg.clone());
                        seg
                    }
                    None => return Ok(Step::MountFull),
                },
            }
        };
        debug_assert!(
            in_seg + bytes.len() <= self.data.write_pool.seg_bytes(),
            "a piece lies in one segment"
        );
        let range = in_seg as u32..(in_seg + bytes.len()) as u32;
        let full = {
            let mut s = seg.state.lock();
            if s.sealed {
                return Ok(Step::WaitSent(seg.clone()));
            }
            if s.extents.would_overflow(&range) {
                drop(s);
                self.send_segment(st, &seg);
                return Ok(Step::WaitSent(seg));
            }
            seg.buf.mr().lock()[range.start as usize..range.end as usize].copy_from_slice(bytes);
            s.extents.add(range.clone());
            // A sequential writer has moved past it: no reason to wait any longer.
            range.end as usize == self.data.write_pool.seg_bytes()
        };
        if full {
            self.send_segment(st, &seg);
        }
        Ok(Step::Done)
    }

    /// Seals `seg` and sends its ranges in the background (nothing if already sent).
    fn send_segment(&self, st: &Arc<FileState>, seg: &Arc<WriteSeg>) {
        self.send_segment_now(st, seg, false);
    }

    /// [`Client::send_segment`]; with `eager`, its first call leaves from this thread
    /// ([`crate::eager`]): for the one segment a flush waits for (a small file's close),
    /// not for sends in bulk, whose first polls (copies of scattered ranges into
    /// requests) would then all run on the thread that asked, a FUSE thread's included.
    fn send_segment_now(&self, st: &Arc<FileState>, seg: &Arc<WriteSeg>, eager: bool) {
        let extents = {
            let mut s = seg.state.lock();
            if s.sealed {
                return;
            }
            s.sealed = true;
            s.extents.clone()
        };
        let (client, st, seg) = (self.arc(), st.clone(), seg.clone());
        let send = async move {
            let base = seg.index * client.data.write_pool.seg_bytes() as u64;
            let r = (client.data)
                .write_ranges(&st, base, extents.ranges(), seg.buf.mr())
                .await;
            match r {
                Ok(chunks) => st.stored(&chunks),
                Err(e) => {
                    tracing::warn!(ino = %st.ino, error = %e, "a buffered write failed");
                    st.write_failed(WireError::new(e.code(), e.to_string()));
                }
            }
            {
                let mut io = st.io.lock();
                if io
                    .dirty
                    .get(&seg.index)
                    .is_some_and(|s| Arc::ptr_eq(s, &seg))
                {
                    io.dirty.remove(&seg.index);
                }
            }
            seg.done.send_replace(true);
            st.sent.notify_waiters();
        };
        if !eager {
            drop(self.rt.spawn(send));
        } else if !crate::eager::spawn(&self.rt, send) {
            tracing::warn!("a segment's send panicked");
        }
    }

    /// Sends `segs` and waits until each has been stored or failed.
    pub(super) async fn send_and_wait(&self, st: &Arc<FileState>, segs: &[Arc<WriteSeg>]) {
        for seg in segs {
            self.send_segment_now(st, seg, segs.len() == 1);
        }
        for seg in segs {
            seg.wait_done().await;
        }
    }

    /// Sends every write buffered for the file so far and waits for them. Failures are
    /// counted in the file's state, for its handles to report.
    pub(crate) async fn flush_writes(&self, st: &Arc<FileState>) {
        let segs: Vec<_> = st.io.lock().dirty.values().cloned().collect();
        self.send_and_wait(st, &segs).await;
    }

    /// Starts sending the buffered segments of every open file of this client.
    fn send_all_buffered(&self) {
        for st in self.open_files() {
            let segs: Vec<_> = st.io.lock().dirty.values().cloned().collect();
            for seg in &segs {
                self.send_segment(&st, seg);
            }
        }
    }
}

fn new_segment(index: u64, buf: SegBuf) -> Arc<WriteSeg> {
    Arc::new(WriteSeg {
        index,
        buf,
        state: Mutex::new(SegState {
            extents: Extents::default(),
            sealed: false,
        }),
        done: watch::channel(false).0,
    })
}

impl FileState {
    /// Records whether the file is immutable, as this mount set or read its flags (or
    /// an open for writing showed it is not): its handles opened for writing before
    /// write no more, as Linux refuses writes to an immutable file whatever the
    /// descriptor. The FUSE write path and the library check it; a write-back of pages
    /// dirtied before is let through (ext4 writes them back before it sets the flag).
    /// Another mount's change is not seen here (README, "Not yet").
    pub(crate) fn set_immutable(&self, on: bool) {
        self.immutable.store(on, Ordering::SeqCst);
    }

    /// Whether [`FileState::set_immutable`] said so.
    pub(crate) fn is_immutable(&self) -> bool {
        self.immutable.load(Ordering::SeqCst)
    }

    /// EPERM for a write to a file known immutable.
    pub(crate) fn check_mutable(&self) -> Result<()> {
        if !self.is_immutable() {
            return Ok(());
        }
        Err(ClientError::Refused(WireError::new(
            proto::ErrorCode::NotPermitted,
            format!("{} is immutable", self.ino),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::{seg_pieces, segments_per_file, SegPiece};

    const MIB: usize = 1 << 20;

    #[test]
    fn a_write_is_cut_at_segment_boundaries_into_pieces_that_cover_it_in_order() {
        let seg = 4 * MIB;
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let offset = x % (1 << 40);
            let len = (x >> 40) as usize % (3 * seg) + 1;
            let pieces: Vec<SegPiece> = seg_pieces(offset, len, seg).collect();
            let mut next = 0;
            for p in &pieces {
                assert_eq!(p.data.start, next, "pieces follow each other");
                let at = offset + p.data.start as u64;
                assert_eq!((p.seg, p.in_seg as u64), (at / seg as u64, at % seg as u64));
                assert!(
                    p.in_seg + p.data.len() <= seg,
                    "a piece stays in its segment"
                );
                assert!(!p.data.is_empty());
                next = p.data.end;
            }
            assert_eq!(next, len, "the pieces cover the write");
            assert!(pieces.len() <= len.div_ceil(seg) + 1);
        }
        assert_eq!(seg_pieces(0, 0, seg).count(), 0);
        let across: Vec<_> = seg_pieces(seg as u64 - 1, 2, seg).collect();
        let want = [
            SegPiece {
                seg: 0,
                in_seg: seg - 1,
                data: 0..1,
            },
            SegPiece {
                seg: 1,
                in_seg: 0,
                data: 1..2,
            },
        ];
        assert_eq!(across, want);
    }

    #[test]
    fn each_writer_of_a_file_brings_its_own_budget_within_the_mounts() {
        let (file, mount, seg) = (64 * MIB as u64, 1024 * MIB as u64, 4 * MIB);
        assert_eq!(
            segments_per_file(0, file, mount, seg),
            16,
            "no writer counts as one"
        );
        assert_eq!(segments_per_file(1, file, mount, seg), 16);
        assert_eq!(segments_per_file(4, file, mount, seg), 64);
        assert_eq!(
            segments_per_file(64, file, mount, seg),
            256,
            "capped by the mount"
        );
        assert_eq!(
            segments_per_file(1, MIB as u64, mount, seg),
            1,
            "at least one"
        );
        assert_eq!(segments_per_file(u32::MAX, u64::MAX, mount, seg), 256);
    }
}
