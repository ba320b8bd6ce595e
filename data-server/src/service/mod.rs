//! The data server's request handler: chunk commands in, one-sided transfers out.
//!
//! A read: the store fills a registered buffer, then the engine WRITEs it into the
//! client's granted slice. A write: the engine READs the client's slice into a registered
//! buffer, then the store writes it. Requests larger than one buffer move in steps.
//! Writes go down the chunk's replication chain (`chain.rs`); copies that missed writes
//! are brought up to date from a serving member (`resync.rs`).

mod chain;
mod grants;
mod locks;
mod pause;
mod resync;
#[cfg(test)]
mod tests;

pub use grants::{GrantCheck, MAX_VERIFIED_GRANTS};
pub use resync::Resync;

use crate::cluster_view::ClusterView;
use crate::error::DataError;
use crate::metrics::{DataMetrics, OneSided, Payload};
use crate::store::{ChunkStore, ReplicaFields};
use bytes::Bytes;
use chain::{ChainWrite, Source};
use locks::ChunkLocks;
use pause::PausePoint;
use proto::data::{
    fits_inline, ChunkData, ChunkInfo, ChunkMeta, DataRequest, DeleteFile, DiskUsage, Fsync,
    InlineBytes, ListChunks, Moved, Placement, ReadChunk, ReadInline, Repair, ReplicaData,
    Replicate, TruncateFile, Usage, WriteChunk, WriteInline, WriteRanges, WriteZeros,
    MAX_INLINE_WRITE_BYTES,
};
use proto::grant::GrantMode;
use proto::{codec, rpc, ChunkId, ProtoError, RemoteBuf, Request, Rpc, WireError};
use serde::Serialize;
use std::sync::Arc;
use tokio::sync::Notify;
use tracing::{debug, warn, Instrument};
use transport::{
    multi_thread_runtime, BufferPool, Connection, Handler, HandlerFuture, MemoryRegion,
    TransportError,
};

/// Chunks one `ListChunks` answer carries at most.
pub const MAX_LIST_CHUNKS: u32 = 1024;

/// Serves [`DataRequest`]s against a [`ChunkStore`].
#[derive(Clone)]
pub struct DataService {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<ChunkStore>,
    /// Buffers of requests from clients (reads, and writes at the head).
    pool: BufferPool,
    /// Buffers of replicated writes at members with a successor.
    relay_pool: BufferPool,
    /// Buffers of replicated writes at the tail.
    tail_pool: BufferPool,
    max_msg_bytes: usize,
    view: Arc<ClusterView>,
    locks: ChunkLocks,
    /// Woken when a copy here was marked stale: the resync task repairs it.
    stale_found: Arc<Notify>,
    /// Checks of grants and roles; `None` on a server without keys, which serves all.
    grants: Option<GrantCheck>,
    /// Requests and bytes counted for the metrics; unset: not counted (unit tests).
    metrics: std::sync::OnceLock<Arc<DataMetrics>>,
    #[cfg(test)]
    pauses: pause::Pauses,
}

/// The registered buffers of a data service.
pub struct Pools {
    /// Client requests.
    pub io: BufferPool,
    /// Replicated writes at relaying members.
    pub relay: BufferPool,
    /// Replicated writes at tails.
    pub tail: BufferPool,
}

impl DataService {
    /// A service over `store`, moving bytes through `pools`, knowing the cluster through
    /// `view`.
    pub fn new(
        store: Arc<ChunkStore>,
        pools: Pools,
        max_msg_bytes: usize,
        view: Arc<ClusterView>,
        grants: Option<GrantCheck>,
    ) -> DataService {
        DataService {
            inner: Arc::new(Inner {
                store,
                pool: pools.io,
                relay_pool: pools.relay,
                tail_pool: pools.tail,
                max_msg_bytes,
                view,
                locks: ChunkLocks::default(),
                stale_found: Arc::new(Notify::new()),
                grants,
                metrics: std::sync::OnceLock::new(),
                #[cfg(test)]
                pauses: pause::Pauses::default(),
            }),
        }
    }

    /// The background task that brings this server's copies up to date.
    pub fn resync(&self, interval: std::time::Duration) -> Resync {
        Resync::new(self.inner.clone(), interval)
    }

    /// Counts every request from now on in `metrics` (a second call is ignored).
    pub fn count_in(&self, metrics: Arc<DataMetrics>) {
        let _ = self.inner.metrics.set(metrics);
    }

    /// Grant refusals so far, per reason (empty on a server without keys).
    pub fn grant_refusals(&self) -> Vec<(String, u64)> {
        self.inner
            .grants
            .as_ref()
            .map_or_else(Vec::new, GrantCheck::refusals)
    }
}

impl Handler for DataService {
    fn handle(&self, conn: Connection, request: Bytes) -> HandlerFuture {
        let inner = self.inner.clone();
        Box::pin(async move {
            let limit = inner.max_msg_bytes;
            match codec::decode::<DataRequest>(&request) {
                Ok(req) => {
                    let span = tracing::debug_span!("data", op = req.name(), peer = conn.peer());
                    let (name, moved) = (req.name(), Payload::of(&req));
                    let started = std::time::Instant::now();
                    let answer = inner.route(&conn, req, limit).instrument(span).await;
                    if let Some(m) = inner.metrics.get() {
                        m.record(name, moved, started.elapsed(), &answer);
                    }
                    Bytes::from(answer)
                }
                Err(e) => {
                    warn!(peer = conn.peer(), error = %e, "undecodable request");
                    let err: Result<(), DataError> = Err(DataError::from(e));
                    Bytes::from(answer(err, limit))
                }
            }
        })
    }

    fn disconnected(&self, conn: transport::ConnId, _how: transport::Closed) {
        if let Some(g) = &self.inner.grants {
            g.disconnected(conn);
        }
    }
}

/// The answer to request `R` as a handler returns it.
type Reply<R> = Result<<R as Rpc>::Reply, DataError>;

/// Encodes a handler's answer: the one place a [`DataError`] becomes a [`WireError`].
fn answer<T: Serialize>(result: Result<T, DataError>, limit: usize) -> Vec<u8> {
    rpc::answer(&result.map_err(WireError::from), limit)
}

/// How a call to another data server failed.
enum PeerFailure {
    /// The peer could not be reached, or its connection broke.
    Unreached(TransportError),
    /// The peer answered with an error (or with bytes that do not decode).
    Answered(WireError),
}

impl From<TransportError> for PeerFailure {
    fn from(e: TransportError) -> Self {
        PeerFailure::Unreached(e)
    }
}

impl From<ProtoError> for PeerFailure {
    fn from(e: ProtoError) -> Self {
        PeerFailure::Answered(e.into())
    }
}

impl From<WireError> for PeerFailure {
    fn from(e: WireError) -> Self {
        PeerFailure::Answered(e)
    }
}

/// Calls another data server (a successor in a chain, or the source of a copy). A
/// connection that fails is `Unavailable`, naming the peer.
async fn call_peer<R: Rpc<Envelope = DataRequest>>(conn: &Connection, req: R) -> Reply<R> {
    let req = Request::new(req);
    match transport::rpc::call::<R, PeerFailure>(conn, &req, usize::MAX).await {
        Ok(reply) => Ok(reply),
        Err(PeerFailure::Answered(e)) => Err(DataError::Remote(e)),
        Err(PeerFailure::Unreached(e)) => Err(DataError::Unavailable(format!(
            "data server {} failed: {e}",
            conn.peer()
        ))),
    }
}

/// The bytes of an inline write, refused past [`MAX_INLINE_WRITE_BYTES`] (a sender
/// that does not keep the limit could otherwise make steps larger than a buffer).
fn check_inline(data: Vec<u8>) -> Result<Bytes, DataError> {
    if data.len() > MAX_INLINE_WRITE_BYTES {
        return Err(DataError::TooBig(format!(
            "inline write of {} bytes, limit {MAX_INLINE_WRITE_BYTES}",
            data.len()
        )));
    }
    Ok(Bytes::from(data))
}

/// Runs blocking store work where the request is ([`transport::blocking::in_place`]):
/// a small file's step is a read or write of the page cache, and waking a pool thread
/// for it and then the request's task again cost more than that on a busy machine. A
/// request's handler yields before its first such call ([`Inner::route`]), so that none
/// runs inside the transport's first poll (the connection's reader, which would wait
/// for it). A panic in `f` is an error.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DataError> + Send + 'static,
) -> Result<T, DataError> {
    transport::blocking::in_place(f)
        .await
        .map_err(|e| DataError::Task(format!("store task {e}")))?
}

impl Inner {
    /// Runs one one-sided `transfer` of `bytes` bytes, timed for the metrics: this
    /// server issues it, so its time here is the transfer's (on tcp, the emulated
    /// operation's round trip; on rdma, the NIC's until its completion).
    async fn one_sided(
        &self,
        conn: &Connection,
        op: OneSided,
        bytes: u64,
        transfer: impl std::future::Future<Output = Result<(), TransportError>>,
    ) -> Result<(), TransportError> {
        let started = std::time::Instant::now();
        let r = transfer.await;
        if let (Ok(()), Some(m)) = (&r, self.metrics.get()) {
            m.one_sided(op, bytes, started.elapsed());
        }
        if let Err(TransportError::TimedOut { .. }) = &r {
            // The peer let a transfer run past its timeout: it may be receiving or
            // sending it still, holding this server's buffer on the wire until it ends
            // (`BufferPool` keeps such a buffer aside). Giving the connection up ends
            // its reader and writer, and the buffer comes back; the peer connects again.
            conn.abandon();
        }
        r
    }

    /// Where the service tests may hold a request; nothing outside tests.
    async fn pause_point(&self, _at: PausePoint) {
        #[cfg(test)]
        self.pauses.wait(_at).await;
    }

    /// Hands each request to its handler and encodes the answer; a handler's return
    /// type names its request's reply type, so the pairs cannot be mixed up.
    #[rustfmt::skip]
    async fn route(&self, conn: &Connection, req: DataRequest, limit: usize) -> Vec<u8> {
        use DataRequest as D;
        if let Err(e) = self.permitted(conn, &req) {
            return answer::<()>(Err(e), limit);
        }
        // Out of the transport's first poll (the connection's reader) before any store
        // work runs on this task (`blocking`).
        if multi_thread_runtime() {
            tokio::task::yield_now().await;
        }
        match req {
            D::ReadChunk(r) => answer(self.read_chunk(conn, r).await, limit),
            D::WriteChunk(r) => answer(self.write_chunk(conn, r).await, limit),
            D::WriteInline(r) => answer(self.write_inline(conn, r).await, limit),
            D::WriteRanges(r) => answer(self.write_ranges(conn, r).await, limit),
            D::ReadInline(r) => answer(self.read_inline(conn, r).await, limit),
            D::ChunkData(r) => answer(self.chunk_data(r).await, limit),
            D::WriteZeros(r) => answer(self.write_zeros(conn, r).await, limit),
            D::Replicate(r) => answer(self.replicate_in(conn, r).await, limit),
            D::ChunkInfo(r) => answer(self.chunk_info(r).await, limit),
            D::ListChunks(r) => answer(self.list_chunks(r).await, limit),
            D::FetchChunk(r) => answer(self.fetch(conn, r.chunk, r.dest).await, limit),
            D::Repair(r) => answer(self.repair(r).await, limit),
            D::TruncateFile(r) => answer(self.truncate_file(r).await, limit),
            D::DeleteFile(r) => answer(self.delete_file(r).await, limit),
            D::Fsync(r) => answer(self.fsync(r).await, limit),
            D::Usage(r) => answer(self.usage(r).await, limit),
        }
    }

    /// Whether the peer may send `req` at all (see `grants`): a client's chunk request
    /// needs a grant for its file, the chain's and the administrator's requests a
    /// server or the admin capability. Everything passes on a server without keys.
    fn permitted(&self, conn: &Connection, req: &DataRequest) -> Result<(), DataError> {
        use DataRequest as D;
        use GrantMode::{CutTo, Read, ReadWrite};
        let Some(g) = &self.grants else {
            return Ok(());
        };
        match req {
            D::ReadChunk(r) => g.chunk_access(conn, r.grant.as_ref(), r.chunk.inode, Read),
            D::WriteChunk(r) => g.chunk_access(conn, r.grant.as_ref(), r.chunk.inode, ReadWrite),
            D::WriteInline(r) => g.chunk_access(conn, r.grant.as_ref(), r.chunk.inode, ReadWrite),
            D::WriteRanges(r) => g.chunk_access(conn, r.grant.as_ref(), r.chunk.inode, ReadWrite),
            D::ReadInline(r) => g.chunk_access(conn, r.grant.as_ref(), r.chunk.inode, Read),
            D::ChunkData(r) => g.chunk_access(conn, r.grant.as_ref(), r.chunk.inode, Read),
            D::WriteZeros(r) => g.chunk_access(conn, r.grant.as_ref(), r.chunk.inode, ReadWrite),
            // A cut grant allows a truncation to its own length.
            D::TruncateFile(r) => g.chunk_access(
                conn,
                r.grant.as_ref(),
                r.inode,
                CutTo(r.size, r.chunk_size_bytes),
            ),
            // Durability only: any grant of the file will do, for every chunk named.
            D::Fsync(r) => r
                .chunks
                .iter()
                .try_for_each(|c| g.chunk_access(conn, r.grant.as_ref(), c.inode, Read)),
            D::Replicate(_) => g.server_only(conn, "replicate"),
            D::FetchChunk(_) => g.server_only(conn, "fetch_chunk"),
            D::ChunkInfo(_) => g.admin_only(conn, "chunk_info"),
            D::ListChunks(_) => g.admin_only(conn, "list_chunks"),
            D::Repair(_) => g.admin_only(conn, "repair"),
            D::DeleteFile(_) => g.admin_only(conn, "delete"),
            D::Usage(_) => g.admin_only(conn, "usage"),
        }
    }

    /// Takes `chunk`'s read lock for a read that names `place`, once this server may
    /// serve it there. The map comes before the lock, as on the write paths: fetching it
    /// may wait on the metadata server, which nobody does holding a chunk lock. Serving
    /// is checked under the lock: a write that marks this copy stale holds it
    /// exclusively, so it cannot land between the check and the read.
    async fn lock_for_read(
        &self,
        chunk: ChunkId,
        place: Placement,
    ) -> Result<locks::ChunkGuard<'_>, DataError> {
        self.view.at(place.map_version).await?;
        self.pause_point(PausePoint::ReadLock).await;
        let lock = self.locks.read(chunk).await;
        self.check_serving(chunk, place.chain)?;
        Ok(lock)
    }

    async fn read_chunk(&self, conn: &Connection, r: ReadChunk) -> Reply<ReadChunk> {
        let ReadChunk {
            chunk,
            place,
            chunk_size_bytes,
            offset,
            len,
            dest,
            grant: _,
        } = r;
        let _lock = self.lock_for_read(chunk, place).await?;
        if len == 0 {
            // No step to check the copy in: checked alone.
            let store = self.store.clone();
            blocking(move || chain::readable_copy(&store, chunk)).await?;
        }
        self.read(conn, chunk, chunk_size_bytes, offset, len, dest)
            .await?;
        Ok(Moved { len })
    }

    /// A small read answered with its bytes: the lock and checks of a read
    /// ([`Self::lock_for_read`]), then the copy's check and its read in one blocking
    /// call (`blocking`), into a buffer of the pool that bounds the reads and writes in
    /// flight (page-aligned, so a large chunk's whole blocks come with `O_DIRECT`),
    /// copied into the reply.
    async fn read_inline(&self, conn: &Connection, r: ReadInline) -> Reply<ReadInline> {
        let ReadInline {
            chunk,
            place,
            chunk_size_bytes,
            offset,
            len,
            grant: _,
        } = r;
        // Refused before any disk read if the reply could not carry the bytes.
        if !fits_inline(len as usize, conn.max_request_bytes()) {
            return Err(DataError::TooBig(format!(
                "inline read of {len} bytes, limit {MAX_INLINE_WRITE_BYTES} and 1 KiB under \
                 the message size {}",
                conn.max_request_bytes()
            )));
        }
        let _lock = self.lock_for_read(chunk, place).await?;
        let buf = self.pool.take().await;
        let mr: MemoryRegion = buf.mr().clone();
        let store = self.store.clone();
        let data = blocking(move || {
            let mut fill = mr.lock();
            // A buffer is at least 64 KiB (`io_buffer_bytes`), the inline limit.
            let dst = fill.get_mut(..len as usize).ok_or_else(|| {
                DataError::TooBig(format!("inline read of {len} bytes: larger than a buffer"))
            })?;
            // The copy's state is checked after its bytes are read, its page fetched
            // meanwhile (`prefetch_fields`); nothing read leaves before the check, and
            // the chunk's lock keeps both in one state.
            store.prefetch_fields(chunk);
            let read = store.read(chunk, chunk_size_bytes, offset, dst);
            // A stale copy answers so, whatever its read gave.
            chain::readable_copy(&store, chunk)?;
            read?;
            Ok(dst.to_vec())
        })
        .await?;
        drop(buf);
        debug!(%chunk, offset, len, "read inline");
        Ok(InlineBytes { data })
    }

    async fn write_chunk(&self, conn: &Connection, r: WriteChunk) -> Reply<WriteChunk> {
        let (chunk, offset) = (r.chunk, r.offset);
        let src = Source::Remote(r.src);
        let w = ChainWrite::new(chunk, r.place, r.chunk_size_bytes, offset, src);
        let len = self.head_write(conn, w).await?;
        debug!(%chunk, offset, len, "written");
        Ok(Moved { len })
    }

    async fn write_inline(&self, conn: &Connection, r: WriteInline) -> Reply<WriteInline> {
        let (chunk, offset) = (r.chunk, r.offset);
        let src = Source::Inline(check_inline(r.data)?);
        let w = ChainWrite::new(chunk, r.place, r.chunk_size_bytes, offset, src);
        let len = self.head_write(conn, w).await?;
        debug!(%chunk, offset, len, "written inline");
        Ok(Moved { len })
    }

    async fn write_ranges(&self, conn: &Connection, r: WriteRanges) -> Reply<WriteRanges> {
        let (chunk, count) = (r.chunk, r.ranges.len());
        let ranges = chain::check_ranges(r.ranges, r.chunk_size_bytes)?;
        let offset = ranges.first().map_or(0, |(at, _)| *at);
        let src = Source::Ranges(ranges);
        let w = ChainWrite::new(chunk, r.place, r.chunk_size_bytes, offset, src);
        let len = self.head_write(conn, w).await?;
        debug!(%chunk, count, len, "written in ranges");
        Ok(Moved { len })
    }

    /// Which blocks of a chunk hold data: read as a read is (a stale copy refuses).
    async fn chunk_data(&self, r: ChunkData) -> Reply<ChunkData> {
        let ChunkData {
            chunk,
            place,
            chunk_size_bytes,
            grant: _,
        } = r;
        let _lock = self.lock_for_read(chunk, place).await?;
        let store = self.store.clone();
        blocking(move || {
            let found = store.data_blocks(chunk, chunk_size_bytes);
            chain::readable_copy(&store, chunk)?;
            found
        })
        .await
    }

    async fn write_zeros(&self, conn: &Connection, r: WriteZeros) -> Reply<WriteZeros> {
        let src = Source::Zeros(r.len);
        let w = ChainWrite::new(r.chunk, r.place, r.chunk_size_bytes, r.offset, src);
        let len = self.head_write(conn, w).await?;
        Ok(Moved { len })
    }

    async fn replicate_in(&self, conn: &Connection, r: Replicate) -> Reply<Replicate> {
        let src = match r.data {
            ReplicaData::Bytes(b) => Source::Remote(b),
            ReplicaData::Zeros(n) => Source::Zeros(n),
            ReplicaData::Inline(v) => Source::Inline(check_inline(v)?),
            ReplicaData::Ranges(v) => Source::Ranges(chain::check_ranges(v, r.chunk_size_bytes)?),
        };
        let w = ChainWrite::new(r.chunk, r.place, r.chunk_size_bytes, r.offset, src);
        let len = self.replicate(conn, w, r.version, r.base_version).await?;
        Ok(Moved { len })
    }

    async fn chunk_info(&self, r: ChunkInfo) -> Reply<ChunkInfo> {
        let (store, chunk) = (self.store.clone(), r.chunk);
        let _lock = self.locks.read(chunk).await;
        if r.verify {
            blocking(move || Ok(store.fetch(chunk)?.map(|(m, _)| m))).await
        } else {
            blocking(move || store.chunk_meta(chunk)).await
        }
    }

    async fn list_chunks(&self, r: ListChunks) -> Reply<ListChunks> {
        let (store, chain, after) = (self.store.clone(), r.chain, r.after);
        let limit = r.limit.clamp(1, MAX_LIST_CHUNKS) as usize;
        let list = blocking(move || store.chain_chunks(Some(chain), after, limit)).await?;
        // A chunk whose header cannot be read lists as a stale copy of version 0: a
        // syncing member then neither copies it nor drops its own.
        let list = list
            .into_iter()
            .map(|c| {
                c.unwrap_or_else(|chunk| ChunkMeta {
                    chunk,
                    chain,
                    version: 0,
                    len: 0,
                    chunk_size_bytes: 0,
                    stale: true,
                })
            })
            .collect();
        Ok(list)
    }

    async fn repair(&self, r: Repair) -> Reply<Repair> {
        self.repair_from(&r.from, r.chunk, r.chain, true)
            .await
            .map(drop)
    }

    async fn truncate_file(&self, r: TruncateFile) -> Reply<TruncateFile> {
        self.truncate(r.inode, r.size, r.chunk_size_bytes).await
    }

    async fn delete_file(&self, r: DeleteFile) -> Reply<DeleteFile> {
        let store = self.store.clone();
        blocking(move || store.delete_file(r.inode)).await
    }

    async fn fsync(&self, r: Fsync) -> Reply<Fsync> {
        let store = self.store.clone();
        blocking(move || store.fsync(&r.chunks)).await
    }

    async fn usage(&self, _: Usage) -> Reply<Usage> {
        let store = self.store.clone();
        let u = blocking(move || store.usage()).await?;
        Ok(DiskUsage {
            capacity_bytes: u.capacity_bytes,
            used_bytes: u.used_bytes,
            chunks: u.chunks,
            grant_refusals: self
                .grants
                .as_ref()
                .map_or_else(Vec::new, GrantCheck::refusals),
        })
    }

    /// Steps of at most one buffer over `len` bytes: (offset within the request, length).
    fn steps(&self, len: u32) -> impl Iterator<Item = (u32, u32)> {
        let step = self.pool.buffer_bytes() as u32;
        (0..len)
            .step_by(step as usize)
            .map(move |o| (o, step.min(len - o)))
    }

    /// Reads `len` bytes of a local copy into the client's buffer `dest`, step by step;
    /// the first step also refuses a stale copy (`chain::readable_copy`), in the same
    /// blocking call as its read: each such call cost about as much as a cached read.
    async fn read(
        &self,
        conn: &Connection,
        chunk: ChunkId,
        chunk_size: u32,
        offset: u32,
        len: u32,
        dest: RemoteBuf,
    ) -> Result<(), DataError> {
        if u64::from(len) > dest.len {
            return Err(DataError::InvalidArgument(format!(
                "read of {len} bytes into a buffer of {}",
                dest.len
            )));
        }
        check_span(&dest)?;
        for (at, n) in self.steps(len) {
            let buf = self.pool.take().await;
            let mr: MemoryRegion = buf.mr().clone();
            let store = self.store.clone();
            let fill = mr.clone();
            let off = offset
                .checked_add(at)
                .ok_or_else(|| range_error(offset, len))?;
            blocking(move || {
                // As an inline read: the state checked after the bytes, before they go.
                if at == 0 {
                    store.prefetch_fields(chunk);
                }
                let read = store.read(chunk, chunk_size, off, &mut fill.lock()[..n as usize]);
                if at == 0 {
                    chain::readable_copy(&store, chunk)?;
                }
                read
            })
            .await?;
            let target = RemoteBuf {
                addr: dest.addr + u64::from(at),
                len: u64::from(n),
                key: dest.key,
            };
            let write = conn.write(target, &mr, 0);
            self.one_sided(conn, OneSided::Write, u64::from(n), write)
                .await
                .map_err(DataError::from)?;
        }
        debug!(%chunk, offset, len, "read");
        Ok(())
    }

    /// Cuts a file here. The chunk holding the new end changes without a chain write,
    /// so its version moves by one on every member: copies that missed the cut differ.
    async fn truncate(&self, inode: proto::InodeId, size: u64, cs: u32) -> Result<(), DataError> {
        let boundary = size.checked_sub(1).map(|end| ChunkId {
            inode,
            index: end / u64::from(cs.max(1)),
        });
        let _lock = match boundary {
            Some(c) => Some(self.locks.write(c).await),
            None => None,
        };
        let store = self.store.clone();
        blocking(move || {
            // The boundary chunk's state, read once: the cut changes its bytes, not it,
            // and a version that cannot move is refused before anything is cut.
            let moved = match boundary {
                Some(c) => match store.chunk_meta(c)? {
                    Some(m) => Some((
                        c,
                        ReplicaFields {
                            chain: m.chain,
                            version: chain::next_version(c, m.version)?,
                            stale: m.stale,
                        },
                    )),
                    None => None,
                },
                None => None,
            };
            store.truncate_file(inode, size, cs)?;
            if let Some((c, f)) = moved {
                store.set_replica(c, f)?;
            }
            Ok(())
        })
        .await
    }
}

/// Refuses a peer's buffer whose end lies past the end of the address space, so that
/// the address of every step inside it is computed without overflow.
pub(super) fn check_span(r: &RemoteBuf) -> Result<(), DataError> {
    match r.addr.checked_add(r.len) {
        Some(_) => Ok(()),
        None => Err(DataError::InvalidArgument(format!(
            "a buffer of {} bytes at {:#x} ends past the address space",
            r.len, r.addr
        ))),
    }
}

fn range_error(offset: u32, len: u32) -> DataError {
    DataError::InvalidArgument(format!(
        "range of {len} bytes at {offset} is outside the chunk"
    ))
}
