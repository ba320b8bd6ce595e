//! Which blocks of a chunk hold data (`SEEK_DATA`, `SEEK_HOLE`; `proto::data::ChunkData`).
//!
//! A block never written is a hole. So is a written block of zeros: a hole punched
//! inside a chunk and zeros written are stored as zero bytes with the zero block's crc
//! (`replica.rs`), and a copy of the file by its data ranges reads the same without
//! them. An entry naming the zero block's crc is not enough: a block of data whose crc
//! happened to match would be called a hole, and such a copy would lose it, so those
//! blocks are read and looked at. Every other entry counts as data, pending and damaged
//! ones too (a read tells which).

use super::chunk::{ChunkFile, Opened};
use super::format::{read_entries, Entry, Geometry};
use super::ChunkStore;
use crate::error::{DataError, IoContext};
use proto::ChunkId;

/// Most blocks of zeros read in one `pread` while checking them: 256 KiB of 4 KiB
/// blocks, 4 MiB of a version 2 file's 64 KiB ones.
const ZERO_CHECK_BLOCKS: usize = 64;

impl ChunkStore {
    /// Which blocks of the chunk hold data (see [`proto::data::ChunkData`]); `None` for a
    /// missing chunk.
    pub fn data_blocks(
        &self,
        chunk: ChunkId,
        chunk_size: u32,
    ) -> Result<Option<proto::data::DataBlocks>, DataError> {
        Geometry::new(chunk_size)?;
        let _shared = self.read_lock(chunk);
        match self.open_chunk(chunk)? {
            Opened::Missing | Opened::Empty(_) => Ok(None),
            Opened::Chunk(cf) => {
                cf.check_chunk_size(chunk_size)?;
                let runs = cf.data_blocks()?;
                Ok(Some(proto::data::DataBlocks {
                    block_bytes: cf.geo.block_size,
                    runs,
                }))
            }
        }
    }
}

impl ChunkFile {
    /// Runs `[first, end)` of the blocks below the data's end that hold data.
    pub fn data_blocks(&self) -> Result<Vec<(u32, u32)>, DataError> {
        if self.data_len == 0 {
            return Ok(Vec::new());
        }
        let geo = self.geo;
        let bs = geo.block_size as usize;
        let last = geo.block_of(self.data_len - 1);
        let entries = read_entries(&self.file, geo, (0, last), &self.path)?;
        let zero_crc = geo.block_crc(&[]);
        let zero_entry = |e: &Entry| *e == Entry::Stable(zero_crc);
        let mut data = vec![true; entries.len()];
        let mut buf = Vec::new();
        let mut i = 0;
        while i < entries.len() {
            if entries[i] == Entry::Unwritten {
                data[i] = false;
                i += 1;
                continue;
            }
            if !zero_entry(&entries[i]) {
                i += 1;
                continue;
            }
            let run = entries[i..]
                .iter()
                .take(ZERO_CHECK_BLOCKS)
                .take_while(|e| zero_entry(e))
                .count();
            buf.resize(run * bs, 0);
            let pos = geo.data_offset + geo.block_start(i as u32);
            self.read_run(&mut buf, pos)
                .ctx(|| format!("read {}", self.path.display()))?;
            self.forget_read(geo.block_start(i as u32), buf.len());
            for (k, block) in buf.chunks(bs).enumerate() {
                // A non-zero byte is data: a block whose crc matched the zero block's, or
                // damage, which a read reports.
                data[i + k] = block.iter().any(|&b| b != 0);
            }
            i += run;
        }
        Ok(runs_of(&data))
    }
}

/// The runs `[first, end)` of `true` in `flags`.
fn runs_of(flags: &[bool]) -> Vec<(u32, u32)> {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for (b, _) in (0u32..).zip(flags).filter(|(_, &f)| f) {
        match runs.last_mut() {
            Some(run) if run.1 == b => run.1 = b + 1,
            _ => runs.push((b, b + 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::runs_of;

    #[test]
    fn runs_join_neighbouring_blocks() {
        assert_eq!(runs_of(&[]), []);
        assert_eq!(runs_of(&[false, true, true, false, true]), [(1, 3), (4, 5)]);
        assert_eq!(runs_of(&[true; 3]), [(0, 3)]);
    }
}
