//! Open files: what one client knows of each, reads through a readahead cache, writes
//! through per-file buffers, length commits, fsync and truncation.
//!
//! Reads and writes move whole segments (`segment_bytes`, aligned in the file) between
//! registered buffers and the data servers with one-sided transfers: `read` prefetches
//! segments while a handle reads sequentially, `write` copies into segment buffers that
//! are sent in the background. One short lock per file ([`FileState`]'s `io`) covers
//! both maps and is never held across a network call; the ordering rules that keep
//! cached bytes correct are in `read.rs` and `write.rs`.

mod append;
pub(crate) mod around;
pub(crate) mod datapath;
mod extents;
pub(crate) mod grants;
mod members;
mod pieces;
mod read;
mod read_plan;
mod readahead;
mod replicas;
mod seek;
mod write;

pub(crate) use append::{APPEND_LINGER_MS, MAX_APPEND_LINGER_MS};
pub use read::ReadBuf;
pub use seek::Seek;

use crate::client::Client;
use crate::config::AtimeMode;
use crate::error::{ClientError, Result};
use datapath::DataPath;
use parking_lot::Mutex;
use pieces::{batches, pieces, windows, Piece};
use proto::meta::{fs, Commit};
use proto::runs::{self, ChunkRuns, MAX_COMMIT_RUNS};
use proto::{Attr, ChainId, ChunkId, InodeId, Layout, SessionId, Timestamp, WireError};
use read::CacheSeg;
use readahead::Readahead;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;
use transport::MemoryRegion;
use write::WriteSeg;

/// What one client knows of a file that it has open, shared by all its handles.
pub struct FileState {
    pub(crate) ino: InodeId,
    pub(crate) layout: Layout,
    inner: Mutex<FileInner>,
    /// The segments cached for reading and buffered for writing. Taken briefly, never
    /// across a network call; never taken while `inner` is held.
    io: Mutex<IoState>,
    /// Woken whenever a write segment has been sent (or failed): writers waiting for room
    /// under the per-file bound look again.
    sent: Notify,
    /// Writable opens and truncations, which decide whether read-around may store.
    pub(crate) gate: around::StoreGate,
    /// This client's open was ended by the server while it was cut off.
    lost: AtomicBool,
    /// The file is known immutable (`write.rs`, `FileState::check_mutable`).
    immutable: AtomicBool,
    /// `O_APPEND` writes not yet placed (`append.rs`). Taken briefly, never across a
    /// network call, nor while `io` or `inner` is held.
    appends: Mutex<append::AppendQueue>,
    /// Held while appends are placed: one placement per file at a time, in order.
    placing: tokio::sync::Mutex<()>,
}

struct FileInner {
    /// The length as this client sees it: the server's, grown by local writes.
    size: u64,
    /// Time of the last local write.
    mtime: Timestamp,
    /// Writes not yet committed to the metadata server; bumped by every write.
    write_gen: u64,
    committed_gen: u64,
    /// The attributes the metadata server answered this client's last commit with, until
    /// the mount records them as its own change (`FileHandle::take_committed_attr`).
    committed_attr: Option<Attr>,
    /// Chunks written since the last fsync, per chain.
    unsynced: BTreeMap<ChainId, BTreeSet<ChunkId>>,
    /// Chunks written and punched since the last commit, for the next one.
    chunks: ChunkDelta,
    /// The server's attributes of the file as last seen: what answers `fstat` while the
    /// metadata server is away (`client::away`).
    known: Attr,
}

/// The chunks a client's writes filled and its punches emptied since its last commit
/// (see `proto::meta::Commit`): disjoint, each at most `MAX_COMMIT_RUNS` runs (writes
/// merge past it, punches drop runs, so a commit only ever counts more held).
#[derive(Clone, Default)]
struct ChunkDelta {
    wrote: ChunkRuns,
    punched: ChunkRuns,
}

impl ChunkDelta {
    fn wrote(&mut self, chunks: &ChunkRuns) {
        self.wrote.union(chunks);
        self.wrote.cap_merging(MAX_COMMIT_RUNS);
        self.punched.subtract(chunks);
    }

    fn punched(&mut self, chunks: &ChunkRuns) {
        self.punched.union(chunks);
        self.punched.cap_dropping(MAX_COMMIT_RUNS);
        self.wrote.subtract(chunks);
    }

    /// The file was cut to `chunks` chunks: none past them is written or punched.
    fn clip(&mut self, chunks: u64) {
        self.wrote.clip(chunks);
        self.punched.clip(chunks);
    }
}

/// The segments of one file held in registered buffers, by segment index.
#[derive(Default)]
struct IoState {
    /// Read segments: prefetched, or being fetched.
    cache: BTreeMap<u64, Arc<CacheSeg>>,
    /// Write segments: buffered, or being sent. A segment index is never in both maps
    /// for long: a write drops the cached segment it lands in, and no fetch starts for
    /// a segment while it has buffered writes.
    dirty: BTreeMap<u64, Arc<WriteSeg>>,
    /// Background writes of the file that failed so far, and the last failure. Each
    /// handle's next fsync or close (flush) after a failure reports it, once, as Linux
    /// reports a writeback error once per open file; writes fail early until then. No
    /// lost byte goes unreported, and a writer that was told can go on (after freeing
    /// space, say) instead of failing until it closes.
    errors: u64,
    last_error: Option<WireError>,
    /// (mtime, size) of the server's attributes when the file was last opened: a new
    /// open that finds them changed drops the cache (close-to-open).
    opened_as: Option<(Timestamp, u64)>,
}

impl FileState {
    pub(crate) fn new(attr: &Attr, layout: Layout) -> FileState {
        FileState {
            ino: attr.ino,
            layout,
            inner: Mutex::new(FileInner {
                size: attr.size,
                mtime: attr.mtime,
                write_gen: 0,
                committed_gen: 0,
                committed_attr: None,
                unsynced: BTreeMap::new(),
                chunks: ChunkDelta::default(),
                known: attr.clone(),
            }),
            io: Mutex::new(IoState {
                opened_as: Some((attr.mtime, attr.size)),
                ..IoState::default()
            }),
            sent: Notify::new(),
            gate: around::StoreGate::default(),
            lost: AtomicBool::new(false),
            immutable: AtomicBool::new(false),
            appends: Mutex::new(append::AppendQueue::default()),
            placing: tokio::sync::Mutex::new(()),
        }
    }

    /// Another open of the same file: take the server's length unless local writes are
    /// still uncommitted (they can only have grown it), and drop cached bytes if the
    /// file changed since the last open (close-to-open).
    pub(crate) fn opened(&self, attr: &Attr) {
        {
            let mut i = self.inner.lock();
            if i.write_gen == i.committed_gen {
                i.size = attr.size;
            }
            i.known = attr.clone();
        }
        let mut io = self.io.lock();
        let now = Some((attr.mtime, attr.size));
        if io.opened_as != now {
            io.cache.clear();
            io.opened_as = now;
            drop(io);
            // Changed elsewhere: a block read before this open must not be stored.
            self.gate.changed_elsewhere();
        }
    }

    /// Replaces length, blocks and mtime by the local view while writes are
    /// uncommitted.
    pub(crate) fn overlay(&self, attr: &mut Attr) {
        let mut i = self.inner.lock();
        i.known = attr.clone();
        if i.write_gen != i.committed_gen {
            attr.size = attr.size.max(i.size);
            attr.blocks = self.blocks_with_writes(&i, attr.blocks, attr.size);
            // A write changes the contents and the inode: both times move.
            attr.mtime = i.mtime;
            attr.ctime = attr.ctime.max(i.mtime);
        } else {
            i.size = attr.size;
        }
    }

    /// The attributes last seen from the server, with this client's length and, while
    /// writes are uncommitted, their mtime.
    pub(crate) fn known_attr(&self) -> Attr {
        let i = self.inner.lock();
        let mut attr = i.known.clone();
        attr.size = i.size;
        if i.write_gen != i.committed_gen {
            attr.blocks = self.blocks_with_writes(&i, attr.blocks, attr.size);
            attr.mtime = i.mtime;
            attr.ctime = attr.ctime.max(i.mtime);
        }
        attr
    }

    /// The server's `blocks` of a file `size` long, with the chunks this client wrote
    /// and has not committed: as many blocks as they count at that length more, but
    /// never more than a dense file has (some may be held already). A stale count of
    /// its own writes lasts no longer than a stale length does.
    fn blocks_with_writes(&self, i: &FileInner, blocks: u64, size: u64) -> u64 {
        let cs = u64::from(self.layout.chunk_size_bytes);
        let written = runs::blocks(Some(&i.chunks.wrote), size, cs);
        blocks
            .saturating_add(written)
            .min(size.div_ceil(runs::BLOCK_BYTES))
            .max(blocks)
    }

    /// The file was cut or grown to `size`: cached bytes past or around it are stale.
    pub(crate) fn truncated(&self, size: u64) {
        self.drop_cache();
        let mut i = self.inner.lock();
        let cs = u64::from(self.layout.chunk_size_bytes);
        i.chunks.clip(runs::chunks_of(size, cs));
        i.size = size;
        i.mtime = Timestamp::now();
    }

    pub(crate) fn size(&self) -> u64 {
        self.inner.lock().size
    }

    /// Drops every cached read segment (fetches in flight finish into nothing).
    fn drop_cache(&self) {
        self.io.lock().cache.clear();
    }

    /// A local write of `[offset, end)` was accepted: the length and mtime this client
    /// shows move now, its chunks hold data, and a commit is due.
    fn wrote(&self, offset: u64, end: u64) {
        let chunks = runs::touched(offset, end, u64::from(self.layout.chunk_size_bytes));
        let mut i = self.inner.lock();
        i.chunks.wrote(&chunks);
        i.size = i.size.max(end);
        i.mtime = Timestamp::now();
        i.write_gen += 1;
    }

    /// `fallocate` reserved `[offset, end)`, growing the file to `end` if `grow`: its
    /// chunks count as holding data, as a write's do, and a commit is due to say so,
    /// with the length. The commit carries an mtime: now, never the one this client saw
    /// at its open (another mount may have moved it).
    fn allocated(&self, offset: u64, end: u64, grow: bool) {
        let mut i = self.inner.lock();
        let end = if grow {
            i.size = i.size.max(end);
            end
        } else {
            end.min(i.size)
        };
        if offset >= end {
            return;
        }
        let chunks = runs::touched(offset, end, u64::from(self.layout.chunk_size_bytes));
        i.chunks.wrote(&chunks);
        i.mtime = Timestamp::now();
        i.write_gen += 1;
    }

    /// `[offset, end)` was punched (or zeroed): the chunks it covers whole hold no
    /// data, and a commit is due to say so.
    fn punched(&self, offset: u64, end: u64) {
        let chunks = runs::covered(offset, end, u64::from(self.layout.chunk_size_bytes));
        let mut i = self.inner.lock();
        i.chunks.punched(&chunks);
        i.mtime = Timestamp::now();
        i.write_gen += 1;
    }

    /// Bytes reached these chunks: the next fsync must sync them.
    fn stored(&self, chunks: &[(ChainId, ChunkId)]) {
        let mut i = self.inner.lock();
        for (chain, chunk) in chunks {
            i.unsynced.entry(*chain).or_default().insert(*chunk);
        }
    }

    /// Nothing to send or commit: no buffered write or queued append, no uncommitted
    /// length.
    fn settled(&self) -> bool {
        let io_quiet = self.io.lock().dirty.is_empty();
        io_quiet && self.appends_idle() && self.pending_commit().is_none()
    }

    /// The metadata server ended this client's open of the file while the client was
    /// cut off (see `client::resume`): every handle fails from now on, and no length
    /// is committed any more.
    pub(crate) fn lose(&self, e: WireError) {
        self.lost.store(true, Ordering::SeqCst);
        self.write_failed(e);
    }

    /// Whether [`FileState::lose`] happened.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Records a failed background write.
    fn write_failed(&self, e: WireError) {
        let mut io = self.io.lock();
        io.errors += 1;
        io.last_error = Some(e);
    }

    /// Failures recorded so far.
    fn error_count(&self) -> u64 {
        self.io.lock().errors
    }

    /// The failure count and the last failure, if there were failures past `reported`
    /// (the failure is cloned only then: writes check on every call).
    fn errors_since(&self, reported: u64) -> Option<(u64, WireError)> {
        let io = self.io.lock();
        let count = io.errors;
        io.last_error
            .as_ref()
            .filter(|_| count != reported)
            .map(|e| (count, e.clone()))
    }

    /// The commit to send, with the write generation it covers; `None` if nothing is new.
    fn pending_commit(&self) -> Option<(Commit, u64)> {
        let i = self.inner.lock();
        (i.write_gen != i.committed_gen).then_some((
            Commit {
                wrote: i.chunks.wrote.clone(),
                punched: i.chunks.punched.clone(),
                ..Commit::length(i.size, i.mtime)
            },
            i.write_gen,
        ))
    }

    /// The generation of the last accepted write.
    fn write_gen(&self) -> u64 {
        self.inner.lock().write_gen
    }

    fn committed(&self, generation: u64) {
        let mut i = self.inner.lock();
        i.committed_gen = i.committed_gen.max(generation);
        // A write since the commit was taken keeps every chunk for the next one: sent
        // twice, a chunk counts once.
        if i.write_gen == generation {
            i.chunks = ChunkDelta::default();
        }
    }

    /// A commit up to `generation` was answered with `attr`.
    pub(crate) fn committed_with(&self, generation: u64, attr: &Attr) {
        self.committed(generation);
        self.inner.lock().committed_attr = Some(attr.clone());
    }
}

/// One open of a file (a FUSE file handle).
pub struct FileHandle {
    pub(crate) state: Arc<FileState>,
    pub(crate) session: SessionId,
    /// The first read through this open must move the access time (see
    /// [`FileHandle::new`]).
    atime_due: AtomicBool,
    /// This open's sequential-read detector and readahead window.
    readahead: Mutex<Readahead>,
    /// Open for writing (counted in the file's `gate` until dropped).
    writer: AtomicBool,
    /// The file's failed background writes this handle has reported (see
    /// `IoState::errors`); failures from before the open are not its to report.
    errors_reported: AtomicU64,
}

impl Drop for FileHandle {
    fn drop(&mut self) {
        if self.writer.load(Ordering::Relaxed) {
            self.state.gate.writer_closed();
        }
    }
}

/// Whether a read now should move the access time, as the mount's `atime` option
/// decides; for `relatime`: the access time is older than the last change, or more than
/// a day old.
fn atime_due(attr: &Attr, mode: AtimeMode) -> bool {
    match mode {
        AtimeMode::NoAtime => return false,
        AtimeMode::StrictAtime => return true,
        AtimeMode::RelAtime => {}
    }
    const DAY_SECS: i64 = 24 * 3600;
    let now = Timestamp::now();
    attr.atime <= attr.mtime || attr.atime <= attr.ctime || attr.atime.secs + DAY_SECS <= now.secs
}

impl FileHandle {
    /// An open of the file `state` in `session`, found with attributes `attr`, on a
    /// mount whose `atime` option is `atime`: the first read through it moves the access
    /// time if that option says so (with `strictatime` always; later reads of the same
    /// open come from the kernel's page cache as often as not, so they do not).
    pub(crate) fn new(
        state: Arc<FileState>,
        session: SessionId,
        attr: &Attr,
        atime: AtimeMode,
    ) -> FileHandle {
        let due = attr.kind == proto::FileKind::Regular && atime_due(attr, atime);
        FileHandle {
            session,
            atime_due: AtomicBool::new(due),
            readahead: Mutex::new(Readahead::default()),
            writer: AtomicBool::new(false),
            errors_reported: AtomicU64::new(state.error_count()),
            state,
        }
    }

    /// This open's reads move the access time no more: the open moved it already
    /// (`OpenAt`), or asked that they leave it (`O_NOATIME`, which the kernel allows
    /// only to the file's owner or a holder of `CAP_FOWNER`).
    pub(crate) fn atime_settled(&self) {
        self.atime_due.store(false, Ordering::Relaxed);
    }

    /// This open's first read is to move the access time.
    pub fn reads_move_atime(&self) -> bool {
        self.atime_due.load(Ordering::Relaxed)
    }

    /// Nothing to send, commit or report: no buffered write, no uncommitted length, no
    /// failed background write this handle has yet to report. A flush or close of such
    /// a file needs no round trip.
    pub(crate) fn settled(&self) -> bool {
        self.state.settled() && !self.has_unreported_error()
    }

    /// Whether a background write failed since this handle last reported one.
    pub(crate) fn has_unreported_error(&self) -> bool {
        self.state.error_count() != self.errors_reported.load(Ordering::SeqCst)
    }

    /// Fails with the last failed background write if one failed since this handle last
    /// reported one (or opened), without reporting it: a write or fallocate fails early,
    /// and the fsync or close after it still reports the failure (a write's error names
    /// no byte range, so it must not stand in for the fsync's).
    pub(crate) fn check_write_error(&self) -> Result<()> {
        let reported = self.errors_reported.load(Ordering::SeqCst);
        match self.state.errors_since(reported) {
            Some((_, e)) => Err(ClientError::Remote(e)),
            None => Ok(()),
        }
    }

    /// As [`FileHandle::check_write_error`], and reports it: fsync and close (flush) fail
    /// once per failure, as Linux reports a writeback error once per open file.
    pub(crate) fn take_write_error(&self) -> Result<()> {
        let reported = self.errors_reported.load(Ordering::SeqCst);
        let Some((count, e)) = self.state.errors_since(reported) else {
            return Ok(());
        };
        // Once, also when two calls of this handle race.
        match self.errors_reported.compare_exchange(
            reported,
            count,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(_) => Err(ClientError::Remote(e)),
            Err(_) => Ok(()),
        }
    }

    /// The attributes the last commit of this client brought for the file (a flush,
    /// fsync or append that committed a length), once: what the mount then records as
    /// its own change, so that its next open keeps the cached pages its writes updated.
    pub(crate) fn take_committed_attr(&self) -> Option<Attr> {
        self.state.inner.lock().committed_attr.take()
    }

    /// Records that this open may write (the mount's open flags say so): no read-around
    /// store into the page cache while it lasts.
    pub async fn mark_writer(&self) {
        if !self.writer.swap(true, Ordering::Relaxed) {
            self.state.gate.writer_opened().await;
        }
    }

    /// The open file's inode.
    pub fn ino(&self) -> InodeId {
        self.state.ino
    }
}

/// How long a `statfs` answer may stand in for a new one in `fallocate`'s space check.
const FREE_SEEN_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether `new_bytes` fit in the free bytes a `statfs` answered (`seen`: when, how
/// many) without asking again: the answer is under [`FREE_SEEN_FOR`] old and the new
/// bytes take at most a tenth of it. The check is a guess at the time of the call anyway
/// (nothing is reserved); near the limit it always asks.
fn space_seen_suffices(
    seen: Option<(std::time::Instant, u64)>,
    now: std::time::Instant,
    new_bytes: u64,
) -> bool {
    seen.is_some_and(|(at, free)| {
        now.saturating_duration_since(at) < FREE_SEEN_FOR && new_bytes <= free / 10
    })
}

/// Refuses ranges whose end does not fit a file offset.
fn check_range(offset: u64, len: u64) -> Result<u64> {
    proto::file_end(offset, len).ok_or_else(|| ClientError::TooLarge("offset too large".into()))
}

impl DataPath {
    /// Moves one piece between `mr` and its chain.
    async fn transfer(
        &self,
        layout: &Layout,
        p: Piece,
        mr: &MemoryRegion,
        write: bool,
    ) -> Result<()> {
        if write {
            self.chain_write(layout, p, Some(mr)).await
        } else {
            self.chain_read(layout, p, mr).await
        }
    }

    /// Writes the written `ranges` of a segment buffer (offsets in `mr`, which holds the
    /// file's bytes from `base` on) to the data servers, all at once; returns the chunks
    /// touched. Small ranges of one chunk go together, as one chain write
    /// ([`batches`]), so scattered small writes cost a round of the chain per batch and
    /// not per write.
    pub(super) async fn write_ranges(
        &self,
        state: &FileState,
        base: u64,
        ranges: &[std::ops::Range<u32>],
        mr: &MemoryRegion,
    ) -> Result<Vec<(ChainId, ChunkId)>> {
        let layout = &state.layout;
        let mut ps = Vec::new();
        for r in ranges {
            let (at, len) = (base + u64::from(r.start), (r.end - r.start) as usize);
            ps.extend(pieces(layout, state.ino, at, len, r.start as usize)?);
        }
        let sends = batches(&ps).into_iter().map(|b| {
            let batch = &ps[b];
            self.chain_write_ranges(layout, batch, mr)
        });
        futures::future::try_join_all(sends).await?;
        Ok(ps.iter().map(|p| (p.chain, p.chunk)).collect())
    }

    /// Moves `len` file bytes at `offset` between `mr` (from `buf_base` on) and the data
    /// servers, every chunk's piece in parallel; returns the chunks touched.
    pub(super) async fn transfer_range(
        &self,
        state: &FileState,
        offset: u64,
        len: usize,
        mr: &MemoryRegion,
        buf_base: usize,
        write: bool,
    ) -> Result<Vec<(ChainId, ChunkId)>> {
        let layout = &state.layout;
        let ps = pieces(layout, state.ino, offset, len, buf_base)?;
        futures::future::try_join_all(ps.iter().map(|p| self.transfer(layout, *p, mr, write)))
            .await?;
        Ok(ps.iter().map(|p| (p.chain, p.chunk)).collect())
    }
}

impl Client {
    /// Sends buffered writes, then reports the length and mtime of uncommitted writes to
    /// the metadata server; fails with a write that failed since this handle last
    /// reported one.
    pub async fn flush(&self, fh: &FileHandle) -> Result<()> {
        self.commit_pending(&fh.state).await?;
        fh.take_write_error()
    }

    /// Places the file's queued appends, sends its buffered writes and returns the
    /// commit that covers them, with its write generation; `None` if nothing is new.
    pub(crate) async fn send_for_commit(&self, state: &Arc<FileState>) -> Option<(Commit, u64)> {
        self.place_appends(state).await;
        self.send_written(state).await
    }

    /// [`Client::send_for_commit`] without placing appends (a placement calls it). The
    /// commit is taken before the writes are sent: every write it covers was buffered
    /// before, so it is sent first and the length never runs ahead of the bytes.
    async fn send_written(&self, state: &Arc<FileState>) -> Option<(Commit, u64)> {
        let pending = state.pending_commit();
        self.flush_writes(state).await;
        // Another client may have cut what this one wrote past the committed length
        // while its open was lost: committing a length over that would show zeros. A
        // new metadata connection tells whether it was, before anything is committed.
        // Unreachable until the wait ends: the commit's own call fails then.
        let _ = self.resume_waiting().await;
        pending.filter(|_| !state.is_lost())
    }

    /// Commits what this client wrote to a file and has not yet reported, after its
    /// queued appends were placed and its buffered writes reached the data servers.
    pub(crate) async fn commit_pending(&self, state: &Arc<FileState>) -> Result<()> {
        self.place_appends(state).await;
        self.commit_written(state).await
    }

    /// [`Client::commit_pending`] without placing appends (a placement calls it, and a
    /// truncation holding the placement lock).
    pub(crate) async fn commit_written(&self, state: &Arc<FileState>) -> Result<()> {
        self.commit_written_as(state, true).await
    }

    /// [`Client::commit_written`]; `early`: the server may answer before its log holds
    /// the commit (a close), else it answers once the log does (an `fsync`, which
    /// would otherwise need a `Settle` after it).
    async fn commit_written_as(&self, state: &Arc<FileState>, early: bool) -> Result<()> {
        let Some((commit, generation)) = self.send_written(state).await else {
            return Ok(());
        };
        let req = fs::Commit {
            ino: state.ino,
            commit,
        };
        // The epoch as of after the commit forgot the file's copy (`DirAttrs::before`).
        let (attr, since) = self.meta_early(req, early).await?;
        state.committed_with(generation, &attr);
        // After a close the kernel asks for the attributes again before the next
        // `utime`, `chmod` or `chown` (`tar x`, `cp -a`): this reply has them.
        self.keep_attr(attr, since);
        Ok(())
    }

    /// Makes every byte written through this client durable on the data servers, then
    /// commits the length (the fsync order in ARCHITECTURE.md): queued appends are
    /// placed and buffered writes sent first, and a write that failed in the background
    /// fails the fsync, once.
    pub async fn fsync(&self, fh: &FileHandle) -> Result<()> {
        self.place_appends(&fh.state).await;
        self.flush_writes(&fh.state).await;
        let unsynced = std::mem::take(&mut fh.state.inner.lock().unsynced);
        if let Err(e) = self.data.sync_chains(&fh.state.layout, &unsynced).await {
            // Keep the chunks unsynced so that the next fsync tries again.
            let mut i = fh.state.inner.lock();
            for (chain, chunks) in unsynced {
                i.unsynced.entry(chain).or_default().extend(chunks);
            }
            return Err(e);
        }
        // Committed durably before the reply: a commit answered early would need a
        // `Settle` after it, a second round trip on every `fsync`.
        self.place_appends(&fh.state).await;
        self.commit_written_as(&fh.state, false).await?;
        fh.take_write_error()?;
        // Its create (or a change of its directory) may have been answered early.
        self.settle().await
    }

    /// Ends the open: sends buffered writes, commits what is uncommitted and closes the
    /// session. The session is closed even when a write failed; the failure is returned.
    pub async fn release(&self, fh: &FileHandle) -> Result<()> {
        let pending = self.send_for_commit(&fh.state).await;
        self.session_closed(fh.session);
        let flushed = fh.take_write_error();
        // The length and mtime are committed even when a write failed (as a local file
        // system keeps the size of a write whose page failed to reach the disk): the
        // bytes that did arrive become visible, and the changed mtime tells every other
        // client's next open that its cached bytes are stale. The failure is returned.
        let Some((commit, generation)) = pending else {
            // Nothing to commit: the close is batched with others (`release_later`).
            self.release_later(fh.session);
            return flushed;
        };
        let req = fs::Release {
            session: fh.session,
            commit: Some(commit),
        };
        self.meta(req).await?;
        fh.state.committed(generation);
        flushed
    }

    /// `fallocate(2)`: mode 0 grows the file to cover the range; `KEEP_SIZE` alone
    /// changes nothing visible; `PUNCH_HOLE | KEEP_SIZE` makes the range read as zeros;
    /// `ZERO_RANGE` does too and, without `KEEP_SIZE`, grows the file to cover it (there
    /// is no space to reserve, so zeroing and punching are the same here). Other modes
    /// (collapse, insert, unshare) are not supported. Every mode but a punch first
    /// checks the free space (see `Client::check_space`).
    pub async fn fallocate(&self, fh: &FileHandle, offset: u64, len: u64, mode: i32) -> Result<()> {
        // The length it checks and grows must include this mount's appends.
        self.place_appends(&fh.state).await;
        let end = proto::file_end(offset, len)
            .ok_or_else(|| ClientError::TooLarge("range too large".into()))?;
        let keep = libc::FALLOC_FL_KEEP_SIZE;
        let (punch, zero) = (libc::FALLOC_FL_PUNCH_HOLE, libc::FALLOC_FL_ZERO_RANGE);
        // As `vfs_fallocate`: nothing on an immutable file, and only an allocation (no
        // punched or zeroed range) on an append-only one. The server is asked before a
        // cut only; an allocation, which changes no byte, is judged as a write is, by
        // what this mount knows (one call per allocation cost 1.3 ms, see below).
        if mode & (punch | zero) != 0 {
            self.refuse_if_flagged(fh.ino(), "punched or zeroed range")
                .await?;
        } else {
            fh.state.check_mutable()?;
        }
        if mode & punch == 0 {
            self.check_space(fh, offset, end).await?;
        }
        match mode {
            // Like a write's, the new length and chunks are committed with the next
            // flush, fsync or close, not at once: one call per `fallocate` cost 1.3 ms.
            0 => {
                fh.state.allocated(offset, end, true);
                Ok(())
            }
            m if m == keep => {
                fh.state.allocated(offset, end, false);
                Ok(())
            }
            m if m == punch | keep || m == zero | keep => self.punch(fh, offset, end).await,
            m if m == zero => {
                self.punch(fh, offset, end).await?;
                self.grow_to(fh, end).await
            }
            m => Err(ClientError::NotSupported(format!("fallocate mode {m:#x}"))),
        }
    }

    /// Fails with ENOSPC when the bytes of `[offset, end)` past the file's end need more
    /// than the free space. A local file system refuses an allocation it cannot back;
    /// here nothing is reserved, so this is a check at the time of the call against the
    /// metadata server's `statfs`: the data servers' free space as of their last
    /// heartbeats, summed and divided by the default copies (so `replicas` x the new
    /// bytes must fit). It can still be wrong: writes since the last heartbeats are not
    /// counted, two allocations at once may each fit alone, chunks go round-robin over
    /// the chains so one full server can fail a write the total allows, and holes inside
    /// the file are not counted (the client does not know which chunks exist).
    /// A small allocation is checked against the last answer if it is recent
    /// ([`space_seen_suffices`]), so that many small ones do not each ask.
    async fn check_space(&self, fh: &FileHandle, offset: u64, end: u64) -> Result<()> {
        let new_bytes = end.saturating_sub(offset.max(fh.state.size()));
        if new_bytes == 0 {
            return Ok(());
        }
        let seen = *self.free_seen.lock();
        if space_seen_suffices(seen, std::time::Instant::now(), new_bytes) {
            return Ok(());
        }
        let free = self.statfs().await?.free_bytes;
        if new_bytes > free {
            return Err(ClientError::NoSpace(format!(
                "fallocate of {new_bytes} new bytes with {free} free"
            )));
        }
        Ok(())
    }

    /// Makes the file at least `end` bytes long (never shorter).
    async fn grow_to(&self, fh: &FileHandle, end: u64) -> Result<()> {
        if end > fh.state.size() {
            let set = proto::SetAttr {
                size: Some(end),
                ..Default::default()
            };
            self.setattr(fh.ino(), set).await?;
        }
        Ok(())
    }

    /// Zeroes `[offset, end)` (clamped to the file's length) on the data servers, after
    /// the buffered writes (which may cover the range) went out.
    async fn punch(&self, fh: &FileHandle, offset: u64, end: u64) -> Result<()> {
        self.flush_writes(&fh.state).await;
        fh.check_write_error()?;
        let size = fh.state.size();
        // A range past the end frees the last chunk too: its bytes below the end are
        // all in the range.
        let covers_to = if end >= size { u64::MAX } else { end };
        let end = end.min(size);
        if offset >= end {
            return Ok(());
        }
        let layout = &fh.state.layout;
        let ps = pieces(layout, fh.ino(), offset, (end - offset) as usize, 0)?;
        let zero = ps.iter().map(|p| self.data.chain_write(layout, *p, None));
        let zeroed = futures::future::try_join_all(zero).await;
        // Dropped after the zeros are stored, so no fetch can cache the old bytes.
        fh.state.drop_cache();
        zeroed?;
        let chunks: Vec<_> = ps.iter().map(|p| (p.chain, p.chunk)).collect();
        fh.state.stored(&chunks);
        fh.state.punched(offset, covers_to);
        // Committed now, so that `stat` and `du` show the freed chunks at once.
        self.commit_pending(&fh.state).await
    }
}

#[cfg(test)]
mod tests {
    use super::{space_seen_suffices, FREE_SEEN_FOR};
    use std::time::{Duration, Instant};

    #[test]
    fn a_recent_statfs_answers_small_allocations_only() {
        let at = Instant::now();
        let gib = 1u64 << 30;
        assert!(space_seen_suffices(Some((at, 10 * gib)), at, gib));
        assert!(
            !space_seen_suffices(Some((at, 10 * gib)), at, gib + 1),
            "more than a tenth asks again"
        );
        let later = at + FREE_SEEN_FOR + Duration::from_millis(1);
        assert!(
            !space_seen_suffices(Some((at, 10 * gib)), later, 1),
            "too old"
        );
        assert!(!space_seen_suffices(None, at, 1), "never asked");
        assert!(!space_seen_suffices(Some((at, 5)), at, 1), "nearly full");
    }
}
