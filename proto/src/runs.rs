//! Sets of chunk indexes as sorted runs, and the blocks a file's chunks hold.
//!
//! A file's chunks that hold data are kept (by the metadata server) and reported (by
//! writers, in their commits) as runs `[start, end)` of chunk indexes, so a dense file
//! of any size is one run and a sparse checkpoint a few. Every set has a bound on its
//! runs; past it, runs are merged or dropped in the direction that over-reports what a
//! file holds, never under-reports it (see [`ChunkRuns::cap_merging`] and
//! [`ChunkRuns::cap_dropping`]).

use serde::{Deserialize, Serialize};

/// Bytes of one block of `st_blocks`.
pub const BLOCK_BYTES: u64 = 512;

/// Most runs of chunks one commit may report written, and as many punched
/// ([`crate::meta::Commit`]); a writer merges past it. About 20 KiB at most on the wire.
pub const MAX_COMMIT_RUNS: usize = 1024;

/// A set of chunk indexes: sorted, disjoint, non-adjacent runs `[start, end)`, none
/// empty. Decoding refuses anything else.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<(u64, u64)>", into = "Vec<(u64, u64)>")]
pub struct ChunkRuns {
    runs: Vec<(u64, u64)>,
}

impl TryFrom<Vec<(u64, u64)>> for ChunkRuns {
    type Error = String;

    fn try_from(runs: Vec<(u64, u64)>) -> Result<Self, String> {
        let mut prev_end = None;
        for &(s, e) in &runs {
            if s >= e || prev_end.is_some_and(|p| s <= p) {
                return Err(format!(
                    "chunk runs not sorted, disjoint and non-empty: {runs:?}"
                ));
            }
            prev_end = Some(e);
        }
        Ok(ChunkRuns { runs })
    }
}

impl From<ChunkRuns> for Vec<(u64, u64)> {
    fn from(r: ChunkRuns) -> Self {
        r.runs
    }
}

impl ChunkRuns {
    /// The chunks `[start, end)` (none if `start >= end`).
    pub fn range(start: u64, end: u64) -> ChunkRuns {
        let mut r = ChunkRuns::default();
        r.insert(start, end);
        r
    }

    /// The runs, in order.
    pub fn runs(&self) -> &[(u64, u64)] {
        &self.runs
    }

    /// How many runs there are.
    pub fn len(&self) -> usize {
        self.runs.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Whether chunk `i` is in the set.
    pub fn contains(&self, i: u64) -> bool {
        let at = self.runs.partition_point(|&(_, e)| e <= i);
        self.runs.get(at).is_some_and(|&(s, _)| s <= i)
    }

    /// Adds the chunks `[start, end)`.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        // Runs ending before `start` (not touching it) stay; those from `first` up to
        // the first starting after `end` merge into one.
        let first = self.runs.partition_point(|&(_, e)| e < start);
        let last = self.runs.partition_point(|&(s, _)| s <= end);
        let (mut s, mut e) = (start, end);
        if first < last {
            s = s.min(self.runs[first].0);
            e = e.max(self.runs[last - 1].1);
        }
        self.runs.splice(first..last, [(s, e)]);
    }

    /// Removes the chunks `[start, end)`.
    pub fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut out = Vec::with_capacity(self.runs.len() + 1);
        for &(s, e) in &self.runs {
            if e <= start || s >= end {
                out.push((s, e));
                continue;
            }
            if s < start {
                out.push((s, start));
            }
            if e > end {
                out.push((end, e));
            }
        }
        self.runs = out;
    }

    /// Adds every chunk of `other`.
    pub fn union(&mut self, other: &ChunkRuns) {
        for &(s, e) in &other.runs {
            self.insert(s, e);
        }
    }

    /// Removes every chunk of `other`.
    pub fn subtract(&mut self, other: &ChunkRuns) {
        for &(s, e) in &other.runs {
            self.remove(s, e);
        }
    }

    /// Keeps only the chunks below `end`.
    pub fn clip(&mut self, end: u64) {
        self.remove(end, u64::MAX);
    }

    /// Whether every chunk `[0, end)` is in the set.
    pub fn covers(&self, end: u64) -> bool {
        end == 0 || self.runs.first().is_some_and(|&(s, e)| s == 0 && e >= end)
    }

    /// At most `max` runs (at least one), by merging the two runs with the smallest gap
    /// between them until it fits: the set only grows (a writer's report of what it
    /// wrote, the chunks a file holds: over-reported, never under-reported).
    pub fn cap_merging(&mut self, max: usize) {
        let max = max.max(1);
        while self.runs.len() > max {
            let gap = |i: usize| self.runs[i + 1].0 - self.runs[i].1;
            let Some(i) = (0..self.runs.len() - 1).min_by_key(|&i| gap(i)) else {
                return;
            };
            self.runs[i].1 = self.runs[i + 1].1;
            self.runs.remove(i + 1);
        }
    }

    /// At most `max` runs, by dropping the shortest runs: the set only shrinks (a
    /// writer's report of what it punched: a chunk left out stays counted as held).
    pub fn cap_dropping(&mut self, max: usize) {
        while self.runs.len() > max {
            let Some(i) = (0..self.runs.len()).min_by_key(|&i| self.runs[i].1 - self.runs[i].0)
            else {
                return;
            };
            self.runs.remove(i);
        }
    }
}

/// Index of the chunk after the last one a file of `size` bytes reaches with chunks of
/// `chunk_bytes` (its chunk count if it were dense).
pub fn chunks_of(size: u64, chunk_bytes: u64) -> u64 {
    size.div_ceil(chunk_bytes.max(1))
}

/// The chunks of `[offset, end)` in a file with chunks of `chunk_bytes` (those the bytes
/// touch: a write of part of a chunk makes it hold data).
pub fn touched(offset: u64, end: u64, chunk_bytes: u64) -> ChunkRuns {
    let cs = chunk_bytes.max(1);
    if offset >= end {
        return ChunkRuns::default();
    }
    ChunkRuns::range(offset / cs, (end - 1) / cs + 1)
}

/// The chunks wholly inside `[offset, end)` (what a punched hole frees).
pub fn covered(offset: u64, end: u64, chunk_bytes: u64) -> ChunkRuns {
    let cs = chunk_bytes.max(1);
    ChunkRuns::range(offset.div_ceil(cs), end / cs)
}

/// `st_blocks` (512-byte units) of a file of `size` bytes whose chunks of `chunk_bytes`
/// holding data are `held`, `None` meaning all of them (a file written before the
/// metadata server kept the set, or a dense one): each held chunk counts the bytes of
/// it below `size`, rounded up to a block.
pub fn blocks(held: Option<&ChunkRuns>, size: u64, chunk_bytes: u64) -> u64 {
    let Some(held) = held else {
        return size.div_ceil(BLOCK_BYTES);
    };
    let cs = chunk_bytes.max(1);
    let n = chunks_of(size, cs);
    let mut bytes: u64 = 0;
    for &(s, e) in held.runs() {
        let e = e.min(n);
        if s >= e {
            break;
        }
        // Every chunk but the file's last is whole below `size`.
        let whole = e.min(n - 1).saturating_sub(s);
        let mut run = whole.saturating_mul(cs.div_ceil(BLOCK_BYTES) * BLOCK_BYTES);
        if e == n {
            run = run.saturating_add((size - (n - 1) * cs).div_ceil(BLOCK_BYTES) * BLOCK_BYTES);
        }
        bytes = bytes.saturating_add(run);
    }
    bytes / BLOCK_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn set(r: &ChunkRuns) -> BTreeSet<u64> {
        r.runs().iter().flat_map(|&(s, e)| s..e).collect()
    }

    /// A small deterministic generator: the tests need no crate for it.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self, below: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % below
        }
    }

    #[test]
    fn inserts_and_removes_match_a_set_of_indexes() {
        let mut rng = Lcg(7);
        for _ in 0..200 {
            let mut runs = ChunkRuns::default();
            let mut model = BTreeSet::new();
            for _ in 0..40 {
                let s = rng.next(64);
                let e = s + rng.next(8);
                if rng.next(3) == 0 {
                    runs.remove(s, e);
                    model.retain(|i| *i < s || *i >= e);
                } else {
                    runs.insert(s, e);
                    model.extend(s..e);
                }
                assert_eq!(set(&runs), model);
                // The invariant decoding checks holds after every change.
                assert!(
                    ChunkRuns::try_from(runs.runs().to_vec()).is_ok(),
                    "{runs:?}"
                );
                for i in 0..72 {
                    assert_eq!(runs.contains(i), model.contains(&i), "{i} in {runs:?}");
                }
            }
        }
    }

    #[test]
    fn decoding_refuses_unsorted_overlapping_adjacent_or_empty_runs() {
        for bad in [
            vec![(3, 3)],
            vec![(4, 2)],
            vec![(0, 4), (2, 6)],
            vec![(0, 4), (4, 6)],
            vec![(5, 6), (0, 1)],
        ] {
            assert!(ChunkRuns::try_from(bad.clone()).is_err(), "{bad:?}");
            let bytes = crate::codec::encode(&bad, 1024).unwrap();
            assert!(
                crate::codec::decode::<ChunkRuns>(&bytes).is_err(),
                "{bad:?}"
            );
        }
        let good = ChunkRuns::try_from(vec![(0, 2), (5, 9)]).unwrap();
        let bytes = crate::codec::encode(&good, 1024).unwrap();
        assert_eq!(crate::codec::decode::<ChunkRuns>(&bytes).unwrap(), good);
    }

    #[test]
    fn capping_only_grows_when_merging_and_only_shrinks_when_dropping() {
        let mut rng = Lcg(11);
        for _ in 0..100 {
            let mut runs = ChunkRuns::default();
            for _ in 0..30 {
                let s = rng.next(500);
                runs.insert(s, s + 1 + rng.next(4));
            }
            let before = set(&runs);
            let mut merged = runs.clone();
            merged.cap_merging(4);
            assert!(merged.len() <= 4);
            assert!(set(&merged).is_superset(&before));
            let mut dropped = runs.clone();
            dropped.cap_dropping(4);
            assert!(dropped.len() <= 4);
            assert!(set(&dropped).is_subset(&before));
        }
        let mut r = ChunkRuns::try_from(vec![(0, 1), (2, 3), (10, 11)]).unwrap();
        r.cap_merging(2);
        assert_eq!(
            r.runs(),
            &[(0, 3), (10, 11)],
            "the smallest gap merges first"
        );
    }

    #[test]
    fn touched_and_covered_chunks() {
        let cs = 100;
        assert_eq!(touched(0, 1, cs).runs(), &[(0, 1)]);
        assert_eq!(touched(99, 101, cs).runs(), &[(0, 2)]);
        assert_eq!(touched(100, 200, cs).runs(), &[(1, 2)]);
        assert!(touched(5, 5, cs).is_empty());
        assert_eq!(covered(0, 200, cs).runs(), &[(0, 2)]);
        assert_eq!(covered(1, 299, cs).runs(), &[(1, 2)]);
        assert!(covered(1, 199, cs).is_empty());
        assert!(covered(150, 120, cs).is_empty());
    }

    #[test]
    fn blocks_count_held_chunks_below_the_size() {
        let cs = 4 << 20;
        let blocks_per_chunk = cs / 512;
        // No record: as dense as the size says.
        assert_eq!(blocks(None, 1000, cs), 2);
        assert_eq!(blocks(None, 0, cs), 0);
        // A small file: its one chunk's bytes, rounded up to a block.
        let first = ChunkRuns::range(0, 1);
        assert_eq!(blocks(Some(&first), 1000, cs), 2);
        assert_eq!(blocks(Some(&first), 512, cs), 1);
        // 1 MiB at 0 and at 1 GiB of a 1 GiB + 1 MiB file.
        let size = (1 << 30) + (1 << 20);
        let mut sparse = ChunkRuns::range(0, 1);
        sparse.insert(256, 257);
        assert_eq!(blocks(Some(&sparse), size, cs), blocks_per_chunk + 2048);
        // Dense: the same as no record.
        let dense = ChunkRuns::range(0, chunks_of(size, cs));
        assert_eq!(blocks(Some(&dense), size, cs), blocks(None, size, cs));
        // Chunks past the size count nothing; an empty set nothing at all.
        assert_eq!(blocks(Some(&ChunkRuns::range(3, 9)), cs * 2, cs), 0);
        assert_eq!(blocks(Some(&ChunkRuns::default()), size, cs), 0);
        // Never more than a dense file of the same size.
        let mut rng = Lcg(3);
        for _ in 0..500 {
            let size = rng.next(50 * cs);
            let mut held = ChunkRuns::default();
            for _ in 0..5 {
                let s = rng.next(60);
                held.insert(s, s + rng.next(10));
            }
            let b = blocks(Some(&held), size, cs);
            assert!(b <= blocks(None, size, cs), "{held:?} at {size}");
            let n = chunks_of(size, cs);
            let model: u64 = set(&held)
                .into_iter()
                .filter(|&i| i < n)
                .map(|i| (cs.min(size - i * cs)).div_ceil(512))
                .sum();
            assert_eq!(b, model, "{held:?} at {size}");
        }
    }
}
