//! The byte ranges of one write segment that hold buffered, unsent bytes.

use std::ops::Range;

/// Ranges a segment may hold before it is sent, so scattered small writes go out in
/// batches rather than piling up without bound. Small ranges of one chunk travel
/// together, up to `proto::data::MAX_WRITE_RANGES` (as many as this) and 64 KiB in one
/// chain write, so a full list of 512-byte writes into one chunk is eight chain writes.
pub(crate) const MAX_EXTENTS_PER_SEGMENT: usize = 1024;

/// Written ranges of one segment, as offsets within it: sorted, disjoint, and with
/// overlapping or touching ranges merged, so a segment filled by sequential writes is one
/// range and goes out as one large transfer per chunk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Extents {
    ranges: Vec<Range<u32>>,
}

impl Extents {
    /// Records that `r` was written. Empty ranges are ignored.
    pub(crate) fn add(&mut self, r: Range<u32>) {
        if r.is_empty() {
            return;
        }
        // Ranges ending before `r` starts (and not touching it) stay as they are; so do
        // ranges starting after it ends; everything between merges with `r`.
        let first = self.ranges.partition_point(|x| x.end < r.start);
        let last = self.ranges.partition_point(|x| x.start <= r.end);
        let merged = if first < last {
            self.ranges[first].start.min(r.start)..self.ranges[last - 1].end.max(r.end)
        } else {
            r
        };
        self.ranges.splice(first..last, std::iter::once(merged));
    }

    /// The ranges, in order.
    pub(crate) fn ranges(&self) -> &[Range<u32>] {
        &self.ranges
    }

    /// Whether any written byte lies in `r`.
    pub(crate) fn overlaps(&self, r: &Range<u32>) -> bool {
        let i = self.ranges.partition_point(|x| x.end <= r.start);
        self.ranges.get(i).is_some_and(|x| x.start < r.end)
    }

    /// Number of disjoint ranges.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether adding `r` would leave more than [`MAX_EXTENTS_PER_SEGMENT`] ranges.
    pub(crate) fn would_overflow(&self, r: &Range<u32>) -> bool {
        if self.ranges.len() < MAX_EXTENTS_PER_SEGMENT {
            return false;
        }
        // Only a range touching none of the present ones adds one.
        !self
            .ranges
            .iter()
            .any(|x| x.start <= r.end && r.start <= x.end)
    }

    /// Whether `[0, len)` is written entirely.
    #[cfg(test)]
    pub(crate) fn covers(&self, len: u32) -> bool {
        matches!(self.ranges.as_slice(), [only] if only.start == 0 && only.end >= len)
    }
}

#[cfg(test)]
// A list of one range is what these tests mean, not a range of numbers.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    fn of(list: &[Range<u32>]) -> Extents {
        let mut e = Extents::default();
        for r in list {
            e.add(r.clone());
        }
        e
    }

    #[test]
    fn sequential_writes_merge_into_one_range() {
        let e = of(&[0..10, 10..20, 20..4096]);
        assert_eq!(e.ranges(), &[0..4096]);
        assert!(e.covers(4096));
        assert!(!e.covers(4097));
    }

    #[test]
    fn disjoint_ranges_stay_sorted_and_apart() {
        let e = of(&[50..60, 0..10, 20..30]);
        assert_eq!(e.ranges(), &[0..10, 20..30, 50..60]);
        assert!(!e.covers(60));
    }

    #[test]
    fn a_range_bridging_several_merges_them_all() {
        let e = of(&[0..10, 20..30, 40..50, 60..70]);
        let mut b = e.clone();
        b.add(5..45);
        assert_eq!(b.ranges(), &[0..50, 60..70]);
        let mut c = e.clone();
        c.add(10..20);
        assert_eq!(
            c.ranges(),
            &[0..30, 40..50, 60..70],
            "touching ranges merge"
        );
        let mut d = e;
        d.add(0..100);
        assert_eq!(d.ranges(), &[0..100]);
    }

    #[test]
    fn overwrites_inside_a_range_change_nothing_and_empty_ranges_are_ignored() {
        let mut e = of(&[0..100]);
        e.add(10..20);
        e.add(30..30);
        assert_eq!(e.ranges(), &[0..100]);
        assert_eq!(e.len(), 1);
    }

    #[test]
    fn overlaps_finds_a_written_byte_in_a_range_and_nothing_beside_or_between() {
        let e = of(&[10..20, 40..50]);
        for hit in [0..11, 19..30, 15..16, 30..41, 0..100, 49..50] {
            assert!(e.overlaps(&hit), "{hit:?}");
        }
        for miss in [0..10, 20..40, 50..60, 25..26, 5..5] {
            assert!(!e.overlaps(&miss), "{miss:?}");
        }
        assert!(!of(&[]).overlaps(&(0..u32::MAX)));
    }

    #[test]
    fn only_a_new_separate_range_overflows_a_full_list() {
        let list: Vec<Range<u32>> = (0..MAX_EXTENTS_PER_SEGMENT as u32)
            .map(|i| i * 10..i * 10 + 5)
            .collect();
        let e = of(&list);
        assert_eq!(e.len(), MAX_EXTENTS_PER_SEGMENT);
        assert!(!e.would_overflow(&(3..8)), "overlaps a range");
        assert!(!e.would_overflow(&(5..10)), "touches two ranges");
        assert!(e.would_overflow(&(u32::MAX - 1..u32::MAX)));
    }
}
