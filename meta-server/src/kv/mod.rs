//! The key-value store under the namespace: one small trait, three engines.
//!
//! The namespace only needs point reads, ordered range scans and atomic, durable batches,
//! so that is all [`KvStore`] offers. [`TxnStore`] adds what several metadata servers on
//! one engine will need (issue 24): reads that carry a [`Revision`] and commits that hold
//! only if what was read is unchanged. Every engine (redb and sled in this process, etcd
//! over the network) passes one conformance suite (`conformance`), which is what lets the
//! configuration choose between them.

pub mod deadline;
pub mod etcd;
mod group;
mod redb;
mod revisions;
mod sled;
pub(crate) mod wal;

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod conformance_txn;

pub use self::etcd::{EtcdConfig, EtcdStore};
pub use self::group::{
    lazily, lazily_within, staging_for, take_pending, with_local, Early, GroupCommit,
    GroupObserver, LAZY_DELAY,
};
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
    /// A transaction read `key` at a revision that is no longer its current one (or read
    /// it absent and it exists, or the reverse): nothing was written. Read again and retry.
    #[error(
        "{engine} store: conflict: key {} changed since it was read",
        Escaped(key)
    )]
    Conflict {
        /// Name of the engine.
        engine: &'static str,
        /// The first key found changed.
        key: Vec<u8>,
    },
    /// A transaction is over one of the engine's limits ([`TxnStore::limits`]); nothing
    /// was written. The message names the limit and the setting behind it.
    #[error("{engine} store: transaction too large: {message}")]
    TooLarge {
        /// Name of the engine.
        engine: &'static str,
        /// Which limit, by how much.
        message: String,
    },
    /// The engine could not be reached, or did not answer, within the configured time;
    /// the message says whether a change may have been applied all the same.
    #[error("{engine} store unavailable: {message}")]
    Unavailable {
        /// Name of the engine.
        engine: &'static str,
        /// What failed, and for how long it was retried.
        message: String,
    },
}

/// Shows a key as text where it is printable, `\xNN` elsewhere.
pub(crate) struct Escaped<'a>(pub(crate) &'a [u8]);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
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

    /// Logs a group of batches, each atomic on its own ([`GroupCommit`] stages them
    /// apart), as [`KvStore::log`] does. The default merges them into one batch; an
    /// engine with a per-transaction limit (etcd) packs them into several transactions,
    /// cutting only between batches.
    fn log_group(&self, batches: &[WriteBatch]) -> Result<bool, KvError> {
        let mut merged = WriteBatch::new();
        for b in batches {
            merged.extend(b.clone());
        }
        self.log(&merged)
    }

    /// Refuses, before anything is staged, a batch that this engine could never commit
    /// (over a transaction limit); group commit asks, so that only the caller of that
    /// batch hears it.
    fn check_batch(&self, _batch: &WriteBatch) -> Result<(), KvError> {
        Ok(())
    }

    /// Whether reads are local and brief (an embedded engine): the server may then run
    /// point reads on its async workers. A store across the network answers `false`.
    fn reads_are_local(&self) -> bool {
        true
    }

    /// The engine's name, for logs.
    fn engine(&self) -> &'static str;
}

/// The version of a key's value in a store: a new value gets a new, higher revision, so
/// a transaction can check that a key is unchanged since it read it.
///
/// Revisions of different keys are comparable only for order within one engine
/// (etcd's `mod_revision`, the store-wide revision of the key's last write; in the
/// embedded engines, a counter of this process, see `revisions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(pub u64);

/// A value with the revision it was read at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    /// The value.
    pub value: Vec<u8>,
    /// Its revision.
    pub revision: Revision,
}

/// What a transaction read of one key, checked again at commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadCheck {
    /// The key.
    pub key: Vec<u8>,
    /// The revision read; `None`: the key was absent (and must still be).
    pub revision: Option<Revision>,
}

impl ReadCheck {
    /// The check for what [`TxnStore::get_versioned`] answered for `key`.
    pub fn of(key: impl Into<Vec<u8>>, read: &Option<Versioned>) -> ReadCheck {
        ReadCheck {
            key: key.into(),
            revision: read.as_ref().map(|v| v.revision),
        }
    }
}

/// The most a transaction may carry; `None` where the engine sets no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnLimits {
    /// Checks, and (separately) puts and deletes after one operation per key is kept.
    pub max_ops: Option<usize>,
    /// Bytes of keys and values of one transaction, as the engine counts them.
    pub max_bytes: Option<usize>,
}

/// The engine interface of issue 24: a [`KvStore`] whose reads carry revisions and whose
/// commits can be made conditional on them (optimistic transactions).
///
/// Narrow on purpose: point reads with a revision, and one commit that compares the
/// revisions of the keys read (or their absence) and applies a [`WriteBatch`] all or
/// nothing. etcd does it in one `Txn`; TiKV's and FoundationDB's optimistic
/// transactions (a read version, writes buffered, conflicts found at commit) do it with
/// the reads made inside the transaction (see ARCHITECTURE.md).
pub trait TxnStore: KvStore {
    /// The value under `key` and its revision, if the key exists.
    fn get_versioned(&self, key: &[u8]) -> Result<Option<Versioned>, KvError>;

    /// Applies `batch` atomically and durably if every check holds at the moment of the
    /// commit; otherwise writes nothing and answers [`KvError::Conflict`] naming a key
    /// that changed. A batch over [`TxnStore::limits`] is [`KvError::TooLarge`].
    fn commit_if(&self, checks: &[ReadCheck], batch: WriteBatch) -> Result<(), KvError>;

    /// This engine's limits on one transaction.
    fn limits(&self) -> TxnLimits;

    /// [`TxnStore::get_versioned`] as the store was at its store-wide revision `at`
    /// (`None`: now), and the revision read at: reads that pass on the first one's
    /// revision see one moment of the store, whatever commits land between them. An
    /// engine without such revisions (an embedded one, which one server uses) reads now
    /// and answers `None`. A revision the engine no longer keeps (etcd compacted it) is a
    /// [`KvError::Conflict`] naming no key (an empty one): the caller reads again from
    /// now.
    fn get_at(
        &self,
        key: &[u8],
        _at: Option<Revision>,
    ) -> Result<(Option<Versioned>, Option<Revision>), KvError> {
        Ok((self.get_versioned(key)?, None))
    }

    /// [`KvStore::scan`] as the store was at `at`, as [`TxnStore::get_at`] reads.
    fn scan_at(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        _at: Option<Revision>,
    ) -> Result<(Vec<KvPair>, Option<Revision>), KvError> {
        Ok((self.scan(start, end, limit)?, None))
    }

    /// Puts `key` (absent until now) for as long as the returned handle lives and
    /// renews it: how a metadata server on a shared engine says it is alive (see
    /// `namespace::sweep`). On etcd the key goes with a lease (`etcd.owner_lease_ms`)
    /// when the process dies, is cut off, or drops the handle. An embedded engine
    /// serves one process, which no other server outlives: the key is only put, and
    /// stays until deleted.
    fn hold_live(&self, key: &[u8], value: &[u8]) -> Result<LiveKey, KvError> {
        let absent = ReadCheck {
            key: key.to_vec(),
            revision: None,
        };
        let mut batch = WriteBatch::new();
        batch.put(key.to_vec(), value.to_vec());
        self.commit_if(&[absent], batch)?;
        let revision = self
            .get_versioned(key)?
            .ok_or_else(|| KvError::Engine {
                engine: self.engine(),
                message: "a live key vanished as it was put".into(),
            })?
            .revision;
        Ok(LiveKey {
            revision,
            holder: Box::new(()),
        })
    }
}

/// What keeps a live key alive, and tells when it no longer is (see
/// [`TxnStore::hold_live`]); dropping it lets the key go.
pub trait KeepsAlive: Send + Sync {
    /// Whether the key is known gone (its lease expired, or was not renewed in time).
    fn lost(&self) -> bool;

    /// Stops renewing without releasing, as a process killed with SIGKILL does: the
    /// key goes when its lease runs out. For tests.
    #[cfg(test)]
    fn abandon(self: Box<Self>) {}
}

/// Nothing to renew: the key of an embedded engine is never lost.
impl KeepsAlive for () {
    fn lost(&self) -> bool {
        false
    }
}

/// A key held while this value lives ([`TxnStore::hold_live`]).
pub struct LiveKey {
    /// The revision the key was put at; it keeps it while held (renewals do not write
    /// it), so a commit may check it as a fence.
    pub revision: Revision,
    holder: Box<dyn KeepsAlive>,
}

impl LiveKey {
    /// A key kept by `holder`, put at `revision`.
    pub fn new(revision: Revision, holder: Box<dyn KeepsAlive>) -> LiveKey {
        LiveKey { revision, holder }
    }

    /// Whether the key is known gone.
    pub fn lost(&self) -> bool {
        self.holder.lost()
    }

    /// See [`KeepsAlive::abandon`]. For tests.
    #[cfg(test)]
    pub fn abandon(self) {
        self.holder.abandon()
    }
}

/// Which engine to run the namespace on; configuration names them `"sled"`, `"redb"` and
/// `"etcd"` (whose endpoints and key prefix are [`EtcdConfig`]).
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
    /// An etcd v3 cluster: each commit one `Txn`, nothing kept in this process.
    Etcd,
}

impl StoreKind {
    /// Every engine.
    pub const ALL: [StoreKind; 3] = [StoreKind::Sled, StoreKind::Redb, StoreKind::Etcd];
    /// The engines kept in a local directory, for tests and benchmarks that need no
    /// etcd.
    pub const EMBEDDED: [StoreKind; 2] = [StoreKind::Sled, StoreKind::Redb];

    /// The engine's configuration name.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Sled => "sled",
            StoreKind::Redb => "redb",
            StoreKind::Etcd => "etcd",
        }
    }

    /// The engine of configuration name `name`.
    pub fn from_name(name: &str) -> Option<StoreKind> {
        StoreKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Opens (creating if needed) the embedded store of engine `kind` inside directory `dir`;
/// etcd needs its endpoints: [`open_engine`].
///
/// Each engine keeps its files under its own name in `dir` (`dir/sled/`,
/// `dir/meta.redb`, each with its log `dir/<name>.wal`), so switching the engine in the
/// configuration never feeds one engine's files to the other.
pub fn open_store(kind: StoreKind, dir: &Path) -> Result<Arc<dyn TxnStore>, KvError> {
    open_engine(kind, dir, &EtcdConfig::default())
}

/// Opens the store of engine `kind`: an embedded one in `dir`, or etcd as `etcd` says.
pub fn open_engine(
    kind: StoreKind,
    dir: &Path,
    etcd: &EtcdConfig,
) -> Result<Arc<dyn TxnStore>, KvError> {
    open_engine_fenced(kind, dir, etcd, None)
}

/// [`open_engine`]; on etcd every commit fenced by `fence`, the owner key and the lease
/// this server holds it under (see `etcd/owner.rs`).
pub fn open_engine_fenced(
    kind: StoreKind,
    dir: &Path,
    etcd: &EtcdConfig,
    fence: Option<(String, i64)>,
) -> Result<Arc<dyn TxnStore>, KvError> {
    if kind != StoreKind::Etcd {
        std::fs::create_dir_all(dir).map_err(|e| KvError::from_io(kind.name(), &e))?;
    }
    Ok(match kind {
        StoreKind::Etcd => {
            let store = EtcdStore::connect(etcd)?;
            Arc::new(match fence {
                Some((key, lease)) => store.fenced_by(key, lease),
                None => store,
            })
        }
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
            assert_eq!(StoreKind::from_name(kind.name()), Some(kind));
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
