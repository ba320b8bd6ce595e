//! Locks on a shared engine: each file's locks in one key (`W` ino), read and written by
//! the checked transaction of each lock call, so that a lock taken through one
//! metadata server conflicts with one asked through another, and a server's crash loses
//! none (the issue 24 rule: "locks are still held by their owners").
//!
//! Each lock names the server and connection it was taken through. The rules are those
//! of the table in memory (`locks`): a connection that closes drops the locks taken over
//! it, one that broke keeps them for the session grace, and a client that resumes moves
//! them to its new connection. A client that comes back on another server takes each of
//! its locks back there (`SetLock::reclaim`, as after any new connection): the owner's
//! own range is replaced, now naming that server, and the first server's end of the
//! old connection leaves it. A server that died leaves its locks in the keys until a
//! live one ends them, a session grace after its live key went (`sweep`), as it ends
//! its sessions.
//!
//! No lock grace at a start on a shared engine: locks are not lost by a restart there.

use super::locks::{conflict_in, set_in, Held};
use super::records::{decode, encode};
use super::txn::{Reads, Txn};
use super::{keys, ConnId, Namespace};
use crate::error::MetaError;
use proto::meta::{LockKind, LockSpec};
use proto::{ClientId, InodeId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashSet};

/// One file's locks as stored.
#[derive(Default, Serialize, Deserialize)]
struct FileLocks {
    locks: Vec<Held>,
}

fn read(txn: &Txn<'_>, ino: InodeId) -> Result<Vec<Held>, MetaError> {
    match txn.raw(&keys::locks(ino))? {
        None => Ok(Vec::new()),
        Some(v) => Ok(decode::<FileLocks>(&v, "locks")?.locks),
    }
}

fn store(txn: &mut Txn<'_>, ino: InodeId, locks: Vec<Held>) -> Result<(), MetaError> {
    if locks.is_empty() {
        txn.delete(keys::locks(ino));
    } else {
        txn.put(keys::locks(ino), encode(&FileLocks { locks })?);
    }
    Ok(())
}

/// The servers holding locks in a locks key's value; `None` if it does not decode.
pub(super) fn holders(v: &[u8]) -> Option<Vec<u64>> {
    let l = decode::<FileLocks>(v, "locks").ok()?;
    let mut servers: Vec<u64> = l.locks.iter().map(|h| h.server).collect();
    servers.sort_unstable();
    servers.dedup();
    Some(servers)
}

/// Whether a locks key's value decodes (for the namespace check).
pub(super) fn decodes(v: &[u8]) -> bool {
    decode::<FileLocks>(v, "locks").is_ok()
}

/// Ends the locks of `ino` held through those of `servers` that have no live key as
/// `txn` reads it; how many it ended.
pub(super) fn end_dead(
    txn: &mut Txn<'_>,
    ino: InodeId,
    servers: &[u64],
) -> Result<usize, MetaError> {
    let held = read(txn, ino)?;
    let mut dead = Vec::new();
    for &s in servers {
        if txn.raw(&keys::server(s))?.is_none() {
            dead.push(s);
        }
    }
    let before = held.len();
    let kept: Vec<Held> = held
        .into_iter()
        .filter(|h| !dead.contains(&h.server))
        .collect();
    let ended = before - kept.len();
    if ended > 0 {
        store(txn, ino, kept)?;
    }
    Ok(ended)
}

fn no_live_key() -> MetaError {
    MetaError::Store(crate::kv::KvError::Unavailable {
        engine: "shared",
        message: "this metadata server holds no live key in the engine yet".into(),
    })
}

impl Namespace {
    /// Takes, converts or releases a lock for `client` over `conn` (`SetLock`).
    pub(super) fn set_lock(
        &self,
        ino: InodeId,
        client: ClientId,
        conn: ConnId,
        want: LockSpec,
    ) -> Result<(), MetaError> {
        if self.checked.is_none() {
            return self.locks.lock().set(ino, client, conn, want);
        }
        let mut st = self.state.lock();
        let mut txn = self.begin(&st);
        // A server whose live key went takes no lock: the others may be ending its own.
        let me = match want.kind {
            LockKind::Unlock => txn.holder(),
            _ => txn.holder_fenced(),
        }
        .ok_or_else(no_live_key)?;
        let taker = Held {
            client,
            server: me.id,
            conn,
            spec: want,
        };
        let kept = set_in(&read(&txn, ino)?, ino, taker)?;
        let holds = kept.iter().any(|h| h.server == me.id && h.conn == conn);
        store(&mut txn, ino, kept)?;
        Self::commit_txn(&mut st, txn)?;
        let mut table = self.locks.lock();
        let files = table.by_conn.entry(conn).or_default();
        if holds {
            files.insert(ino);
        } else {
            files.remove(&ino);
            if files.is_empty() {
                table.by_conn.remove(&conn);
            }
        }
        Ok(())
    }

    /// The first lock of another owner that conflicts with `want` (`GetLock`).
    pub(super) fn lock_conflict(
        &self,
        ino: InodeId,
        client: ClientId,
        want: &LockSpec,
    ) -> Result<Option<LockSpec>, MetaError> {
        if self.checked.is_none() {
            return Ok(self.locks.lock().conflict(ino, client, want));
        }
        let locks = match self.store.get(&keys::locks(ino))? {
            None => return Ok(None),
            Some(v) => decode::<FileLocks>(&v, "locks")?.locks,
        };
        Ok(conflict_in(&locks, client, want))
    }

    /// The locks held on `ino` (on a shared engine, through every server).
    pub(super) fn file_locks(&self, ino: InodeId) -> Result<Vec<Held>, MetaError> {
        if self.checked.is_none() {
            return Ok(self.locks.lock().of(ino));
        }
        match self.store.get(&keys::locks(ino))? {
            None => Ok(Vec::new()),
            Some(v) => Ok(decode::<FileLocks>(&v, "locks")?.locks),
        }
    }

    /// Drops every lock of one owner on one file (`ReleaseLocks`: its last descriptor
    /// closed), through whichever server it was taken.
    pub(super) fn release_lock_owner(
        &self,
        ino: InodeId,
        client: ClientId,
        owner: u64,
    ) -> Result<(), MetaError> {
        self.lock_wait_over(client, owner);
        if self.checked.is_none() {
            self.locks.lock().release_owner(ino, client, owner);
            return Ok(());
        }
        self.change_locks(ino, |held| held.retain(|h| !h.same_owner(client, owner)))
    }

    /// Drops every lock taken over `conn` (it closed, or its grace ran out).
    pub(super) fn release_conn_locks(&self, conn: ConnId) {
        self.locks.lock().waits.release_conn(conn);
        if self.checked.is_none() {
            return self.locks.lock().release_conn(conn);
        }
        let Some(files) = self.locks.lock().by_conn.remove(&conn) else {
            return;
        };
        let me = self.state.lock().shared.me.map(|h| h.id);
        for ino in files {
            let dropped = self.retry_conflicts("dropping a connection's locks", || {
                self.change_locks(ino, |held| {
                    held.retain(|h| Some(h.server) != me || h.conn != conn)
                })
            });
            if let Err(e) = dropped {
                // Left in the engine: they end when this server does (`sweep`).
                tracing::warn!(%ino, conn = conn.0, error = %e, "dropping the locks of a closed connection failed");
            }
        }
    }

    /// Moves the locks `client` took through this server's connections `from` to
    /// `conn` (it resumed here on a new connection).
    pub(super) fn move_client_locks(&self, client: ClientId, conn: ConnId, from: &HashSet<ConnId>) {
        if self.checked.is_none() {
            return self.locks.lock().move_client(client, conn, from);
        }
        let files: BTreeSet<InodeId> = {
            let table = self.locks.lock();
            from.iter()
                .filter_map(|c| table.by_conn.get(c))
                .flatten()
                .copied()
                .collect()
        };
        let me = self.state.lock().shared.me.map(|h| h.id);
        for &ino in &files {
            let moved = self.retry_conflicts("moving a resumed client's locks", || {
                self.change_locks(ino, |held| {
                    held.iter_mut()
                        .filter(|h| {
                            h.client == client && Some(h.server) == me && from.contains(&h.conn)
                        })
                        .for_each(|h| h.conn = conn)
                })
            });
            if let Err(e) = moved {
                tracing::warn!(%ino, %client, error = %e, "moving a resumed client's locks failed: they end with its old connection");
                continue;
            }
            self.locks
                .lock()
                .by_conn
                .entry(conn)
                .or_default()
                .insert(ino);
        }
    }

    /// One checked transaction that changes `ino`'s locks with `f`.
    fn change_locks(&self, ino: InodeId, f: impl FnOnce(&mut Vec<Held>)) -> Result<(), MetaError> {
        let mut st = self.state.lock();
        let mut txn = self.begin(&st);
        let mut held = read(&txn, ino)?;
        let before = held.clone();
        f(&mut held);
        if held == before {
            return Ok(());
        }
        store(&mut txn, ino, held)?;
        Self::commit_txn(&mut st, txn)
    }
}
