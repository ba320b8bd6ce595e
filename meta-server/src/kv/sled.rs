//! The sled 0.34 engine.

use super::wal::Engine;
use super::{BatchOp, KvError, KvPair, KvStore, WriteBatch};
use std::path::Path;
use std::time::{Duration, Instant};

const ENGINE: &str = "sled";

/// How long `open` waits for another holder of the database lock to let go.
///
/// sled 0.34 releases its file lock from background threads a moment after the last
/// handle is dropped, so an open right after a drop in the same process (a restart in a
/// test) can find the lock still held. A second server on the same directory still fails,
/// only later.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// A [`KvStore`] on one sled tree (the default tree of a sled database).
pub struct SledStore {
    db: ::sled::Db,
    /// sled's log file, opened a second time only to `fdatasync` it; see `commit`.
    log: std::fs::File,
}

impl SledStore {
    /// Opens or creates the sled database in directory `dir`.
    pub fn open(dir: &Path) -> Result<SledStore, KvError> {
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            // Every commit flushes explicitly; the background flusher would only add fsyncs.
            let opened = ::sled::Config::new().path(dir).flush_every_ms(None).open();
            match opened {
                Ok(db) => {
                    // sled 0.34 keeps its log in the file "db" of its directory.
                    let log = std::fs::File::open(dir.join("db"))
                        .map_err(|e| KvError::from_io(ENGINE, &e))?;
                    return Ok(SledStore { db, log });
                }
                // sled reports a held lock only as text inside an `Other` I/O error.
                Err(::sled::Error::Io(e))
                    if e.to_string().contains("could not acquire lock")
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(map_err(e)),
            }
        }
    }
}

impl Engine for SledStore {
    fn apply(&self, batch: &WriteBatch) -> Result<(), KvError> {
        // sled's Batch keeps one entry per key, the last one inserted: the order rule of
        // WriteBatch holds. apply_batch is atomic across crashes.
        let mut b = ::sled::Batch::default();
        for op in batch.ops() {
            match op {
                BatchOp::Put(k, v) => b.insert(k.as_slice(), v.as_slice()),
                BatchOp::Delete(k) => b.remove(k.as_slice()),
            }
        }
        self.db.apply_batch(b).map_err(map_err)
    }

    fn persist(&self) -> Result<(), KvError> {
        // flush writes the log out, but on Linux sled 0.34 ends it with sync_file_range,
        // which neither flushes the disk's write cache nor the file's metadata: enough
        // for kill -9, not for power loss. fdatasync on the same file closes that gap.
        self.db.flush().map_err(map_err)?;
        self.log
            .sync_data()
            .map_err(|e| KvError::from_io(ENGINE, &e))
    }
}

fn map_err(e: ::sled::Error) -> KvError {
    match e {
        ::sled::Error::Io(io) => KvError::from_io(ENGINE, &io),
        ::sled::Error::Corruption { at, .. } => KvError::Corruption {
            engine: ENGINE,
            message: format!("corruption at {at:?}"),
        },
        other => KvError::Engine {
            engine: ENGINE,
            message: other.to_string(),
        },
    }
}

impl KvStore for SledStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        Ok(self.db.get(key).map_err(map_err)?.map(|v| v.to_vec()))
    }

    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>, KvError> {
        // sled panics on an inverted range; the trait promises an empty answer instead.
        if start >= end {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for item in self.db.range(start..end).take(limit) {
            let (k, v) = item.map_err(map_err)?;
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    fn commit(&self, batch: WriteBatch) -> Result<(), KvError> {
        self.apply(&batch)?;
        self.persist()
    }

    fn engine(&self) -> &'static str {
        ENGINE
    }
}
