//! The node id the metadata server gave this data server, kept in `<dir>/node_id`.
//!
//! File: magic `b"TSRNODE1"`, format version u32, node id u32, crc32c of the preceding 16
//! bytes u32 (all little-endian). Saved by writing a temporary file, fsyncing it, renaming
//! it over the old one and fsyncing the directory, so a crash leaves the old id or the new.

use super::dirs::{remove_if_present, save_atomically};
use crate::error::DataError;
use proto::NodeId;
use std::fs;
use std::path::Path;

const FILE_NAME: &str = "node_id";
const TMP_NAME: &str = "node_id.tmp";
const MAGIC: [u8; 8] = *b"TSRNODE1";
const VERSION: u32 = 1;
const LEN: usize = 20;

pub(super) fn encode(node: NodeId) -> [u8; LEN] {
    let mut b = [0u8; LEN];
    b[0..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&node.0.to_le_bytes());
    let crc = crc32c::crc32c(&b[..16]);
    b[16..20].copy_from_slice(&crc.to_le_bytes());
    b
}

pub(super) fn decode(path: &Path, b: &[u8]) -> Result<NodeId, DataError> {
    let bad = |reason: &str| DataError::CorruptNodeId {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    if b.len() != LEN {
        return Err(bad(&format!("{} bytes instead of {LEN}", b.len())));
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    if b[0..8] != MAGIC {
        return Err(bad("bad magic"));
    }
    if crc32c::crc32c(&b[..16]) != u32_at(16) {
        return Err(bad("checksum mismatch"));
    }
    if u32_at(8) != VERSION {
        return Err(bad(&format!("unknown format version {}", u32_at(8))));
    }
    Ok(NodeId(u32_at(12)))
}

/// Reads the saved node id; `None` if none was ever saved.
pub(crate) fn load(dir: &Path) -> Result<Option<NodeId>, DataError> {
    let path = dir.join(FILE_NAME);
    match fs::read(&path) {
        Ok(bytes) => decode(&path, &bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(DataError::io(format!("read {}", path.display()), e)),
    }
}

/// Saves the node id durably, replacing any earlier one atomically.
pub(crate) fn save(dir: &Path, node: NodeId) -> Result<(), DataError> {
    save_atomically(dir, FILE_NAME, TMP_NAME, &encode(node))
}

/// Removes a temporary file a crash during [`save`] left behind.
pub(crate) fn remove_stale_tmp(dir: &Path) -> Result<(), DataError> {
    remove_if_present(&dir.join(TMP_NAME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_and_damage() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(load(tmp.path()).unwrap(), None);
        save(tmp.path(), NodeId(41)).unwrap();
        save(tmp.path(), NodeId(42)).unwrap();
        assert_eq!(load(tmp.path()).unwrap(), Some(NodeId(42)));
        assert!(!tmp.path().join(TMP_NAME).exists());
        let path = tmp.path().join(FILE_NAME);
        let mut bytes = fs::read(&path).unwrap();
        bytes[13] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert!(matches!(
            load(tmp.path()),
            Err(DataError::CorruptNodeId { .. })
        ));
        fs::write(&path, b"short").unwrap();
        assert!(matches!(
            load(tmp.path()),
            Err(DataError::CorruptNodeId { .. })
        ));
    }
}
