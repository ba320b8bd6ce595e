//! Entry points for the fuzz targets in `fuzz/` (issue 23): each decodes bytes as one of
//! the store's on-disk formats, as the store would read them from a damaged or hostile
//! disk, and asserts what must hold of whatever decodes. Not part of the API: nothing in
//! Tessera calls these, and they may change with the formats.

use super::format::{self, Entry};
use super::{node_id, replica, saved_usage};
use proto::{ChunkId, InodeId};
use std::path::Path;

/// The chunk the decoders name in their errors; any id does.
const CHUNK: ChunkId = ChunkId {
    inode: InodeId(1),
    index: 0,
};

/// Entries of a fuzzed table whose content is resolved against the fuzzed data.
const RESOLVED_ENTRIES: usize = 4;

/// A chunk file's first bytes: the header, the replica fields inside it, and (standing
/// for the table, which starts at the next page on disk) checksum table entries after them. A header that decodes names a geometry whose header
/// decodes to the same geometry; an entry that decodes as valid is its own encoding.
pub fn chunk_file(bytes: &[u8]) {
    if let Ok(geo) = format::decode_header(CHUNK, bytes) {
        let again = format::decode_header(CHUNK, &format::encode_header(geo));
        assert_eq!(again.ok(), Some(geo), "a decoded header re-encodes");
    }
    let fields_at = replica::AT as usize;
    if let Some(b) = bytes.get(fields_at..fields_at + replica::LEN) {
        let b: &[u8; replica::LEN] = b.try_into().expect("a slice of LEN bytes");
        if let Ok(f) = replica::decode(CHUNK, b) {
            if f != replica::ReplicaFields::default() {
                assert_eq!(&replica::encode(f), b, "valid replica fields are canonical");
            }
        }
    }
    let table = bytes.get(fields_at + replica::LEN..).unwrap_or_default();
    let entries = format::decode_entries(table);
    let data = table
        .get(entries.len() * format::ENTRY_BYTES..)
        .unwrap_or_default();
    for (entry, raw) in entries.iter().zip(table.chunks_exact(format::ENTRY_BYTES)) {
        match entry {
            Entry::Damaged => assert_eq!(Entry::decode(&Entry::Damaged.encode()), *entry),
            e => assert_eq!(&e.encode()[..], raw, "a valid entry is its own encoding"),
        }
    }
    // Resolving checksums a whole (zero-padded) block, of the largest size: a few
    // entries are enough, and keep the target fast.
    if let Ok(geo) = format::Geometry::new(format::MAX_CHUNK_SIZE_BYTES) {
        for entry in entries.iter().take(RESOLVED_ENTRIES) {
            let _ = entry.resolve(geo, data);
        }
    }
}

/// The saved node id file: whatever decodes is exactly the encoding of that id.
pub fn node_id(bytes: &[u8]) {
    if let Ok(node) = node_id::decode(Path::new("node_id"), bytes) {
        assert_eq!(
            &node_id::encode(node)[..],
            bytes,
            "a node id file is canonical"
        );
    }
}

/// The usage a clean shutdown saves: whatever decodes is exactly its encoding.
pub fn saved_usage(bytes: &[u8]) {
    if let Ok(saved) = saved_usage::decode(bytes) {
        assert_eq!(
            &saved_usage::encode(saved)[..],
            bytes,
            "saved usage is canonical"
        );
    }
}

/// A file name met while scanning the chunk directories: one that parses as a chunk's
/// is exactly the name the store gives that chunk.
pub fn chunk_name(name: &str) {
    if let Some(index) = format::parse_chunk_name(name) {
        assert_eq!(
            format!("{index:016x}.chunk"),
            name,
            "a chunk name is canonical"
        );
    }
}
