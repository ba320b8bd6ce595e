//! Constants, encodings and path names of the store's on-disk format; how it is
//! updated and what a crash leaves is in [`super`].
//!
//! # On-disk format (version 3; version 2 read and written as it is)
//!
//! ```text
//! <dir>/LOCK                      held (flock) while a store has the directory open
//! <dir>/node_id                   this server's node id (see `node_id.rs`)
//! <dir>/usage                     the usage a clean shutdown saved (see `saved_usage.rs`)
//! <dir>/chunk_tree                "2\n": the tree's layout version (see below)
//! <dir>/chunks/<bb>/<inode>.chunk             chunk 0 of the inode
//! <dir>/chunks/<bb>/<inode>/<index>.chunk     its other chunks
//!     bb    = inode % 256, 2 lowercase hex digits (all 256 made at open)
//!     inode = inode number, 16 lowercase hex digits
//!     index = chunk index, 16 lowercase hex digits (1 and up)
//! ```
//!
//! A file's first chunk lies in its bucket, so that a small file (one chunk) costs no
//! directory of its own: no `mkdir` on each copy's create and one dependent disk read
//! less on a cold open. Tree version 1 (no `chunk_tree` file) kept chunk 0 in the inode
//! directory too; opening such a store moves each into its bucket first (`scan.rs`,
//! `migrate_tree`: a rename each, synced, then the version written).
//!
//! A chunk file, all integers little-endian:
//!
//! | offset | size | contents |
//! | --- | --- | --- |
//! | 0 | 8 | magic `b"TSRCHNK1"` (the kind of file; the same in every version) |
//! | 8 | 4 | format version, 3 (or 2) |
//! | 12 | 4 | block size in bytes: `max(4096, chunk size / 1024)` (version 2: 65536) |
//! | 16 | 4 | chunk size in bytes (a power of two, 64 KiB ..= 64 MiB) |
//! | 20 | 4 | crc32c of bytes 0..20 |
//! | 24 | 4072 | zero |
//! | 4096 | 16 × blocks, padded with zeros to a multiple of 4096 | checksum table |
//! | `data_offset` | chunk length | data: chunk byte `i` at `data_offset + i` |
//!
//! `blocks = chunk_size / block_size`, `data_offset = 4096 + round_up(16 × blocks, 4096)`.
//! The chunk's length is the file length minus `data_offset` (0 if the file is shorter).
//! A file of another version fails with [`DataError::UnsupportedFormat`]; version 1 (one
//! crc per block, 8-byte entries) is not converted: there were no deployments.
//!
//! Version 3 differs from 2 only in its block size. Version 2 checked 64 KiB blocks,
//! so a 4 KiB read of a large chunk read and checked 64 KiB (on this machine's disk,
//! 122 us against 60 for 4 KiB with `O_DIRECT`); version 3's blocks are 4 KiB up to
//! 4 MiB chunks (the default), and grow with larger chunks so that a table never holds
//! more than 1024 entries (16 KiB, what a 64 MiB chunk of version 2 had): a write reads
//! the whole table. A store keeps its version 2 files as they are (their headers say
//! so); chunks it creates are version 3. An earlier build refuses a version 3 file
//! by its version.
//!
//! A table entry is 16 bytes: crc slot A (u32) at 0, crc slot B (u32) at 4, a kind (u8) at
//! 8, three zero bytes, and the crc32c of bytes 0..12 at 12; a slot the kind does not use
//! is 0. Sixteen zero bytes are a block never written.
//!
//! | kind | name | slots | the block reads as |
//! | --- | --- | --- | --- |
//! | – | unwritten | – | zeros, unchecked, whatever the disk holds there |
//! | 1 | stable | A = crc | its bytes, if they match A |
//! | 2 | pending | A = old crc, B = new crc | its bytes, if they match A or B |
//! | 3 | pending first | A = new crc | its bytes if they match A, else zeros |
//!
//! Bytes that match no crc the entry allows, and any entry that is not exactly one of these
//! encodings (a flipped bit anywhere), read as [`DataError::Corrupt`] and are never
//! returned. A block's crc covers all `block_size` bytes, counting the bytes past the end
//! of the file as zeros.
//!

use crate::error::{DataError, IoContext};
use proto::{ChunkId, InodeId};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// First bytes of every chunk file. It names the kind of file, not its format version, so
/// a file of another version is recognised as such.
pub(crate) const MAGIC: [u8; 8] = *b"TSRCHNK1";
/// Version of the chunk file format; bump it on any incompatible change. Version 1 had one
/// crc per block, which a crash between the data and the table write could strand.
pub(crate) const FORMAT_VERSION: u32 = 3;
/// The earlier version, still read and written: its blocks are [`V2_BLOCK_SIZE_BYTES`].
const FORMAT_VERSION_2: u32 = 2;
/// Bytes covered by one checksum at least (version 3): a page, the smallest read worth
/// answering alone.
pub const MIN_BLOCK_SIZE_BYTES: u32 = 4096;
/// Bytes covered by one checksum in a version 2 file; no block is larger.
pub const V2_BLOCK_SIZE_BYTES: u32 = 64 * 1024;
/// Most checksum table entries a version 3 chunk has: larger chunks get larger blocks.
const MAX_TABLE_ENTRIES: u32 = 1024;
// `ZEROS` pads any block: no version 3 block is larger than a version 2 one.
const _: () = assert!(MAX_CHUNK_SIZE_BYTES / MAX_TABLE_ENTRIES <= V2_BLOCK_SIZE_BYTES);
/// Smallest chunk size a file may use.
pub const MIN_CHUNK_SIZE_BYTES: u32 = 64 * 1024;
/// Largest chunk size a file may use.
pub const MAX_CHUNK_SIZE_BYTES: u32 = 64 * 1024 * 1024;
/// Size of the header area at the start of a chunk file.
pub(crate) const HEADER_BYTES: u64 = 4096;
/// Header bytes covered by the header crc: magic, version, block size, chunk size.
const HEADER_FIELDS_BYTES: usize = 20;
/// Alignment of the table and data areas, and the unit of space accounting.
const PAGE_BYTES: u64 = 4096;
/// Bytes of one checksum table entry: a power of two, so that no entry straddles a page
/// (a `pwrite` cut short by a kill -9 stops at a page boundary) or a disk sector.
pub(crate) const ENTRY_BYTES: usize = 16;
/// Entry bytes covered by the entry's own crc: the two crc slots, the kind, reserved bytes.
const ENTRY_FIELDS_BYTES: usize = 12;
/// Entry kinds (byte 8 of an entry); see [`Entry`].
const KIND_STABLE: u8 = 1;
const KIND_PENDING: u8 = 2;
const KIND_PENDING_FIRST: u8 = 3;

/// Zeros to feed the crc for the part of a block past the end of the file.
static ZEROS: [u8; V2_BLOCK_SIZE_BYTES as usize] = [0; V2_BLOCK_SIZE_BYTES as usize];

/// Where things are inside a chunk file of one chunk size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// The format version of the file.
    pub version: u32,
    /// Bytes of data a chunk may hold.
    pub chunk_size: u32,
    /// Bytes covered by one checksum: a power of two, a multiple of the page size.
    pub block_size: u32,
    /// Blocks in a chunk (`chunk_size / block_size`, at least 1).
    pub blocks: u32,
    /// Offset of data byte 0 in the file.
    pub data_offset: u64,
}

impl Geometry {
    /// The geometry of a new chunk file (this version's) of a chunk size that came from a
    /// peer, which it checks. A file's own geometry comes from its header
    /// ([`decode_header`]): a version 2 file's differs.
    pub fn new(chunk_size: u32) -> Result<Geometry, DataError> {
        #[cfg(test)]
        if NEW_FILES_V2.with(std::cell::Cell::get) {
            return Geometry::v2(chunk_size);
        }
        Geometry::v3(chunk_size)
    }

    /// The geometry of a version 3 file of a checked chunk size.
    fn v3(chunk_size: u32) -> Result<Geometry, DataError> {
        check_chunk_size(chunk_size)?;
        let block_size = (chunk_size / MAX_TABLE_ENTRIES).max(MIN_BLOCK_SIZE_BYTES);
        Ok(Geometry::of(FORMAT_VERSION, chunk_size, block_size))
    }

    /// The geometry of a version 2 file of a checked chunk size.
    fn v2(chunk_size: u32) -> Result<Geometry, DataError> {
        check_chunk_size(chunk_size)?;
        Ok(Geometry::of(
            FORMAT_VERSION_2,
            chunk_size,
            V2_BLOCK_SIZE_BYTES,
        ))
    }

    fn of(version: u32, chunk_size: u32, block_size: u32) -> Geometry {
        let blocks = chunk_size / block_size;
        let table = round_up_page(u64::from(blocks) * ENTRY_BYTES as u64);
        Geometry {
            version,
            chunk_size,
            block_size,
            blocks,
            data_offset: HEADER_BYTES + table,
        }
    }

    /// Start of block `block` in chunk (data) coordinates.
    pub fn block_start(&self, block: u32) -> u64 {
        u64::from(block) * u64::from(self.block_size)
    }

    /// The block holding chunk byte `pos`.
    pub fn block_of(&self, pos: u64) -> u32 {
        (pos / u64::from(self.block_size)) as u32
    }

    /// crc32c of a block whose stored bytes are `bytes`; the rest of the block counts as
    /// zeros.
    pub fn block_crc(&self, bytes: &[u8]) -> u32 {
        let crc = crc32c::crc32c(bytes);
        let pad = (self.block_size as usize).saturating_sub(bytes.len());
        crc32c::crc32c_append(crc, &ZEROS[..pad])
    }

    /// Checks that `[offset, offset + len)` lies inside a chunk; returns its end.
    pub fn check_range(&self, chunk: ChunkId, offset: u32, len: usize) -> Result<u64, DataError> {
        let end = u64::try_from(len)
            .ok()
            .and_then(|l| l.checked_add(u64::from(offset)))
            .filter(|&end| end <= u64::from(self.chunk_size));
        end.ok_or_else(|| {
            DataError::InvalidArgument(format!(
                "{chunk}: range of {len} bytes at offset {offset} exceeds the chunk size {}",
                self.chunk_size
            ))
        })
    }

    /// Offset in the file of table entry `block`.
    pub fn entry_pos(&self, block: u32) -> u64 {
        HEADER_BYTES + u64::from(block) * ENTRY_BYTES as u64
    }
}

#[cfg(test)]
thread_local! {
    /// Makes this thread's new chunk files version 2, for the tests of files an earlier
    /// build left.
    pub(crate) static NEW_FILES_V2: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Checks a chunk size that came from a peer or from a header.
fn check_chunk_size(chunk_size: u32) -> Result<(), DataError> {
    if !chunk_size.is_power_of_two()
        || !(MIN_CHUNK_SIZE_BYTES..=MAX_CHUNK_SIZE_BYTES).contains(&chunk_size)
    {
        return Err(DataError::InvalidArgument(format!(
            "chunk size {chunk_size} is not a power of two between \
             {MIN_CHUNK_SIZE_BYTES} and {MAX_CHUNK_SIZE_BYTES}"
        )));
    }
    Ok(())
}

/// Rounds up to a multiple of the page size, the unit disks allocate in.
pub(crate) fn round_up_page(n: u64) -> u64 {
    n.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

/// The first page of a new chunk file.
pub(crate) fn encode_header(geo: Geometry) -> Vec<u8> {
    let mut page = vec![0u8; HEADER_BYTES as usize];
    page[0..8].copy_from_slice(&MAGIC);
    page[8..12].copy_from_slice(&geo.version.to_le_bytes());
    page[12..16].copy_from_slice(&geo.block_size.to_le_bytes());
    page[16..20].copy_from_slice(&geo.chunk_size.to_le_bytes());
    let crc = crc32c::crc32c(&page[..HEADER_FIELDS_BYTES]);
    page[20..24].copy_from_slice(&crc.to_le_bytes());
    page
}

/// Number of header bytes [`decode_header`] needs.
pub(crate) const HEADER_USED_BYTES: usize = HEADER_FIELDS_BYTES + 4;

/// Checks a header and returns the geometry it records.
pub(crate) fn decode_header(chunk: ChunkId, h: &[u8]) -> Result<Geometry, DataError> {
    let bad = |reason: String| DataError::CorruptHeader { chunk, reason };
    if h.len() < HEADER_USED_BYTES {
        return Err(bad(format!("only {} header bytes", h.len())));
    }
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    if h[0..8] != MAGIC {
        return Err(bad("bad magic".into()));
    }
    let crc = crc32c::crc32c(&h[..HEADER_FIELDS_BYTES]);
    if crc != u32_at(20) {
        return Err(bad("header checksum mismatch".into()));
    }
    let (version, block_size, chunk_size) = (u32_at(8), u32_at(12), u32_at(16));
    let geo = match version {
        FORMAT_VERSION => Geometry::v3(chunk_size),
        FORMAT_VERSION_2 => Geometry::v2(chunk_size),
        _ => return Err(DataError::UnsupportedFormat { chunk, version }),
    };
    let geo = geo.map_err(|_| bad(format!("bad chunk size {chunk_size}")))?;
    // The block size follows from the version and the chunk size; recorded to be checked.
    if block_size != geo.block_size {
        return Err(bad(format!(
            "block size {block_size}, not the {} of version {version} for {chunk_size}-byte chunks",
            geo.block_size
        )));
    }
    Ok(geo)
}

/// A decoded checksum table entry: which versions of its block the block may hold.
///
/// Encoding (16 bytes, little-endian): crc slot A at 0, crc slot B at 4, the kind at 8,
/// three zero bytes, and the crc32c of bytes 0..12 at 12. A slot a kind does not use is 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    /// Never written: reads as zeros whatever the disk holds there. Sixteen zero bytes.
    Unwritten,
    /// Kind 1, slot A: the block holds the version with this crc.
    Stable(u32),
    /// Kind 2, slots A and B: an update of the block from version `old` to version `new`
    /// was under way, so the block holds either (or, if the data write was cut short in
    /// the middle of the block, neither: corrupt).
    Pending {
        /// crc of the version the block held before the update.
        old: u32,
        /// crc of the version the update stores.
        new: u32,
    },
    /// Kind 3, slot A: the first write of a version with this crc into a block without
    /// data was under way. Bytes that do not match are the ones the block had: none, so
    /// the block reads as zeros.
    PendingFirst(u32),
    /// Any other bit pattern: the table itself is damaged.
    Damaged,
}

/// What a block holds, decided from its entry and the crc of its stored bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Content {
    /// No data: zeros, whatever the disk holds there.
    Zeros,
    /// The stored bytes, a version with this crc.
    Stored(u32),
    /// Stored bytes that match no version the entry allows, or a damaged entry.
    Corrupt,
}

impl Entry {
    /// Decodes one entry. Only the exact encoding of a valid entry is accepted (its crc,
    /// kind, reserved bytes and unused slot all check), so that damage to the table is
    /// caught rather than read as a hole or as another kind.
    pub fn decode(bytes: &[u8; ENTRY_BYTES]) -> Entry {
        if *bytes == [0; ENTRY_BYTES] {
            return Entry::Unwritten;
        }
        let slot =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let entry = match bytes[8] {
            KIND_STABLE => Entry::Stable(slot(0)),
            KIND_PENDING => Entry::Pending {
                old: slot(0),
                new: slot(4),
            },
            KIND_PENDING_FIRST => Entry::PendingFirst(slot(0)),
            _ => return Entry::Damaged,
        };
        if entry.encode() == *bytes {
            entry
        } else {
            Entry::Damaged
        }
    }

    /// The encoding of this entry. [`Entry::Damaged`] encodes as a pattern that decodes as
    /// damaged again (an unknown kind), so that rewriting it launders nothing.
    pub fn encode(self) -> [u8; ENTRY_BYTES] {
        let (kind, a, b) = match self {
            Entry::Unwritten => return [0; ENTRY_BYTES],
            Entry::Damaged => return [0xFF; ENTRY_BYTES],
            Entry::Stable(crc) => (KIND_STABLE, crc, 0),
            Entry::Pending { old, new } => (KIND_PENDING, old, new),
            Entry::PendingFirst(crc) => (KIND_PENDING_FIRST, crc, 0),
        };
        let mut e = [0u8; ENTRY_BYTES];
        e[0..4].copy_from_slice(&a.to_le_bytes());
        e[4..8].copy_from_slice(&b.to_le_bytes());
        e[8] = kind;
        let crc = crc32c::crc32c(&e[..ENTRY_FIELDS_BYTES]);
        e[ENTRY_FIELDS_BYTES..].copy_from_slice(&crc.to_le_bytes());
        e
    }

    /// What a block of `geo` holds if its stored bytes are `bytes` (the rest of the block
    /// counts as zeros). Their crc is computed only for entries that need it.
    pub fn resolve(self, geo: Geometry, bytes: &[u8]) -> Content {
        match self {
            Entry::Unwritten => Content::Zeros,
            Entry::Damaged => Content::Corrupt,
            Entry::Stable(crc) if geo.block_crc(bytes) == crc => Content::Stored(crc),
            Entry::Stable(_) => Content::Corrupt,
            Entry::Pending { old, new } => match geo.block_crc(bytes) {
                crc if crc == old || crc == new => Content::Stored(crc),
                _ => Content::Corrupt,
            },
            Entry::PendingFirst(crc) if geo.block_crc(bytes) == crc => Content::Stored(crc),
            Entry::PendingFirst(_) => Content::Zeros,
        }
    }

    /// The entry to store before the data of a block holding `current` is replaced by a
    /// version with crc `new`: it allows both, so a crash at any point leaves the block
    /// readable. A corrupt block has no version to keep; it stays corrupt until the data
    /// with crc `new` is in place.
    pub fn intent(current: Content, new: u32) -> Entry {
        match current {
            Content::Stored(old) => Entry::Pending { old, new },
            Content::Zeros => Entry::PendingFirst(new),
            Content::Corrupt => Entry::Stable(new),
        }
    }
}

/// Reads table entries from their encoding.
pub(crate) fn decode_entries(bytes: &[u8]) -> Vec<Entry> {
    bytes
        .chunks_exact(ENTRY_BYTES)
        .map(|e| Entry::decode(e.try_into().expect("chunks_exact yields whole entries")))
        .collect()
}

/// The encoding of table entries.
pub(crate) fn encode_entries(entries: &[Entry]) -> Vec<u8> {
    entries.iter().flat_map(|e| e.encode()).collect()
}

/// Bytes a chunk file is charged against the capacity: the header and table, plus each
/// written block up to the chunk's end, in whole pages (what a file system allocates).
pub(crate) fn accounted_bytes(geo: Geometry, table: &[Entry], data_len: u64) -> u64 {
    accounted(geo, table.iter().map(|&e| e != Entry::Unwritten), data_len)
}

/// [`accounted_bytes`] of a table as stored: an entry is written unless its 16 bytes are
/// all zero (what [`Entry::decode`] reads as unwritten), so nothing is decoded. A write
/// charges its chunk from the whole table, up to 1024 entries: decoding each (a crc per
/// entry) cost a 4 KiB write into a full 4 MiB chunk half its time.
pub(crate) fn accounted_raw(geo: Geometry, table: &[u8], data_len: u64) -> u64 {
    const _: () = assert!(ENTRY_BYTES == 16, "an entry is one u128");
    // One 128-bit compare per entry: the byte-wise test was a fifth of a data server's
    // time under scattered small writes, each of which counts the whole table twice.
    let written = table.chunks_exact(ENTRY_BYTES).map(|e| {
        let word: [u8; 16] = e.try_into().unwrap_or([1; 16]);
        u128::from_ne_bytes(word) != 0
    });
    accounted(geo, written, data_len)
}

/// The header and table, plus each block `written` says holds data, in whole pages up
/// to the chunk's end.
fn accounted(geo: Geometry, written: impl Iterator<Item = bool>, data_len: u64) -> u64 {
    let data: u64 = (0u32..)
        .zip(written)
        .filter(|&(_, written)| written)
        .map(|(b, _)| {
            let in_block = data_len.saturating_sub(geo.block_start(b));
            round_up_page(in_block.min(u64::from(geo.block_size)))
        })
        .sum();
    geo.data_offset + data
}

/// Reads `dst.len()` bytes at `pos`, filling what lies past the end of the file with zeros.
pub(crate) fn read_full_at(file: &File, mut dst: &mut [u8], mut pos: u64) -> std::io::Result<()> {
    while !dst.is_empty() {
        match file.read_at(dst, pos) {
            Ok(0) => {
                dst.fill(0);
                return Ok(());
            }
            Ok(n) => {
                dst = &mut dst[n..];
                pos += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads the stored bytes of the whole table of a chunk file.
pub(crate) fn read_table_bytes(
    file: &File,
    geo: Geometry,
    path: &Path,
) -> Result<Vec<u8>, DataError> {
    let mut bytes = vec![0u8; geo.blocks as usize * ENTRY_BYTES];
    read_full_at(file, &mut bytes, geo.entry_pos(0))
        .ctx(|| format!("read checksum table of {}", path.display()))?;
    Ok(bytes)
}

/// Reads table entries `first..=last` from a chunk file.
pub(crate) fn read_entries(
    file: &File,
    geo: Geometry,
    (first, last): (u32, u32),
    path: &Path,
) -> Result<Vec<Entry>, DataError> {
    let mut bytes = vec![0u8; (last - first + 1) as usize * ENTRY_BYTES];
    read_full_at(file, &mut bytes, geo.entry_pos(first))
        .ctx(|| format!("read checksum table of {}", path.display()))?;
    Ok(decode_entries(&bytes))
}

/// Directory holding every chunk.
pub(crate) fn chunks_root(dir: &Path) -> PathBuf {
    dir.join("chunks")
}

/// Bucket of an inode: spreads inode directories over 256 directories.
pub(crate) fn bucket_of(inode: InodeId) -> u8 {
    (inode.0 % 256) as u8
}

/// Directory of one bucket.
pub(crate) fn bucket_dir(root: &Path, bucket: u8) -> PathBuf {
    root.join(format!("{bucket:02x}"))
}

/// Directory holding the chunks of one inode.
pub(crate) fn inode_dir(root: &Path, inode: InodeId) -> PathBuf {
    bucket_dir(root, bucket_of(inode)).join(format!("{:016x}", inode.0))
}

/// File of one chunk. A file's first chunk lies in its bucket, named by the inode
/// ([`first_chunk_path`]): a small file, one chunk, then costs no directory of its own
/// (a `mkdir` on each copy's create, and one more dependent disk read on a cold open,
/// per `scripts/profile-small.sh`). Its other chunks lie in its inode directory.
pub(crate) fn chunk_path(root: &Path, chunk: ChunkId) -> PathBuf {
    if chunk.index == 0 {
        first_chunk_path(root, chunk.inode)
    } else {
        inode_dir(root, chunk.inode).join(chunk_name(chunk.index))
    }
}

/// File of an inode's chunk 0: `<bucket>/<inode>.chunk`.
pub(crate) fn first_chunk_path(root: &Path, inode: InodeId) -> PathBuf {
    bucket_dir(root, bucket_of(inode)).join(chunk_name(inode.0))
}

/// Where chunk 0 lay before the first chunk moved into the bucket (tree version 1):
/// `<bucket>/<inode>/0000000000000000.chunk`.
pub(crate) fn nested_first_chunk_path(root: &Path, inode: InodeId) -> PathBuf {
    inode_dir(root, inode).join(chunk_name(0))
}

/// `<16 hex digits>.chunk`: a chunk index in an inode directory, an inode in a bucket.
pub(crate) fn chunk_name(n: u64) -> String {
    format!("{n:016x}.chunk")
}

/// Parses 16 lowercase hex digits, as written by [`inode_dir`] and [`chunk_path`].
pub(crate) fn parse_hex16(name: &str) -> Option<u64> {
    let ok = name.len() == 16 && name.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    ok.then(|| u64::from_str_radix(name, 16).ok()).flatten()
}

/// The number a chunk file name holds (a chunk index in an inode directory, an inode in a
/// bucket), or `None` for any other file.
pub(crate) fn parse_chunk_name(name: &str) -> Option<u64> {
    name.strip_suffix(".chunk").and_then(parse_hex16)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: ChunkId = ChunkId {
        inode: InodeId(0x1234),
        index: 2,
    };

    #[test]
    fn geometry_of_the_extreme_chunk_sizes() {
        let small = Geometry::new(64 << 10).unwrap();
        assert_eq!((small.block_size, small.blocks), (4096, 16));
        assert_eq!(small.data_offset, 8192);
        let default = Geometry::new(4 << 20).unwrap();
        assert_eq!((default.block_size, default.blocks), (4096, 1024));
        assert_eq!(default.data_offset, 4096 + 16384);
        let large = Geometry::new(64 << 20).unwrap();
        assert_eq!((large.block_size, large.blocks), (65536, 1024));
        assert_eq!(large.data_offset, 4096 + 16384);
        // Version 2: 64 KiB blocks whatever the chunk size.
        let v2 = Geometry::v2(4 << 20).unwrap();
        assert_eq!(
            (v2.block_size, v2.blocks, v2.data_offset),
            (65536, 64, 8192)
        );
        for bad in [0, 1, 32 << 10, (64 << 10) + 1, 3 << 20, 128 << 20, u32::MAX] {
            assert!(matches!(
                Geometry::new(bad),
                Err(DataError::InvalidArgument(_))
            ));
        }
    }

    #[test]
    fn range_checks_do_not_overflow() {
        let geo = Geometry::new(1 << 20).unwrap();
        assert_eq!(geo.check_range(CHUNK, (1 << 20) - 10, 10).unwrap(), 1 << 20);
        assert!(geo.check_range(CHUNK, (1 << 20) - 10, 11).is_err());
        assert!(geo.check_range(CHUNK, u32::MAX, usize::MAX).is_err());
        assert!(geo.check_range(CHUNK, u32::MAX, 0).is_err());
    }

    #[test]
    fn header_round_trips_and_rejects_damage() {
        for geo in [Geometry::new(4 << 20), Geometry::v2(4 << 20)] {
            let geo = geo.unwrap();
            let page = encode_header(geo);
            assert_eq!(decode_header(CHUNK, &page).unwrap(), geo);
            for i in 0..HEADER_USED_BYTES {
                let mut bad = page.clone();
                bad[i] ^= 0x10;
                let err = decode_header(CHUNK, &bad).unwrap_err();
                assert!(
                    matches!(err, DataError::CorruptHeader { .. }),
                    "byte {i}: {err}"
                );
            }
            assert!(decode_header(CHUNK, &page[..10]).is_err());
        }
    }

    /// A block size other than the one its version and chunk size give is refused, even
    /// under a matching header checksum.
    #[test]
    fn a_header_with_another_block_size_is_refused() {
        for (geo, other) in [
            (Geometry::new(4 << 20).unwrap(), 65536u32),
            (Geometry::v2(4 << 20).unwrap(), 4096),
        ] {
            let mut page = encode_header(geo);
            page[12..16].copy_from_slice(&other.to_le_bytes());
            let crc = crc32c::crc32c(&page[..HEADER_FIELDS_BYTES]);
            page[20..24].copy_from_slice(&crc.to_le_bytes());
            let err = decode_header(CHUNK, &page).unwrap_err();
            assert!(
                matches!(err, DataError::CorruptHeader { .. }),
                "{other}: {err}"
            );
        }
    }

    #[test]
    fn a_version_1_chunk_file_is_refused_by_name() {
        let mut page = encode_header(Geometry::new(1 << 20).unwrap());
        page[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32c::crc32c(&page[..HEADER_FIELDS_BYTES]);
        page[20..24].copy_from_slice(&crc.to_le_bytes());
        let err = decode_header(CHUNK, &page).unwrap_err();
        assert!(
            matches!(err, DataError::UnsupportedFormat { version: 1, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("format version 1"), "{err}");
    }

    const ALL_KINDS: [Entry; 5] = [
        Entry::Unwritten,
        Entry::Stable(0x1234_5678),
        Entry::Pending {
            old: 0xDEAD_BEEF,
            new: 0x0BAD_F00D,
        },
        Entry::PendingFirst(0xCAFE_0001),
        // A crc of 0 is a valid crc, not an empty slot.
        Entry::Stable(0),
    ];

    #[test]
    fn entries_round_trip_and_catch_any_flipped_bit() {
        for entry in ALL_KINDS {
            let bytes = entry.encode();
            assert_eq!(Entry::decode(&bytes), entry);
            for bit in 0..ENTRY_BYTES * 8 {
                let mut bad = bytes;
                bad[bit / 8] ^= 1 << (bit % 8);
                assert_eq!(Entry::decode(&bad), Entry::Damaged, "{entry:?} bit {bit}");
            }
        }
        assert_eq!(Entry::decode(&Entry::Damaged.encode()), Entry::Damaged);
        // Reserved bytes and an unused slot must be zero even under a matching crc.
        let mut e = Entry::Stable(9).encode();
        e[4] = 1;
        let crc = crc32c::crc32c(&e[..ENTRY_FIELDS_BYTES]);
        e[ENTRY_FIELDS_BYTES..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(Entry::decode(&e), Entry::Damaged);
        let table = encode_entries(&ALL_KINDS);
        assert_eq!(table.len(), ALL_KINDS.len() * ENTRY_BYTES);
        assert_eq!(decode_entries(&table), ALL_KINDS);
    }

    #[test]
    fn each_kind_accepts_exactly_its_versions() {
        let geo = Geometry::new(1 << 20).unwrap();
        let (old, new, other) = (&b"old"[..], &b"new"[..], &b"torn"[..]);
        let (c_old, c_new) = (geo.block_crc(old), geo.block_crc(new));
        let pending = Entry::Pending {
            old: c_old,
            new: c_new,
        };
        assert_eq!(pending.resolve(geo, old), Content::Stored(c_old));
        assert_eq!(pending.resolve(geo, new), Content::Stored(c_new));
        assert_eq!(pending.resolve(geo, other), Content::Corrupt);
        let first = Entry::PendingFirst(c_new);
        assert_eq!(first.resolve(geo, new), Content::Stored(c_new));
        assert_eq!(first.resolve(geo, other), Content::Zeros);
        assert_eq!(
            Entry::Stable(c_old).resolve(geo, old),
            Content::Stored(c_old)
        );
        assert_eq!(Entry::Stable(c_old).resolve(geo, new), Content::Corrupt);
        assert_eq!(Entry::Unwritten.resolve(geo, other), Content::Zeros);
        assert_eq!(Entry::Damaged.resolve(geo, old), Content::Corrupt);
        assert_eq!(Entry::intent(Content::Stored(c_old), c_new), pending);
        assert_eq!(Entry::intent(Content::Zeros, c_new), first);
        assert_eq!(Entry::intent(Content::Corrupt, c_new), Entry::Stable(c_new));
    }

    #[test]
    fn block_crc_pads_with_zeros() {
        for geo in [Geometry::new(1 << 20), Geometry::v2(1 << 20)] {
            let geo = geo.unwrap();
            let mut full = vec![0u8; geo.block_size as usize];
            full[..3].copy_from_slice(b"abc");
            assert_eq!(geo.block_crc(b"abc"), crc32c::crc32c(&full));
            assert_eq!(geo.block_crc(&full), crc32c::crc32c(&full));
        }
    }

    #[test]
    fn accounting_counts_written_blocks_up_to_the_end() {
        let geo = Geometry::v2(1 << 20).unwrap();
        let mut table = vec![Entry::Unwritten; geo.blocks as usize];
        assert_eq!(accounted_bytes(geo, &table, 0), geo.data_offset);
        table[0] = Entry::Stable(1);
        assert_eq!(accounted_bytes(geo, &table, 1), geo.data_offset + 4096);
        table[3] = Entry::PendingFirst(1);
        let len = geo.block_start(3) + 5000;
        assert_eq!(
            accounted_bytes(geo, &table, len),
            geo.data_offset + 65536 + 8192
        );
        // 4 KiB blocks: a written block counts its page, up to the end.
        let geo = Geometry::new(1 << 20).unwrap();
        let mut table = vec![Entry::Unwritten; geo.blocks as usize];
        table[0] = Entry::Stable(1);
        table[3] = Entry::Stable(1);
        let len = geo.block_start(3) + 100;
        assert_eq!(accounted_bytes(geo, &table, len), geo.data_offset + 8192);
        // The same from the stored table, damaged entries counted as written.
        let mut raw = encode_entries(&table);
        assert_eq!(accounted_raw(geo, &raw, len), geo.data_offset + 8192);
        raw[2 * ENTRY_BYTES + 5] = 1;
        assert_eq!(
            Entry::decode(&raw[32..48].try_into().unwrap()),
            Entry::Damaged
        );
        assert_eq!(accounted_raw(geo, &raw, len), geo.data_offset + 12288);
    }

    #[test]
    fn paths_and_names() {
        let p = chunk_path(Path::new("/d/chunks"), CHUNK);
        assert_eq!(
            p,
            Path::new("/d/chunks/34/0000000000001234/0000000000000002.chunk")
        );
        let first = ChunkId { index: 0, ..CHUNK };
        assert_eq!(
            chunk_path(Path::new("/d/chunks"), first),
            Path::new("/d/chunks/34/0000000000001234.chunk")
        );
        assert_eq!(
            nested_first_chunk_path(Path::new("/d/chunks"), CHUNK.inode),
            Path::new("/d/chunks/34/0000000000001234/0000000000000000.chunk")
        );
        assert_eq!(parse_chunk_name("0000000000000002.chunk"), Some(2));
        assert_eq!(parse_chunk_name("000000000000000G.chunk"), None);
        assert_eq!(parse_chunk_name("+000000000000002.chunk"), None);
        assert_eq!(parse_chunk_name("0000000000000002.tmp"), None);
        assert_eq!(parse_hex16("ffffffffffffffff"), Some(u64::MAX));
    }
}
