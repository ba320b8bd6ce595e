//! Entry points for the fuzz targets in `fuzz/` (issue 23): each decodes bytes as the
//! metadata server would read them from its store or its log, and asserts what must hold
//! of whatever decodes. Not part of the API: nothing in Tessera calls these, and they may
//! change with the formats.

use crate::kv::wal;
use crate::namespace::records::{
    decode, encode, ChainRecord, DirentRecord, InodeRecord, NodeRecord, Superblock,
};
use crate::namespace::{ClientRecord, RevocationRecord};
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Debug;

/// Decodes `bytes` as a stored `T`; what decodes encodes to a record that decodes back
/// to the same value.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(bytes: &[u8]) {
    if let Ok(rec) = decode::<T>(bytes, "fuzzed record") {
        let again = encode(&rec).expect("a decoded record encodes");
        let back = decode::<T>(&again, "re-encoded record").expect("and decodes again");
        assert_eq!(back, rec, "a record survives a round trip");
    }
}

/// One stored value of the namespace: `kind` picks which record type the bytes are read
/// as (every value type under the key schema of `namespace::keys`).
pub fn namespace_record(kind: u8, bytes: &[u8]) {
    match kind % 9 {
        0 => round_trip::<Superblock>(bytes),
        1 => round_trip::<InodeRecord>(bytes),
        2 => round_trip::<DirentRecord>(bytes),
        3 => round_trip::<NodeRecord>(bytes),
        4 => round_trip::<ChainRecord>(bytes),
        // The cluster map version.
        5 => round_trip::<u64>(bytes),
        // A client's key id, capabilities and revocation.
        6 => round_trip::<ClientRecord>(bytes),
        // A revoked client key.
        7 => round_trip::<RevocationRecord>(bytes),
        // Extended attribute values and the directory layout attribute.
        _ => round_trip::<Vec<u8>>(bytes),
    }
}

/// The body of one metadata log record (a write batch): what decodes is exactly the
/// encoding of that batch.
pub fn log_record(bytes: &[u8]) {
    if let Some(batch) = wal::decode(bytes) {
        assert_eq!(wal::encode(&batch), bytes, "a log record is canonical");
    }
}
