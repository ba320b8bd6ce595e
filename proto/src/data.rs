//! Messages between clients and data servers.
//!
//! Bulk bytes never travel inside these messages: a read names the client buffer the
//! server WRITEs into, a write names the client buffer the server READs from.

use crate::error::WireError;
use crate::ids::{ChunkId, InodeId};
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
        /// The file's chunk size.
        chunk_size_bytes: u32,
        /// Offset within the chunk.
        offset: u32,
        /// Bytes to read; `offset + len <= chunk_size_bytes` and `len <= dest.len`.
        len: u32,
        /// Where to WRITE the bytes.
        dest: RemoteBuf,
    },
    /// Writes `src.len` bytes at `offset` of a chunk, READing them from the client.
    WriteChunk {
        /// The chunk.
        chunk: ChunkId,
        /// The file's chunk size.
        chunk_size_bytes: u32,
        /// Offset within the chunk.
        offset: u32,
        /// Where to READ the bytes from; `offset + src.len <= chunk_size_bytes`.
        src: RemoteBuf,
    },
    /// Writes `len` zero bytes at `offset` of a chunk (a punched hole), without moving
    /// any bytes over the network.
    WriteZeros {
        /// The chunk.
        chunk: ChunkId,
        /// The file's chunk size.
        chunk_size_bytes: u32,
        /// Offset within the chunk.
        offset: u32,
        /// Bytes to zero; `offset + len <= chunk_size_bytes`.
        len: u32,
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
