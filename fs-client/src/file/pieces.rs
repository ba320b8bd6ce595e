//! Cutting transfers into pieces, one per chunk, and grouping a segment's small pieces
//! into batches sent as one chain write each.

use crate::error::{ClientError, Result};
use proto::data::{MAX_INLINE_WRITE_BYTES, MAX_WRITE_RANGES};
use proto::{ChainId, ChunkId, InodeId, Layout};
use std::ops::Range;

/// One piece of a transfer: a range inside one chunk, and where it sits in the buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Piece {
    pub(super) chunk: ChunkId,
    pub(super) chain: ChainId,
    pub(super) offset_in_chunk: u32,
    pub(super) len: u32,
    pub(super) buf_offset: usize,
}

/// Cuts `len` file bytes at `offset` at chunk boundaries; the bytes sit in a buffer
/// from `buf_base` on.
pub(super) fn pieces(
    layout: &Layout,
    ino: InodeId,
    offset: u64,
    len: usize,
    buf_base: usize,
) -> Result<Vec<Piece>> {
    let cs = u64::from(layout.chunk_size_bytes);
    let mut out = Vec::new();
    let mut pos = offset;
    let end = offset + len as u64;
    while pos < end {
        let index = pos / cs;
        let in_chunk = pos % cs;
        let n = (cs - in_chunk).min(end - pos);
        let chain = layout
            .chain_for(index)
            .ok_or_else(|| ClientError::NoDataServers("file has no data servers".into()))?;
        out.push(Piece {
            chunk: ChunkId { inode: ino, index },
            chain,
            offset_in_chunk: in_chunk as u32,
            len: n as u32,
            buf_offset: buf_base + (pos - offset) as usize,
        });
        pos += n;
    }
    Ok(out)
}

/// Cuts a read of `len` bytes at file `offset` into windows of at most `step` bytes
/// (a power of two) whose ends fall on multiples of `step` in
/// the file: `(where in the read it starts, bytes)`. Windows cut from `offset` instead
/// would, at any offset not on a boundary, each straddle a chunk boundary now and then,
/// and that window costs a second call for its few bytes in the next chunk (a
/// `torch.load` storage lies 64 bytes past a boundary: 1 MiB windows then sent 17 calls
/// per 4 MiB chunk instead of 4).
pub(super) fn windows(
    offset: u64,
    len: usize,
    step: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let step64 = step as u64;
    let mut at = 0usize;
    std::iter::from_fn(move || {
        if at >= len {
            return None;
        }
        let pos = offset + at as u64;
        let to_boundary = (step64 - pos % step64) as usize;
        let n = to_boundary.min(len - at);
        let w = (at, n);
        at += n;
        Some(w)
    })
}

/// Groups `ps` (pieces in file order) into batches to send, as index ranges of `ps`: a
/// run of pieces of one chunk, each small enough to travel in a request, at most
/// [`MAX_WRITE_RANGES`] of them and [`MAX_INLINE_WRITE_BYTES`] in all, is one batch; any
/// other piece is a batch of its own.
pub(super) fn batches(ps: &[Piece]) -> Vec<Range<usize>> {
    let small = |p: &Piece| p.len as usize <= MAX_INLINE_WRITE_BYTES;
    let mut out: Vec<Range<usize>> = Vec::new();
    let mut bytes = 0usize;
    for (i, p) in ps.iter().enumerate() {
        let joins = out.last().is_some_and(|b| {
            let last = &ps[b.end - 1];
            small(last)
                && small(p)
                && last.chunk == p.chunk
                && b.len() < MAX_WRITE_RANGES
                && bytes + p.len as usize <= MAX_INLINE_WRITE_BYTES
        });
        match out.last_mut() {
            Some(b) if joins => {
                b.end = i + 1;
                bytes += p.len as usize;
            }
            _ => {
                out.push(i..i + 1);
                bytes = p.len as usize;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_end_on_boundaries_of_the_file() {
        let w: Vec<_> = windows(64, 3 << 20, 1 << 20).collect();
        assert_eq!(
            w,
            vec![
                (0, (1 << 20) - 64),
                ((1 << 20) - 64, 1 << 20),
                ((2 << 20) - 64, 1 << 20),
                ((3 << 20) - 64, 64)
            ]
        );
        let aligned: Vec<_> = windows(4 << 20, 2 << 20, 1 << 20).collect();
        assert_eq!(aligned, vec![(0, 1 << 20), (1 << 20, 1 << 20)]);
        assert_eq!(windows(100, 10, 1 << 20).collect::<Vec<_>>(), vec![(0, 10)]);
        assert_eq!(windows(5, 0, 4096).count(), 0);
        // Together they cover the read once, in order.
        let mut next = 0;
        for (at, n) in windows(12_345, 9_999_999, 65_536) {
            assert_eq!(at, next);
            assert!(n > 0 && n <= 65_536);
            next = at + n;
            assert!((12_345 + next as u64).is_multiple_of(65_536) || next == 9_999_999);
        }
        assert_eq!(next, 9_999_999);
    }

    fn piece(index: u64, offset_in_chunk: u32, len: u32) -> Piece {
        Piece {
            chunk: ChunkId {
                inode: InodeId(7),
                index,
            },
            chain: ChainId(1),
            offset_in_chunk,
            len,
            buf_offset: offset_in_chunk as usize,
        }
    }

    #[test]
    fn scattered_small_pieces_of_one_chunk_go_together_up_to_the_limits() {
        // 512-byte pieces every 1 KiB of chunk 0: 128 fill 64 KiB exactly.
        let ps: Vec<Piece> = (0..300).map(|i| piece(0, i * 1024, 512)).collect();
        let per = MAX_INLINE_WRITE_BYTES / 512;
        assert_eq!(batches(&ps), vec![0..per, per..2 * per, 2 * per..300]);
        // One-byte pieces: the count limit cuts first.
        let ps: Vec<Piece> = (0..2500).map(|i| piece(0, i * 2, 1)).collect();
        let m = MAX_WRITE_RANGES;
        assert_eq!(batches(&ps), vec![0..m, m..2 * m, 2 * m..2500]);
    }

    #[test]
    fn a_new_chunk_or_a_large_piece_starts_a_batch_of_its_own() {
        let big = MAX_INLINE_WRITE_BYTES as u32 + 1;
        let ps = vec![
            piece(0, 0, 100),
            piece(0, 200, 100),
            piece(0, 400, big),
            piece(0, 400 + big + 10, 100),
            piece(1, 0, 100),
            piece(1, 300, 100),
        ];
        assert_eq!(batches(&ps), vec![0..2, 2..3, 3..4, 4..6]);
        assert!(batches(&[]).is_empty());
    }

    #[test]
    fn every_piece_is_in_exactly_one_batch_in_order() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for _ in 0..200 {
            let mut ps = Vec::new();
            let mut at = 0u32;
            for _ in 0..(x % 3000) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let cap = if x.is_multiple_of(5) { 70_000 } else { 2_000 };
                let len = 1 + (x % cap) as u32;
                let index = u64::from(at / (1 << 22));
                ps.push(piece(index, at % (1 << 22), len));
                at += len + 1 + (x >> 40) as u32 % 5_000;
            }
            let bs = batches(&ps);
            let mut next = 0;
            for b in &bs {
                assert_eq!(b.start, next, "batches follow each other");
                assert!(!b.is_empty());
                let group = &ps[b.clone()];
                assert!(group.iter().all(|p| p.chunk == group[0].chunk));
                let bytes: usize = group.iter().map(|p| p.len as usize).sum();
                assert!(
                    group.len() == 1
                        || (bytes <= MAX_INLINE_WRITE_BYTES && group.len() <= MAX_WRITE_RANGES)
                );
                next = b.end;
            }
            assert_eq!(next, ps.len());
            x = x.wrapping_add(1);
        }
    }
}
