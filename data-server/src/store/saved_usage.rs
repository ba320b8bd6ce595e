//! The store's usage saved at a clean shutdown, in `<dir>/usage`, so that the next start
//! need not open every chunk file to count it: that count reads each chunk's header and
//! checksum table, a disk read per chunk, minutes for millions of chunks.
//!
//! The file is taken (read, then removed durably) when the store opens, before anything
//! can change the store: a server that stops any other way (a crash, a kill) leaves no
//! file, and its next start counts. It is written only after every chunk operation has
//! ended and the file system is synced, so it describes what the disk holds.
//!
//! File: magic `b"TSRUSAG1"`, format version u32, used bytes u64, chunk files u64,
//! crc32c of the preceding 28 bytes u32 (all little-endian).

use super::dirs::{fsync_dir, remove_if_present, save_atomically, syncfs};
use crate::error::DataError;
use std::path::Path;

const FILE_NAME: &str = "usage";
const TMP_NAME: &str = "usage.tmp";
const MAGIC: [u8; 8] = *b"TSRUSAG1";
const VERSION: u32 = 1;
const LEN: usize = 32;

/// Bytes charged to chunks and the number of chunk files, as [`super::Usage`] has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Saved {
    pub used_bytes: u64,
    pub chunks: u64,
}

pub(super) fn encode(u: Saved) -> [u8; LEN] {
    let mut b = [0u8; LEN];
    b[0..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..20].copy_from_slice(&u.used_bytes.to_le_bytes());
    b[20..28].copy_from_slice(&u.chunks.to_le_bytes());
    let crc = crc32c::crc32c(&b[..28]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The saved usage, or why it cannot be used.
pub(super) fn decode(b: &[u8]) -> Result<Saved, String> {
    if b.len() != LEN {
        return Err(format!("{} bytes instead of {LEN}", b.len()));
    }
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    if b[0..8] != MAGIC {
        return Err("bad magic".into());
    }
    if crc32c::crc32c(&b[..28]) != u32_at(28) {
        return Err("checksum mismatch".into());
    }
    if u32_at(8) != VERSION {
        return Err(format!("unknown format version {}", u32_at(8)));
    }
    Ok(Saved {
        used_bytes: u64_at(12),
        chunks: u64_at(20),
    })
}

/// Reads the usage a clean shutdown saved in `dir` and removes the file durably, so that
/// it is used at most once. `None` when there is none, or it is damaged (then the caller
/// counts, as after a crash).
pub(crate) fn take(dir: &Path) -> Result<Option<Saved>, DataError> {
    remove_if_present(&dir.join(TMP_NAME))?;
    let path = dir.join(FILE_NAME);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DataError::io(format!("read {}", path.display()), e)),
    };
    remove_if_present(&path)?;
    fsync_dir(dir)?;
    match decode(&bytes) {
        Ok(saved) => Ok(Some(saved)),
        Err(reason) => {
            tracing::warn!(path = %path.display(), %reason,
                "saved usage not usable: counting the chunks");
            Ok(None)
        }
    }
}

/// Syncs the file system holding `dir`, then saves `usage` in `dir`. The caller makes
/// sure nothing changes the store any more.
pub(crate) fn save(dir: &Path, usage: Saved) -> Result<(), DataError> {
    syncfs(dir)?;
    save_atomically(dir, FILE_NAME, TMP_NAME, &encode(usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_usage_is_taken_once_and_a_damaged_one_is_not_used() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(take(tmp.path()).unwrap(), None);
        let u = Saved {
            used_bytes: 5 << 40,
            chunks: 3_000_000,
        };
        save(tmp.path(), u).unwrap();
        assert_eq!(take(tmp.path()).unwrap(), Some(u));
        assert_eq!(take(tmp.path()).unwrap(), None, "taken once");
        let path = tmp.path().join(FILE_NAME);
        let mut bytes = encode(u).to_vec();
        bytes[21] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(take(tmp.path()).unwrap(), None, "checksum mismatch");
        assert!(!path.exists(), "a damaged file goes too");
        std::fs::write(&path, b"short").unwrap();
        assert_eq!(take(tmp.path()).unwrap(), None);
        assert_eq!(decode(b"short"), Err("5 bytes instead of 32".into()));
    }
}
