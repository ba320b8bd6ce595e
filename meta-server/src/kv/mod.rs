//! The embedded key-value store under the namespace: one small trait, two engines.
//!
//! The namespace only needs point reads, ordered range scans and atomic, durable batches,
//! so that is all [`KvStore`] offers. Both engines pass one conformance suite
//! (`conformance`), which is what lets the configuration choose between them.

mod group;
mod redb;
mod sled;
pub(crate) mod wal;

#[cfg(test)]
mod conformance;

pub use self::group::{lazily, take_pending, GroupCommit, LAZY_DELAY};
pub use self::redb::RedbStore;
pub use self::sled::SledStore;
pub use self::wal::{Engine, LoggedStore};

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

/// Errors of a key-value engine.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The engine failed (I/O error, bug, misuse); the message says how.
    #[error("{engine} store: {message}")]
    Engine {
        /// Name of the engine, as [`KvStore::engine`] gives it.
        engine: &'static str,
        /// What went wrong.
        message: String,
    },
    /// The engine found its files damaged.
    #[error("{engine} store is corrupt: {message}")]
    Corruption {
        /// Name of the engine.
        engine: &'static str,
        /// What the engine reported.
        message: String,
    },
    /// The disk under the store is full.
    #[error("{engine} store: no space left on device: {message}")]
    NoSpace {
        /// Name of the engine.
        engine: &'static str,
        /// What the engine reported.
        message: String,
    },
}

impl KvError {
    /// Classifies an I/O error: a full disk must reach the client as `NoSpace`, not `Io`.
    pub(crate) fn from_io(engine: &'static str, e: &std::io::Error) -> KvError {
        let message = e.to_string();
        // ENOSPC is 28 on Linux; the kind check covers platforms where the number differs.
        if e.kind() == std::io::ErrorKind::StorageFull || e.raw_os_error() == Some(28) {
            KvError::NoSpace { engine, message }
        } else {
            KvError::Engine { engine, message }
        }
    }
}

/// A key and its value, as [`KvStore::scan`] returns them.
pub type KvPair = (Vec<u8>, Vec<u8>);

/// One operation of a [`WriteBatch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchOp {
    /// Sets `key` to `value`.
    Put(Vec<u8>, Vec<u8>),
    /// Removes `key` (no error if it is absent).
    Delete(Vec<u8>),
}

/// An ordered list of puts and deletes applied all together or not at all.
///
/// Operations apply in order, so when one key appears twice the later operation wins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<BatchOp>,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> WriteBatch {
        WriteBatch::default()
    }

    /// Appends a put of `value` under `key`.
    pub fn put(&mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.ops.push(BatchOp::Put(key.into(), value.into()));
    }

    /// Appends a delete of `key`.
    pub fn delete(&mut self, key: impl Into<Vec<u8>>) {
        self.ops.push(BatchOp::Delete(key.into()));
    }

    /// The operations in the order they apply.
    pub fn ops(&self) -> &[BatchOp] {
        &self.ops
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch has no operation.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Appends every operation of `other`, after this batch's own.
    pub fn extend(&mut self, other: WriteBatch) {
        self.ops.extend(other.ops);
    }
}

impl BatchOp {
    /// The key, and the value a put stores (`None` for a delete).
    pub fn key_value(&self) -> (&[u8], Option<&[u8]>) {
        match self {
            BatchOp::Put(k, v) => (k, Some(v)),
            BatchOp::Delete(k) => (k, None),
        }
    }
}

/// A sorted, durable key-value store of byte strings.
///
/// Keys order by their bytes (lexicographically, unsigned), which is why the namespace
/// encodes integers big-endian in its keys.
pub trait KvStore: Send + Sync + 'static {
    /// The value stored under `key`, if any.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError>;

    /// Up to `limit` pairs with `start <= key < end`, ascending by key bytes.
    ///
    /// An empty or inverted range (`start >= end`) yields nothing.
    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>, KvError>;

    /// Applies every put and delete of the batch atomically, and durably (on stable
    /// storage, surviving kill -9 and power loss as far as the engine allows) before
    /// returning.
    fn commit(&self, batch: WriteBatch) -> Result<(), KvError>;

    /// Makes the batch durable, and applies it too unless the store has a log to put it
    /// in first. Returns whether [`KvStore::apply_logged`] must still be called before
    /// reads of this store see it; until then the caller keeps the batch visible itself
    /// ([`GroupCommit`] does, in its overlay). The caller logs one batch at a time and
    /// applies logged batches in the order they were logged.
    fn log(&self, batch: &WriteBatch) -> Result<bool, KvError> {
        self.commit(batch.clone())?;
        Ok(false)
    }

    /// Applies a batch that [`KvStore::log`] made durable but did not apply. An error
    /// means the batch is durable but the store refuses further changes.
    fn apply_logged(&self, _batch: &WriteBatch) -> Result<(), KvError> {
        Ok(())
    }

    /// Applies the batch so that every later read sees it, and returns a ticket to
    /// [`KvStore::wait`] on for its durability; `None` when it is durable already. Engines
    /// commit synchronously; [`GroupCommit`] stages and commits in groups.
    fn stage(&self, batch: WriteBatch) -> Result<Option<u64>, KvError> {
        self.commit(batch).map(|()| None)
    }

    /// Waits until the batch of `ticket` (and every batch staged before it) is durable.
    fn wait(&self, _ticket: u64) -> Result<(), KvError> {
        Ok(())
    }

    /// The engine's name, for logs.
    fn engine(&self) -> &'static str;
}

/// Which engine to run the namespace on; configuration names them `"sled"` and `"redb"`.
///
/// The default is redb: both engines pass the conformance and kill -9 suites, and sled
/// creates faster (`examples/kv_bench.rs`), but redb makes its commits durable with its
/// own fdatasync (sled 0.34 needs the extra one `SledStore` adds), takes less disk for
/// the same keys, and is maintained, where sled 0.34 is a 2021 release.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// sled 0.34: a log-structured tree. Behind the redo log each commit is `apply_batch`;
    /// a checkpoint is `flush` and fdatasync.
    Sled,
    /// redb 4: a copy-on-write B-tree file. Behind the redo log each commit is one write
    /// transaction without durability; a checkpoint is one with immediate durability.
    #[default]
    Redb,
}

impl StoreKind {
    /// Every engine, for tests and benchmarks that run on each.
    pub const ALL: [StoreKind; 2] = [StoreKind::Sled, StoreKind::Redb];

    /// The engine's configuration name.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Sled => "sled",
            StoreKind::Redb => "redb",
        }
    }
}

/// Opens (creating if needed) the store of engine `kind` inside directory `dir`.
///
/// Each engine keeps its files under its own name in `dir` (`dir/sled/`,
/// `dir/meta.redb`, each with its log `dir/<name>.wal`), so switching the engine in the configuration never feeds one
/// engine's files to the other.
pub fn open_store(kind: StoreKind, dir: &Path) -> Result<Arc<dyn KvStore>, KvError> {
    std::fs::create_dir_all(dir).map_err(|e| KvError::from_io(kind.name(), &e))?;
    Ok(match kind {
        StoreKind::Sled => Arc::new(LoggedStore::open(
            SledStore::open(&dir.join("sled"))?,
            &dir.join("sled.wal"),
        )?),
        StoreKind::Redb => Arc::new(LoggedStore::open(
            RedbStore::open(&dir.join("meta.redb"))?,
            &dir.join("meta.redb.wal"),
        )?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::value::{Error, StrDeserializer};
    use serde::de::IntoDeserializer;

    #[test]
    fn store_kinds_have_lowercase_config_names() {
        for kind in StoreKind::ALL {
            let de: StrDeserializer<'_, Error> = kind.name().into_deserializer();
            assert_eq!(StoreKind::deserialize(de).unwrap(), kind);
        }
        let de: StrDeserializer<'_, Error> = "Sled".into_deserializer();
        assert!(StoreKind::deserialize(de).is_err());
    }

    #[test]
    fn open_store_keeps_engines_apart() {
        // Guards against one engine opening the other's files after a config change.
        let dir = tempfile::tempdir().unwrap();
        let sled = open_store(StoreKind::Sled, dir.path()).unwrap();
        let mut b = WriteBatch::new();
        b.put(b"k".to_vec(), b"sled".to_vec());
        sled.commit(b).unwrap();
        let redb = open_store(StoreKind::Redb, dir.path()).unwrap();
        assert_eq!(redb.get(b"k").unwrap(), None);
        assert_eq!(sled.get(b"k").unwrap(), Some(b"sled".to_vec()));
    }
}
