//! Read planning on a model of a file's segments: a cache of (start, length) per
//! segment, buffered write ranges per segment, and a pool with a number of free buffers.

use super::*;
use crate::file::readahead::{RaParams, Readahead};
use std::collections::BTreeMap;

const MIB: u64 = 1 << 20;
const SEG: u64 = 4 * MIB;
const P: RaParams = RaParams {
    seg_bytes: SEG,
    max_bytes: 32 * MIB,
};
const RANDOM: Advice = Advice {
    ahead: 0,
    late: false,
};

/// A file's `IoState` as the planner sees it, and the readahead pool.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Model {
    size: u64,
    /// Cached segments: index -> (file offset, bytes held).
    cache: BTreeMap<u64, (u64, u64)>,
    /// Buffered writes: segment index -> file ranges `[a, b)`.
    dirty: BTreeMap<u64, Vec<(u64, u64)>>,
    /// Buffers the readahead pool has free.
    free: usize,
    /// Segments fetched, in the order the fetches started.
    fetched: Vec<u64>,
}

impl Model {
    fn new(size: u64, free: usize) -> Model {
        Model {
            size,
            cache: BTreeMap::new(),
            dirty: BTreeMap::new(),
            free,
            fetched: Vec::new(),
        }
    }

    fn plan(&self, offset: u64, len: u64, advice: Advice) -> Plan<u64, u64> {
        plan_read(self, offset, len as usize, advice, self.size, SEG)
    }

    /// One read of a stream: what `Client::plan_read` does, on the model.
    fn read(&mut self, ra: &mut Readahead, offset: u64, len: u64) -> Step<u64, u64> {
        let advice = ra.observe(offset, len, P);
        let plan = self.plan(offset, len, advice);
        apply(plan, self).expect("the model's fetches do not fail")
    }
}

impl SegView for Model {
    type Seg = u64;
    type Write = u64;

    fn writes_in(&self, _seg: u64, first: u64, last: u64, from: u64, to: u64) -> Vec<(u64, bool)> {
        let overlaps = |r: &Vec<(u64, u64)>| r.iter().any(|&(a, b)| a.max(from) < b.min(to));
        self.dirty
            .range(first..=last)
            .map(|(k, r)| (*k, overlaps(r)))
            .collect()
    }

    fn cached_holding(&self, k: u64, from: u64, to: u64) -> Option<u64> {
        let &(start, len) = self.cache.get(&k)?;
        (start <= from && to <= start + len).then_some(k)
    }

    fn occupied(&self, k: u64) -> bool {
        self.dirty.contains_key(&k) || self.cache.contains_key(&k)
    }

    fn cached_in(&self, from: u64, to: u64) -> Vec<u64> {
        self.cache.range(from..to).map(|(k, _)| *k).collect()
    }
}

impl Fetcher for Model {
    type Seg = u64;

    fn fetch(&mut self, k: u64) -> Result<Option<u64>> {
        let start = k * SEG;
        if start >= self.size || self.free == 0 {
            return Ok(None);
        }
        self.free -= 1;
        self.cache.insert(k, (start, (self.size - start).min(SEG)));
        self.fetched.push(k);
        Ok(Some(k))
    }

    fn evict(&mut self, k: u64) {
        if self.cache.remove(&k).is_some() {
            self.free += 1;
        }
    }
}

/// A xorshift generator: the tests are random but repeatable.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn random_access_fetches_nothing_and_serves_only_what_is_cached_whole() {
    let mut m = Model::new(64 * MIB, 8);
    m.cache.insert(2, (2 * SEG, SEG));
    // Fetched when the file ended inside segment 3.
    m.cache.insert(3, (3 * SEG, MIB));
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..10_000 {
        let offset = rng.below(m.size - 1);
        let len = 1 + rng.below((m.size - offset).min(MIB));
        let (first, last) = (offset / SEG, (offset + len - 1) / SEG);
        let plan = m.plan(offset, len, RANDOM);
        let whole = (first..=last).all(|k| {
            let from = offset.max(k * SEG);
            let to = (offset + len).min((k + 1) * SEG);
            m.cached_holding(k, from, to).is_some()
        });
        if whole {
            let serve = (first..=last).map(Source::Cached).collect();
            let (ahead, evict) = (Vec::new(), Vec::new());
            let want = Plan::Segments(SegPlan {
                serve,
                ahead,
                evict,
            });
            assert_eq!(plan, want, "read {offset}+{len}");
        } else {
            assert_eq!(plan, Plan::Direct, "read {offset}+{len}");
        }
    }
    assert_eq!(
        m.plan(3 * SEG + MIB - 1, 2, RANDOM),
        Plan::Direct,
        "bytes past what a segment fetched from a shorter file holds are not served from it"
    );
}

#[test]
fn a_sequential_stream_fetches_each_segment_once_ahead_and_lets_passed_ones_go() {
    let mut m = Model::new(256 * MIB, 64);
    let mut ra = Readahead::default();
    let first = m.read(&mut ra, 0, MIB);
    assert_eq!(first, Step::Serve(vec![0]));
    assert_eq!(
        m.fetched,
        [0, 1],
        "one segment read, the window's one ahead"
    );
    for i in 1..256 {
        let step = m.read(&mut ra, i * MIB, MIB);
        assert_eq!(step, Step::Serve(vec![i * MIB / SEG]), "read {i}");
    }
    let want: Vec<u64> = (0..64).collect();
    assert_eq!(m.fetched, want, "every segment fetched once, in order");
    let kept: Vec<u64> = m.cache.keys().copied().collect();
    assert!(
        kept.len() <= 32 * MIB as usize / SEG as usize + 3,
        "segments the stream passed leave the cache: {kept:?}"
    );
    assert_eq!(kept.last(), Some(&63));
}

#[test]
fn a_late_read_uses_what_is_cached_and_never_fetches_or_evicts() {
    let late = Advice {
        ahead: 16 * MIB,
        late: true,
    };
    let mut m = Model::new(64 * MIB, 8);
    assert_eq!(m.plan(SEG, MIB, late), Plan::Direct, "its segment has gone");
    m.cache.insert(0, (0, SEG));
    m.cache.insert(1, (SEG, SEG));
    let plan = m.plan(SEG, MIB, late);
    let want = Plan::Segments(SegPlan {
        serve: vec![Source::Cached(1)],
        ahead: vec![],
        evict: vec![],
    });
    assert_eq!(plan, want, "nothing ahead, segment 0 stays");
    assert_eq!(apply(plan, &mut m).ok(), Some(Step::Serve(vec![1])));
    assert!(m.fetched.is_empty() && m.cache.contains_key(&0));
}

#[test]
fn buffered_writes_over_the_range_are_sent_first_and_beside_it_make_the_read_exact() {
    let ahead = Advice {
        ahead: 8 * MIB,
        late: false,
    };
    let mut m = Model::new(64 * MIB, 8);
    m.dirty.insert(1, vec![(SEG + 100, SEG + 200)]);
    m.dirty.insert(2, vec![(2 * SEG, 2 * SEG + 10)]);
    assert_eq!(
        m.plan(SEG + 150, 100, ahead),
        Plan::SendWrites(vec![1]),
        "bytes of the read are only in the buffer"
    );
    assert_eq!(
        m.plan(SEG + 150, SEG, ahead),
        Plan::SendWrites(vec![1, 2]),
        "across two segments with writes in both"
    );
    assert_eq!(
        m.plan(SEG, 100, ahead),
        Plan::Exact,
        "writes beside the read: the servers hold its bytes"
    );
    assert_eq!(m.plan(SEG + 200, 100, RANDOM), Plan::Exact, "random or not");
    let plan = m.plan(0, MIB, ahead);
    let want = Plan::Segments(SegPlan {
        serve: vec![Source::Fetch(0)],
        ahead: vec![],
        evict: vec![],
    });
    assert_eq!(plan, want, "no prefetch of segments with buffered writes");
}

#[test]
fn a_pool_out_of_buffers_makes_the_read_direct_and_stops_prefetching() {
    let ahead = Advice {
        ahead: 32 * MIB,
        late: false,
    };
    let mut m = Model::new(64 * MIB, 1);
    let across = m.plan(SEG - MIB, 2 * MIB, ahead);
    assert_eq!(apply(across, &mut m).ok(), Some(Step::Direct));
    assert_eq!(
        m.fetched,
        [0],
        "the fetch started stays cached for later reads"
    );
    assert!(m.cache.contains_key(&0));

    let mut m = Model::new(64 * MIB, 3);
    m.cache.insert(20, (20 * SEG, SEG));
    let plan = m.plan(0, MIB, ahead);
    let step = apply(plan, &mut m).ok();
    assert_eq!(
        step,
        Some(Step::Serve(vec![0])),
        "the read itself had a buffer"
    );
    assert_eq!(
        m.fetched,
        [0, 1, 2],
        "prefetching stops at the first refusal"
    );

    let mut m = Model::new(64 * MIB, 0);
    assert_eq!(
        apply(m.plan(0, MIB, ahead), &mut m).ok(),
        Some(Step::Direct)
    );
    assert_eq!(m.plan(0, MIB, RANDOM), Plan::Direct);
}

#[test]
fn two_streams_on_one_file_never_evict_each_others_segments() {
    let mut m = Model::new(512 * MIB, 64);
    let (mut a, mut b) = (Readahead::default(), Readahead::default());
    // Stream b starts at 256 MiB: its first read is random, the next opens its window.
    let mut ends = (0, 256 * MIB);
    for _ in 0..200 {
        for (ra, end) in [(&mut a, &mut ends.0), (&mut b, &mut ends.1)] {
            let step = m.read(ra, *end, MIB);
            assert!(
                matches!(step, Step::Serve(_) | Step::Direct),
                "{step:?} at {end}"
            );
            *end += MIB;
        }
    }
    let mut seen = BTreeMap::new();
    for k in &m.fetched {
        *seen.entry(k).or_insert(0) += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "fetched again after an early eviction: {twice:?}"
    );
    let near = |k: u64, end: u64| k * SEG + 12 * SEG >= end && k * SEG <= end + 32 * MIB;
    for k in m.cache.keys() {
        assert!(
            near(*k, ends.0) || near(*k, ends.1),
            "segment {k} passed by both streams is still cached"
        );
    }
}

#[test]
fn plan_and_apply_decide_as_the_planner_before_the_split_did() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for round in 0..2_000 {
        let size = 1 + rng.below(96 * MIB);
        let mut m = Model::new(size, rng.below(12) as usize);
        for k in 0..size.div_ceil(SEG) {
            match rng.below(6) {
                0 => {
                    let len = (size - k * SEG).min(SEG);
                    m.cache.insert(k, (k * SEG, 1 + rng.below(len)));
                }
                1 => {
                    let a = k * SEG + rng.below(SEG);
                    m.dirty.insert(k, vec![(a, a + 1 + rng.below(MIB))]);
                }
                _ => {}
            }
        }
        let offset = rng.below(size);
        let len = 1 + rng.below((size - offset).min(8 * MIB));
        let advice = Advice {
            ahead: [0, SEG, 8 * MIB, 32 * MIB][rng.below(4) as usize],
            late: rng.below(4) == 0,
        };
        let mut old = m.clone();
        let want = old_plan_read(&mut old, offset, len, advice);
        let got = apply(m.plan(offset, len, advice), &mut m).ok();
        assert_eq!(got, Some(want), "round {round}: {offset}+{len} {advice:?}");
        assert_eq!(m, old, "round {round}: the same fetches and evictions");
    }
}

/// `Client::plan_read` as it was before the decision was split from the fetches,
/// on the model: the oracle for the test above.
fn old_plan_read(io: &mut Model, offset: u64, len: u64, advice: Advice) -> Step<u64, u64> {
    let (window, seg, size) = (advice.ahead, SEG, io.size);
    let end = offset + len;
    let (first, last) = (offset / seg, (end - 1) / seg);
    let mut beside_writes = false;
    let mut writes = Vec::new();
    for (k, overlaps) in io.writes_in(seg, first, last, offset, end) {
        if overlaps {
            writes.push(k);
        } else {
            beside_writes = true;
        }
    }
    if !writes.is_empty() {
        return Step::SendWrites(writes);
    }
    if beside_writes {
        return Step::Exact;
    }
    if window == 0 {
        let cached: Option<Vec<_>> = (first..=last)
            .map(|k| io.cached_holding(k, offset.max(k * seg), end.min((k + 1) * seg)))
            .collect();
        return cached.map_or(Step::Direct, Step::Serve);
    }
    let mut needed = Vec::new();
    for k in first..=last {
        match io.cached_holding(k, offset.max(k * seg), end.min((k + 1) * seg)) {
            Some(c) => needed.push(c),
            None if advice.late => return Step::Direct,
            None => match io.fetch(k).ok().flatten() {
                Some(c) => needed.push(c),
                None => return Step::Direct,
            },
        }
    }
    if advice.late {
        return Step::Serve(needed);
    }
    let ahead_end = end.saturating_add(window).min(size);
    for k in last + 1..ahead_end.div_ceil(seg) {
        if io.dirty.contains_key(&k) || io.cache.contains_key(&k) {
            continue;
        }
        if io.fetch(k).ok().flatten().is_none() {
            break;
        }
    }
    let keep_from = first.saturating_sub((window / seg).max(MIN_SEGMENTS_KEPT_BEHIND));
    let passed_from = keep_from.saturating_sub(window / seg + 2);
    let passed: Vec<u64> = io
        .cache
        .range(passed_from..keep_from)
        .map(|(k, _)| *k)
        .collect();
    for k in passed {
        io.evict(k);
    }
    Step::Serve(needed)
}

/// Guards against the readahead counters calling a read a hit when it fetched for
/// itself, or a miss when prefetching had its bytes on the way.
#[test]
fn a_sequential_stream_misses_once_then_hits_and_random_reads_miss() {
    let mut m = Model::new(64 * MIB, 64);
    let mut ra = Readahead::default();
    let mut hits = Vec::new();
    for i in 0..8 {
        let advice = ra.observe(i * MIB, MIB, P);
        let plan = m.plan(i * MIB, MIB, advice);
        hits.push(plan.readahead_hit());
        apply(plan, &mut m).expect("the model's fetches do not fail");
    }
    let mut want = vec![Some(true); 8];
    want[0] = Some(false);
    assert_eq!(
        hits, want,
        "the first read fetches, the prefetched ones hit"
    );
    let random = m.plan(40 * MIB, MIB, RANDOM);
    assert_eq!(random, Plan::Direct);
    assert_eq!(random.readahead_hit(), Some(false));
    m.dirty.insert(10, vec![(40 * MIB, 40 * MIB + 10)]);
    assert_eq!(m.plan(40 * MIB, MIB, RANDOM).readahead_hit(), None);
}
