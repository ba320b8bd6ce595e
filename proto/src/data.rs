//! Messages between clients and data servers.
//!
//! Bulk bytes never travel inside these messages: a read names the client buffer the
//! server WRITEs into, a write names the client buffer the server READs from. The one
//! exception is a small write (at most [`MAX_INLINE_WRITE_BYTES`]): its bytes ride in
//! the request, as RDMA stacks send small payloads inline, because fetching them with
//! a one-sided READ costs a round trip per chain member for a few KiB.

use crate::error::WireError;
use crate::ids::{ChainId, ChunkId, InodeId};
use crate::RemoteBuf;
use serde::{Deserialize, Serialize};

/// Largest write whose bytes travel inside the request ([`DataRequest::WriteInline`],
/// [`ReplicaData::Inline`]) instead of being READ from the sender's buffer.
pub const MAX_INLINE_WRITE_BYTES: usize = 64 * 1024;

/// Room left in a request for everything but an inline write's bytes (ids, placement,
/// offsets: under a hundred bytes encoded).
const INLINE_HEADROOM_BYTES: usize = 1024;

/// Whether a write of `len` bytes may travel inline on a connection whose peer takes
/// requests of at most `max_request_bytes`.
pub fn fits_inline(len: usize, max_request_bytes: usize) -> bool {
    len <= MAX_INLINE_WRITE_BYTES && len + INLINE_HEADROOM_BYTES <= max_request_bytes
}

/// A request to a data server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DataRequest {
    /// Reads `len` bytes at `offset` of a chunk into the client's buffer `dest`
    /// (holes and bytes past the chunk's end read as zeros).
    ReadChunk {
        /// The chunk.
        chunk: ChunkId,
        /// Where the chunk lives: a member that is not serving it refuses with `Stale`.
        place: Placement,
        /// The file's chunk size.
        chunk_size_bytes: u32,
        /// Offset within the chunk.
        offset: u32,
        /// Bytes to read; `offset + len <= chunk_size_bytes` and `len <= dest.len`.
        len: u32,
        /// Where to WRITE the bytes.
        dest: RemoteBuf,
    },
    /// Writes `src.len` bytes at `offset` of a chunk, READing them from the client. Sent
    /// to the head of the chunk's chain; acknowledged once every member has the bytes.
    WriteChunk {
        /// The chunk.
        chunk: ChunkId,
        /// Where the chunk lives and how many copies the file asks for.
        place: Placement,
        /// The file's chunk size.
        chunk_size_bytes: u32,
        /// Offset within the chunk.
        offset: u32,
        /// Where to READ the bytes from; `offset + src.len <= chunk_size_bytes`.
        src: RemoteBuf,
    },
    /// Writes the bytes carried in the request (at most [`MAX_INLINE_WRITE_BYTES`]) at
    /// `offset` of a chunk. Sent to the head, like `WriteChunk`.
    WriteInline {
        /// The chunk.
        chunk: ChunkId,
        /// Where the chunk lives and how many copies the file asks for.
        place: Placement,
        /// The file's chunk size.
        chunk_size_bytes: u32,
        /// Offset within the chunk.
        offset: u32,
        /// The bytes; `offset + data.len() <= chunk_size_bytes`.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Writes `len` zero bytes at `offset` of a chunk (a punched hole), without moving
    /// any bytes over the network. Sent to the head, like `WriteChunk`.
    WriteZeros {
        /// The chunk.
        chunk: ChunkId,
        /// Where the chunk lives and how many copies the file asks for.
        place: Placement,
        /// The file's chunk size.
        chunk_size_bytes: u32,
        /// Offset within the chunk.
        offset: u32,
        /// Bytes to zero; `offset + len <= chunk_size_bytes`.
        len: u32,
    },
    /// A write passed down a chain by a member to its successor.
    Replicate {
        /// The chunk.
        chunk: ChunkId,
        /// Where the chunk lives and how many copies the file asks for.
        place: Placement,
        /// The file's chunk size.
        chunk_size_bytes: u32,
        /// Offset within the chunk.
        offset: u32,
        /// The chunk's version after this write, given by the head.
        version: u64,
        /// The version the head had before it (a member holding another one missed a
        /// write and must copy the whole chunk).
        base_version: u64,
        /// The bytes: READ from the predecessor, or zeros.
        data: ReplicaData,
    },
    /// A chunk's version and state; with `verify`, every block's checksum is checked.
    ChunkInfo {
        /// The chunk.
        chunk: ChunkId,
        /// Read and check every block.
        verify: bool,
    },
    /// Up to `limit` chunks of chain `chain` held here, after `after`, in store order.
    ListChunks {
        /// The chain.
        chain: ChainId,
        /// Start after this chunk (`None`: from the beginning).
        after: Option<ChunkId>,
        /// At most this many.
        limit: u32,
    },
    /// WRITEs a whole chunk into the caller's buffer and returns its version, consistent
    /// with each other (a resync or repair copying a chunk).
    FetchChunk {
        /// The chunk.
        chunk: ChunkId,
        /// Where to WRITE the bytes; at least the chunk's size.
        dest: RemoteBuf,
    },
    /// Replaces the local copy of a chunk with the copy of the data server at `from`.
    Repair {
        /// The chunk.
        chunk: ChunkId,
        /// The chain it belongs to.
        chain: ChainId,
        /// Address of a data server with a good copy.
        from: String,
    },
    /// Cuts a file's chunks held here to `size` bytes: drops whole chunks past it and
    /// zeroes the tail of the chunk that holds the new end.
    TruncateFile {
        /// The file.
        inode: InodeId,
        /// The new length of the file.
        size: u64,
        /// The file's chunk size.
        chunk_size_bytes: u32,
    },
    /// Removes every chunk of a file held here.
    DeleteFile {
        /// The file.
        inode: InodeId,
    },
    /// Makes the named chunks durable (data and directory entries).
    Fsync {
        /// The chunks written since the last fsync.
        chunks: Vec<ChunkId>,
    },
    /// Disk usage.
    Usage,
}

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

/// A successful answer of a data server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DataReply {
    /// Nothing to return.
    Unit,
    /// The bytes are in the client's buffer.
    Read {
        /// Bytes written into the buffer (the `len` asked for).
        len: u32,
    },
    /// The bytes are stored (not yet durable: see `Fsync`).
    Written {
        /// Bytes stored.
        len: u32,
    },
    /// A chunk's state (`None`: not held here).
    Info(Option<ChunkMeta>),
    /// Chunks held here.
    Chunks(Vec<ChunkMeta>),
    /// A whole chunk is in the caller's buffer.
    Fetched(ChunkMeta),
    /// Disk usage.
    Usage {
        /// Bytes this server may use.
        capacity_bytes: u64,
        /// Bytes it uses.
        used_bytes: u64,
        /// Chunk files it holds.
        chunks: u64,
    },
}

/// The answer to every [`DataRequest`].
pub type DataResult = Result<DataReply, WireError>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;

    #[test]
    fn an_inline_write_round_trips_and_fits_its_limit() {
        let data = vec![7u8; MAX_INLINE_WRITE_BYTES];
        let req = DataRequest::WriteInline {
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
        };
        // The largest inline write, with every other field at its widest, stays within
        // the headroom `fits_inline` leaves.
        let bytes = codec::encode(&req, MAX_INLINE_WRITE_BYTES + INLINE_HEADROOM_BYTES).unwrap();
        assert_eq!(codec::decode::<DataRequest>(&bytes).unwrap(), req);
        let rep = DataRequest::Replicate {
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
        };
        let bytes = codec::encode(&rep, 4096).unwrap();
        assert_eq!(codec::decode::<DataRequest>(&bytes).unwrap(), rep);

        assert!(fits_inline(MAX_INLINE_WRITE_BYTES, 128 * 1024));
        assert!(!fits_inline(MAX_INLINE_WRITE_BYTES + 1, 1 << 24));
        // A peer taking only 4 KiB requests gets small writes inline, not 4 KiB ones.
        assert!(fits_inline(3000, 4096));
        assert!(!fits_inline(4096, 4096));
    }
}
