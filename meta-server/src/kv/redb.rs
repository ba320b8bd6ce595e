//! The redb 4 engine.

use super::wal::Engine;
use super::{BatchOp, KvError, KvPair, KvStore, WriteBatch};
use ::redb::{Database, Durability, ReadableDatabase, TableDefinition};
use std::path::Path;

const ENGINE: &str = "redb";

/// The one table every key lives in.
const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("tessera");

/// A [`KvStore`] on one table of a redb database file.
pub struct RedbStore {
    db: Database,
}

impl RedbStore {
    /// Opens or creates the redb database file at `path`.
    pub fn open(path: &Path) -> Result<RedbStore, KvError> {
        let db = Database::create(path).map_err(engine_err)?;
        // Create the table up front: a read of a table that was never written fails in redb,
        // and reads must see an empty store instead.
        let txn = db.begin_write().map_err(engine_err)?;
        txn.open_table(TABLE).map_err(engine_err)?;
        txn.commit().map_err(engine_err)?;
        Ok(RedbStore { db })
    }
}

impl RedbStore {
    /// One write transaction with the batch; `Immediate` syncs it before returning.
    fn write(&self, batch: &WriteBatch, durability: Durability) -> Result<(), KvError> {
        let mut txn = self.db.begin_write().map_err(engine_err)?;
        txn.set_durability(durability).map_err(engine_err)?;
        {
            let mut table = txn.open_table(TABLE).map_err(engine_err)?;
            for op in batch.ops() {
                match op {
                    BatchOp::Put(k, v) => {
                        table
                            .insert(k.as_slice(), v.as_slice())
                            .map_err(engine_err)?;
                    }
                    BatchOp::Delete(k) => {
                        table.remove(k.as_slice()).map_err(engine_err)?;
                    }
                }
            }
        }
        // Dropping an uncommitted transaction aborts it, so an error above leaves no trace.
        txn.commit().map_err(engine_err)?;
        Ok(())
    }
}

/// Behind the log (`kv::wal`), batches are applied without redb's own sync; an
/// empty transaction with immediate durability persists every earlier one.
impl Engine for RedbStore {
    fn apply(&self, batch: &WriteBatch) -> Result<(), KvError> {
        self.write(batch, Durability::None)
    }

    fn persist(&self) -> Result<(), KvError> {
        self.write(&WriteBatch::new(), Durability::Immediate)
    }
}

/// Maps any redb error, keeping a full disk and corruption apart from the rest.
fn engine_err(e: impl Into<::redb::Error>) -> KvError {
    match e.into() {
        ::redb::Error::Io(io) => KvError::from_io(ENGINE, &io),
        ::redb::Error::Corrupted(message) => KvError::Corruption {
            engine: ENGINE,
            message,
        },
        other => KvError::Engine {
            engine: ENGINE,
            message: other.to_string(),
        },
    }
}

impl KvStore for RedbStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        let txn = self.db.begin_read().map_err(engine_err)?;
        let table = txn.open_table(TABLE).map_err(engine_err)?;
        let value = table.get(key).map_err(engine_err)?;
        Ok(value.map(|v| v.value().to_vec()))
    }

    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>, KvError> {
        // Mirror the sled engine: an inverted range is empty, never an error or a panic.
        if start >= end {
            return Ok(Vec::new());
        }
        let txn = self.db.begin_read().map_err(engine_err)?;
        let table = txn.open_table(TABLE).map_err(engine_err)?;
        let mut out = Vec::new();
        for item in table.range(start..end).map_err(engine_err)?.take(limit) {
            let (k, v) = item.map_err(engine_err)?;
            out.push((k.value().to_vec(), v.value().to_vec()));
        }
        Ok(out)
    }

    fn commit(&self, batch: WriteBatch) -> Result<(), KvError> {
        self.write(&batch, Durability::Immediate)
    }

    fn engine(&self) -> &'static str {
        ENGINE
    }
}
