//! Talking to chains instead of single servers: writes to the head with retries across
//! map changes, reads from any serving member with failover, fsync and truncation on
//! every member.
//!
//! A request that fails because the sender's map is old (`Stale`) is retried at once
//! with a fresh map. One that fails because a server is unreachable is retried once the
//! metadata server has noticed (its map version moves: the server's lease ran out and it
//! left its chains), waiting at most `failover_timeout_ms` in all. A read tries every
//! serving member before it waits.

use super::datapath::DataPath;
use super::grants::renewable;
use super::members::{
    classify, read_order, sync_targets, truncate_targets, unavailable, write_head, Next,
};
use super::pieces::Piece;
use crate::error::{ClientError, Result};
use crate::metrics::FailoverOp;
use crate::rpc;
use proto::data::{
    fits_inline, fits_ranges, ChunkData, DataBlocks, Fsync, InlineRange, Moved, Placement,
    ReadChunk, ReadInline, TruncateFile, WriteChunk, WriteInline, WriteRanges, WriteZeros,
};
use proto::meta::{ClusterMap, WATCH_AFTER, WATCH_EVERY};
use proto::{ChainId, ChunkId, InodeId, Layout, NodeId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::debug;
use transport::{Access, MemoryRegion};

/// Tries of one request across map changes (the pauses while a chunk's copy is being
/// repaired are bounded by the failover deadline alone: `Next::counts_as_try`).
const MAX_ATTEMPTS: u32 = 8;
/// Longest pause before trying a chunk whose copy is being repaired again: the pauses
/// start at [`MAP_POLL`] and double.
const MAX_REPAIR_PAUSE: Duration = Duration::from_secs(2);
/// How often a client waiting for a map change asks the metadata server: as often as
/// a call watching a server looks (the watches share these reads).
const MAP_POLL: Duration = WATCH_EVERY;

impl DataPath {
    /// Refreshes the map until its version passes `seen` or `deadline` comes.
    async fn await_change(&self, seen: u64, deadline: Instant) {
        loop {
            if self.refresh_map().await.is_ok() && self.map().version > seen {
                return;
            }
            if Instant::now() + MAP_POLL >= deadline {
                return;
            }
            tokio::time::sleep(MAP_POLL).await;
        }
    }

    /// Re-reads the map unless it was read less than [`MAP_POLL`] ago: the calls that
    /// watch servers share the reads.
    async fn refresh_map_shared(&self) {
        let fresh = self
            .map_read
            .lock()
            .is_some_and(|at| at.elapsed() < MAP_POLL);
        if !fresh {
            let _ = self.refresh_map().await;
        }
    }

    /// `call` to data server `node`, given up with `Unavailable` once the metadata
    /// server says `node` is down. A server that hangs (stopped, its disk stuck) keeps
    /// its connections open: without this, every call to it waited out the transport's
    /// whole timeout, as long as the failover budget, and failed instead of going to
    /// the other members once the server's lease ran out. Giving up drops the call's
    /// grants, so a server that wakes later can no longer touch the buffer.
    pub(crate) async fn unless_down<T>(
        &self,
        node: NodeId,
        call: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let down = async {
            tokio::time::sleep(WATCH_AFTER).await;
            loop {
                self.refresh_map_shared().await;
                if !self.map().is_up(node) {
                    return;
                }
                tokio::time::sleep(WATCH_EVERY).await;
            }
        };
        tokio::select! {
            biased;
            r = call => r,
            () = down => Err(unavailable(format!(
                "data server {node} stopped answering and its lease ran out"
            ))),
        }
    }

    fn placement(map: &ClusterMap, layout: &Layout, chain: ChainId) -> Placement {
        Placement {
            chain,
            map_version: map.version,
            replicas: layout.replicas,
        }
    }

    /// Runs `op` on file `ino` against the current map, retrying across map changes,
    /// and once with a renewed grant when a data server refuses the one held.
    async fn with_failover<T, F, Fut>(&self, what: &str, ino: InodeId, mut op: F) -> Result<T>
    where
        F: FnMut(Arc<ClusterMap>, Option<proto::grant::Grant>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let deadline = Instant::now() + self.failover_timeout;
        let mut attempt = 0;
        let mut repair_pause = MAP_POLL;
        let mut renewed = false;
        loop {
            let map = self.map();
            let grant = self.grant_for(ino).await;
            let err = match op(map.clone(), grant).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if let ClientError::Remote(w) = &err {
                if renewable(w.code) && !renewed {
                    renewed = true;
                    debug!(error = %err, what, %ino, "grant refused, renewing");
                    if self.renew_now(ino).await {
                        continue;
                    }
                }
            }
            let next = classify(&err);
            if next.counts_as_try() {
                attempt += 1;
            }
            if attempt >= MAX_ATTEMPTS || Instant::now() >= deadline {
                return Err(err);
            }
            if !matches!(next, Next::Fail) {
                self.ep.count_retry();
            }
            match next {
                Next::Fail => return Err(err),
                Next::Refresh => {
                    debug!(error = %err, what, "stale map, refreshing");
                    let _ = self.refresh_map().await;
                }
                Next::Pause => {
                    debug!(error = %err, what, "server busy, retrying");
                    tokio::time::sleep(MAP_POLL).await;
                }
                Next::Repairing => {
                    debug!(error = %err, what, "chunk being repaired, retrying");
                    let left = deadline.saturating_duration_since(Instant::now());
                    tokio::time::sleep(repair_pause.min(left)).await;
                    repair_pause = (repair_pause * 2).min(MAX_REPAIR_PAUSE);
                }
                Next::Wait => {
                    debug!(error = %err, what, "server unreachable, waiting for the map to change");
                    self.await_change(map.version, deadline).await;
                }
            }
        }
    }

    /// Writes one piece (bytes from `mr`, or zeros) through the head of its chain.
    pub(super) async fn chain_write(
        &self,
        layout: &Layout,
        p: Piece,
        mr: Option<&MemoryRegion>,
    ) -> Result<()> {
        self.chain_write_each(layout, std::slice::from_ref(&p), mr)
            .await
    }

    /// Writes `ps`, pieces of one chunk in the order of their offsets, from `mr` through
    /// the chunk's chain: one piece as [`DataPath::chain_write`], several small ones in
    /// one request ([`WriteRanges`]).
    pub(super) async fn chain_write_ranges(
        &self,
        layout: &Layout,
        ps: &[Piece],
        mr: &MemoryRegion,
    ) -> Result<()> {
        self.chain_write_each(layout, ps, Some(mr)).await
    }

    async fn chain_write_each(
        &self,
        layout: &Layout,
        ps: &[Piece],
        mr: Option<&MemoryRegion>,
    ) -> Result<()> {
        let Some(&first) = ps.first() else {
            return Ok(());
        };
        debug_assert!(
            ps.len() == 1 || mr.is_some(),
            "zeros are written one piece at a time"
        );
        let tried = Tried::default();
        let tried = &tried;
        self.with_failover("write", first.chunk.inode, |map, file_grant| async move {
            let head = write_head(&map, layout.replicas, first.chain)?;
            if tried.moves_to(head) {
                self.ep.metrics().failover(FailoverOp::Write);
            }
            let r = match mr {
                Some(mr) if ps.len() > 1 => {
                    self.write_ranges_to(head, &map, layout, ps, mr, file_grant)
                        .await
                }
                _ => {
                    self.write_to(head, &map, layout, first, mr, file_grant)
                        .await
                }
            };
            if r.is_err() {
                tried.failed(head);
            }
            r
        })
        .await
    }

    /// Writes one piece through `head`, the head of its chain in `map`.
    async fn write_to(
        &self,
        head: NodeId,
        map: &ClusterMap,
        layout: &Layout,
        p: Piece,
        mr: Option<&MemoryRegion>,
        file_grant: Option<proto::grant::Grant>,
    ) -> Result<()> {
        let conn = self.data_conn(head).await?;
        let place = Self::placement(map, layout, p.chain);
        let chunk_size_bytes = layout.chunk_size_bytes;
        // A few KiB go inside the request: a READ of them would cost each chain
        // member a round trip.
        let inline = fits_inline(p.len as usize, conn.max_request_bytes());
        let grant = match mr {
            Some(mr) if !inline => {
                Some(conn.grant(mr, p.buf_offset, p.len as usize, Access::RemoteRead)?)
            }
            _ => None,
        };
        let offset = p.offset_in_chunk;
        let written = match (&grant, mr) {
            (Some(g), _) => {
                let src = g.remote();
                let req = WriteChunk {
                    chunk: p.chunk,
                    place,
                    chunk_size_bytes,
                    offset,
                    src,
                    grant: file_grant,
                };
                self.unless_down(head, rpc::data_call(&self.ep, &conn, req))
                    .await?
            }
            (None, Some(mr)) => {
                let data = mr.lock()[p.buf_offset..p.buf_offset + p.len as usize].to_vec();
                let req = WriteInline {
                    chunk: p.chunk,
                    place,
                    chunk_size_bytes,
                    offset,
                    data,
                    grant: file_grant,
                };
                self.unless_down(head, rpc::data_call(&self.ep, &conn, req))
                    .await?
            }
            (None, None) => {
                let (chunk, len) = (p.chunk, p.len);
                let req = WriteZeros {
                    chunk,
                    place,
                    chunk_size_bytes,
                    offset,
                    len,
                    grant: file_grant,
                };
                self.unless_down(head, rpc::data_call(&self.ep, &conn, req))
                    .await?
            }
        };
        drop(grant);
        moved_all(written, p.len, "write")
    }

    /// Writes `ps`, small pieces of one chunk, through `head` in one [`WriteRanges`]; on a
    /// connection whose peer takes smaller requests than they need, one by one.
    async fn write_ranges_to(
        &self,
        head: NodeId,
        map: &ClusterMap,
        layout: &Layout,
        ps: &[Piece],
        mr: &MemoryRegion,
        file_grant: Option<proto::grant::Grant>,
    ) -> Result<()> {
        let conn = self.data_conn(head).await?;
        let bytes: u32 = ps.iter().map(|p| p.len).sum();
        if !fits_ranges(ps.len(), bytes as usize, conn.max_request_bytes()) {
            let each = ps.iter().map(|p| {
                let g = file_grant.clone();
                self.write_to(head, map, layout, *p, Some(mr), g)
            });
            futures::future::try_join_all(each).await?;
            return Ok(());
        }
        let ranges = {
            let b = mr.lock();
            ps.iter()
                .map(|p| InlineRange {
                    offset: p.offset_in_chunk,
                    data: b[p.buf_offset..p.buf_offset + p.len as usize].to_vec(),
                })
                .collect()
        };
        let req = WriteRanges {
            chunk: ps[0].chunk,
            place: Self::placement(map, layout, ps[0].chain),
            chunk_size_bytes: layout.chunk_size_bytes,
            ranges,
            grant: file_grant,
        };
        let written = self
            .unless_down(head, rpc::data_call(&self.ep, &conn, req))
            .await?;
        moved_all(written, bytes, "write of ranges")
    }

    /// Reads one piece into `mr` from a serving member of its chain, trying the others
    /// when one fails.
    pub(super) async fn chain_read(
        &self,
        layout: &Layout,
        p: Piece,
        mr: &MemoryRegion,
    ) -> Result<()> {
        self.ask_readers("read", layout, p.chunk, p.chain, |map, node, grant| async move {
            self.read_from(&map, layout, p, mr, node, &grant).await
        })
        .await
    }

    /// Runs `op` against the members that serve reads of `chain`, in read order, until
    /// one answers; each failure moves to the next member, and across map changes and
    /// a renewed grant (`with_failover`). Reads and seeks take this one path.
    async fn ask_readers<T, F, Fut>(
        &self,
        what: &str,
        layout: &Layout,
        chunk: ChunkId,
        chain: ChainId,
        op: F,
    ) -> Result<T>
    where
        F: Fn(Arc<ClusterMap>, NodeId, Option<proto::grant::Grant>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let tried = Tried::default();
        let (tried, op) = (&tried, &op);
        self.with_failover(what, chunk.inode, |map, grant| async move {
            let readers = read_order(&map, layout.replicas, chain)?;
            let mut last = None;
            for &node in &readers {
                if last.is_some() {
                    self.ep.count_retry();
                }
                if tried.moves_to(node) {
                    self.ep.metrics().failover(FailoverOp::Read);
                }
                match op(map.clone(), node, grant.clone()).await {
                    Ok(v) => return Ok(v),
                    Err(e) => {
                        debug!(error = %e, %node, %chunk, what, "call failed, trying another member");
                        tried.failed(node);
                        last = Some(e);
                    }
                }
            }
            Err(last.unwrap_or_else(|| unavailable("no member answered".into())))
        })
        .await
    }

    /// Which blocks of chunk `index` of file `ino` hold data (`None`: no copy, all a
    /// hole), from a serving member of its chain, as a read is.
    pub(super) async fn chunk_data(
        &self,
        layout: &Layout,
        ino: InodeId,
        index: u64,
    ) -> Result<Option<DataBlocks>> {
        let chain = layout
            .chain_for(index)
            .ok_or_else(|| ClientError::NoDataServers("file has no data servers".into()))?;
        let chunk = ChunkId { inode: ino, index };
        self.ask_readers(
            "seek",
            layout,
            chunk,
            chain,
            |map, node, grant| async move {
                let req = ChunkData {
                    chunk,
                    place: Self::placement(&map, layout, chain),
                    chunk_size_bytes: layout.chunk_size_bytes,
                    grant,
                };
                let conn = self.data_conn(node).await?;
                let blocks = self
                    .unless_down(node, rpc::data_call(&self.ep, &conn, req))
                    .await?;
                // Checked before it is trusted: a wrong answer would skip data.
                if let Some(b) = &blocks {
                    b.check(layout.chunk_size_bytes).map_err(|e| {
                        ClientError::Protocol(format!("{node}'s data blocks of {chunk}: {e}"))
                    })?;
                }
                Ok(blocks)
            },
        )
        .await
    }

    async fn read_from(
        &self,
        map: &ClusterMap,
        layout: &Layout,
        p: Piece,
        mr: &MemoryRegion,
        node: NodeId,
        file_grant: &Option<proto::grant::Grant>,
    ) -> Result<()> {
        let conn = self.data_conn(node).await?;
        if fits_inline(p.len as usize, conn.max_request_bytes()) {
            // The bytes come in the reply, copied into `mr`: cheaper for a few KiB than
            // the one-sided WRITE's extra round trip.
            let req = ReadInline {
                chunk: p.chunk,
                place: Self::placement(map, layout, p.chain),
                chunk_size_bytes: layout.chunk_size_bytes,
                offset: p.offset_in_chunk,
                len: p.len,
                grant: file_grant.clone(),
            };
            let reply = self
                .unless_down(node, rpc::data_call(&self.ep, &conn, req))
                .await?;
            return fill_piece(mr, p, &reply.data);
        }
        let grant = conn.grant(mr, p.buf_offset, p.len as usize, Access::RemoteWrite)?;
        let req = ReadChunk {
            chunk: p.chunk,
            place: Self::placement(map, layout, p.chain),
            chunk_size_bytes: layout.chunk_size_bytes,
            offset: p.offset_in_chunk,
            len: p.len,
            dest: grant.remote(),
            grant: file_grant.clone(),
        };
        let reply = self
            .unless_down(node, rpc::data_call(&self.ep, &conn, req))
            .await?;
        drop(grant);
        moved_all(reply, p.len, "read")
    }

    /// Makes `chunks` durable on every member of their chains that takes writes.
    pub(super) async fn sync_chains(
        &self,
        layout: &Layout,
        chunks: &BTreeMap<ChainId, BTreeSet<ChunkId>>,
    ) -> Result<()> {
        let Some(ino) = chunks.values().flatten().next().map(|c| c.inode) else {
            return Ok(());
        };
        self.with_failover("fsync", ino, |map, grant| async move {
            let per_node = sync_targets(&map, layout.replicas, chunks)?;
            let syncs = per_node.into_iter().map(|(node, chunks)| {
                let grant = grant.clone();
                async move {
                    let conn = self.data_conn(node).await?;
                    let req = Fsync { chunks, grant };
                    self.unless_down(node, rpc::data_call(&self.ep, &conn, req))
                        .await
                }
            });
            futures::future::try_join_all(syncs).await?;
            Ok(())
        })
        .await
    }

    /// Cuts a file's chunks to `size` on every member of its chains that takes writes,
    /// with `cut_grant` if given (an open's grant for the cut of a vanished writer's
    /// tail), else the file's grant.
    pub(crate) async fn truncate_data(
        &self,
        ino: InodeId,
        layout: &Layout,
        size: u64,
        cut_grant: Option<&proto::grant::Grant>,
    ) -> Result<()> {
        self.with_failover("truncate", ino, |map, grant| async move {
            let nodes = truncate_targets(&map, layout)?;
            let grant = cut_grant.cloned().or(grant);
            let cuts = nodes.into_iter().map(|node| {
                let grant = grant.clone();
                async move {
                    let conn = self.data_conn(node).await?;
                    let req = TruncateFile {
                        inode: ino,
                        size,
                        chunk_size_bytes: layout.chunk_size_bytes,
                        grant,
                    };
                    self.unless_down(node, rpc::data_call(&self.ep, &conn, req))
                        .await
                }
            });
            futures::future::try_join_all(cuts).await?;
            Ok(())
        })
        .await
    }
}

/// The member a call of one request last failed on (0: none yet, else the node's
/// number plus one, which cannot overflow a u64), to tell a failover (the request goes to another member) from a
/// retry on the same one. An atomic: checked before every call, it costs a load.
#[derive(Default)]
struct Tried(AtomicU64);

impl Tried {
    /// Records that the call to `node` failed.
    fn failed(&self, node: NodeId) {
        self.0.store(u64::from(node.0) + 1, Ordering::Relaxed);
    }

    /// Whether a call to `node` now moves away from a member that failed.
    fn moves_to(&self, node: NodeId) -> bool {
        let last = self.0.load(Ordering::Relaxed);
        last != 0 && last != u64::from(node.0) + 1
    }
}

/// Checks that a data server moved all `len` bytes of a read or a write.
/// Copies an inline read's bytes into piece `p`'s place in `mr`.
fn fill_piece(mr: &MemoryRegion, p: Piece, data: &[u8]) -> Result<()> {
    if data.len() != p.len as usize {
        return Err(ClientError::Protocol(format!(
            "inline read of {} bytes answered with {}",
            p.len,
            data.len()
        )));
    }
    let mut buf = mr.lock();
    let dst = buf
        .get_mut(p.buf_offset..p.buf_offset + data.len())
        .ok_or_else(|| {
            ClientError::Protocol(format!(
                "read piece of {} bytes at {} lies outside its buffer",
                p.len, p.buf_offset
            ))
        })?;
    dst.copy_from_slice(data);
    Ok(())
}

fn moved_all(moved: Moved, len: u32, what: &str) -> Result<()> {
    if moved.len == len {
        return Ok(());
    }
    Err(ClientError::Protocol(format!(
        "{what} of {len} bytes answered with {} bytes moved",
        moved.len
    )))
}
