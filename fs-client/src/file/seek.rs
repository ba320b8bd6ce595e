//! `SEEK_DATA` and `SEEK_HOLE`: where a file's next data or hole starts, from the blocks
//! its chunks' copies hold (`proto::data::ChunkData`, asked of a serving member of each
//! chunk's chain, as a read is).
//!
//! The chunks from the offset's on are asked in turn, a few at once (up to
//! [`MAX_CHUNKS_PER_SEEK`]), and the metadata server's record of the chunks a file holds
//! is not used: it may count a chunk free that holds data (README, `st_blocks`), and a
//! copy by data ranges (`cp`, `tar -S`) would then lose that chunk's bytes. A hole is a block never written or a written
//! block of zeros, so a copy by data ranges reads the same as the file.

use super::FileHandle;
use crate::error::{ClientError, Result};
use crate::Client;

/// Chunks asked about at once while a seek crosses holes, reached by doubling from one:
/// a seek answered by its first chunk (most of `cp`'s) costs one call, a run of chunks
/// without data one round of this many calls.
const MAX_CHUNKS_IN_FLIGHT: u64 = 16;

/// Most chunks one seek asks about: 256 GiB of 4 MiB chunks, about 3 s here. The
/// kernel holds the file's inode lock meanwhile, and a file may be exabytes long. A
/// `SEEK_DATA` that runs out answers with the first chunk it did not ask about (the
/// bytes before it are holes; a caller's next seek from there goes on), a `SEEK_HOLE`
/// with the end of the file (always a hole). Both are answers POSIX allows, but not
/// the exact ones a local file system gives (the `SEEK_DATA` answer is a hole to a
/// `SEEK_HOLE` from there): fstests' `seek_sanity_test` looks for data past a hole of
/// 32 GiB and takes only its offset, so the bound stays above that for chunks of
/// 512 KiB and more (4 MiB by default).
const MAX_CHUNKS_PER_SEEK: u64 = 65_536;

/// What a seek looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seek {
    /// `SEEK_DATA`: the first byte of data at or after the offset.
    Data,
    /// `SEEK_HOLE`: the first byte of a hole at or after the offset (the end of the
    /// file is one).
    Hole,
}

impl Client {
    /// Where the next data (or hole) at or after `offset` starts. Fails with
    /// [`ClientError::PastEnd`] (ENXIO) for an offset at or past the end, and for data
    /// asked after the last data. Writes buffered by this client count as data: they
    /// are sent first (one that failed is reported here, as by a write). Pages changed
    /// through a shared `mmap` that the kernel has not written back yet do not count.
    pub async fn seek(&self, fh: &FileHandle, offset: u64, what: Seek) -> Result<u64> {
        let state = &fh.state;
        self.place_appends(state).await;
        self.flush_writes(state).await;
        fh.check_write_error()?;
        let size = self.getattr(state.ino).await?.size;
        if offset >= size {
            return Err(ClientError::PastEnd(format!(
                "offset {offset} of a file of {size} bytes"
            )));
        }
        let cs = u64::from(state.layout.chunk_size_bytes);
        let last = (size - 1) / cs;
        let (mut first, mut width) = (offset / cs, 1);
        let budget_end = first.saturating_add(MAX_CHUNKS_PER_SEEK);
        while first <= last {
            if first >= budget_end {
                return match what {
                    Seek::Data => answer(what, first * cs, size, offset),
                    Seek::Hole => answer(what, size, size, offset),
                };
            }
            let batch: Vec<u64> =
                (first..=last.min(first + width - 1).min(budget_end - 1)).collect();
            let asked = batch
                .iter()
                .map(|&i| self.data.chunk_data(&state.layout, state.ino, i));
            // In order: an answer in an earlier chunk stands whatever a later one did.
            for (&index, blocks) in batch.iter().zip(futures::future::join_all(asked).await) {
                let base = index * cs;
                let from = offset.saturating_sub(base);
                let found = match (what, blocks?) {
                    (Seek::Data, None) => None,
                    (Seek::Data, Some(b)) => b.data_from(from),
                    (Seek::Hole, None) => Some(from),
                    (Seek::Hole, Some(b)) => Some(b.hole_from(from)),
                };
                // Past this chunk is the next chunk's to say (a hole ending here, say).
                if let Some(at) = found.filter(|&x| x < cs) {
                    return answer(what, base + at, size, offset);
                }
            }
            first += batch.len() as u64;
            width = (width * 2).min(MAX_CHUNKS_IN_FLIGHT);
        }
        answer(what, size, size, offset)
    }
}

/// The seek's answer for a first match at `at` in a file of `size` bytes: data at or past
/// the end is none, a hole there is the end.
fn answer(what: Seek, at: u64, size: u64, offset: u64) -> Result<u64> {
    match what {
        _ if at < size => Ok(at),
        Seek::Hole => Ok(size),
        Seek::Data => Err(ClientError::PastEnd(format!(
            "no data from offset {offset} to the end, {size}"
        ))),
    }
}
