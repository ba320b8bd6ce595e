//! One open chunk file: verified reads, crash-safe updates of blocks, truncation.
//!
//! Nothing here locks: the store holds the chunk's lock around every call. The order of
//! the steps of an update, and what a crash between them leaves, is in [`super`].

use super::cache::Fds;
use super::format::{
    self, accounted_bytes, accounted_raw, decode_header, encode_entries, encode_header,
    read_entries, read_full_at, read_table_bytes, Content, Entry, Geometry, ENTRY_BYTES,
    HEADER_USED_BYTES,
};
use crate::error::{DataError, IoContext};
use proto::ChunkId;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use transport::AlignedBuf;

/// Alignment of buffer address, file position and length for `O_DIRECT`: the page size,
/// a multiple of every disk's logical block size. Block runs start and end on multiples
/// of it (the data offset is page-rounded, blocks are whole pages), and transport regions
/// start on one (`transport::REGION_ALIGN_BYTES`).
const DIRECT_ALIGN: usize = 4096;

/// Chunks up to this size are read and written through the page cache even with
/// `direct_io` on. Reading a chunk's header reads ahead (the disk's `read_ahead_kb`, often
/// 128 KiB to 8 MiB), which brings in a small chunk whole in the same disk request: a
/// direct read would fetch the bytes a second time. Small files are the data sets read
/// whole; larger chunks are the streams and the random reads, where the copy and the
/// wasted read-ahead cost.
pub(crate) const DIRECT_MIN_CHUNK_BYTES: u64 = 1 << 20;

/// Opens `path` read-write with `O_DIRECT`. Some file systems refuse it (`EINVAL`);
/// the buffered descriptor then serves every read and write.
fn open_direct(path: &Path) -> std::io::Result<Arc<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map(Arc::new)
}

/// Reads `dst` from `file` (opened with `O_DIRECT`) at `pos` while reads stay aligned;
/// returns the bytes read. Fewer than `dst.len()`: the file ends there, or a read came
/// back short of an alignment boundary (the next position would not be aligned), and
/// the caller reads the rest through the page cache.
fn read_direct_at(file: &File, dst: &mut [u8], pos: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < dst.len() {
        match file.read_at(&mut dst[done..], pos + done as u64) {
            Ok(n) if n > 0 && n.is_multiple_of(DIRECT_ALIGN) => done += n,
            Ok(n) => return Ok(done + n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// What opening a chunk's file found.
pub(crate) enum Opened {
    /// No file.
    Missing,
    /// A zero-length file: a crash hit between creating it and writing its header.
    Empty(File),
    /// A chunk file with a valid header.
    Chunk(ChunkFile),
}

/// An open chunk file with a verified header.
pub(crate) struct ChunkFile {
    pub chunk: ChunkId,
    /// Shared with the store's cache of open files.
    pub file: Arc<File>,
    /// The same file opened with `O_DIRECT`, if the store's `direct_io` is on and the file
    /// system allows it: runs of whole
    /// blocks are read and written through it straight between the disk and the caller's
    /// (page-aligned) buffer, without a copy through the page cache, which on this path
    /// costs more CPU than the checksums. The client keeps the bytes in its own page
    /// cache, so the server keeping a second copy would only cost memory. Durability is
    /// unchanged: a direct write is not durable before the store's `fdatasync` either.
    pub direct: Option<Arc<File>>,
    pub path: PathBuf,
    pub geo: Geometry,
    /// Bytes of chunk data: the file's length minus the data offset (0 if shorter).
    pub data_len: u64,
}

/// Steps of an update at which the crash tests stop the store, as a kill -9 would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CrashPoint {
    /// A write stored its intent entries, none of its data.
    WriteIntent,
    /// A write stored its data, not its final entries.
    WriteData,
    /// A truncation stored its intent entries, not the new file length.
    TruncateIntent,
    /// A truncation set the new file length, not its final entries.
    TruncateLength,
    /// A repair marked the old copy stale and cut it, wrote nothing new.
    InstallCut,
    /// A repair wrote the new bytes, not the new replica fields.
    InstallData,
}

/// Where the crash tests may stop an update; nothing outside tests.
#[inline]
pub(crate) fn crash_point(_at: CrashPoint) {
    #[cfg(test)]
    super::tests_crash::maybe_crash(_at);
}

/// Bytes to store at chunk offset `pos`.
struct Edge {
    pos: u64,
    bytes: Vec<u8>,
}

/// A checked, not yet applied, write: everything is computed before the disk changes.
pub(crate) struct WritePlan {
    /// Bytes charged to the chunk before and after the write.
    pub accounted_before: u64,
    pub accounted_after: u64,
    /// The table's bytes for blocks `first_block..`: `intent` is stored before the data
    /// and lets each block written be read as its old or its new version, `done` after
    /// it. Blocks between the ranges written keep their entries' stored bytes.
    first_block: u32,
    intent: Vec<u8>,
    done: Vec<u8>,
    /// Partially covered blocks, merged, to store instead of the data.
    edges: Vec<Edge>,
    /// Runs of whole blocks: (chunk offset, index of the range, range in its data).
    middle: Vec<(u64, usize, Range<usize>)>,
    pub new_len: u64,
}

/// The data bytes a chunk file of `len` bytes holds. A file longer than its header's
/// chunk size allows is damaged: its length must not become a chunk length, which sizes
/// the buffer of a whole-chunk fetch and is reported to peers.
fn data_len(chunk: ChunkId, geo: Geometry, len: u64) -> Result<u64, DataError> {
    let data_len = len.saturating_sub(geo.data_offset);
    if data_len > u64::from(geo.chunk_size) {
        return Err(DataError::CorruptHeader {
            chunk,
            reason: format!(
                "file of {len} bytes is longer than a chunk of {} bytes",
                geo.chunk_size
            ),
        });
    }
    Ok(data_len)
}

/// `posix_fadvise` of `file`'s bytes `[pos, pos + len)`: advice only, its failure changes
/// nothing read.
pub(super) fn advise(file: &File, pos: u64, len: usize, advice: libc::c_int) {
    // SAFETY: plain system call on a descriptor the caller holds open.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            pos as libc::off_t,
            len as libc::off_t,
            advice,
        );
    }
}

impl ChunkFile {
    /// Opens the chunk's file at `path` if there is one; `writable` opens it read-write.
    pub fn open(path: &Path, chunk: ChunkId, writable: bool) -> Result<Opened, DataError> {
        let file = match File::options().read(true).write(writable).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Opened::Missing),
            Err(e) => return Err(DataError::io(format!("open {}", path.display()), e)),
        };
        let len = file
            .metadata()
            .ctx(|| format!("stat {}", path.display()))?
            .len();
        if len == 0 {
            return Ok(Opened::Empty(file));
        }
        let mut header = [0u8; HEADER_USED_BYTES];
        read_full_at(&file, &mut header, 0).ctx(|| format!("read {}", path.display()))?;
        let geo = if len < HEADER_USED_BYTES as u64 {
            decode_header(chunk, &header[..len as usize])?
        } else {
            decode_header(chunk, &header)?
        };
        Ok(Opened::Chunk(ChunkFile {
            chunk,
            file: Arc::new(file),
            direct: None,
            path: path.to_owned(),
            geo,
            data_len: data_len(chunk, geo, len)?,
        }))
    }

    /// A chunk file opened earlier, whose header was checked then: only its length, which
    /// writes and truncations change, is read again.
    pub fn reopen(
        (file, direct): Fds,
        path: PathBuf,
        chunk: ChunkId,
        geo: Geometry,
    ) -> Result<ChunkFile, DataError> {
        let len = file
            .metadata()
            .ctx(|| format!("stat {}", path.display()))?
            .len();
        Ok(ChunkFile {
            chunk,
            file,
            direct,
            path,
            geo,
            data_len: data_len(chunk, geo, len)?,
        })
    }

    /// Turns a new or empty file into an empty chunk: header, then a sparse (all zero,
    /// hence all unwritten) table.
    pub fn init(file: File, path: &Path, id: ChunkId, geo: Geometry) -> Result<Self, DataError> {
        let what = || format!("initialise {}", path.display());
        file.write_all_at(&encode_header(geo), 0).ctx(what)?;
        file.set_len(geo.data_offset).ctx(what)?;
        Ok(ChunkFile {
            chunk: id,
            file: Arc::new(file),
            direct: None,
            path: path.to_owned(),
            geo,
            data_len: 0,
        })
    }

    /// Refuses a request whose chunk size differs from the one the chunk was written with.
    pub fn check_chunk_size(&self, chunk_size: u32) -> Result<(), DataError> {
        if self.geo.chunk_size == chunk_size {
            return Ok(());
        }
        Err(DataError::InvalidArgument(format!(
            "{}: request uses chunk size {chunk_size}, the chunk was written with {}",
            self.chunk, self.geo.chunk_size
        )))
    }

    /// Reads the whole checksum table.
    pub fn table(&self) -> Result<Vec<Entry>, DataError> {
        read_entries(&self.file, self.geo, (0, self.geo.blocks - 1), &self.path)
    }

    /// Bytes this chunk is charged against the store's capacity.
    pub fn accounted(&self) -> Result<u64, DataError> {
        let raw = read_table_bytes(&self.file, self.geo, &self.path)?;
        Ok(accounted_raw(self.geo, &raw, self.data_len))
    }

    /// Stores entries `first..first + entries.len()` with one `pwrite`.
    fn store_entries(&self, first: u32, entries: &[Entry]) -> Result<(), DataError> {
        self.store_entry_bytes(first, &encode_entries(entries))
    }

    /// Writes encoded table entries from block `first` on.
    fn store_entry_bytes(&self, first: u32, bytes: &[u8]) -> Result<(), DataError> {
        self.file
            .write_all_at(bytes, self.geo.entry_pos(first))
            .ctx(|| format!("write checksum table of {}", self.path.display()))
    }

    /// Reads the stored bytes of `block` into `dst` (a whole block; zeros past the end of
    /// the file) and decides what they are; `dst` then holds what the block holds.
    fn load_block(&self, block: u32, entry: Entry, dst: &mut [u8]) -> Result<Content, DataError> {
        let pos = self.geo.data_offset + self.geo.block_start(block);
        self.read_run(dst, pos)
            .ctx(|| format!("read {}", self.path.display()))?;
        self.check(block, entry, dst)
    }

    /// Decides what the stored bytes of `block` are: bytes that are not the chunk's are
    /// zeroed, bytes that match no version the entry allows are an error.
    fn check(&self, block: u32, entry: Entry, bytes: &mut [u8]) -> Result<Content, DataError> {
        match entry.resolve(self.geo, bytes) {
            Content::Corrupt => Err(self.corrupt(block)),
            Content::Zeros => {
                bytes.fill(0);
                Ok(Content::Zeros)
            }
            stored @ Content::Stored(_) => Ok(stored),
        }
    }

    fn corrupt(&self, block: u32) -> DataError {
        tracing::warn!(chunk = %self.chunk, block, path = %self.path.display(),
            "block failed its checksum");
        DataError::Corrupt {
            chunk: self.chunk,
            block,
        }
    }

    /// Fills `buf` with chunk bytes `[offset, offset + buf.len())`, verifying every written
    /// block it touches. The range must lie inside the chunk; an empty `buf` reads nothing.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DataError> {
        if buf.is_empty() {
            // An empty chunk's whole length (a copy installed empty).
            return Ok(());
        }
        let geo = self.geo;
        let bs = u64::from(geo.block_size);
        let end = offset + buf.len() as u64;
        let (first, last) = (geo.block_of(offset), geo.block_of(end - 1));
        if offset.is_multiple_of(bs) && end.is_multiple_of(bs) {
            return self.read_whole_blocks(offset, buf, (first, last));
        }
        // Only the entries of the blocks read: a table is up to 16 KiB.
        let entries = read_entries(&self.file, geo, (first, last), &self.path)?;
        let at = |b: u32| (b - first) as usize;
        // The whole blocks inside the range go straight into the caller's buffer with
        // one read, as an aligned read's do.
        let whole = offset.next_multiple_of(bs)..end / bs * bs;
        if whole.start < whole.end {
            let (a, b) = (geo.block_of(whole.start), geo.block_of(whole.end - 1));
            let span = &mut buf[(whole.start - offset) as usize..(whole.end - offset) as usize];
            self.read_run(span, geo.data_offset + whole.start)
                .ctx(|| format!("read {}", self.path.display()))?;
            self.check_run(a, &entries[at(a)..=at(b)], span)?;
        }
        // The part blocks at either end: one block when the range lies inside it.
        let head = (!offset.is_multiple_of(bs)).then_some(first);
        let tail = (!end.is_multiple_of(bs) && head != Some(last)).then_some(last);
        for block in head.into_iter().chain(tail) {
            let (lo, hi) = (
                geo.block_start(block).max(offset),
                (geo.block_start(block) + bs).min(end),
            );
            let dst = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
            self.read_part(block, entries[at(block)], lo, dst)?;
        }
        Ok(())
    }

    /// [`ChunkFile::read`] of whole blocks `first..=last` from `offset`. The blocks'
    /// bytes are read before their checksum entries, with the entries' page asked of
    /// the kernel first (read-ahead advice, which returns at once): on a cold file the
    /// two disk reads overlap instead of one waiting for the other (a 4 KiB read's
    /// entry and data are two reads at different places). An unwritten block's bytes
    /// are read too, and replaced by zeros.
    fn read_whole_blocks(
        &self,
        offset: u64,
        buf: &mut [u8],
        (first, last): (u32, u32),
    ) -> Result<(), DataError> {
        let geo = self.geo;
        let entries_len = (last - first + 1) as usize * ENTRY_BYTES;
        self.advise(geo.entry_pos(first), entries_len, libc::POSIX_FADV_WILLNEED);
        self.read_run(buf, geo.data_offset + offset)
            .ctx(|| format!("read {}", self.path.display()))?;
        let entries = read_entries(&self.file, geo, (first, last), &self.path)?;
        self.check_run(first, &entries, buf)
    }

    /// Checks the whole blocks in `bytes`, from `first` on, against their `entries`.
    fn check_run(&self, first: u32, entries: &[Entry], bytes: &mut [u8]) -> Result<(), DataError> {
        let blocks = bytes.chunks_mut(self.geo.block_size as usize);
        // `zip` stops at the shorter side: one entry per block, or a block goes unchecked.
        debug_assert_eq!(blocks.len(), entries.len(), "one checksum entry per block");
        for (i, (bytes, entry)) in blocks.zip(entries).enumerate() {
            self.check(first + i as u32, *entry, bytes)?;
        }
        Ok(())
    }

    /// Reads chunk bytes `[lo, lo + dst.len())`, part of `block`: the whole block is read
    /// to check it, into a page-aligned scratch so that a large chunk's goes straight
    /// from the disk (`read_run`): a cold 4 KiB read then pays no read-ahead and leaves no
    /// pages behind. An unwritten block is not read at all.
    fn read_part(
        &self,
        block: u32,
        entry: Entry,
        lo: u64,
        dst: &mut [u8],
    ) -> Result<(), DataError> {
        if entry == Entry::Unwritten {
            // Whatever the disk holds there (a hole, or bytes of a write a crash cut
            // short), an unwritten block reads as zeros.
            dst.fill(0);
            return Ok(());
        }
        let mut scratch = AlignedBuf::zeroed(self.geo.block_size as usize);
        self.load_block(block, entry, &mut scratch)?;
        let from = (lo - self.geo.block_start(block)) as usize;
        dst.copy_from_slice(&scratch[from..from + dst.len()]);
        Ok(())
    }

    /// Drops the pages of chunk bytes `[offset, offset + len)` from the page cache (see
    /// `ChunkStore::read`). Advice only: a failure changes nothing read.
    pub fn forget_read(&self, offset: u64, len: usize) {
        let pos = self.geo.data_offset + offset;
        self.advise(pos, len, libc::POSIX_FADV_DONTNEED);
    }

    /// `posix_fadvise` of the file's bytes `[pos, pos + len)`: advice only, its failure
    /// changes nothing read.
    fn advise(&self, pos: u64, len: usize, advice: libc::c_int) {
        advise(&self.file, pos, len, advice);
    }

    /// Opens the file's `O_DIRECT` descriptor (read-write). False if the file system
    /// refuses `O_DIRECT` (then no other chunk file will get one either); any other
    /// failure leaves the file without one, buffered.
    pub fn open_direct(&mut self) -> bool {
        match open_direct(&self.path) {
            Ok(f) => self.direct = Some(f),
            Err(e) => {
                tracing::debug!(path = %self.path.display(), error = %e,
                    "no O_DIRECT: buffered I/O only");
                return e.raw_os_error() != Some(libc::EINVAL);
            }
        }
        true
    }

    /// Its descriptors, for the store's cache of open files.
    pub fn fds(&self) -> Fds {
        (Arc::clone(&self.file), self.direct.clone())
    }

    /// Reads whole blocks at file position `pos` (block-aligned): with `O_DIRECT` when the
    /// buffer is page-aligned, else (or if the file system refuses it) through the page
    /// cache. Zeros past the end of the file, as [`read_full_at`].
    pub(super) fn read_run(&self, dst: &mut [u8], pos: u64) -> std::io::Result<()> {
        if let Some(direct) = self.direct_for(self.data_len, dst) {
            match read_direct_at(direct, dst, pos) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(e),
                // The end of the file (zeros from here) or a short read: the rest
                // buffered, which fills zeros past the end.
                Ok(n) if n < dst.len() => {
                    return read_full_at(&self.file, &mut dst[n..], pos + n as u64);
                }
                Ok(_) => return Ok(()),
            }
        }
        read_full_at(&self.file, dst, pos)
    }

    /// Writes whole blocks at file position `pos` (block-aligned), with `O_DIRECT` when the
    /// buffer is page-aligned, else (or if the file system refuses it) through the page
    /// cache. A direct write that fails part way is written again whole, buffered: the
    /// same bytes to the same place.
    fn write_run(&self, src: &[u8], pos: u64, new_len: u64) -> std::io::Result<()> {
        if let Some(direct) = self.direct_for(new_len, src) {
            match direct.write_all_at(src, pos) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                done => return done,
            }
        }
        self.file.write_all_at(src, pos)
    }

    /// The `O_DIRECT` descriptor if a run in `buf` may use it: the buffer is page-aligned
    /// and the chunk holds more than [`DIRECT_MIN_CHUNK_BYTES`] (`chunk_len`).
    fn direct_for(&self, chunk_len: u64, buf: &[u8]) -> Option<&File> {
        let aligned = (buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN);
        let direct = self.direct.as_deref()?;
        (aligned && chunk_len > DIRECT_MIN_CHUNK_BYTES).then_some(direct)
    }

    /// Plans a write of `ranges` (`(offset, bytes)`: in ascending order, not
    /// overlapping, none empty) into this chunk, or into a chunk that does not exist yet
    /// (`cf == None`). Partially covered blocks that hold data are read (once, however
    /// many ranges share them) and verified here: writing into a corrupt block is
    /// refused rather than laundering its bad bytes under a fresh checksum.
    pub fn plan_write(
        cf: Option<&ChunkFile>,
        new_geo: Geometry,
        ranges: &[(u64, &[u8])],
    ) -> Result<WritePlan, DataError> {
        // An existing file keeps the geometry (the format version) it was made with.
        let geo = cf.map_or(new_geo, |cf| cf.geo);
        let bs = u64::from(geo.block_size);
        let span = |r: &(u64, &[u8])| r.0..r.0 + r.1.len() as u64;
        debug_assert!(
            ranges.iter().all(|r| !r.1.is_empty())
                && ranges.windows(2).all(|w| span(&w[0]).end <= w[1].0),
            "ranges are sorted, disjoint and not empty"
        );
        let (Some(head), Some(tail)) = (ranges.first(), ranges.last()) else {
            return Err(DataError::InvalidArgument("a write of no bytes".into()));
        };
        let end = span(tail).end;
        let (first, last) = (geo.block_of(head.0), geo.block_of(end - 1));
        // The table as stored: only the entries of the blocks written are decoded; the
        // charge before and after is counted from the bytes (`accounted_raw`).
        let (mut raw, old_len) = match cf {
            Some(cf) => (read_table_bytes(&cf.file, geo, &cf.path)?, cf.data_len),
            None => (vec![0u8; geo.blocks as usize * ENTRY_BYTES], 0),
        };
        let at = |block: u32| block as usize * ENTRY_BYTES;
        let stored = raw[at(first)..at(last + 1)].to_vec();
        let mut plan = WritePlan {
            accounted_before: cf.map_or(0, |_| accounted_raw(geo, &raw, old_len)),
            accounted_after: 0,
            first_block: first,
            intent: stored.clone(),
            done: stored,
            edges: Vec::new(),
            middle: Vec::new(),
            new_len: old_len.max(end),
        };
        // Records a block's entries in the plan and in `raw` (for the charge after).
        let set = |plan: &mut WritePlan, raw: &mut [u8], block: u32, intent: Entry, crc: u32| {
            let (i, done) = (at(block - first), Entry::Stable(crc).encode());
            plan.intent[i..i + ENTRY_BYTES].copy_from_slice(&intent.encode());
            plan.done[i..i + ENTRY_BYTES].copy_from_slice(&done);
            raw[at(block)..at(block + 1)].copy_from_slice(&done);
        };
        // The partly covered block being gathered, and its pieces.
        let mut partial: Option<(u32, Vec<EdgePiece>)> = None;
        for (k, r) in ranges.iter().enumerate() {
            let (offset, data) = (r.0, r.1);
            let end = span(r).end;
            for block in geo.block_of(offset)..=geo.block_of(end - 1) {
                let (lo, hi) = (
                    geo.block_start(block).max(offset),
                    (geo.block_start(block) + bs).min(end),
                );
                let src = (lo - offset) as usize..(hi - offset) as usize;
                if hi - lo == bs {
                    let crc = geo.block_crc(&data[src.clone()]);
                    match plan.middle.last_mut() {
                        Some((pos, j, run)) if *j == k && *pos + run.len() as u64 == lo => {
                            run.end = src.end;
                        }
                        _ => plan.middle.push((lo, k, src)),
                    }
                    let old = Entry::decode(&entry_of(&raw, block));
                    let intent = whole_block_intent(cf, geo, block, old, crc)?;
                    set(&mut plan, &mut raw, block, intent, crc);
                    continue;
                }
                if let Some((b, pieces)) = partial.take_if(|(b, _)| *b != block) {
                    let old = Entry::decode(&entry_of(&raw, b));
                    let (edge, intent, crc) = plan_edge(cf, geo, old, &pieces, old_len)?;
                    plan.edges.push(edge);
                    set(&mut plan, &mut raw, b, intent, crc);
                }
                let piece = (lo..hi, &data[src]);
                match &mut partial {
                    Some((_, pieces)) => pieces.push(piece),
                    None => partial = Some((block, vec![piece])),
                }
            }
        }
        if let Some((b, pieces)) = partial {
            let old = Entry::decode(&entry_of(&raw, b));
            let (edge, intent, crc) = plan_edge(cf, geo, old, &pieces, old_len)?;
            plan.edges.push(edge);
            set(&mut plan, &mut raw, b, intent, crc);
        }
        plan.accounted_after = accounted_raw(geo, &raw, plan.new_len);
        Ok(plan)
    }

    /// Stores a planned write of `ranges` (those it was planned with): the intent
    /// entries, the data, then the final entries. Each step is complete before the next
    /// starts, so a crash leaves every block readable as its old or its new version (see
    /// [`super`]).
    pub fn apply_write(
        &mut self,
        plan: &WritePlan,
        ranges: &[(u64, &[u8])],
    ) -> Result<(), DataError> {
        self.store_entry_bytes(plan.first_block, &plan.intent)?;
        crash_point(CrashPoint::WriteIntent);
        let what = || format!("write {}", self.path.display());
        let base = self.geo.data_offset;
        for (pos, k, range) in &plan.middle {
            self.write_run(&ranges[*k].1[range.clone()], base + pos, plan.new_len)
                .ctx(what)?;
        }
        for edge in &plan.edges {
            self.file
                .write_all_at(&edge.bytes, base + edge.pos)
                .ctx(what)?;
        }
        crash_point(CrashPoint::WriteData);
        self.store_entry_bytes(plan.first_block, &plan.done)?;
        self.data_len = plan.new_len;
        Ok(())
    }

    /// Cuts the chunk to `keep` bytes (0 too: an installed empty copy is cut from its
    /// one-byte placeholder, `replica.rs`): later bytes read as zeros, also after
    /// the chunk grows again. Returns the bytes charged before and after. Like a write it
    /// goes in three steps: entries (the boundary block pending, later blocks unwritten),
    /// the file length, the boundary block's final entry.
    ///
    /// Entries past `keep` are cleared even when the file is already short enough, so a
    /// retried truncation also clears entries an earlier, interrupted one left behind.
    pub fn truncate(&mut self, keep: u64) -> Result<(u64, u64), DataError> {
        let table = self.table()?;
        let before = accounted_bytes(self.geo, &table, self.data_len);
        let new_len = keep.min(self.data_len);
        let bs = u64::from(self.geo.block_size);
        let mut intent = table.clone();
        intent
            .iter_mut()
            .skip(keep.div_ceil(bs) as usize)
            .for_each(|e| *e = Entry::Unwritten);
        let mut done = intent.clone();
        let cut = self.geo.block_of(keep);
        if keep < self.data_len
            && !keep.is_multiple_of(bs)
            && table[cut as usize] != Entry::Unwritten
        {
            if let Some((pending, stable)) = self.plan_cut(cut, table[cut as usize], keep)? {
                intent[cut as usize] = pending;
                done[cut as usize] = stable;
            }
        }
        if let Some(range) = changed(&table, &intent) {
            self.store_entries(range.start as u32, &intent[range])?;
        }
        crash_point(CrashPoint::TruncateIntent);
        if keep < self.data_len {
            let what = || format!("truncate {}", self.path.display());
            self.file.set_len(self.geo.data_offset + keep).ctx(what)?;
            crash_point(CrashPoint::TruncateLength);
        }
        if let Some(range) = changed(&intent, &done) {
            self.store_entries(range.start as u32, &done[range])?;
        }
        self.data_len = new_len;
        Ok((before, accounted_bytes(self.geo, &done, new_len)))
    }

    /// The intent and final entries of boundary block `block` when the chunk is cut to
    /// `keep` bytes. `None` leaves a corrupt block's entry alone, so it still reads as
    /// corrupt instead of being re-checksummed around bad bytes.
    fn plan_cut(
        &self,
        block: u32,
        entry: Entry,
        keep: u64,
    ) -> Result<Option<(Entry, Entry)>, DataError> {
        let mut bytes = vec![0u8; self.geo.block_size as usize];
        match self.load_block(block, entry, &mut bytes) {
            Err(DataError::Corrupt { .. }) => Ok(None),
            Err(e) => Err(e),
            // Its stored bytes were never the chunk's, so neither are the ones kept.
            Ok(Content::Zeros) => Ok(Some((Entry::Unwritten, Entry::Unwritten))),
            Ok(current) => {
                bytes[(keep - self.geo.block_start(block)) as usize..].fill(0);
                let new = self.geo.block_crc(&bytes);
                Ok(Some((Entry::intent(current, new), Entry::Stable(new))))
            }
        }
    }
}

/// The intent entry of a block that a write covers whole with data of crc `new`. A
/// `Stable` entry's bytes match it (an update stores that entry only after its data), so
/// only a block whose last update was interrupted is read, to learn which version it holds.
fn whole_block_intent(
    cf: Option<&ChunkFile>,
    geo: Geometry,
    block: u32,
    old: Entry,
    new: u32,
) -> Result<Entry, DataError> {
    let current = match (old, cf) {
        (Entry::Unwritten, _) | (_, None) => Content::Zeros,
        (Entry::Stable(crc), _) => Content::Stored(crc),
        (Entry::Damaged, _) => Content::Corrupt,
        (Entry::Pending { .. } | Entry::PendingFirst(_), Some(cf)) => {
            let mut bytes = vec![0u8; geo.block_size as usize];
            match cf.load_block(block, old, &mut bytes) {
                // The write replaces all of it: no version to keep.
                Err(DataError::Corrupt { .. }) => Content::Corrupt,
                other => other?,
            }
        }
    };
    Ok(Entry::intent(current, new))
}

/// Bytes to write at a range of chunk bytes inside one block.
type EdgePiece<'a> = (Range<u64>, &'a [u8]);

/// Plans the write of `pieces` (chunk byte ranges of one block, in order, with their
/// bytes): merges them with what the block holds (read once, verified) and returns the
/// bytes to store, the block's intent entry and its new crc.
fn plan_edge(
    cf: Option<&ChunkFile>,
    geo: Geometry,
    old: Entry,
    pieces: &[EdgePiece],
    old_len: u64,
) -> Result<(Edge, Entry, u32), DataError> {
    let (Some((head, _)), Some((tail, _))) = (pieces.first(), pieces.last()) else {
        return Err(DataError::InvalidArgument("an edge of no bytes".into()));
    };
    let (lo, hi) = (head.start, tail.end);
    let block = geo.block_of(lo);
    let start = geo.block_start(block);
    let stop = start + u64::from(geo.block_size);
    let mut merged = vec![0u8; geo.block_size as usize];
    let current = match (old, cf) {
        (Entry::Unwritten, _) | (_, None) => Content::Zeros,
        (_, Some(cf)) => cf.load_block(block, old, &mut merged)?,
    };
    for (range, piece) in pieces {
        merged[(range.start - start) as usize..(range.end - start) as usize].copy_from_slice(piece);
    }
    let crc = geo.block_crc(&merged);
    // A block without data may still hold stray bytes on disk (a write cut short by a
    // crash), so store it whole up to the chunk's end; the disk then matches the new crc.
    let (from, to) = match current {
        Content::Stored(_) => (lo, hi),
        _ => (start, stop.min(hi.max(old_len))),
    };
    merged.truncate((to - start) as usize);
    merged.drain(..(from - start) as usize);
    let edge = Edge {
        pos: from,
        bytes: merged,
    };
    Ok((edge, Entry::intent(current, crc), crc))
}

/// The stored bytes of `block`'s entry in a table's bytes.
fn entry_of(raw: &[u8], block: u32) -> [u8; ENTRY_BYTES] {
    let i = block as usize * ENTRY_BYTES;
    let mut e = [0u8; ENTRY_BYTES];
    e.copy_from_slice(&raw[i..i + ENTRY_BYTES]);
    e
}

fn changed(a: &[Entry], b: &[Entry]) -> Option<Range<usize>> {
    let first = a.iter().zip(b).position(|(x, y)| x != y)?;
    let last = a.iter().zip(b).rposition(|(x, y)| x != y)?;
    Some(first..last + 1)
}

/// Bytes a chunk file on disk is charged against the capacity, as [`ChunkFile::accounted`]
/// computes it; a file whose header cannot be read is charged its length in pages, so the
/// charge at startup and at removal agree.
pub(crate) fn measure(path: &Path, chunk: ChunkId) -> Result<u64, DataError> {
    match ChunkFile::open(path, chunk, false) {
        Ok(Opened::Chunk(cf)) => cf.accounted(),
        Ok(Opened::Missing | Opened::Empty(_)) => Ok(0),
        Err(DataError::CorruptHeader { .. } | DataError::UnsupportedFormat { .. }) => {
            let meta = std::fs::metadata(path).ctx(|| format!("stat {}", path.display()))?;
            Ok(format::round_up_page(meta.len()))
        }
        Err(e) => Err(e),
    }
}
