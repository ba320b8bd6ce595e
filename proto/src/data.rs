//! Messages between clients and data servers.
//!
//! Bulk bytes never travel inside these messages: a read names the client buffer the
//! server WRITEs into, a write names the client buffer the server READs from.

use crate::error::WireError;
use crate::ids::{ChainId, ChunkId, InodeId};
use crate::RemoteBuf;
use serde::{Deserialize, Serialize};

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaData {
    /// READ them from the predecessor's buffer.
    Bytes(RemoteBuf),
    /// This many zeros.
    Zeros(u32),
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
