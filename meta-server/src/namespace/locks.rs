//! Byte-range and whole-file locks, held for every client in one table so that they
//! hold across mounts.
//!
//! Off a shared engine locks live in memory. As NFS locks are, they are taken back by
//! their clients after a restart of the metadata server (`SetLock::reclaim`, within
//! `lock_grace_ms`, when no other new lock is given), and they are dropped when the
//! connection of the client that took them closes (the client died), or
//! `session_grace_ms` after it broke unless the client resumed (see `resume`), so a dead
//! holder never blocks anyone for good. On a shared engine each file's locks are a key
//! in the engine instead, with the same rules (`shared_locks`): the table here then
//! only knows which files this server's connections hold locks on.

use super::deadlock::Waits;
use super::ConnId;
use crate::error::MetaError;
use proto::meta::{LockKind, LockSpec};
use proto::{ClientId, InodeId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, HashSet};

/// Most locks held on one file at once; more are refused with `NoSpace` (ENOLCK-like).
pub const MAX_LOCKS_PER_FILE: usize = 4096;

/// One held lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Held {
    pub client: ClientId,
    /// On a shared engine, the server the lock was taken through (`Holder::id`); 0 off it.
    pub server: u64,
    /// The connection it was taken over, on that server.
    pub conn: ConnId,
    pub spec: LockSpec,
}

impl Held {
    pub(super) fn same_owner(&self, client: ClientId, owner: u64) -> bool {
        self.client == client && self.spec.owner == owner
    }
}

/// The first lock of `held` of another owner that conflicts with `want`.
pub(super) fn conflict_in(held: &[Held], client: ClientId, want: &LockSpec) -> Option<LockSpec> {
    conflicting(held, client, want).map(|h| h.spec)
}

/// [`conflict_in`], with its holder.
pub(super) fn conflicting<'a>(
    held: &'a [Held],
    client: ClientId,
    want: &LockSpec,
) -> Option<&'a Held> {
    held.iter()
        .find(|h| !h.same_owner(client, want.owner) && conflicts(&h.spec, want))
}

/// The locks of a file (`held`) after `taker` takes, converts or releases (`Unlock`) a
/// range for one owner, POSIX style: the owner's own locks in the range are replaced,
/// split where they stick out. `WouldBlock` on a conflict, `NoSpace` past
/// [`MAX_LOCKS_PER_FILE`]; `held` is left as it was either way.
pub(super) fn set_in(held: &[Held], ino: InodeId, taker: Held) -> Result<Vec<Held>, MetaError> {
    let want = taker.spec;
    if want.start > want.end {
        return Err(MetaError::InvalidArgument(
            "lock range ends before it starts".into(),
        ));
    }
    if want.kind != LockKind::Unlock {
        if let Some(c) = conflict_in(held, taker.client, &want) {
            return Err(MetaError::WouldBlock(format!(
                "{ino} bytes {}..={} are locked by pid {}",
                c.start, c.end, c.pid
            )));
        }
    }
    let kept = proto::meta::set_lock_range(
        held.to_vec(),
        &want,
        |h: &Held| h.same_owner(taker.client, want.owner),
        |h| &mut h.spec,
        || taker,
    );
    if kept.len() > MAX_LOCKS_PER_FILE {
        return Err(MetaError::NoSpace(format!(
            "more than {MAX_LOCKS_PER_FILE} locks on {ino}"
        )));
    }
    Ok(kept)
}

fn overlaps(a: &LockSpec, b: &LockSpec) -> bool {
    a.start <= b.end && b.start <= a.end
}

fn conflicts(a: &LockSpec, b: &LockSpec) -> bool {
    overlaps(a, b) && (a.kind == LockKind::Write || b.kind == LockKind::Write)
}

/// All locks of all files (off a shared engine).
#[derive(Default)]
pub struct LockTable {
    files: HashMap<InodeId, Vec<Held>>,
    /// On a shared engine: the files each of this server's connections took a lock on
    /// (the locks themselves are in the engine).
    pub(super) by_conn: HashMap<ConnId, BTreeSet<InodeId>>,
    /// The owners waiting for a lock (`F_SETLKW`), for deadlock detection.
    pub(super) waits: Waits,
}

impl LockTable {
    /// Locks held over every file (for the metrics); on a shared engine, the files
    /// locked through this server's connections.
    pub fn held(&self) -> usize {
        self.files.values().map(Vec::len).sum::<usize>()
            + self.by_conn.values().map(BTreeSet::len).sum::<usize>()
    }

    /// The first lock of another owner that conflicts with `want`, if any.
    pub fn conflict(&self, ino: InodeId, client: ClientId, want: &LockSpec) -> Option<LockSpec> {
        conflict_in(self.files.get(&ino)?, client, want)
    }

    /// The locks held on `ino`.
    pub(super) fn of(&self, ino: InodeId) -> Vec<Held> {
        self.files.get(&ino).cloned().unwrap_or_default()
    }

    /// Takes, converts or releases (`Unlock`) a range for one owner, POSIX style: the
    /// owner's own locks in the range are replaced, split where they stick out.
    pub fn set(
        &mut self,
        ino: InodeId,
        client: ClientId,
        conn: ConnId,
        want: LockSpec,
    ) -> Result<(), MetaError> {
        let taker = Held {
            client,
            server: 0,
            conn,
            spec: want,
        };
        let kept = set_in(
            self.files.get(&ino).map_or(&[][..], Vec::as_slice),
            ino,
            taker,
        )?;
        if kept.is_empty() {
            self.files.remove(&ino);
        } else {
            self.files.insert(ino, kept);
        }
        Ok(())
    }

    /// Drops every lock of one owner on one file.
    pub fn release_owner(&mut self, ino: InodeId, client: ClientId, owner: u64) {
        if let Some(held) = self.files.get_mut(&ino) {
            held.retain(|h| !h.same_owner(client, owner));
            if held.is_empty() {
                self.files.remove(&ino);
            }
        }
    }

    /// Drops every lock taken over a connection that closed.
    pub fn release_conn(&mut self, conn: ConnId) {
        self.files.retain(|_, held| {
            held.retain(|h| h.conn != conn);
            !held.is_empty()
        });
    }

    /// Whether any lock was taken over `conn`.
    pub fn holds_conn(&self, conn: ConnId) -> bool {
        self.files.values().flatten().any(|h| h.conn == conn)
            || self.by_conn.get(&conn).is_some_and(|f| !f.is_empty())
    }

    /// Moves the locks of `client` held through connections `from` to `conn` (the client
    /// resumed on a new connection), so that they end with that connection instead of
    /// the old one. Locks on other connections (live ones) stay where they are.
    pub fn move_client(&mut self, client: ClientId, conn: ConnId, from: &HashSet<ConnId>) {
        self.files
            .values_mut()
            .flatten()
            .filter(|h| h.client == client && from.contains(&h.conn))
            .for_each(|h| h.conn = conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ClientId = ClientId(1);
    const B: ClientId = ClientId(2);
    const F: InodeId = InodeId(9);

    fn spec(owner: u64, start: u64, end: u64, kind: LockKind) -> LockSpec {
        LockSpec {
            owner,
            pid: owner as u32,
            start,
            end,
            kind,
        }
    }

    /// Guards against a refused lock (too many on the file) dropping the file's locks:
    /// the table was emptied before the count was checked.
    #[test]
    fn a_lock_refused_for_the_count_leaves_the_files_locks_as_they_were() {
        let mut t = LockTable::default();
        for i in 0..MAX_LOCKS_PER_FILE as u64 {
            t.set(F, A, ConnId(1), spec(1, 2 * i, 2 * i, LockKind::Write))
                .unwrap();
        }
        // A read lock between two write locks: one more lock (a write lock there would
        // join its neighbours into one).
        let e = t
            .set(F, A, ConnId(1), spec(1, 1, 1, LockKind::Read))
            .unwrap_err();
        assert!(matches!(e, MetaError::NoSpace(_)), "{e}");
        assert_eq!(t.held(), MAX_LOCKS_PER_FILE);
        assert!(t.conflict(F, B, &spec(1, 0, 0, LockKind::Read)).is_some());
    }

    #[test]
    fn shared_locks_coexist_and_exclusive_ones_conflict_across_owners() {
        let mut t = LockTable::default();
        t.set(F, A, ConnId(1), spec(1, 0, 99, LockKind::Read))
            .unwrap();
        t.set(F, B, ConnId(2), spec(1, 50, 60, LockKind::Read))
            .unwrap();
        let e = t
            .set(F, B, ConnId(2), spec(1, 90, 200, LockKind::Write))
            .unwrap_err();
        assert!(matches!(e, MetaError::WouldBlock(_)), "{e}");
        // Past the first client's range the write lock is free.
        t.set(F, B, ConnId(2), spec(1, 100, u64::MAX, LockKind::Write))
            .unwrap();
        assert_eq!(
            t.conflict(F, A, &spec(1, 150, 150, LockKind::Read))
                .unwrap()
                .start,
            100
        );
        // The same owner on another client is another owner.
        assert!(t
            .conflict(F, A, &spec(1, 55, 55, LockKind::Write))
            .is_some());
    }

    #[test]
    fn unlock_splits_an_owners_range_and_upgrades_replace_in_place() {
        let mut t = LockTable::default();
        t.set(F, A, ConnId(1), spec(7, 0, 99, LockKind::Write))
            .unwrap();
        t.set(F, A, ConnId(1), spec(7, 40, 59, LockKind::Unlock))
            .unwrap();
        assert!(t
            .conflict(F, B, &spec(1, 45, 50, LockKind::Write))
            .is_none());
        assert!(t.conflict(F, B, &spec(1, 39, 39, LockKind::Read)).is_some());
        assert!(t.conflict(F, B, &spec(1, 60, 60, LockKind::Read)).is_some());
        // Downgrading its own range never conflicts with itself.
        t.set(F, A, ConnId(1), spec(7, 0, 99, LockKind::Read))
            .unwrap();
        assert!(t.conflict(F, B, &spec(1, 10, 10, LockKind::Read)).is_none());
        assert!(t
            .conflict(F, B, &spec(1, 10, 10, LockKind::Write))
            .is_some());
    }

    #[test]
    fn closing_an_owner_or_a_connection_releases_its_locks() {
        let mut t = LockTable::default();
        t.set(F, A, ConnId(1), spec(7, 0, 9, LockKind::Write))
            .unwrap();
        t.set(F, A, ConnId(1), spec(8, 10, 19, LockKind::Write))
            .unwrap();
        t.release_owner(F, A, 7);
        assert!(t.conflict(F, B, &spec(1, 0, 9, LockKind::Write)).is_none());
        assert!(t
            .conflict(F, B, &spec(1, 10, 10, LockKind::Write))
            .is_some());
        t.release_conn(ConnId(1));
        assert!(t
            .conflict(F, B, &spec(1, 0, u64::MAX, LockKind::Write))
            .is_none());
        assert!(t.files.is_empty());
    }

    #[test]
    fn a_range_ending_before_it_starts_is_refused() {
        let mut t = LockTable::default();
        let e = t
            .set(F, A, ConnId(1), spec(1, 10, 9, LockKind::Read))
            .unwrap_err();
        assert!(matches!(e, MetaError::InvalidArgument(_)));
    }
}
