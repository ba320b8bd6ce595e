//! The readahead window of one open file handle: how far ahead of the reader to prefetch.

/// What the window needs to know of the mount's configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RaParams {
    /// The prefetch unit, in bytes (one registered buffer).
    pub seg_bytes: u64,
    /// The largest window, in bytes; 0 turns readahead off.
    pub max_bytes: u64,
}

/// What [`Readahead::observe`] advises for one read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Advice {
    /// Bytes past the read's end to prefetch (0: none, read only the range).
    pub ahead: u64,
    /// The read lies wholly before the end of a later read of the same stream that
    /// arrived first: whatever it would prefetch is already asked for, and a segment it
    /// misses is not worth fetching whole any more.
    pub late: bool,
}

/// Sequential-access detection and the window it earns.
///
/// A read continuing where the last one ended opens a window of one segment; each read
/// that enters a new segment while the stream goes on doubles it, up to the maximum.
/// Once a window is open, reads may arrive out of order (the kernel keeps several
/// readahead requests in flight and they are served in parallel), so any read within
/// the window's distance of the stream's end still counts as sequential; one that ends
/// before the stream's end is late. Any other read closes the window: random access
/// never prefetches, and reads just what it asks for.
#[derive(Clone, Debug)]
pub(crate) struct Readahead {
    /// End of the furthest read of the current stream.
    last_end: u64,
    /// The window, in bytes; 0 while no sequential stream is seen.
    window_bytes: u64,
    /// Segment index of the last read, to grow the window once per segment.
    last_seg: u64,
}

impl Default for Readahead {
    /// A fresh open: a first read at offset 0 counts as the start of a stream, as whole
    /// files are mostly read from the start.
    fn default() -> Self {
        Readahead {
            last_end: 0,
            window_bytes: 0,
            last_seg: u64::MAX,
        }
    }
}

impl Readahead {
    /// Records a read of `len` bytes at `offset` and returns what to prefetch for it.
    pub(crate) fn observe(&mut self, offset: u64, len: u64, p: RaParams) -> Advice {
        let end = offset.saturating_add(len);
        let seg = offset / p.seg_bytes.max(1);
        let sequential = if self.window_bytes == 0 {
            offset == self.last_end
        } else {
            offset.abs_diff(self.last_end) <= self.window_bytes
        };
        if p.max_bytes == 0 || !sequential {
            *self = Readahead {
                last_end: end,
                window_bytes: 0,
                last_seg: seg,
            };
            return Advice {
                ahead: 0,
                late: false,
            };
        }
        let late = self.window_bytes > 0 && end <= self.last_end;
        self.last_end = self.last_end.max(end);
        if self.window_bytes == 0 {
            self.window_bytes = p.seg_bytes.min(p.max_bytes);
        } else if seg != self.last_seg {
            self.window_bytes = self.window_bytes.saturating_mul(2).min(p.max_bytes);
        }
        self.last_seg = seg;
        Advice {
            ahead: self.window_bytes,
            late,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const P: RaParams = RaParams {
        seg_bytes: 4 * MIB,
        max_bytes: 32 * MIB,
    };

    #[test]
    fn a_sequential_stream_opens_one_segment_and_doubles_per_segment_to_the_max() {
        let mut ra = Readahead::default();
        let advice: Vec<Advice> = (0..24).map(|i| ra.observe(i * MIB, MIB, P)).collect();
        assert!(
            advice.iter().all(|a| !a.late),
            "reads in order are never late"
        );
        let windows: Vec<u64> = advice.iter().map(|a| a.ahead / MIB).collect();
        assert_eq!(
            windows,
            [
                4, 4, 4, 4, // segment 0
                8, 8, 8, 8, // segment 1
                16, 16, 16, 16, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32
            ]
        );
    }

    #[test]
    fn random_reads_never_open_a_window() {
        let mut ra = Readahead::default();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let offset = (x % (1 << 20)) * 4096 + 4096;
            assert_eq!(ra.observe(offset, 4096, P).ahead, 0, "read at {offset}");
        }
    }

    #[test]
    fn a_seek_then_sequential_reads_opens_a_window_on_the_second_read() {
        let mut ra = Readahead::default();
        assert_eq!(ra.observe(100 * MIB, MIB, P).ahead, 0);
        assert_eq!(ra.observe(101 * MIB, MIB, P).ahead, 4 * MIB);
    }

    #[test]
    fn reads_out_of_order_within_the_window_keep_it_and_a_far_one_closes_it() {
        let mut ra = Readahead::default();
        for i in 0..9 {
            ra.observe(i * MIB, MIB, P);
        }
        let w = ra.observe(11 * MIB, MIB, P);
        assert_eq!(
            w.ahead,
            16 * MIB,
            "ahead of the stream's end, inside the window"
        );
        assert!(!w.late, "the furthest read is not late");
        let behind = ra.observe(9 * MIB, MIB, P);
        assert_eq!(behind.ahead, 16 * MIB, "behind it, inside");
        assert!(behind.late, "a read the stream has passed is late");
        assert_eq!(ra.observe(500 * MIB, MIB, P).ahead, 0, "far away: random");
        assert_eq!(
            ra.observe(12 * MIB, MIB, P).ahead,
            0,
            "the old stream is forgotten"
        );
    }

    #[test]
    fn a_zero_maximum_turns_readahead_off() {
        let off = RaParams {
            seg_bytes: 4 * MIB,
            max_bytes: 0,
        };
        let mut ra = Readahead::default();
        assert_eq!(ra.observe(0, MIB, off).ahead, 0);
        assert_eq!(ra.observe(MIB, MIB, off).ahead, 0);
    }
}
