//! The data server's request handler: chunk commands in, one-sided transfers out.
//!
//! A read: the store fills a registered buffer, then the engine WRITEs it into the
//! client's granted slice. A write: the engine READs the client's slice into a registered
//! buffer, then the store writes it. Requests larger than one buffer move in steps.

use crate::error::DataError;
use crate::store::ChunkStore;
use bytes::Bytes;
use proto::data::{DataReply, DataRequest, DataResult};
use proto::{codec, ChunkId, ErrorCode, RemoteBuf, WireError};
use std::sync::Arc;
use tracing::{debug, warn, Instrument};
use transport::{BufferPool, Connection, Handler, HandlerFuture, MemoryRegion};

/// Serves [`DataRequest`]s against a [`ChunkStore`].
#[derive(Clone)]
pub struct DataService {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<ChunkStore>,
    pool: BufferPool,
    max_msg_bytes: usize,
}

impl DataService {
    /// A service over `store`, moving bytes through `pool`.
    pub fn new(store: Arc<ChunkStore>, pool: BufferPool, max_msg_bytes: usize) -> DataService {
        DataService {
            inner: Arc::new(Inner {
                store,
                pool,
                max_msg_bytes,
            }),
        }
    }
}

impl Handler for DataService {
    fn handle(&self, conn: Connection, request: Bytes) -> HandlerFuture {
        let inner = self.inner.clone();
        Box::pin(async move {
            let result: DataResult = match codec::decode::<DataRequest>(&request) {
                Ok(req) => {
                    let span = tracing::debug_span!("data", op = op_name(&req), peer = conn.peer());
                    inner.serve(&conn, req).instrument(span).await
                }
                Err(e) => {
                    warn!(peer = conn.peer(), error = %e, "undecodable request");
                    Err(WireError::from(e))
                }
            };
            encode_reply(&result, inner.max_msg_bytes)
        })
    }
}

fn encode_reply(result: &DataResult, limit: usize) -> Bytes {
    match codec::encode(result, limit) {
        Ok(b) => Bytes::from(b),
        Err(e) => {
            let err: DataResult = Err(WireError::new(ErrorCode::TooBig, e.to_string()));
            // A bare error always fits: it has no payload beyond the message.
            Bytes::from(codec::encode(&err, usize::MAX).unwrap_or_default())
        }
    }
}

fn op_name(req: &DataRequest) -> &'static str {
    match req {
        DataRequest::ReadChunk { .. } => "read",
        DataRequest::WriteChunk { .. } => "write",
        DataRequest::WriteZeros { .. } => "write_zeros",
        DataRequest::TruncateFile { .. } => "truncate",
        DataRequest::DeleteFile { .. } => "delete",
        DataRequest::Fsync { .. } => "fsync",
        DataRequest::Usage => "usage",
    }
}

/// Runs blocking store work on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DataError> + Send + 'static,
) -> Result<T, WireError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(WireError::from),
        Err(e) => Err(WireError::new(
            ErrorCode::Io,
            format!("store task failed: {e}"),
        )),
    }
}

impl Inner {
    async fn serve(&self, conn: &Connection, req: DataRequest) -> DataResult {
        let store = self.store.clone();
        match req {
            DataRequest::ReadChunk {
                chunk,
                chunk_size_bytes,
                offset,
                len,
                dest,
            } => {
                self.read(conn, chunk, chunk_size_bytes, offset, len, dest)
                    .await?;
                Ok(DataReply::Read { len })
            }
            DataRequest::WriteChunk {
                chunk,
                chunk_size_bytes,
                offset,
                src,
            } => {
                let len = self
                    .write(conn, chunk, chunk_size_bytes, offset, src)
                    .await?;
                Ok(DataReply::Written { len })
            }
            DataRequest::WriteZeros {
                chunk,
                chunk_size_bytes,
                offset,
                len,
            } => {
                blocking(move || write_zeros(&store, chunk, chunk_size_bytes, offset, len)).await?;
                Ok(DataReply::Written { len })
            }
            DataRequest::TruncateFile {
                inode,
                size,
                chunk_size_bytes,
            } => {
                blocking(move || store.truncate_file(inode, size, chunk_size_bytes)).await?;
                Ok(DataReply::Unit)
            }
            DataRequest::DeleteFile { inode } => {
                blocking(move || store.delete_file(inode)).await?;
                Ok(DataReply::Unit)
            }
            DataRequest::Fsync { chunks } => {
                blocking(move || store.fsync(&chunks)).await?;
                Ok(DataReply::Unit)
            }
            DataRequest::Usage => {
                let u = blocking(move || store.usage()).await?;
                Ok(DataReply::Usage {
                    capacity_bytes: u.capacity_bytes,
                    used_bytes: u.used_bytes,
                    chunks: u.chunks,
                })
            }
        }
    }

    /// Steps of at most one buffer over `len` bytes: (offset within the request, length).
    fn steps(&self, len: u32) -> impl Iterator<Item = (u32, u32)> {
        let step = self.pool.buffer_bytes() as u32;
        (0..len)
            .step_by(step as usize)
            .map(move |o| (o, step.min(len - o)))
    }

    async fn read(
        &self,
        conn: &Connection,
        chunk: ChunkId,
        chunk_size: u32,
        offset: u32,
        len: u32,
        dest: RemoteBuf,
    ) -> Result<(), WireError> {
        if u64::from(len) > dest.len {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("read of {len} bytes into a buffer of {}", dest.len),
            ));
        }
        for (at, n) in self.steps(len) {
            let buf = self.pool.take().await;
            let mr: MemoryRegion = buf.mr().clone();
            let store = self.store.clone();
            let fill = mr.clone();
            let off = offset
                .checked_add(at)
                .ok_or_else(|| range_error(offset, len))?;
            blocking(move || store.read(chunk, chunk_size, off, &mut fill.lock()[..n as usize]))
                .await?;
            let target = RemoteBuf {
                addr: dest.addr + u64::from(at),
                len: u64::from(n),
                key: dest.key,
            };
            conn.write(target, &mr, 0).await.map_err(WireError::from)?;
        }
        debug!(%chunk, offset, len, "read");
        Ok(())
    }

    async fn write(
        &self,
        conn: &Connection,
        chunk: ChunkId,
        chunk_size: u32,
        offset: u32,
        src: RemoteBuf,
    ) -> Result<u32, WireError> {
        let len = u32::try_from(src.len)
            .ok()
            .filter(|l| u64::from(offset) + u64::from(*l) <= u64::from(chunk_size))
            .ok_or_else(|| range_error(offset, src.len.min(u64::from(u32::MAX)) as u32))?;
        for (at, n) in self.steps(len) {
            let buf = self.pool.take().await;
            let mr: MemoryRegion = buf.mr().clone();
            let part = RemoteBuf {
                addr: src.addr + u64::from(at),
                len: u64::from(n),
                key: src.key,
            };
            conn.read(part, &mr, 0).await.map_err(WireError::from)?;
            let store = self.store.clone();
            let off = offset + at;
            blocking(move || store.write(chunk, chunk_size, off, &mr.lock()[..n as usize])).await?;
        }
        debug!(%chunk, offset, len, "written");
        Ok(len)
    }
}

/// Zeroes a range of a chunk through the store's ordinary (checksummed, crash-safe)
/// write path, one bounded piece at a time.
fn write_zeros(
    store: &ChunkStore,
    chunk: ChunkId,
    chunk_size: u32,
    offset: u32,
    len: u32,
) -> Result<(), DataError> {
    const PIECE_BYTES: u32 = 1 << 20;
    // Past the stored bytes everything already reads as zeros: write nothing there, so
    // punching a hole never allocates.
    let stored = store.chunk_len(chunk)?;
    let len = u64::from(len).min(stored.saturating_sub(u64::from(offset))) as u32;
    let zeros = vec![0u8; PIECE_BYTES.min(len) as usize];
    let mut done = 0u32;
    while done < len {
        let n = PIECE_BYTES.min(len - done);
        let at = offset.checked_add(done).ok_or_else(|| {
            DataError::InvalidArgument(format!("zero range at {offset} overflows"))
        })?;
        store.write(chunk, chunk_size, at, &zeros[..n as usize])?;
        done += n;
    }
    Ok(())
}

fn range_error(offset: u32, len: u32) -> WireError {
    WireError::new(
        ErrorCode::InvalidArgument,
        format!("range of {len} bytes at {offset} is outside the chunk"),
    )
}
