//! Revisions and conditional commits of the embedded engines ([`TxnStore`] for
//! [`LoggedStore`]).
//!
//! Why in memory, and not a version stored beside each value: an embedded store belongs
//! to one process (redb and sled lock their files), so a revision is only ever compared
//! by the process that read it, within one open of the store; nothing needs it after a
//! restart, and the stored value format stays as it is. A store-wide counter numbers
//! every applied batch; the keys written by the last [`MAX_TRACKED_KEYS`] writes keep
//! their own revision, and every other key has the `floor`, the highest revision let go
//! of. A key's revision therefore changes whenever the key is written (its new revision
//! is above every earlier one, the floor included), which is what a check needs: a
//! commit never misses a change. Letting a key go raises the floor, which changes the
//! revision of every untracked key: a transaction that read one of those before then
//! conflicts although the key did not change, and retries. The bound keeps the table's
//! memory fixed whatever the size of the namespace.

use super::wal::{Engine, LoggedStore};
use super::{KvError, ReadCheck, Revision, TxnLimits, TxnStore, Versioned, WriteBatch};
use std::collections::{HashMap, VecDeque};

/// Keys whose revision is kept apart; above it the oldest is let go of (into the floor).
pub const MAX_TRACKED_KEYS: usize = 65_536;

/// The revision table of one open embedded store.
#[derive(Debug)]
pub(crate) struct Revisions {
    /// Revision of the last batch applied.
    counter: u64,
    /// The revision of every key not in `recent`.
    floor: u64,
    /// Keys written lately, with their revision.
    recent: HashMap<Vec<u8>, u64>,
    /// `recent`'s writes in order, oldest first (an entry is stale once the key was
    /// written again); at most twice [`MAX_TRACKED_KEYS`].
    order: VecDeque<(Vec<u8>, u64)>,
}

impl Default for Revisions {
    fn default() -> Revisions {
        Revisions {
            counter: 1,
            floor: 1,
            recent: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl Revisions {
    /// The current revision of `key` (whether it exists is the engine's to say).
    pub(crate) fn of(&self, key: &[u8]) -> Revision {
        Revision(self.recent.get(key).copied().unwrap_or(self.floor))
    }

    /// Gives every key `batch` writes a new revision; call it with the batch applied.
    pub(crate) fn bump(&mut self, batch: &WriteBatch) {
        if batch.is_empty() {
            return;
        }
        self.counter += 1;
        let rev = self.counter;
        for op in batch.ops() {
            let key = op.key_value().0.to_vec();
            self.recent.insert(key.clone(), rev);
            self.order.push_back((key, rev));
        }
        while self.recent.len() > MAX_TRACKED_KEYS || self.order.len() > 2 * MAX_TRACKED_KEYS {
            let Some((key, rev)) = self.order.pop_front() else {
                break;
            };
            if self.recent.get(&key) == Some(&rev) {
                self.recent.remove(&key);
                self.floor = self.floor.max(rev);
            }
        }
    }
}

impl<E: Engine> TxnStore for LoggedStore<E> {
    fn get_versioned(&self, key: &[u8]) -> Result<Option<Versioned>, KvError> {
        let revs = self.revs.lock();
        let value = self.engine.get(key)?;
        Ok(value.map(|value| Versioned {
            value,
            revision: revs.of(key),
        }))
    }

    fn commit_if(&self, checks: &[ReadCheck], batch: WriteBatch) -> Result<(), KvError> {
        // The order lock keeps the log's order the engine's (as `commit`); the revision
        // table, held from the checks to the apply, keeps every other change out between.
        let _one = self.order.lock();
        let mut revs = self.revs.lock();
        for c in checks {
            let exists = self.engine.get(&c.key)?.is_some();
            let holds = match c.revision {
                None => !exists,
                Some(r) => exists && revs.of(&c.key) == r,
            };
            if !holds {
                return Err(KvError::Conflict {
                    engine: self.engine.engine(),
                    key: c.key.clone(),
                });
            }
        }
        // Checks alone (a change that found nothing to write): they held, nothing to log.
        if batch.is_empty() {
            return Ok(());
        }
        if !self.log_with(&batch, Some(&mut revs))? {
            return Ok(());
        }
        let applied = self.apply_with(&batch, &mut revs);
        drop(revs);
        self.after_apply(applied)
    }

    /// One process, no network message: nothing bounds a transaction but memory (a
    /// batch over the log's record size is committed by the engine itself).
    fn limits(&self) -> TxnLimits {
        TxnLimits {
            max_ops: None,
            max_bytes: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &[u8]) -> WriteBatch {
        let mut b = WriteBatch::new();
        b.put(key, b"v");
        b
    }

    #[test]
    fn a_written_key_never_gets_back_a_revision_it_had() {
        // Guards against a check passing on a key written after it was read, once the
        // key has left the table.
        let mut r = Revisions::default();
        let before = r.of(b"k");
        r.bump(&put(b"k"));
        let after = r.of(b"k");
        assert!(after > before);
        for i in 0..(MAX_TRACKED_KEYS as u32 + 10) {
            r.bump(&put(&i.to_be_bytes()));
        }
        assert!(r.recent.len() <= MAX_TRACKED_KEYS);
        assert!(r.order.len() <= 2 * MAX_TRACKED_KEYS);
        let gone = r.of(b"k");
        assert!(
            gone > after,
            "let go of: the floor is above its last revision"
        );
        assert_ne!(gone, before);
    }

    #[test]
    fn rewriting_one_key_keeps_the_order_queue_bounded() {
        let mut r = Revisions::default();
        for _ in 0..(3 * MAX_TRACKED_KEYS) {
            r.bump(&put(b"same"));
        }
        assert!(r.order.len() <= 2 * MAX_TRACKED_KEYS);
        assert_eq!(r.of(b"same"), Revision(r.counter));
    }
}
