//! Chain replication of chunk writes.
//!
//! A write enters at the head of its chunk's chain (the first member in
//! [`ChainInfo::write_order`]: serving members, then syncing ones). Each member, holding
//! the chunk's lock, stores the bytes and passes them to its successor, which READs them
//! from the member's registered buffer; a member answers only after its successor did, so
//! the head's answer means every member has the bytes. The head gives the write a new
//! version (its own plus one) and names the version it had before (`base_version`): a
//! member holding another one missed a write, stores this one anyway and marks its copy
//! stale, to be copied whole from a serving member before it serves a read again.
//!
//! Every member checks the sender's cluster map version: an older one is refused with
//! `Stale` (the client refreshes its map and retries), a newer one makes the member fetch
//! the map first. Reads take the same lock, so they never see a write that has not yet
//! reached every member.

use super::{blocking, call_peer, range_error, Inner};
use crate::error::DataError;
use crate::metrics::OneSided;
use crate::store::{ChunkStore, Fill, ReplicaFields, Stamp};
use bytes::Bytes;
use proto::data::{
    fits_inline, fits_ranges, InlineRange, MAX_INLINE_WRITE_BYTES, MAX_WRITE_RANGES,
};
use proto::data::{ChunkMeta, Placement, ReplicaData, Replicate};
use proto::meta::{ClusterMap, MemberState};
use proto::{ChainId, ChunkId, NodeId, RemoteBuf};
use std::future::Future;
use transport::{Access, BufferPool, Connection, MemoryRegion};

/// Where a write's bytes come from at one member.
#[derive(Clone)]
pub(super) enum Source {
    /// READ them from this connection's peer (the client, or the predecessor).
    Remote(RemoteBuf),
    /// Zeros.
    Zeros(u32),
    /// Carried in the request (a small write).
    Inline(Bytes),
    /// Separate ranges of the chunk, `(offset, bytes)`, carried in the request (small
    /// scattered writes): checked by [`check_ranges`], stored and passed on in one step.
    Ranges(Vec<(u32, Bytes)>),
}

impl Source {
    fn len(&self) -> u64 {
        match self {
            Source::Remote(b) => b.len,
            Source::Zeros(n) => u64::from(*n),
            Source::Inline(b) => b.len() as u64,
            Source::Ranges(r) => r.iter().map(|(_, b)| b.len() as u64).sum(),
        }
    }
}

/// One chain write as a member sees it.
pub(super) struct ChainWrite {
    pub chunk: ChunkId,
    pub place: Placement,
    pub chunk_size: u32,
    pub offset: u32,
    pub src: Source,
}

impl ChainWrite {
    pub fn new(
        chunk: ChunkId,
        place: Placement,
        chunk_size: u32,
        offset: u32,
        src: Source,
    ) -> Self {
        ChainWrite {
            chunk,
            place,
            chunk_size,
            offset,
            src,
        }
    }
}

/// One chain write at one member: where it goes next and what it carries.
struct Step<'a> {
    map: &'a ClusterMap,
    order: &'a [NodeId],
    pos: usize,
    w: &'a ChainWrite,
    len: u32,
}

impl<'a> Step<'a> {
    fn new(
        map: &'a ClusterMap,
        order: &'a [NodeId],
        pos: usize,
        w: &'a ChainWrite,
        len: u32,
    ) -> Self {
        Step {
            map,
            order,
            pos,
            w,
            len,
        }
    }
}

impl Inner {
    /// The chain order of `place` per `map`, and this server's position in it.
    fn position(
        &self,
        map: &ClusterMap,
        place: &Placement,
    ) -> Result<(Vec<NodeId>, usize), DataError> {
        let chain = map.chain(place.chain).ok_or_else(|| {
            DataError::Stale(format!(
                "{} is not in cluster map {}",
                place.chain, map.version
            ))
        })?;
        let order = chain.write_order(place.replicas);
        let me = self.view.me();
        let pos = order.iter().position(|n| Some(*n) == me).ok_or_else(|| {
            DataError::Stale(format!(
                "this server is not a writable member of {} in map {}",
                place.chain, map.version
            ))
        })?;
        Ok((order, pos))
    }

    /// A write at the head: new version, store, pass down. Returns the bytes stored.
    pub(super) async fn head_write(
        &self,
        conn: &Connection,
        w: ChainWrite,
    ) -> Result<u32, DataError> {
        let len = check_len(&w)?;
        let map = self.view.at(w.place.map_version).await?;
        let (order, pos) = self.position(&map, &w.place)?;
        if pos != 0 {
            return Err(DataError::Stale(format!(
                "not the head of {} in map {}",
                w.place.chain, map.version
            )));
        }
        let _lock = self.locks.write(w.chunk).await;
        let have = self.local_fields(w.chunk).await?;
        if have.stale {
            // A head whose copy missed a write would hand out versions the others hold
            // with other bytes: refuse until the sweep (woken now) has copied it whole.
            // With no other serving member there is nothing to copy from, and waiting
            // would not end it: unavailable until the map changes.
            if super::resync::source(&map, w.place.chain, order[pos]).is_none() {
                return Err(DataError::Unavailable(format!(
                    "{}: the head's copy missed writes and no other member serves it",
                    w.chunk
                )));
            }
            self.stale_found.notify_one();
            return Err(DataError::Busy(format!(
                "{}: the head's copy is being repaired",
                w.chunk
            )));
        }
        let next = next_version(w.chunk, have.version)?;
        let stamp = Stamp {
            chain: w.place.chain,
            version: next,
            base: have.version,
            stale: Some(false),
        };
        debug_assert!(
            stamp.version > stamp.base,
            "a head's write moves the version up"
        );
        let step = Step::new(&map, &order, pos, &w, len);
        self.apply(conn, step, stamp, &self.pool).await?;
        Ok(len)
    }

    /// A write passed down by the predecessor.
    pub(super) async fn replicate(
        &self,
        conn: &Connection,
        w: ChainWrite,
        version: u64,
        base: u64,
    ) -> Result<u32, DataError> {
        let len = check_len(&w)?;
        let map = self.view.at(w.place.map_version).await?;
        let (order, pos) = self.position(&map, &w.place)?;
        let _lock = self.locks.write(w.chunk).await;
        // Relaying members and tails draw on separate pools, so that members waiting on
        // their successors can never hold every buffer a tail needs.
        let pool = if pos + 1 < order.len() {
            &self.relay_pool
        } else {
            &self.tail_pool
        };
        // Whether this copy missed a write is found when the write is stored.
        let stamp = Stamp {
            chain: w.place.chain,
            version,
            base,
            stale: None,
        };
        let step = Step::new(&map, &order, pos, &w, len);
        let stale = self.apply(conn, step, stamp, pool).await?;
        if stale {
            self.stale_found.notify_one();
        }
        Ok(len)
    }

    /// Stores the write here and passes it to the successor, step by step; the last step
    /// also records the new version. Returns whether this copy is stale. Called with the
    /// chunk's lock held, so no other write comes between the steps.
    async fn apply(
        &self,
        conn: &Connection,
        s: Step<'_>,
        stamp: Stamp,
        pool: &BufferPool,
    ) -> Result<bool, DataError> {
        if let Source::Ranges(ranges) = &s.w.src {
            return self.apply_ranges(s, ranges, stamp, pool).await;
        }
        let Step {
            map,
            order,
            pos,
            w,
            len,
        } = s;
        let next = match order.get(pos + 1) {
            Some(&n) => Some((n, self.view.peer(map, n).await?)),
            None => None,
        };
        let step = pool.buffer_bytes() as u32;
        debug_assert!(step > 0, "a buffer pool's buffers hold bytes");
        let mut done = 0u32;
        let mut result = Ok(());
        let mut recorded = None;
        while done < len.max(1) && result.is_ok() {
            let n = step.min(len - done);
            let at = w.offset + done;
            let buf = pool.take().await;
            let mr: MemoryRegion = buf.mr().clone();
            let data = match &w.src {
                Source::Remote(src) => {
                    let Some(addr) = src.addr.checked_add(u64::from(done)) else {
                        result = Err(DataError::InvalidArgument(format!(
                            "a source buffer at {:#x} ends past the address space",
                            src.addr
                        )));
                        break;
                    };
                    let part = RemoteBuf {
                        addr,
                        len: u64::from(n),
                        key: src.key,
                    };
                    let read = conn.read(part, &mr, 0);
                    if let Err(e) = self
                        .one_sided(conn, OneSided::Read, u64::from(n), read)
                        .await
                    {
                        // Earlier steps may have been stored: the version still moves.
                        result = Err(DataError::from(e));
                        break;
                    }
                    Some(mr.clone())
                }
                Source::Zeros(_) => None,
                // Never here: `apply` hands such writes to `apply_ranges` first.
                Source::Ranges(_) => {
                    result = Err(DataError::Task("ranges are stored by apply_ranges".into()));
                    break;
                }
                // Copied into a registered buffer like a READ would: the store and a
                // successor too large for inline bytes then take it the same way.
                Source::Inline(bytes) => {
                    let part = &bytes[done as usize..(done + n) as usize];
                    mr.lock()[..n as usize].copy_from_slice(part);
                    Some(mr.clone())
                }
            };
            // The last step (the only one of every small file) is judged, stored and
            // recorded in one blocking call (`blocking`) instead of three: on a busy
            // machine each one cost about as much as the store itself.
            let record = (done + n >= len).then_some(stamp);
            let local = self.store_step(w, at, n, data.clone(), record);
            let forward = async {
                let Some((node, next)) = &next else {
                    return Ok(());
                };
                self.unless_down(*node, forward(next, w, at, stamp, data.as_ref(), n))
                    .await
            };
            // The successor's request goes first (written to its socket when polled),
            // then the local store, which holds this task while it runs: `biased`, as
            // `join!` otherwise starts each poll with another future.
            let (f, l) = tokio::join!(biased; forward, local);
            let (stored, rec) = l;
            recorded = rec;
            result = stored.and(f);
            done += n;
            debug_assert!(done <= len, "a chain step's done <= len");
            debug_assert!(
                recorded.is_none() || done >= len,
                "only the last step records"
            );
            if len == 0 {
                break;
            }
        }
        match recorded {
            Some(stale) => result.map(|()| stale),
            None => {
                // A step before the last failed, yet the bytes may have changed here: the
                // version moves, so a later comparison sees this copy differ from one
                // that missed the write.
                let store = self.store.clone();
                let (chunk, cs) = (w.chunk, w.chunk_size);
                let v = blocking(move || store.write_versioned(chunk, cs, &[], stamp)).await?;
                result.map(|()| v.stale)
            }
        }
    }

    /// [`Inner::apply`] for a write of separate ranges ([`Source::Ranges`]): their bytes
    /// came in the request, so all of them are stored and recorded in one blocking call
    /// and passed on in one request, while no buffer is taken.
    async fn apply_ranges(
        &self,
        s: Step<'_>,
        ranges: &[(u32, Bytes)],
        stamp: Stamp,
        pool: &BufferPool,
    ) -> Result<bool, DataError> {
        let w = s.w;
        let next = match s.order.get(s.pos + 1) {
            Some(&n) => Some((n, self.view.peer(s.map, n).await?)),
            None => None,
        };
        let (store, owned) = (self.store.clone(), ranges.to_vec());
        let (chunk, cs) = (w.chunk, w.chunk_size);
        let local = blocking(move || {
            let fills: Vec<_> = owned.iter().map(|(at, b)| (*at, Fill::Bytes(b))).collect();
            store.write_versioned(chunk, cs, &fills, stamp)
        });
        let forward = async {
            let Some((node, next)) = &next else {
                return Ok(());
            };
            let bytes = ranges.iter().map(|(_, b)| b.len()).sum();
            if !fits_ranges(ranges.len(), bytes, next.max_request_bytes()) {
                let each = forward_each(next, w, ranges, stamp, pool);
                return self.unless_down(*node, each).await;
            }
            let data = ranges
                .iter()
                .map(|(at, b)| InlineRange {
                    offset: *at,
                    data: b.to_vec(),
                })
                .collect();
            let req = Replicate {
                chunk,
                place: w.place,
                chunk_size_bytes: cs,
                offset: w.offset,
                version: stamp.version,
                base_version: stamp.base,
                data: ReplicaData::Ranges(data),
            };
            self.unless_down(*node, async { call_peer(next, req).await.map(drop) })
                .await
        };
        let (forwarded, local) = tokio::join!(biased; forward, local);
        let v = local?;
        v.stored.and(forwarded).map(|()| v.stale)
    }

    /// `f`, a call to the successor `node`, unless `node`'s lease runs out first.
    async fn unless_down(
        &self,
        node: NodeId,
        f: impl Future<Output = Result<(), DataError>>,
    ) -> Result<(), DataError> {
        tokio::select! {
            biased;
            r = f => r,
            () = self.view.until_down(node) => Err(DataError::Unavailable(format!(
                "successor {node} stopped answering and its lease ran out"
            ))),
        }
    }

    /// Stores one step of a write locally; with `record`, also decides whether the copy
    /// is stale (if not known) and records the new version, under the store's one lock
    /// ([`crate::store::ChunkStore::write_versioned`]). Returns the store's result and,
    /// once recorded, whether the copy is stale.
    async fn store_step(
        &self,
        w: &ChainWrite,
        at: u32,
        n: u32,
        data: Option<MemoryRegion>,
        record: Option<Stamp>,
    ) -> (Result<(), DataError>, Option<bool>) {
        let store = self.store.clone();
        let (chunk, cs) = (w.chunk, w.chunk_size);
        let work = move || {
            let bytes = data.as_ref().map(|mr| mr.lock());
            let fill = match &bytes {
                Some(b) => Fill::Bytes(&b[..n as usize]),
                None => Fill::Zeros(n),
            };
            match record {
                Some(stamp) => {
                    let v = store.write_versioned(chunk, cs, &[(at, fill)], stamp)?;
                    Ok((v.stored, Some(v.stale)))
                }
                None => Ok((store.write_fill(chunk, cs, at, fill), None)),
            }
        };
        match blocking(work).await {
            Ok((stored, stale)) => (stored, stale),
            Err(e) => (Err(e), None),
        }
    }

    /// The replica fields of a local chunk (zero for a chunk this server lacks).
    pub(super) async fn local_fields(&self, chunk: ChunkId) -> Result<ReplicaFields, DataError> {
        let store = self.store.clone();
        let meta = blocking(move || store.chunk_meta(chunk)).await?;
        Ok(fields_of(meta))
    }

    /// Refuses a read of a copy that may miss committed writes in a chain this server
    /// does not serve in its newest map (it is being synced). The copy's own stale flag
    /// is the other half, checked by [`readable_copy`] where the read opens the chunk.
    /// Called holding the chunk's lock.
    pub(super) fn check_serving(&self, chunk: ChunkId, chain: ChainId) -> Result<(), DataError> {
        let map = self.view.current();
        match self.view.my_state(&map, chain) {
            Some(MemberState::Serving) => Ok(()),
            _ => Err(being_synced(chunk)),
        }
    }
}

/// Refuses a read of a stale copy (one that missed a write); a chunk this server lacks
/// reads as zeros. Runs in the read's blocking call, holding the chunk's lock: the
/// copy's header is read there anyway, so the check costs no call of its own.
pub(super) fn readable_copy(store: &ChunkStore, chunk: ChunkId) -> Result<(), DataError> {
    if fields_of(store.chunk_meta(chunk)?).stale {
        return Err(being_synced(chunk));
    }
    Ok(())
}

/// The version after `version` of `chunk`'s copy. A version at the top of its range
/// (only a broken or hostile peer's `Replicate` could leave one) cannot move up: refused,
/// never wrapped to 0.
pub(super) fn next_version(chunk: ChunkId, version: u64) -> Result<u64, DataError> {
    version.checked_add(1).ok_or_else(|| {
        DataError::InvalidArgument(format!("{chunk}: its version cannot move past {version}"))
    })
}

fn being_synced(chunk: ChunkId) -> DataError {
    DataError::Stale(format!("{chunk}: this copy is being brought up to date"))
}

/// The replica fields of a chunk's state (zero for a chunk this server lacks).
fn fields_of(meta: Option<ChunkMeta>) -> ReplicaFields {
    meta.map_or(ReplicaFields::default(), |m| ReplicaFields {
        chain: m.chain,
        version: m.version,
        stale: m.stale,
    })
}

/// Length of the write, within the chunk.
fn check_len(w: &ChainWrite) -> Result<u32, DataError> {
    u32::try_from(w.src.len())
        .ok()
        .filter(|l| u64::from(w.offset) + u64::from(*l) <= u64::from(w.chunk_size))
        .ok_or_else(|| range_error(w.offset, w.src.len().min(u64::from(u32::MAX)) as u32))
}

/// Checks the ranges of a [`proto::data::WriteRanges`] (or of the replicated write it
/// became) for a chunk of `chunk_size` bytes: at least one and at most
/// [`MAX_WRITE_RANGES`], none empty, in ascending order without overlaps, inside the
/// chunk, and [`MAX_INLINE_WRITE_BYTES`] at most in all.
pub(super) fn check_ranges(
    ranges: Vec<InlineRange>,
    chunk_size: u32,
) -> Result<Vec<(u32, Bytes)>, DataError> {
    let bad = |what: String| {
        Err(DataError::InvalidArgument(format!(
            "write of ranges: {what}"
        )))
    };
    if ranges.is_empty() || ranges.len() > MAX_WRITE_RANGES {
        return bad(format!(
            "{} ranges, 1 to {MAX_WRITE_RANGES} allowed",
            ranges.len()
        ));
    }
    let total: usize = ranges.iter().map(|r| r.data.len()).sum();
    if total > MAX_INLINE_WRITE_BYTES {
        return Err(DataError::TooBig(format!(
            "write of ranges: {total} bytes, limit {MAX_INLINE_WRITE_BYTES}"
        )));
    }
    let mut next_free = 0u64;
    let mut out = Vec::with_capacity(ranges.len());
    for r in ranges {
        let (start, end) = (
            u64::from(r.offset),
            u64::from(r.offset) + r.data.len() as u64,
        );
        if r.data.is_empty() || start < next_free || end > u64::from(chunk_size) {
            return bad(format!(
                "range {start}..{end} is empty, overlaps or precedes the one before, or \
                 passes the chunk's {chunk_size} bytes"
            ));
        }
        next_free = end;
        out.push((r.offset, Bytes::from(r.data)));
    }
    Ok(out)
}

/// Passes the ranges of a write to a successor that takes smaller requests than they
/// need together, one range at a time (each inline or READ from a buffer, as
/// [`forward`] decides), all with the write's stamp: the first moves the successor's
/// version, the others find it moved, as retries of it would.
async fn forward_each(
    next: &Connection,
    w: &ChainWrite,
    ranges: &[(u32, Bytes)],
    stamp: Stamp,
    pool: &BufferPool,
) -> Result<(), DataError> {
    let buf = pool.take().await;
    let mr: MemoryRegion = buf.mr().clone();
    for (at, bytes) in ranges {
        let n = bytes.len();
        mr.lock()
            .get_mut(..n)
            .ok_or_else(|| {
                DataError::TooBig(format!("a range of {n} bytes: larger than a buffer"))
            })?
            .copy_from_slice(bytes);
        forward(next, w, *at, stamp, Some(&mr), n as u32).await?;
    }
    Ok(())
}

/// Passes one step to the successor: with the bytes inline when they are few, else it
/// READs them from `data` (or writes zeros).
async fn forward(
    next: &Connection,
    w: &ChainWrite,
    at: u32,
    stamp: Stamp,
    data: Option<&MemoryRegion>,
    n: u32,
) -> Result<(), DataError> {
    let inline = fits_inline(n as usize, next.max_request_bytes());
    let grant = match data {
        Some(mr) if !inline => Some(
            next.grant(mr, 0, n as usize, Access::RemoteRead)
                .map_err(DataError::from)?,
        ),
        _ => None,
    };
    let payload = match (&grant, data) {
        (Some(g), _) => ReplicaData::Bytes(g.remote()),
        (None, Some(mr)) => ReplicaData::Inline(mr.lock()[..n as usize].to_vec()),
        (None, None) => ReplicaData::Zeros(n),
    };
    let req = Replicate {
        chunk: w.chunk,
        place: w.place,
        chunk_size_bytes: w.chunk_size,
        offset: at,
        version: stamp.version,
        base_version: stamp.base,
        data: payload,
    };
    let reply = call_peer(next, req).await;
    drop(grant);
    reply.map(drop)
}
