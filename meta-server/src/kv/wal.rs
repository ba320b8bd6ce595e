//! A redo log in front of an engine: a commit is durable after one small sequential write
//! that is durable when it returns (`O_DSYNC`), instead of the engine's own durable commit.
//!
//! Why: a durable redb commit rewrites a handful of B-tree pages scattered over its file
//! and syncs them, while appending a few hundred bytes to a file that already has its
//! blocks and syncing it costs a fraction of that. Every namespace change waits for one
//! commit (creates in one directory are serialized by the kernel, so group commit cannot
//! share it), so this is most of a create's time on the server.
//!
//! How: [`KvStore::log`] appends the batch as one record to `<engine>.wal` (opened
//! `O_DSYNC`, so the write returns once the record is durable); [`KvStore::apply_logged`]
//! then applies it to the engine *without* the engine's durability ([`Engine::apply`]),
//! which group commit does after the waiters are answered ([`KvStore::commit`] does both). A checkpoint ([`Engine::persist`], then the log's header moved
//! past the last record) runs when the log holds [`CHECKPOINT_BYTES`] or its oldest
//! unpersisted record is [`CHECKPOINT_AFTER`] old, and on close; after it the log is
//! rewritten from its start, so the file never grows beyond [`CHECKPOINT_BYTES`] plus one
//! record and [`GROW_BYTES`] of zeros written ahead. Opening replays every record newer than the header's checkpoint, in order.
//! Replaying a record the engine already has is harmless: a record holds whole values
//! (puts and deletes), so applying the tail again in order ends in the same state.
//!
//! File layout (little-endian):
//! - two header slots at offsets 0 and [`SLOT_BYTES`], written alternately, each
//!   `magic(8) generation(8) checkpoint_seq(8) crc32c(4)`; the valid slot with the
//!   higher generation wins, so a torn header write leaves the other one;
//! - records from [`RECORDS_AT`]: `len(4) crc32c(4) seq(8) body(len)`, the crc over
//!   `seq` and `body`. Reading stops at the first record whose crc fails or whose seq is
//!   not the next one: what follows it is a torn write or an older pass over the file.

use super::revisions::Revisions;
use super::{BatchOp, KvError, KvPair, KvStore, WriteBatch};
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const ENGINE: &str = "wal";
const MAGIC: &[u8; 8] = b"TSRWAL01";
/// Bytes per header slot (one disk sector: a slot is written whole or not at all on
/// most disks, and the second slot covers the rest).
const SLOT_BYTES: u64 = 512;
/// Where records start: after both header slots, on a page boundary.
const RECORDS_AT: u64 = 4096;
/// Bytes of a record's own header: length, crc, sequence number.
const RECORD_HEAD: usize = 16;
/// The log is checkpointed once its records take this many bytes: replay after a crash
/// reads at most this much (plus one record), and the file stays this small.
pub const CHECKPOINT_BYTES: u64 = 4 << 20;
/// ... or once its oldest record is this old, so that the engine's non-durable commits
/// (which redb cannot reuse the space of until a durable one) do not pile up.
pub const CHECKPOINT_AFTER: Duration = Duration::from_secs(2);
/// The file grows by at least this much at a time, zero-filled; see [`Log::grow_to`].
const GROW_BYTES: u64 = 1 << 20;
/// A batch bigger than this is not logged: the engine commits it durably itself (after
/// a checkpoint, so the order of changes holds). No namespace change comes near it.
const MAX_RECORD_BODY: usize = 1 << 20;

/// What the log needs from an engine beyond [`KvStore`]'s reads.
pub trait Engine: KvStore {
    /// Applies the batch atomically, visible to later reads, durable or not.
    fn apply(&self, batch: &WriteBatch) -> Result<(), KvError>;
    /// Makes every batch applied so far durable.
    fn persist(&self) -> Result<(), KvError>;
}

/// An [`Engine`] behind a redo log; see the module documentation.
pub struct LoggedStore<E: Engine> {
    pub(super) engine: E,
    log: Mutex<Log>,
    /// Held by [`KvStore::commit`] (and `commit_if`) from logging to applying.
    pub(super) order: Mutex<()>,
    /// Each key's revision (`super::revisions`). Held while the engine applies a batch
    /// and while a versioned read reads, so a value and its revision always agree.
    /// Taken before `log`, never after.
    pub(super) revs: Mutex<Revisions>,
}

struct Log {
    file: File,
    path: PathBuf,
    /// Where the next record goes.
    end: u64,
    /// Bytes of the file already written (records or zeros): writes below this are
    /// overwrites, which change no file-system metadata.
    written: u64,
    /// Sequence number of the last record written (or of the checkpoint, when none).
    seq: u64,
    /// Sequence number of the last record the engine has applied: a checkpoint waits
    /// until it is `seq`, or it would skip records the engine lacks.
    applied: u64,
    /// Header generation last written.
    generation: u64,
    /// When the oldest record not yet checkpointed was written.
    oldest: Option<Instant>,
    /// Set after a failed write or sync: the file's state is unknown, so every later
    /// commit is refused until a restart replays what is on disk.
    failed: Option<String>,
}

fn io_err(e: &std::io::Error) -> KvError {
    KvError::from_io(ENGINE, e)
}

fn corrupt(path: &Path, what: &str) -> KvError {
    KvError::Corruption {
        engine: ENGINE,
        message: format!("{}: {what}", path.display()),
    }
}

impl<E: Engine> LoggedStore<E> {
    /// Opens (creating if needed) the log at `path` in front of `engine`, replays what
    /// the engine may lack, and checkpoints.
    pub fn open(engine: E, path: &Path) -> Result<LoggedStore<E>, KvError> {
        let existed = path.exists();
        // O_DSYNC: each write returns once its bytes are on stable storage, one system
        // call instead of a write and an fdatasync, and faster than the two.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_DSYNC)
            .open(path)
            .map_err(|e| io_err(&e))?;
        let mut log = Log {
            file,
            path: path.to_path_buf(),
            end: RECORDS_AT,
            written: 0,
            seq: 0,
            applied: 0,
            generation: 0,
            oldest: None,
            failed: None,
        };
        log.written = log.file.metadata().map_err(|e| io_err(&e))?.len();
        if existed && log.written > 0 {
            let (generation, checkpoint) = log.read_header()?;
            log.generation = generation;
            log.seq = checkpoint;
            let replayed = log.replay(&engine)?;
            if replayed > 0 {
                tracing::info!(records = replayed, log = %path.display(), "replayed the metadata log");
            }
        } else if let Some(dir) = path.parent() {
            // A new log: its name must survive a crash too before anything relies on it.
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_err(&e))?;
        }
        log.applied = log.seq;
        log.checkpoint(&engine)?;
        Ok(LoggedStore {
            engine,
            log: Mutex::new(log),
            order: Mutex::new(()),
            revs: Mutex::new(Revisions::default()),
        })
    }
}

impl Log {
    fn read_header(&self) -> Result<(u64, u64), KvError> {
        let mut best: Option<(u64, u64)> = None;
        for slot in 0..2 {
            let mut buf = [0u8; 28];
            if self
                .file
                .read_exact_at(&mut buf, slot * SLOT_BYTES)
                .is_err()
            {
                continue;
            }
            if &buf[..8] != MAGIC || crc32c::crc32c(&buf[..24]) != le32(&buf[24..28]) {
                continue;
            }
            let (generation, seq) = (le64(&buf[8..16]), le64(&buf[16..24]));
            if best.is_none_or(|(g, _)| generation > g) {
                best = Some((generation, seq));
            }
        }
        best.ok_or_else(|| corrupt(&self.path, "no valid header slot"))
    }

    /// Applies every record after the checkpoint to `engine`; returns how many.
    fn replay<E: Engine>(&mut self, engine: &E) -> Result<u64, KvError> {
        let len = self.file.metadata().map_err(|e| io_err(&e))?.len();
        let mut at = RECORDS_AT;
        let mut count = 0;
        while at + RECORD_HEAD as u64 <= len {
            let mut head = [0u8; RECORD_HEAD];
            self.file
                .read_exact_at(&mut head, at)
                .map_err(|e| io_err(&e))?;
            let body_len = le32(&head[0..4]) as usize;
            let seq = le64(&head[8..16]);
            if seq != self.seq + 1 || body_len > MAX_RECORD_BODY {
                break;
            }
            let end = at + (RECORD_HEAD + body_len) as u64;
            if end > len {
                break;
            }
            let mut body = vec![0u8; body_len];
            self.file
                .read_exact_at(&mut body, at + RECORD_HEAD as u64)
                .map_err(|e| io_err(&e))?;
            let crc = crc32c::crc32c_append(crc32c::crc32c(&head[8..16]), &body);
            if crc != le32(&head[4..8]) {
                break;
            }
            // A record whose crc matches but does not decode was written by a bug, not
            // torn by a crash: stop with an error rather than skip a change.
            let batch = decode(&body)
                .ok_or_else(|| corrupt(&self.path, &format!("record {seq} does not decode")))?;
            engine.apply(&batch)?;
            self.seq = seq;
            at = end;
            count += 1;
        }
        Ok(count)
    }

    /// Makes the engine durable up to the last record, then records that in the header
    /// and starts the records over.
    fn checkpoint<E: Engine>(&mut self, engine: &E) -> Result<(), KvError> {
        engine.persist()?;
        let generation = self.generation + 1;
        let mut slot = [0u8; 28];
        slot[..8].copy_from_slice(MAGIC);
        slot[8..16].copy_from_slice(&generation.to_le_bytes());
        slot[16..24].copy_from_slice(&self.seq.to_le_bytes());
        let crc = crc32c::crc32c(&slot[..24]);
        slot[24..28].copy_from_slice(&crc.to_le_bytes());
        let result = self.file.write_all_at(&slot, (generation % 2) * SLOT_BYTES);
        if let Err(e) = result {
            self.failed = Some(e.to_string());
            return Err(io_err(&e));
        }
        self.generation = generation;
        self.end = RECORDS_AT;
        self.oldest = None;
        Ok(())
    }

    fn append(&mut self, body: &[u8]) -> Result<(), KvError> {
        let seq = self.seq + 1;
        let mut rec = Vec::with_capacity(RECORD_HEAD + body.len());
        rec.extend_from_slice(&(body.len() as u32).to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&seq.to_le_bytes()), body);
        rec.extend_from_slice(&crc.to_le_bytes());
        rec.extend_from_slice(&seq.to_le_bytes());
        rec.extend_from_slice(body);
        let result = self
            .grow_to(self.end + rec.len() as u64)
            .and_then(|()| self.file.write_all_at(&rec, self.end));
        match result {
            Ok(()) => {
                self.seq = seq;
                self.end += rec.len() as u64;
                self.oldest.get_or_insert_with(Instant::now);
                Ok(())
            }
            // A full disk before anything was synced leaves an unreadable tail that the
            // next append overwrites: refuse this change only.
            Err(e) if e.raw_os_error() == Some(28) => Err(io_err(&e)),
            Err(e) => {
                self.failed = Some(e.to_string());
                Err(io_err(&e))
            }
        }
    }

    /// Makes sure the file has bytes up to `needed`, writing zeros [`GROW_BYTES`] at a
    /// time. An append that grows the file changes its length, and its synchronous write
    /// then waits for a journal commit of the file system, which is slow while the disk
    /// is busy (a data server deleting gigabytes of chunks); an overwrite of written
    /// blocks waits for its own bytes only. The log rewinds after a checkpoint, so after
    /// its first pass every append is an overwrite. Zeros end a replay (no record has
    /// sequence number 0).
    fn grow_to(&mut self, needed: u64) -> std::io::Result<()> {
        if needed <= self.written {
            return Ok(());
        }
        // Never below the records: the header slots are written in place, by checkpoints.
        let from = self.written.max(RECORDS_AT);
        let target = needed.max(from + GROW_BYTES).next_multiple_of(4096);
        let zeros = vec![0u8; (target - from) as usize];
        self.file.write_all_at(&zeros, from)?;
        self.written = target;
        Ok(())
    }

    fn due(&self) -> bool {
        self.end - RECORDS_AT >= CHECKPOINT_BYTES
            || self.oldest.is_some_and(|t| t.elapsed() >= CHECKPOINT_AFTER)
    }
}

impl<E: Engine> KvStore for LoggedStore<E> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        self.engine.get(key)
    }

    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>, KvError> {
        self.engine.scan(start, end, limit)
    }

    fn commit(&self, batch: WriteBatch) -> Result<(), KvError> {
        // Logging and applying are two steps: one commit at a time keeps the engine's
        // order the log's.
        let _one = self.order.lock();
        if self.log(&batch)? {
            self.apply_logged(&batch)?;
        }
        Ok(())
    }

    /// Appends the batch as one synced record; the engine applies it at
    /// [`KvStore::apply_logged`]. The caller logs and applies one batch at a time, in
    /// order, and applies every logged batch before logging one too big for a record.
    fn log(&self, batch: &WriteBatch) -> Result<bool, KvError> {
        self.log_with(batch, None)
    }

    fn apply_logged(&self, batch: &WriteBatch) -> Result<(), KvError> {
        let applied = self.apply_with(batch, &mut self.revs.lock());
        self.after_apply(applied)
    }

    fn engine(&self) -> &'static str {
        self.engine.engine()
    }
}

impl<E: Engine> LoggedStore<E> {
    /// [`KvStore::log`], with the revision table already held by the caller or not.
    pub(super) fn log_with(
        &self,
        batch: &WriteBatch,
        held: Option<&mut Revisions>,
    ) -> Result<bool, KvError> {
        if batch.is_empty() {
            return Ok(false);
        }
        let body = encode(batch);
        if body.len() <= MAX_RECORD_BODY {
            let mut log = self.log.lock();
            refuse_if_failed(&log)?;
            log.append(&body)?;
            return Ok(true);
        }
        // Too big for a record: the engine commits it durably itself. The revision table
        // is taken before the log, as everywhere.
        let mut own;
        let revs = match held {
            Some(r) => r,
            None => {
                own = self.revs.lock();
                &mut *own
            }
        };
        let mut log = self.log.lock();
        refuse_if_failed(&log)?;
        // Everything logged before it reaches the engine's disk first, which needs
        // the engine to have applied it.
        if log.applied != log.seq {
            return Err(KvError::Engine {
                engine: ENGINE,
                message: "a batch too big for the log came before the ones logged were applied"
                    .into(),
            });
        }
        log.checkpoint(&self.engine)?;
        self.engine.apply(batch)?;
        revs.bump(batch);
        self.engine.persist()?;
        Ok(false)
    }

    /// Applies a logged batch to the engine and moves its keys' revisions, under the
    /// revision table's lock.
    pub(super) fn apply_with(
        &self,
        batch: &WriteBatch,
        revs: &mut Revisions,
    ) -> Result<(), KvError> {
        self.engine.apply(batch)?;
        revs.bump(batch);
        Ok(())
    }

    /// What follows the apply of a logged batch: stop on its failure, else count it and
    /// checkpoint when due. Takes the log's lock: call it without the revision table's.
    pub(super) fn after_apply(&self, applied: Result<(), KvError>) -> Result<(), KvError> {
        let mut log = self.log.lock();
        if let Err(e) = applied {
            // The change is in the log and would come back on a restart although its
            // caller may hear it failed: stop taking changes until that restart.
            log.failed = Some(e.to_string());
            return Err(e);
        }
        log.applied += 1;
        if log.applied == log.seq && log.due() {
            log.checkpoint(&self.engine)?;
        }
        Ok(())
    }
}

/// Refuses every change after a failed write of the log.
fn refuse_if_failed(log: &Log) -> Result<(), KvError> {
    match &log.failed {
        Some(why) => Err(KvError::Engine {
            engine: ENGINE,
            message: format!(
                "an earlier write of the log failed ({why}); restart the metadata server"
            ),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
impl<E: Engine> LoggedStore<E> {
    /// Closes without the closing checkpoint, as a crash would leave the log.
    fn abandon(self) {
        self.log.lock().failed = Some("abandoned by a test".into());
    }
}

impl<E: Engine> Drop for LoggedStore<E> {
    /// A clean close leaves nothing to replay.
    fn drop(&mut self) {
        let log = self.log.get_mut();
        if log.failed.is_none() && log.oldest.is_some() && log.applied == log.seq {
            if let Err(e) = log.checkpoint(&self.engine) {
                tracing::warn!(error = %e, "checkpoint of the metadata log on close failed; the next start replays it");
            }
        }
    }
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

/// `count(4)`, then per operation `tag(1)` (0 put, 1 delete), `key_len(4) key`, and for a
/// put `value_len(4) value`.
pub(crate) fn encode(batch: &WriteBatch) -> Vec<u8> {
    let size: usize = batch
        .ops()
        .iter()
        .map(|op| match op {
            BatchOp::Put(k, v) => 9 + k.len() + v.len(),
            BatchOp::Delete(k) => 5 + k.len(),
        })
        .sum();
    let mut out = Vec::with_capacity(4 + size);
    out.extend_from_slice(&(batch.len() as u32).to_le_bytes());
    for op in batch.ops() {
        let (k, v) = op.key_value();
        out.push(u8::from(v.is_none()));
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
        if let Some(v) = v {
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
    }
    out
}

pub(crate) fn decode(mut b: &[u8]) -> Option<WriteBatch> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Some(head)
    }
    fn bytes(b: &mut &[u8]) -> Option<Vec<u8>> {
        let n = le32(take(b, 4)?) as usize;
        take(b, n).map(<[u8]>::to_vec)
    }
    let count = le32(take(&mut b, 4)?);
    let mut batch = WriteBatch::new();
    for _ in 0..count {
        match take(&mut b, 1)?[0] {
            0 => {
                let k = bytes(&mut b)?;
                batch.put(k, bytes(&mut b)?);
            }
            1 => batch.delete(bytes(&mut b)?),
            _ => return None,
        }
    }
    b.is_empty().then_some(batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::RedbStore;

    /// A fresh directory and the paths of a redb store and its log in it.
    fn paths() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let (db, wal) = (
            dir.path().join("meta.redb"),
            dir.path().join("meta.redb.wal"),
        );
        (dir, db, wal)
    }

    fn open(db: &Path, wal: &Path) -> LoggedStore<RedbStore> {
        LoggedStore::open(RedbStore::open(db).unwrap(), wal).unwrap()
    }

    fn batch(ops: &[(&str, Option<&str>)]) -> WriteBatch {
        let mut b = WriteBatch::new();
        for (k, v) in ops {
            match v {
                Some(v) => b.put(k.as_bytes(), v.as_bytes()),
                None => b.delete(k.as_bytes()),
            }
        }
        b
    }

    #[test]
    fn records_round_trip_and_garbage_does_not_decode() {
        let b = batch(&[("a", Some("1")), ("b", None), ("", Some(""))]);
        assert_eq!(decode(&encode(&b)), Some(b.clone()));
        let enc = encode(&b);
        assert_eq!(decode(&enc[..enc.len() - 1]), None);
        let mut longer = enc.clone();
        longer.push(0);
        assert_eq!(decode(&longer), None);
        assert_eq!(decode(&[9, 0, 0, 0, 7]), None);
    }

    /// The engine never made anything durable (its file is copied before the log is
    /// checkpointed): reopening replays the log into it.
    #[test]
    fn reopen_replays_what_the_engine_did_not_persist() {
        let (_dir, db, wal) = paths();
        {
            let store = open(&db, &wal);
            store
                .commit(batch(&[("k1", Some("v1")), ("k2", Some("v2"))]))
                .unwrap();
            store
                .commit(batch(&[("k1", None), ("k3", Some("v3"))]))
                .unwrap();
            store.abandon();
        }
        // The engine's non-durable commits may or may not have reached its file; the
        // harshest case is an engine that has none of them: recreate it empty, and the
        // log alone must rebuild the state.
        std::fs::remove_file(&db).unwrap();
        let store = open(&db, &wal);
        assert_eq!(store.get(b"k1").unwrap(), None);
        assert_eq!(store.get(b"k2").unwrap(), Some(b"v2".to_vec()));
        assert_eq!(store.get(b"k3").unwrap(), Some(b"v3".to_vec()));
    }

    /// A torn last record (a crash in the middle of its write) is not replayed, the
    /// records before it are, and new commits go on after a restart.
    #[test]
    fn a_torn_record_ends_the_replay() {
        let (_dir, db, wal) = paths();
        let store = open(&db, &wal);
        let (first, second) = (batch(&[("a", Some("1"))]), batch(&[("b", Some("2"))]));
        store.commit(first.clone()).unwrap();
        store.commit(second.clone()).unwrap();
        store.abandon();
        // The second record's last byte never reached the disk (zeros follow the
        // records, so cutting the file would cut only zeros).
        let records = 2 * RECORD_HEAD + encode(&first).len() + encode(&second).len();
        let f = OpenOptions::new().write(true).open(&wal).unwrap();
        f.write_all_at(&[0x5a], RECORDS_AT + records as u64 - 1)
            .unwrap();
        drop(f);
        std::fs::remove_file(&db).unwrap();
        let store = open(&db, &wal);
        assert_eq!(store.get(b"a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(store.get(b"b").unwrap(), None);
        store.commit(batch(&[("c", Some("3"))])).unwrap();
        drop(store);
        let store = open(&db, &wal);
        assert_eq!(store.get(b"c").unwrap(), Some(b"3".to_vec()));
        assert_eq!(store.get(b"b").unwrap(), None);
    }

    /// After a checkpoint the log starts over: records of the earlier pass that remain
    /// further in the file are never replayed, and the file stays small.
    #[test]
    fn records_of_an_earlier_pass_are_not_replayed() {
        let (_dir, db, wal) = paths();
        let store = open(&db, &wal);
        let big = "x".repeat(64 << 10);
        // Enough to pass CHECKPOINT_BYTES at least once.
        let rounds = (CHECKPOINT_BYTES / (64 << 10)) as usize + 8;
        for i in 0..rounds {
            store
                .commit(batch(&[("big", Some(&big)), ("n", Some(&i.to_string()))]))
                .unwrap();
        }
        store.commit(batch(&[("n", Some("last"))])).unwrap();
        store.abandon();
        let len = std::fs::metadata(&wal).unwrap().len();
        assert!(
            len <= RECORDS_AT + CHECKPOINT_BYTES + (70 << 10) + GROW_BYTES,
            "log of {len} bytes"
        );
        let store = open(&db, &wal);
        assert_eq!(store.get(b"n").unwrap(), Some(b"last".to_vec()));
    }

    #[test]
    fn a_log_without_a_valid_header_is_refused() {
        let (_dir, db, wal) = paths();
        std::fs::write(&wal, vec![7u8; 8192]).unwrap();
        match LoggedStore::open(RedbStore::open(&db).unwrap(), &wal) {
            Err(KvError::Corruption { message, .. }) => {
                assert!(message.contains("header"), "{message}")
            }
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("a damaged log was accepted"),
        }
    }
}
