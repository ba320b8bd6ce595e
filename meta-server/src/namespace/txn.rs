//! Reads of records, and the write transaction every mutation builds.
//!
//! A mutation reads records, changes them and writes them back into a [`Txn`], which
//! keeps its writes in an overlay so that later reads in the same mutation see them (a
//! rename that touches one directory twice must not lose the first change). The overlay
//! becomes one [`WriteBatch`] at the end: all of the mutation is committed, or none.
//!
//! On a shared engine (several metadata servers on one etcd prefix, see
//! `Namespace::open_shared`) a transaction is also checked: each key it reads is read
//! with its revision, the superblock too (only once a change needs it), all as of the
//! engine's revision at the first read ([`Snapshot`]), and the commit holds only if none
//! of them moved meanwhile (`TxnStore::commit_if`); otherwise nothing is written and the
//! request runs again (`Namespace::handle`). Reads that change nothing are of one
//! revision too ([`StoreReads`]). A scan is not checked (the engines compare single keys):
//! every change to a directory's entries or an inode's attributes also writes that
//! directory's or inode's record (its times), so a transaction that scanned them and read
//! that record conflicts with one that changed them.

use super::keys;
use super::records::{decode, encode, DirentRecord, InodeRecord, Superblock};
use crate::error::{show, MetaError};
use crate::kv::{KvError, KvPair, KvStore, ReadCheck, Revision, TxnStore, Versioned, WriteBatch};
use proto::InodeId;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

thread_local! {
    /// Set once a checked transaction of the running request committed: from then on a
    /// conflict may not run the request again (its first change has landed).
    static COMMITTED: Cell<bool> = const { Cell::new(false) };
}

thread_local! {
    /// Set while a request that may be applied twice runs (see [`rerunnable`]).
    static RERUNNABLE: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread's last checked commit went unanswered (see [`settle`]).
    static UNANSWERED: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread's last checked commit went without the engine's answer, however
/// it was settled: even one found not landed could still land later (and be refused
/// then by its checks), so the inode numbers it used are not handed out again.
pub(crate) fn last_unanswered() -> bool {
    UNANSWERED.with(|u| u.get())
}

/// Runs `f`, a request that may (`on`) or may not run again after a commit etcd did
/// not answer (`Handle::runs_again_alike`; see [`settle`]).
pub(crate) fn rerunnable<T>(on: bool, f: impl FnOnce() -> T) -> T {
    let before = RERUNNABLE.with(|r| r.replace(on));
    let out = f();
    RERUNNABLE.with(|r| r.set(before));
    out
}

/// Clears the mark of a committed checked transaction, before a request runs.
pub(crate) fn reset_committed() {
    COMMITTED.with(|c| c.set(false));
}

/// Whether a checked transaction committed since [`reset_committed`].
pub(crate) fn committed() -> bool {
    COMMITTED.with(|c| c.get())
}

/// Inode numbers a server on a shared engine reserves at a time: one superblock write
/// per block, so that servers making files do not all write (and conflict on) the
/// superblock per file.
pub const INODE_BLOCK: u64 = 1024;
/// Shards of the inode count on a shared engine: each server counts the inodes it makes
/// and frees in one, picked at start, so two servers rarely write the same count.
pub const COUNT_SHARDS: u8 = 16;

/// What a checked transaction read: each key's revision at its first read.
struct Checked<'a> {
    engine: &'a dyn TxnStore,
    /// Every read at one revision: the decisions taken on them fit one moment, and the
    /// commit holds only if none of the keys read moved since.
    snapshot: Snapshot<'a>,
    reads: RefCell<BTreeMap<Vec<u8>, Option<Revision>>>,
    /// The superblock's revision as this transaction read it (`None`: not read yet).
    sb_revision: Option<Revision>,
    /// What is left of the server's block of inode numbers; refilled from the
    /// superblock when empty.
    inodes: std::ops::Range<u64>,
    /// The server's shard of the inode count, and what this transaction adds to it.
    shard: u8,
    count: i64,
    /// The server this transaction runs on.
    me: Option<Holder>,
}

impl Checked<'_> {
    /// The checks of every key read, for the commit (the transaction ends with it).
    fn take_checks(&self) -> Vec<ReadCheck> {
        let reads = self.reads.take();
        let check = |(key, revision)| ReadCheck { key, revision };
        reads.into_iter().map(check).collect()
    }
}

/// What a server on a shared engine keeps between its transactions.
#[derive(Clone, Debug, Default)]
pub(crate) struct SharedCounters {
    /// The rest of its block of inode numbers.
    pub inodes: std::ops::Range<u64>,
    /// Its shard of the inode count.
    pub shard: u8,
    /// The server itself, once its live key is held (see `sweep`).
    pub me: Option<Holder>,
}

/// A metadata server on a shared engine: its id, named with each session it holds
/// (`opens`), and the revision of its live key (`keys::server`), which a commit that
/// gives the server a session checks: a server whose key is gone (its lease ran out,
/// and others may end its sessions) adds none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub id: u64,
    pub live: Revision,
}

/// Typed reads over anything that can read a raw key.
pub(crate) trait Reads {
    /// The raw value under `key`.
    fn raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MetaError>;

    /// Inode `ino`, if it exists.
    fn try_inode(&self, ino: InodeId) -> Result<Option<InodeRecord>, MetaError> {
        match self.raw(&keys::inode(ino))? {
            Some(v) => Ok(Some(decode(&v, "inode record")?)),
            None => Ok(None),
        }
    }

    /// Inode `ino`, or `NotFound`.
    fn inode(&self, ino: InodeId) -> Result<InodeRecord, MetaError> {
        self.try_inode(ino)?
            .ok_or_else(|| MetaError::NotFound(format!("no inode {ino}")))
    }

    /// The attributes of `ino` (record `rec`), a regular file's blocks from its held
    /// chunks.
    fn attr_of(&self, ino: InodeId, rec: &InodeRecord) -> Result<proto::Attr, MetaError> {
        super::held::attr(self, ino, rec)
    }

    /// Directory `ino`, or `NotFound` / `NotADirectory`.
    fn dir(&self, ino: InodeId) -> Result<InodeRecord, MetaError> {
        let rec = self.inode(ino)?;
        if !rec.is_dir() {
            return Err(MetaError::NotADirectory(format!(
                "{ino} is a {:?}",
                rec.kind
            )));
        }
        Ok(rec)
    }

    /// Entry `name` of directory `parent`, if it exists.
    fn dirent(&self, parent: InodeId, name: &[u8]) -> Result<Option<DirentRecord>, MetaError> {
        match self.raw(&keys::dirent(parent, name))? {
            Some(v) => Ok(Some(decode(&v, "directory entry")?)),
            None => Ok(None),
        }
    }

    /// Entry `name` of directory `parent`, or `NotFound`.
    fn entry(&self, parent: InodeId, name: &[u8]) -> Result<DirentRecord, MetaError> {
        self.dirent(parent, name)?
            .ok_or_else(|| MetaError::NotFound(format!("no {} in {parent}", show(name))))
    }
}

/// Reads of a shared engine at one revision, the first read's: what they find held
/// together at one moment, whatever another server committed between them (else a
/// name read before another server's rename over it gives an inode freed by the time
/// it is read).
pub(crate) struct Snapshot<'a> {
    engine: &'a dyn TxnStore,
    at: Cell<Option<Revision>>,
}

impl<'a> Snapshot<'a> {
    /// Reads of `engine`, at the revision of the first.
    pub(crate) fn new(engine: &'a dyn TxnStore) -> Snapshot<'a> {
        Snapshot {
            engine,
            at: Cell::new(None),
        }
    }

    /// `key` and its revision, as of the snapshot.
    fn get(&self, key: &[u8]) -> Result<Option<Versioned>, KvError> {
        let (read, at) = self.engine.get_at(key, self.at.get())?;
        self.at.set(self.at.get().or(at));
        Ok(read)
    }

    /// Up to `limit` pairs of `[start, end)`, as of the snapshot.
    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>, KvError> {
        let (rows, at) = self.engine.scan_at(start, end, limit, self.at.get())?;
        self.at.set(self.at.get().or(at));
        Ok(rows)
    }
}

/// Reads straight from the store, for operations that change nothing: on a shared
/// engine at one moment ([`Snapshot`]).
pub(crate) struct StoreReads<'a> {
    store: &'a dyn KvStore,
    snapshot: Option<Snapshot<'a>>,
}

impl<'a> StoreReads<'a> {
    /// Reads of `store`, or of the `shared` engine behind it at one moment.
    pub(crate) fn new(store: &'a dyn KvStore, shared: Option<&'a dyn TxnStore>) -> Self {
        StoreReads {
            store,
            snapshot: shared.map(Snapshot::new),
        }
    }

    /// Up to `limit` pairs of `[start, end)`.
    pub(crate) fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<KvPair>, MetaError> {
        Ok(match &self.snapshot {
            Some(s) => s.scan(start, end, limit)?,
            None => self.store.scan(start, end, limit)?,
        })
    }
}

impl Reads for StoreReads<'_> {
    fn raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        Ok(match &self.snapshot {
            Some(s) => s.get(key)?.map(|v| v.value),
            None => self.store.get(key)?,
        })
    }
}

/// The writes of one mutation, over a store, with a working copy of the superblock.
pub(crate) struct Txn<'a> {
    store: &'a dyn KvStore,
    /// Set on a shared engine: reads are recorded and the commit checks them.
    checked: Option<Checked<'a>>,
    /// `None` marks a delete.
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// The superblock as this mutation leaves it; written if it differs from `base`. On a
    /// shared engine read only when a change first needs it ([`Txn::sb`]): most changes
    /// never touch it there.
    sb: Option<Superblock>,
    base: Option<Superblock>,
}

impl<'a> Txn<'a> {
    /// A transaction starting from superblock `sb`.
    pub(crate) fn new(store: &'a dyn KvStore, sb: &Superblock) -> Txn<'a> {
        Txn {
            store,
            checked: None,
            writes: BTreeMap::new(),
            sb: Some(sb.clone()),
            base: Some(sb.clone()),
        }
    }

    /// A checked transaction on the shared `engine` (behind `store`, which commits
    /// straight to it); the superblock is read from the engine when first needed.
    pub(crate) fn checked(
        store: &'a dyn KvStore,
        engine: &'a dyn TxnStore,
        counters: &SharedCounters,
    ) -> Txn<'a> {
        Txn {
            store,
            checked: Some(Checked {
                engine,
                snapshot: Snapshot::new(engine),
                reads: RefCell::new(BTreeMap::new()),
                sb_revision: None,
                inodes: counters.inodes.clone(),
                shard: counters.shard,
                count: 0,
                me: counters.me,
            }),
            writes: BTreeMap::new(),
            sb: None,
            base: None,
        }
    }

    /// The superblock as this mutation leaves it, to read or change; on a shared engine
    /// read (with its revision) at the first call.
    pub(crate) fn sb(&mut self) -> Result<&mut Superblock, MetaError> {
        if let (None, Some(c)) = (&self.sb, &mut self.checked) {
            let read = c
                .snapshot
                .get(&keys::superblock())?
                .ok_or_else(|| MetaError::Corrupt("superblock missing".into()))?;
            let sb: Superblock = decode(&read.value, "superblock")?;
            c.sb_revision = Some(read.revision);
            self.base = Some(sb.clone());
            self.sb = Some(sb);
        }
        self.sb
            .as_mut()
            .ok_or_else(|| MetaError::Corrupt("superblock missing".into()))
    }

    /// Sets `key` to `value`.
    pub(crate) fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.writes.insert(key, Some(value));
    }

    /// Deletes `key`.
    pub(crate) fn delete(&mut self, key: Vec<u8>) {
        self.writes.insert(key, None);
    }

    /// Up to `limit` pairs in `[start, end)` as this transaction sees them.
    pub(crate) fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<KvPair>, MetaError> {
        if start >= end {
            return Ok(Vec::new());
        }
        let overlay = self.writes.range(start.to_vec()..end.to_vec());
        // Ask the store for enough keys that deletes in the overlay cannot starve the page:
        // any store key past those returned sorts after `limit` surviving ones.
        let deletes = overlay.clone().filter(|(_, v)| v.is_none()).count();
        let want = limit.saturating_add(deletes);
        let base = match &self.checked {
            Some(c) => c.snapshot.scan(start, end, want)?,
            None => self.store.scan(start, end, want)?,
        };
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = base.into_iter().collect();
        for (k, v) in overlay {
            match v {
                Some(v) => merged.insert(k.clone(), v.clone()),
                None => merged.remove(k),
            };
        }
        Ok(merged.into_iter().take(limit).collect())
    }

    /// Writes inode `ino`.
    pub(crate) fn put_inode(&mut self, ino: InodeId, rec: &InodeRecord) -> Result<(), MetaError> {
        let value = encode(rec)?;
        self.put(keys::inode(ino), value);
        Ok(())
    }

    /// Reads inode `ino` (`NotFound` if missing), lets `f` change it, writes it back.
    pub(crate) fn update_inode(
        &mut self,
        ino: InodeId,
        f: impl FnOnce(&mut InodeRecord),
    ) -> Result<InodeRecord, MetaError> {
        let mut rec = self.inode(ino)?;
        f(&mut rec);
        self.put_inode(ino, &rec)?;
        Ok(rec)
    }

    /// Writes entry `name` of `parent`.
    pub(crate) fn put_dirent(
        &mut self,
        parent: InodeId,
        name: &[u8],
        d: &DirentRecord,
    ) -> Result<(), MetaError> {
        let value = encode(d)?;
        self.put(keys::dirent(parent, name), value);
        Ok(())
    }

    /// Hands out the next inode number and counts the inode: in the superblock, or on a
    /// shared engine from the server's block and in its shard of the count.
    pub(crate) fn alloc_inode(&mut self) -> Result<InodeId, MetaError> {
        if self.checked.as_ref().is_some_and(|c| c.inodes.is_empty()) {
            let sb = self.sb()?;
            let start = sb.next_inode;
            sb.next_inode += INODE_BLOCK;
            if let Some(c) = &mut self.checked {
                c.inodes = start..start + INODE_BLOCK;
            }
        }
        let Some(c) = &mut self.checked else {
            // A change sent again after an early reply makes the number it gave, kept
            // free at this start (see `early`), unless something has it.
            let wanted = match super::early::take_wanted() {
                Some(ino) if self.raw(&super::keys::inode(ino))?.is_none() => Some(ino),
                _ => None,
            };
            let sb = self.sb()?;
            let ino = match wanted {
                Some(ino) => ino,
                None => {
                    sb.next_inode += 1;
                    InodeId(sb.next_inode - 1)
                }
            };
            sb.inode_count += 1;
            super::early::note_made(ino);
            return Ok(ino);
        };
        let ino = InodeId(c.inodes.start);
        c.inodes.start += 1;
        c.count += 1;
        super::early::note_made(ino);
        Ok(ino)
    }

    /// Counts an inode freed.
    pub(crate) fn count_freed(&mut self) -> Result<(), MetaError> {
        match &mut self.checked {
            Some(c) => c.count -= 1,
            None => {
                let sb = self.sb()?;
                sb.inode_count = sb.inode_count.saturating_sub(1);
            }
        }
        Ok(())
    }

    /// On a shared engine, that every key read is still as read (the checks of a
    /// commit, with nothing to write; the transaction ends with it); nothing off it. An answer that writes nothing,
    /// a refusal too, comes from reads made at several moments: they must still hold
    /// together, or the answer fits no order of the changes (`Conflict` then, and the
    /// request runs again).
    pub(crate) fn check_reads(&self) -> Result<(), MetaError> {
        let Some(c) = &self.checked else {
            return Ok(());
        };
        let checks = c.take_checks();
        // Within the engine's count of checks per transaction (a rename's walk up a
        // deep tree reads more keys than etcd's 128): in several transactions, each
        // after the last read, so all the keys held their values at that moment.
        let most = c
            .engine
            .limits()
            .max_ops
            .unwrap_or(usize::MAX)
            .saturating_sub(2)
            .max(1);
        for part in checks.chunks(most) {
            match c.engine.commit_if(part, WriteBatch::new()) {
                Ok(()) => {}
                // Unanswered, a write-free commit is as good as refused: the request
                // runs again and reads afresh. Named by a key that is no server's
                // live key: a conflict on one of those is taken for the server's own
                // key gone (`retry_on_conflict`), which this is not.
                Err(KvError::Unavailable { engine, .. }) => {
                    return Err(MetaError::Store(KvError::Conflict {
                        engine,
                        key: rerun_key(part),
                    }));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Whether this transaction runs on a shared engine (checked at its commit).
    pub(crate) fn is_shared(&self) -> bool {
        self.checked.is_some()
    }

    /// What the server keeps of this transaction once it has committed (`None` off a
    /// shared engine).
    pub(crate) fn counters(&self) -> Option<SharedCounters> {
        self.checked.as_ref().map(|c| SharedCounters {
            inodes: c.inodes.clone(),
            shard: c.shard,
            me: c.me,
        })
    }

    /// The server this transaction runs on (`None` off a shared engine).
    pub(crate) fn holder(&self) -> Option<Holder> {
        self.checked.as_ref()?.me
    }

    /// The server this transaction runs on, fenced: the commit holds only while the
    /// server's live key is as it put it. `None` off a shared engine (or before the
    /// key is held: the server's start).
    pub(crate) fn holder_fenced(&self) -> Option<Holder> {
        let c = self.checked.as_ref()?;
        let me = c.me?;
        c.reads
            .borrow_mut()
            .entry(keys::server(me.id))
            .or_insert(Some(me.live));
        Some(me)
    }

    /// Stages every write (and the superblock if it changed) as one atomic batch, and
    /// returns the superblock as it now is (if this transaction read it); see
    /// `kv::GroupCommit` for when it is durable.
    pub(crate) fn commit(mut self) -> Result<Option<Superblock>, MetaError> {
        UNANSWERED.with(|u| u.set(false));
        if let Some((shard, count)) = self.checked.as_ref().map(|c| (c.shard, c.count)) {
            if count != 0 {
                // Read through the transaction: two servers adding to one shard
                // conflict, and one of them adds again.
                let key = keys::inode_count(shard);
                let now: i64 = match self.raw(&key)? {
                    Some(v) => decode(&v, "inode count")?,
                    None => 0,
                };
                self.put(key, encode(&now.saturating_add(count))?);
            }
        }
        let mut batch = WriteBatch::new();
        if let Some(sb) = self
            .sb
            .as_ref()
            .filter(|&sb| Some(sb) != self.base.as_ref())
        {
            batch.put(keys::superblock(), encode(sb)?);
        }
        for (k, v) in std::mem::take(&mut self.writes) {
            match v {
                Some(v) => batch.put(k, v),
                None => batch.delete(k),
            }
        }
        if !batch.is_empty() {
            // The change's id is recorded with its first transaction (see `once`):
            // a change whose batch cannot carry it too fails (`TooLarge` on etcd)
            // rather than risk being applied twice.
            let mark = super::once::take_mark();
            if let Some(m) = &mark {
                batch.put(m.key.clone(), m.value.clone());
            }
            let written = match &self.checked {
                // Durable when it returns, or not written at all (`Conflict`).
                Some(c) => {
                    let mut checks = c.take_checks();
                    if self.sb != self.base {
                        checks.push(ReadCheck {
                            key: keys::superblock(),
                            revision: c.sb_revision,
                        });
                    }
                    checks.extend(mark.as_ref().and_then(|m| m.check.clone()));
                    let done = c.engine.commit_if(&checks, batch);
                    let unanswered = matches!(done, Err(KvError::Unavailable { .. }));
                    UNANSWERED.with(|u| u.set(unanswered));
                    let mut mark = mark;
                    if let Err(e) = done.or_else(|e| settle(c.engine, e, mark.as_mut(), &checks)) {
                        // Nothing landed (or, unanswered, maybe it did: the request
                        // fails then): the next try's first transaction carries the mark.
                        if let Some(mark) = mark {
                            super::once::restore_mark(mark);
                        }
                        return Err(e.into());
                    }
                    COMMITTED.with(|m| m.set(true));
                    mark
                }
                // Staged, not yet durable: `Namespace::handle` waits for it before
                // replying, after the namespace lock is released (group commit).
                None => {
                    self.store.stage(batch)?;
                    mark
                }
            };
            if let Some(m) = &written {
                super::once::mark_written(m);
            }
        } else {
            // A change that writes nothing still answered from what it read (a rename
            // between two names of one inode, found so by reads made at two moments).
            self.check_reads()?;
        }
        Ok(self.sb)
    }
}

/// The key a conflict that runs the request again is named by: one of `checks` that is
/// neither a server's live key nor a change's record (a conflict on those means
/// something else, see `retry_on_conflict`); empty if none is.
fn rerun_key(checks: &[ReadCheck]) -> Vec<u8> {
    checks
        .iter()
        .map(|c| &c.key)
        .find(|k| !keys::is_server(k) && !super::once::is_record(k))
        .cloned()
        .unwrap_or_default()
}

/// What a checked commit that failed with `e` comes to. etcd not answering it ("may
/// have been applied") is settled where that is safe, so that an election of etcd's
/// leader is a pause and not an error: a change's first transaction (which carries its
/// `mark`) reads the change's slot back: landed, it holds (`Ok`); not landed, the slot
/// is fenced so that the unanswered try can never land, and a conflict runs the request
/// again (`once::settle_marked`); another server's try landed, a conflict on the slot
/// (`once` answers from its record). A request that may run again ([`rerunnable`]) and
/// has committed nothing runs again: its checks keep the unanswered try from landing
/// after the new one changed what it read. Anything else stays the error it is.
fn settle(
    engine: &dyn TxnStore,
    e: KvError,
    mark: Option<&mut super::once::Mark>,
    checks: &[ReadCheck],
) -> Result<(), KvError> {
    use super::once::Landed;
    let KvError::Unavailable { engine: name, .. } = &e else {
        return Err(e);
    };
    let rerun = KvError::Conflict {
        engine: name,
        key: rerun_key(checks),
    };
    if let Some(mark) = mark {
        let Ok(landed) = super::once::settle_marked(engine, mark) else {
            return Err(e);
        };
        return match landed {
            Some(Landed::Yes) => {
                tracing::info!(error = %e, "an unanswered commit landed: its change's mark is in the engine");
                Ok(())
            }
            Some(Landed::No) => {
                tracing::info!(error = %e, "an unanswered commit did not land: running the change again");
                Err(rerun)
            }
            Some(Landed::Elsewhere) => Err(KvError::Conflict {
                engine: name,
                key: mark.key.clone(),
            }),
            None => Err(e),
        };
    }
    if RERUNNABLE.with(|r| r.get()) && !committed() {
        tracing::info!(error = %e, "an unanswered commit of a request that may be applied twice: running it again");
        return Err(rerun);
    }
    Err(e)
}

impl Reads for Txn<'_> {
    fn raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        if let Some(v) = self.writes.get(key) {
            return Ok(v.clone());
        }
        let Some(c) = &self.checked else {
            return Ok(self.store.get(key)?);
        };
        let read = c.snapshot.get(key)?;
        // All reads are of one moment, so a key read twice reads the same.
        c.reads
            .borrow_mut()
            .entry(key.to_vec())
            .or_insert(read.as_ref().map(|v| v.revision));
        Ok(read.map(|v| v.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{open_store, StoreKind};

    #[test]
    fn scan_merges_overlay_puts_and_deletes_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(StoreKind::Redb, dir.path()).unwrap();
        let mut b = WriteBatch::new();
        for k in [b"a", b"b", b"c", b"d"] {
            b.put(k.to_vec(), k.to_vec());
        }
        store.commit(b).unwrap();
        let mut txn = Txn::new(&*store, &Superblock::initial());
        txn.delete(b"a".to_vec());
        txn.delete(b"b".to_vec());
        txn.put(b"bb".to_vec(), b"new".to_vec());
        let got: Vec<_> = txn
            .scan(b"a", b"z", 2)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(got, vec![b"bb".to_vec(), b"c".to_vec()]);
        assert_eq!(txn.raw(b"a").unwrap(), None);
        assert_eq!(txn.raw(b"d").unwrap(), Some(b"d".to_vec()));
        assert!(txn.scan(b"z", b"a", 5).unwrap().is_empty());
    }
}
