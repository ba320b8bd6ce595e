//! Messages between clients and data servers.
//!
//! Bulk bytes never travel inside these messages: a read names the client buffer the
//! server WRITEs into, a write names the client buffer the server READs from. The
//! exceptions are small reads and writes (at most [`MAX_INLINE_WRITE_BYTES`]): a small
//! write's bytes ride in the request and a small read's in the reply, as RDMA stacks send
//! small payloads inline, because moving a few KiB with a one-sided operation costs one
//! more round trip (on tcp a frame and its acknowledgement) than the call itself.

use crate::grant::Grant;
use crate::ids::{ChainId, ChunkId, InodeId};
use crate::RemoteBuf;
use serde::{Deserialize, Serialize};

/// Largest write whose bytes travel inside the request ([`WriteInline`],
/// [`ReplicaData::Inline`]) instead of being READ from the sender's buffer, and largest
/// read whose bytes travel inside the reply ([`ReadInline`]).
pub const MAX_INLINE_WRITE_BYTES: usize = 64 * 1024;

/// Most ranges one [`WriteRanges`] (or [`ReplicaData::Ranges`]) carries.
pub const MAX_WRITE_RANGES: usize = 1024;

/// Room each range of a [`WriteRanges`] takes in a request beside its bytes (its offset
/// and its bytes' length, encoded: at most ten bytes, rounded up).
const RANGE_HEADROOM_BYTES: usize = 16;

/// Room left in a request for everything but an inline write's bytes (ids, placement,
/// offsets: under a hundred bytes encoded).
const INLINE_HEADROOM_BYTES: usize = 1024;

/// Whether a write of `len` bytes may travel inline on a connection whose peer takes
/// requests of at most `max_request_bytes` (for a read: whose ends both take replies of
/// at most that).
pub fn fits_inline(len: usize, max_request_bytes: usize) -> bool {
    len <= MAX_INLINE_WRITE_BYTES && len + INLINE_HEADROOM_BYTES <= max_request_bytes
}

/// Whether `count` ranges holding `bytes` in all may travel in one [`WriteRanges`] on a
/// connection whose peer takes requests of at most `max_request_bytes`.
pub fn fits_ranges(count: usize, bytes: usize, max_request_bytes: usize) -> bool {
    count <= MAX_WRITE_RANGES
        && fits_inline(bytes, max_request_bytes)
        && bytes + count * RANGE_HEADROOM_BYTES + INLINE_HEADROOM_BYTES <= max_request_bytes
}

crate::rpc_requests! {
    /// A request to a data server, as it travels.
    pub enum DataRequest => DataRequest {
        ReadChunk => Moved, "read", idempotent: true;
        WriteChunk => Moved, "write", idempotent: true;
        WriteInline => Moved, "write_inline", idempotent: true;
        WriteZeros => Moved, "write_zeros", idempotent: true;
        Replicate => Moved, "replicate", idempotent: true;
        ChunkInfo => Option<ChunkMeta>, "chunk_info", idempotent: true;
        ListChunks => Vec<ChunkMeta>, "list_chunks", idempotent: true;
        FetchChunk => ChunkMeta, "fetch_chunk", idempotent: true;
        Repair => (), "repair", idempotent: true;
        TruncateFile => (), "truncate", idempotent: true;
        DeleteFile => (), "delete", idempotent: true;
        Fsync => (), "fsync", idempotent: true;
        Usage => DiskUsage, "usage", idempotent: true;
        // Last, so that the others keep their wire tags.
        ReadInline => InlineBytes, "read_inline", idempotent: true;
        WriteRanges => Moved, "write_ranges", idempotent: true;
        ChunkData => Option<DataBlocks>, "chunk_data", idempotent: true;
    }
}

/// Which blocks of a chunk hold data (`SEEK_DATA`, `SEEK_HOLE`); `None` when this member
/// has no copy of the chunk (all of it a hole). A block never written is a hole, and so
/// is a written block whose bytes are all zeros (a hole punched inside a block's range,
/// zeros written), as a hole reads: a file copied by its data ranges reads the same.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkData {
    /// The chunk.
    pub chunk: ChunkId,
    /// Where the chunk lives: a member that is not serving it refuses with `Stale`.
    pub place: Placement,
    /// The file's chunk size.
    pub chunk_size_bytes: u32,
    /// The metadata server's grant for the chunk's file (`None` only where the cluster
    /// runs without keys).
    pub grant: Option<Grant>,
}

/// Most data runs a [`DataBlocks`] holds: a chunk has at most 1,024 blocks, so at most
/// 512 runs; a reply with more is refused.
pub const MAX_DATA_RUNS: usize = 512;

/// The answer to [`ChunkData`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataBlocks {
    /// Bytes per block of this copy (its format's checksum block).
    pub block_bytes: u32,
    /// Runs `[first, end)` of block indexes that hold data, sorted and disjoint; every
    /// other block is a hole.
    pub runs: Vec<(u32, u32)>,
}

impl DataBlocks {
    /// Checks the answer against a chunk of `chunk_size` bytes, as its reader must
    /// before trusting it: a block size one of the chunk formats uses for such a chunk
    /// (version 3: a 1,024th of the chunk, at least 4 KiB; version 2: 64 KiB), at most
    /// [`MAX_DATA_RUNS`] runs, each non-empty, in order, not overlapping the one before
    /// and inside the chunk. A run past the chunk would move a seek's answer into a
    /// later chunk, over its data; a block size smaller than the copy's, over the rest
    /// of each block.
    pub fn check(&self, chunk_size: u32) -> Result<(), String> {
        let bs = self.block_bytes;
        let v3 = (chunk_size / 1024).max(4096);
        if !(bs == v3 || bs == 64 << 10) || !chunk_size.is_multiple_of(bs) {
            return Err(format!("block size {bs} for a chunk of {chunk_size} bytes"));
        }
        if self.runs.len() > MAX_DATA_RUNS {
            return Err(format!(
                "{} runs, more than {MAX_DATA_RUNS}",
                self.runs.len()
            ));
        }
        let blocks = chunk_size / bs;
        let mut prev_end = 0;
        for (i, &(a, b)) in self.runs.iter().enumerate() {
            if a >= b || b > blocks || (i > 0 && a < prev_end) {
                return Err(format!("run {a}..{b} after {prev_end} in {blocks} blocks"));
            }
            prev_end = b;
        }
        Ok(())
    }

    /// The chunk offsets `[start, end)` of the data runs. A data block counts whole,
    /// as a local file system's does: the zeros after the last byte written in it are
    /// data too.
    fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let bs = u64::from(self.block_bytes);
        let at = move |b: u32| u64::from(b).saturating_mul(bs);
        self.runs.iter().map(move |&(a, b)| (at(a), at(b)))
    }

    /// The first byte at or after chunk offset `from` that holds data, if any.
    pub fn data_from(&self, from: u64) -> Option<u64> {
        self.ranges()
            .find(|&(_, end)| end > from)
            .map(|(start, _)| start.max(from))
    }

    /// The first byte at or after chunk offset `from` of a hole (the chunk's end, or
    /// past it, when none is before).
    pub fn hole_from(&self, from: u64) -> u64 {
        let mut at = from;
        for (start, end) in self.ranges() {
            if start > at {
                break;
            }
            at = at.max(end);
        }
        at
    }
}

/// Reads `len` bytes at `offset` of a chunk into the client's buffer `dest`
/// (holes and bytes past the chunk's end read as zeros).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadChunk {
    /// The chunk.
    pub chunk: ChunkId,
    /// Where the chunk lives: a member that is not serving it refuses with `Stale`.
    pub place: Placement,
    /// The file's chunk size.
    pub chunk_size_bytes: u32,
    /// Offset within the chunk.
    pub offset: u32,
    /// Bytes to read; `offset + len <= chunk_size_bytes` and `len <= dest.len`.
    pub len: u32,
    /// Where to WRITE the bytes.
    pub dest: RemoteBuf,
    /// The metadata server's grant for the chunk's file (`None` only where the cluster
    /// runs without keys).
    pub grant: Option<Grant>,
}

/// Reads `len` bytes at `offset` of a chunk (at most [`MAX_INLINE_WRITE_BYTES`]) and
/// answers with them: a [`ReadChunk`] for small reads, whose bytes cost less in the reply
/// than in a one-sided WRITE of their own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadInline {
    /// The chunk.
    pub chunk: ChunkId,
    /// Where the chunk lives: a member that is not serving it refuses with `Stale`.
    pub place: Placement,
    /// The file's chunk size.
    pub chunk_size_bytes: u32,
    /// Offset within the chunk.
    pub offset: u32,
    /// Bytes to read; `offset + len <= chunk_size_bytes`.
    pub len: u32,
    /// The metadata server's grant for the chunk's file (`None` only where the cluster
    /// runs without keys).
    pub grant: Option<Grant>,
}

/// Writes `src.len` bytes at `offset` of a chunk, READing them from the client. Sent
/// to the head of the chunk's chain; acknowledged once every member has the bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteChunk {
    /// The chunk.
    pub chunk: ChunkId,
    /// Where the chunk lives and how many copies the file asks for.
    pub place: Placement,
    /// The file's chunk size.
    pub chunk_size_bytes: u32,
    /// Offset within the chunk.
    pub offset: u32,
    /// Where to READ the bytes from; `offset + src.len <= chunk_size_bytes`.
    pub src: RemoteBuf,
    /// The metadata server's grant for the chunk's file (`None` only where the cluster
    /// runs without keys).
    pub grant: Option<Grant>,
}

/// Writes the bytes carried in the request (at most [`MAX_INLINE_WRITE_BYTES`]) at
/// `offset` of a chunk. Sent to the head, like `WriteChunk`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteInline {
    /// The chunk.
    pub chunk: ChunkId,
    /// Where the chunk lives and how many copies the file asks for.
    pub place: Placement,
    /// The file's chunk size.
    pub chunk_size_bytes: u32,
    /// Offset within the chunk.
    pub offset: u32,
    /// The bytes; `offset + data.len() <= chunk_size_bytes`.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// The metadata server's grant for the chunk's file (`None` only where the cluster
    /// runs without keys).
    pub grant: Option<Grant>,
}

/// Writes several separate small ranges of one chunk, their bytes carried in the request
/// (at most [`MAX_WRITE_RANGES`], [`MAX_INLINE_WRITE_BYTES`] in all), as one chain write:
/// one version step and one pass down the chain for all of them, where a write of each
/// would take a pass of its own. Sent to the head, like `WriteChunk`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRanges {
    /// The chunk.
    pub chunk: ChunkId,
    /// Where the chunk lives and how many copies the file asks for.
    pub place: Placement,
    /// The file's chunk size.
    pub chunk_size_bytes: u32,
    /// The ranges: in ascending order, not overlapping, none empty, each inside the chunk.
    pub ranges: Vec<InlineRange>,
    /// The metadata server's grant for the chunk's file (`None` only where the cluster
    /// runs without keys).
    pub grant: Option<Grant>,
}

/// One range of a [`WriteRanges`]: bytes and where they go in the chunk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InlineRange {
    /// Offset within the chunk.
    pub offset: u32,
    /// The bytes.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// Writes `len` zero bytes at `offset` of a chunk (a punched hole), without moving
/// any bytes over the network. Sent to the head, like `WriteChunk`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteZeros {
    /// The chunk.
    pub chunk: ChunkId,
    /// Where the chunk lives and how many copies the file asks for.
    pub place: Placement,
    /// The file's chunk size.
    pub chunk_size_bytes: u32,
    /// Offset within the chunk.
    pub offset: u32,
    /// Bytes to zero; `offset + len <= chunk_size_bytes`.
    pub len: u32,
    /// The metadata server's grant for the chunk's file (`None` only where the cluster
    /// runs without keys).
    pub grant: Option<Grant>,
}

/// A write passed down a chain by a member to its successor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replicate {
    /// The chunk.
    pub chunk: ChunkId,
    /// Where the chunk lives and how many copies the file asks for.
    pub place: Placement,
    /// The file's chunk size.
    pub chunk_size_bytes: u32,
    /// Offset within the chunk.
    pub offset: u32,
    /// The chunk's version after this write, given by the head.
    pub version: u64,
    /// The version the head had before it (a member holding another one missed a
    /// write and must copy the whole chunk).
    pub base_version: u64,
    /// The bytes: READ from the predecessor, or zeros.
    pub data: ReplicaData,
}

/// A chunk's version and state; with `verify`, every block's checksum is checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkInfo {
    /// The chunk.
    pub chunk: ChunkId,
    /// Read and check every block.
    pub verify: bool,
}

/// Up to `limit` chunks of chain `chain` held here, after `after`, in store order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListChunks {
    /// The chain.
    pub chain: ChainId,
    /// Start after this chunk (`None`: from the beginning).
    pub after: Option<ChunkId>,
    /// At most this many.
    pub limit: u32,
}

/// WRITEs a whole chunk into the caller's buffer and returns its version, consistent
/// with each other (a resync or repair copying a chunk).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchChunk {
    /// The chunk.
    pub chunk: ChunkId,
    /// Where to WRITE the bytes; at least the chunk's size.
    pub dest: RemoteBuf,
}

/// Replaces the local copy of a chunk with the copy of the data server at `from`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repair {
    /// The chunk.
    pub chunk: ChunkId,
    /// The chain it belongs to.
    pub chain: ChainId,
    /// Address of a data server with a good copy.
    pub from: String,
}

/// Cuts a file's chunks held here to `size` bytes: drops whole chunks past it and
/// zeroes the tail of the chunk that holds the new end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TruncateFile {
    /// The file.
    pub inode: InodeId,
    /// The new length of the file.
    pub size: u64,
    /// The file's chunk size.
    pub chunk_size_bytes: u32,
    /// The metadata server's grant for the chunk's file (`None` only where the cluster
    /// runs without keys).
    pub grant: Option<Grant>,
}

/// Removes every chunk of a file held here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteFile {
    /// The file.
    pub inode: InodeId,
}

/// Makes the named chunks durable (data and directory entries).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fsync {
    /// The chunks written since the last fsync, all of the grant's file.
    pub chunks: Vec<ChunkId>,
    /// The metadata server's grant for the chunks' file (`None` only where the cluster
    /// runs without keys).
    pub grant: Option<Grant>,
}

/// Disk usage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage;

/// Where a chunk lives: its chain, the cluster map version the sender used, and the
/// copies the file asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The chunk's replication chain.
    pub chain: ChainId,
    /// The sender's cluster map version: a server with a newer map refuses the request
    /// with `Stale` (the sender refreshes and retries); with an older one it refreshes.
    pub map_version: u64,
    /// Copies of the chunk the file asks for.
    pub replicas: u8,
}

/// The bytes of a replicated write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaData {
    /// READ them from the predecessor's buffer.
    Bytes(RemoteBuf),
    /// This many zeros.
    Zeros(u32),
    /// The bytes themselves (at most [`MAX_INLINE_WRITE_BYTES`]).
    Inline(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Separate ranges with their bytes, as a [`WriteRanges`] carries them (the
    /// request's `offset` is the first one's).
    Ranges(Vec<InlineRange>),
}

/// What a data server knows of one of its chunks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkMeta {
    /// The chunk.
    pub chunk: ChunkId,
    /// Its chain (as recorded by the write that made it).
    pub chain: ChainId,
    /// Its version: bumped by every write.
    pub version: u64,
    /// Bytes stored.
    pub len: u64,
    /// Its chunk size.
    pub chunk_size_bytes: u32,
    /// Whether this copy missed a write and waits to be copied whole.
    pub stale: bool,
}

/// Bytes moved by a read or a write (the `len` asked for): the reply to [`ReadChunk`]
/// (the bytes are in the client's buffer) and to the writes (the bytes are stored, not
/// yet durable: see [`Fsync`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    /// Bytes read or stored.
    pub len: u32,
}

/// The bytes a [`ReadInline`] asked for (holes and bytes past the chunk's end as zeros).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InlineBytes {
    /// Exactly the `len` bytes asked for.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// A data server's disk usage: the reply to [`Usage`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskUsage {
    /// Bytes this server may use.
    pub capacity_bytes: u64,
    /// Bytes it uses.
    pub used_bytes: u64,
    /// Chunk files it holds.
    pub chunks: u64,
    /// Chunk requests refused for their grant since the server started, per reason
    /// (`proto::grant::GrantFault::name`); empty on a server without keys.
    pub grant_refusals: Vec<(String, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;

    #[test]
    fn data_and_holes_of_a_chunk_follow_its_block_runs() {
        let b = DataBlocks {
            block_bytes: 4096,
            runs: vec![(1, 3), (3, 4), (10, 11)],
        };
        assert_eq!(b.data_from(0), Some(4096));
        assert_eq!(b.data_from(5000), Some(5000));
        assert_eq!(b.data_from(4 * 4096), Some(10 * 4096));
        assert_eq!(b.data_from(11 * 4096), None);
        assert_eq!(b.hole_from(0), 0);
        assert_eq!(b.hole_from(4096), 4 * 4096, "touching runs are one");
        assert_eq!(b.hole_from(10 * 4096 + 1), 11 * 4096);
        assert_eq!(b.hole_from(20 * 4096), 20 * 4096);
        assert_eq!(b.check(1 << 20), Ok(()));
        // What a client must not trust: runs past the chunk, out of order, overlapping
        // or empty, and block sizes that do not divide it.
        let many: Vec<(u32, u32)> = (0..=MAX_DATA_RUNS as u32)
            .map(|i| (2 * i, 2 * i + 1))
            .collect();
        for (block_bytes, runs) in [
            (4096, vec![(255, 257)]),
            (4096, vec![(5, 6), (1, 2)]),
            (4096, vec![(1, 4), (3, 5)]),
            (4096, vec![(2, 2)]),
            (4096, many.clone()),
            (0, vec![]),
            (512, vec![]),
            (3000, vec![]),
            (8192, vec![]),
            (1 << 21, vec![]),
        ] {
            let bad = DataBlocks { block_bytes, runs };
            assert!(bad.check(1 << 20).is_err(), "{bad:?}");
        }
        // The largest answers the formats give pass: 512 runs in 1,024 blocks, and a
        // version 2 copy's 64 KiB blocks.
        let full = DataBlocks {
            block_bytes: 4096,
            runs: many[..MAX_DATA_RUNS].to_vec(),
        };
        assert_eq!(full.check(4 << 20), Ok(()));
        let v2 = DataBlocks {
            block_bytes: 64 << 10,
            runs: vec![(0, 16)],
        };
        assert_eq!(v2.check(1 << 20), Ok(()));
        let touching = DataBlocks {
            block_bytes: 4096,
            runs: (0..=MAX_DATA_RUNS as u32).map(|i| (i, i + 1)).collect(),
        };
        assert!(touching.check(4 << 20).unwrap_err().contains("runs"));
    }

    #[test]
    fn an_inline_write_round_trips_and_fits_its_limit() {
        let data = vec![7u8; MAX_INLINE_WRITE_BYTES];
        let req = DataRequest::WriteInline(WriteInline {
            chunk: ChunkId {
                inode: InodeId(u64::MAX),
                index: u64::MAX,
            },
            place: Placement {
                chain: ChainId(u32::MAX),
                map_version: u64::MAX,
                replicas: u8::MAX,
            },
            chunk_size_bytes: u32::MAX,
            offset: u32::MAX,
            data,
            grant: Some(crate::grant::seal(
                &[0; 32],
                InodeId(u64::MAX),
                &"c".repeat(crate::auth::MAX_PEER_NAME_BYTES),
                crate::grant::GrantMode::CutTo(u64::MAX, u32::MAX),
                u64::MAX,
                u64::MAX,
            )),
        });
        // The largest inline write, with every other field at its widest, stays within
        // the headroom `fits_inline` leaves.
        let bytes = codec::encode(&req, MAX_INLINE_WRITE_BYTES + INLINE_HEADROOM_BYTES).unwrap();
        assert_eq!(codec::decode::<DataRequest>(&bytes).unwrap(), req);
        let rep = DataRequest::Replicate(Replicate {
            chunk: ChunkId {
                inode: InodeId(1),
                index: 2,
            },
            place: Placement {
                chain: ChainId(3),
                map_version: 4,
                replicas: 3,
            },
            chunk_size_bytes: 1 << 22,
            offset: 5,
            version: u64::MAX,
            base_version: u64::MAX - 1,
            data: ReplicaData::Inline(b"abc".to_vec()),
        });
        let bytes = codec::encode(&rep, 4096).unwrap();
        assert_eq!(codec::decode::<DataRequest>(&bytes).unwrap(), rep);

        assert!(fits_inline(MAX_INLINE_WRITE_BYTES, 128 * 1024));
        assert!(!fits_inline(MAX_INLINE_WRITE_BYTES + 1, 1 << 24));
        // A peer taking only 4 KiB requests gets small writes inline, not 4 KiB ones.
        assert!(fits_inline(3000, 4096));
        assert!(!fits_inline(4096, 4096));
    }
}
