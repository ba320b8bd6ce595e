//! How a read is served, decided as a pure function of the file's I/O state and the
//! request ([`plan_read`]), and a thin applier that records the fetches the decision
//! asks for ([`apply`]). `read.rs` runs both under the file's `io` lock and starts the
//! fetches after it; the tests here run them on a model of that state, without buffers
//! or servers.

use super::readahead::Advice;
use crate::error::Result;

/// Fewest read segments a stream keeps behind the segment it reads, for reads of them
/// still on their way. A segment goes as soon as all its bytes are served; one that is
/// never served whole (the reader skipped part of it) goes once the stream is this many
/// segments, or its window's worth of segments if more, past it.
const MIN_SEGMENTS_KEPT_BEHIND: u64 = 1;

/// What [`plan_read`] needs to see of a file's segments (its `IoState`).
pub(super) trait SegView {
    /// A cached read segment, as the plan hands it on.
    type Seg: Clone;
    /// A buffered write segment, as the plan hands it on.
    type Write;
    /// The write segments (of `seg` bytes) with index in `first..=last`, in order,
    /// each with whether its buffered bytes lie in the file range `[from, to)`.
    fn writes_in(
        &self,
        seg: u64,
        first: u64,
        last: u64,
        from: u64,
        to: u64,
    ) -> Vec<(Self::Write, bool)>;
    /// Read segment `k` if it is cached (or being fetched) and holds `[from, to)`.
    fn cached_holding(&self, k: u64, from: u64, to: u64) -> Option<Self::Seg>;
    /// Whether segment `k` is cached or has buffered writes.
    fn occupied(&self, k: u64) -> bool;
    /// Indexes of the cached read segments in `from..to`.
    fn cached_in(&self, from: u64, to: u64) -> Vec<u64>;
}

/// Where one segment of the requested range comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Source<S> {
    /// Cached, or being fetched already.
    Cached(S),
    /// Not cached: fetch segment `k` now.
    Fetch(u64),
}

/// What a read does with the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SegPlan<S> {
    /// The segments of the range, in order.
    pub serve: Vec<Source<S>>,
    /// Segments past the range to prefetch, in order, while the pool has buffers.
    pub ahead: Vec<u64>,
    /// Segments the stream has passed: their bytes are in the kernel's page cache.
    pub evict: Vec<u64>,
}

/// What a read does, decided under the file's lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Plan<S, W> {
    /// Buffered writes cover part of the range: send these, then decide again.
    SendWrites(Vec<W>),
    /// Serve from cached segments, fetching those missing; prefetch and evict.
    Segments(SegPlan<S>),
    /// Read exactly the range into a pooled buffer.
    Direct,
    /// Read exactly the range, never around it: buffered writes lie beside it.
    Exact,
}

impl<S, W> Plan<S, W> {
    /// Whether the read is a readahead hit (every segment of its range cached or on its
    /// way) or a miss (it fetches a segment itself, or reads directly); `None` while it
    /// must first send writes and plan again.
    pub(super) fn readahead_hit(&self) -> Option<bool> {
        match self {
            Plan::SendWrites(_) => None,
            Plan::Segments(p) => Some(p.serve.iter().all(|s| matches!(s, Source::Cached(_)))),
            Plan::Direct | Plan::Exact => Some(false),
        }
    }
}

/// Decides how to serve `[offset, offset + len)` of a file of `size` bytes, cut in
/// segments of `seg` bytes, as `advice` says. Pure: `io` is only looked at.
pub(super) fn plan_read<V: SegView>(
    io: &V,
    offset: u64,
    len: usize,
    advice: Advice,
    size: u64,
    seg: u64,
) -> Plan<V::Seg, V::Write> {
    debug_assert!(
        len > 0 && seg > 0,
        "an empty read is answered before planning"
    );
    let window = advice.ahead;
    let end = offset + len as u64;
    let (first, last) = (offset / seg, (end - 1) / seg);
    let mut beside_writes = false;
    let mut writes = Vec::new();
    for (w, overlaps) in io.writes_in(seg, first, last, offset, end) {
        if overlaps {
            writes.push(w);
        } else {
            beside_writes = true;
        }
    }
    if !writes.is_empty() {
        return Plan::SendWrites(writes);
    }
    if beside_writes {
        // The servers hold every byte of the range (the buffered ones lie beside
        // it), so it is read from them as it is: a program rewriting a file in
        // place reads just ahead of its writes, and sending them first made each
        // read wait for a transfer and a fetch. Nothing is cached or prefetched:
        // a cached copy of the segment would miss the buffered bytes.
        return Plan::Exact;
    }
    let mut serve = Vec::with_capacity((last - first + 1) as usize);
    for k in first..=last {
        let (from, to) = (offset.max(k * seg), end.min((k + 1) * seg));
        match io.cached_holding(k, from, to) {
            Some(c) => serve.push(Source::Cached(c)),
            // Random access uses what is cached or on its way and fetches nothing more.
            // A late read whose segment has gone: the rest of the segment was served
            // and the stream is past it, so fetching it whole again (as the kernel's
            // wide readahead windows made happen for a third of the segments of a
            // stream) would read from the disks bytes nobody asks for.
            None if window == 0 || advice.late => return Plan::Direct,
            None => serve.push(Source::Fetch(k)),
        }
    }
    if window == 0 || advice.late {
        // A late read: the read that passed it prefetched ahead and let go of what lies
        // behind; from here, the same would fetch again segments already served and gone.
        return Plan::Segments(SegPlan {
            serve,
            ahead: Vec::new(),
            evict: Vec::new(),
        });
    }
    let ahead_end = end.saturating_add(window).min(size);
    let ahead = (last + 1..ahead_end.div_ceil(seg))
        .filter(|&k| !io.occupied(k))
        .collect();
    // Segments far enough behind the reader are done with: the kernel holds their
    // bytes. Only those this stream can have passed since its last read go (it moves
    // at most a window and a read per read): other handles of the file may be
    // reading further back, and their prefetched segments stay.
    let keep_from = first.saturating_sub((window / seg).max(MIN_SEGMENTS_KEPT_BEHIND));
    let passed_from = keep_from.saturating_sub(window / seg + 2);
    let evict = io.cached_in(passed_from, keep_from);
    Plan::Segments(SegPlan {
        serve,
        ahead,
        evict,
    })
}

/// What [`apply`] does to the file's segments.
pub(super) trait Fetcher {
    /// A cached read segment.
    type Seg;
    /// Caches segment `k` with its fetch (started once the lock is released); `None`
    /// when the readahead pool has no buffer free (or `k` lies past the end of the
    /// file).
    fn fetch(&mut self, k: u64) -> Result<Option<Self::Seg>>;
    /// Drops segment `k` from the cache.
    fn evict(&mut self, k: u64);
}

/// What a read does once its plan is applied.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step<S, W> {
    /// Send these buffered writes, then plan again.
    SendWrites(Vec<W>),
    /// Serve the range from these segments, in order.
    Serve(Vec<S>),
    /// Read exactly the range into a pooled buffer.
    Direct,
    /// Read exactly the range, never around it.
    Exact,
}

/// Records the fetches `plan` asks for, in order. A segment of the range that finds the
/// pool out of buffers makes the read go direct (those started before it stay cached
/// for later reads), and nothing is prefetched or evicted then; prefetching stops at
/// the first segment that finds no buffer.
pub(super) fn apply<F: Fetcher, W>(plan: Plan<F::Seg, W>, f: &mut F) -> Result<Step<F::Seg, W>> {
    let p = match plan {
        Plan::SendWrites(w) => return Ok(Step::SendWrites(w)),
        Plan::Direct => return Ok(Step::Direct),
        Plan::Exact => return Ok(Step::Exact),
        Plan::Segments(p) => p,
    };
    let mut segs = Vec::with_capacity(p.serve.len());
    for s in p.serve {
        match s {
            Source::Cached(c) => segs.push(c),
            Source::Fetch(k) => match f.fetch(k)? {
                Some(c) => segs.push(c),
                // The mount's readahead memory is in use: read just the range.
                None => return Ok(Step::Direct),
            },
        }
    }
    for k in p.ahead {
        if f.fetch(k)?.is_none() {
            break;
        }
    }
    for k in p.evict {
        f.evict(k);
    }
    Ok(Step::Serve(segs))
}

#[cfg(test)]
#[path = "read_plan_tests.rs"]
mod tests;
