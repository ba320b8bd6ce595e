//! `SEEK_DATA` and `SEEK_HOLE`: where a file's next data or hole starts, from the blocks
//! its chunks' copies hold (`proto::data::ChunkData`, asked of a serving member of each
//! chunk's chain, as a read is).
//!
//! Every chunk below the length is asked in turn, a few at once, and the metadata
//! server's record of the chunks a file holds is not used: it may count a chunk free
//! that holds data (README, `st_blocks`), and a copy by data ranges (`cp`, `tar -S`)
//! would then lose that chunk's bytes. A hole is a block never written or a written
//! block of zeros, so a copy by data ranges reads the same as the file.

use super::FileHandle;
use crate::error::{ClientError, Result};
use crate::Client;

/// Chunks asked about at once while a seek crosses holes: a run of chunks without data
/// costs one round of this many calls to the data servers.
const CHUNKS_IN_FLIGHT: u64 = 16;

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
    /// are sent first. Pages another process changed through a shared `mmap` that the
    /// kernel has not written back yet do not.
    pub async fn seek(&self, fh: &FileHandle, offset: u64, what: Seek) -> Result<u64> {
        let state = &fh.state;
        self.place_appends(state).await;
        self.flush_writes(state).await;
        let mut attr = self.getattr_asked(state.ino).await?;
        state.overlay(&mut attr);
        let size = attr.size;
        if offset >= size {
            return Err(ClientError::PastEnd(format!(
                "offset {offset} of a file of {size} bytes"
            )));
        }
        let cs = u64::from(state.layout.chunk_size_bytes);
        let last = (size - 1) / cs;
        let mut first = offset / cs;
        while first <= last {
            let batch: Vec<u64> = (first..=last.min(first + CHUNKS_IN_FLIGHT - 1)).collect();
            let asked = batch
                .iter()
                .map(|&i| self.data.chunk_data(&state.layout, state.ino, i));
            let answers = futures::future::try_join_all(asked).await?;
            for (&index, blocks) in batch.iter().zip(&answers) {
                let base = index * cs;
                let from = offset.saturating_sub(base);
                let found = match (what, blocks) {
                    (Seek::Data, None) => None,
                    (Seek::Data, Some(b)) => b.data_from(from),
                    (Seek::Hole, None) => Some(from),
                    (Seek::Hole, Some(b)) => Some(b.hole_from(from)).filter(|&h| h < cs),
                };
                if let Some(at) = found.map(|x| base + x) {
                    return answer(what, at, size, offset);
                }
            }
            first += batch.len() as u64;
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
