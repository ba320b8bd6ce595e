//! Append leases: a connection that is the only one with a file open for writing may
//! place `O_APPEND` writes at the end it knows, buffered like plain writes, instead of
//! asking for each append's range (`Append`, one durable change per write).
//!
//! - **Granted** by `TakeLease` while no other connection has the file open for
//!   writing. One lease per file; all sessions of the holding connection share it (its
//!   client orders the appends of its own processes).
//! - **Recalled** when another connection opens the file for writing: that open is
//!   answered `Busy` (the client asks again every 20 ms), and the holder's pending
//!   `Recalls` call is answered with the file. The holder sends what it buffered,
//!   commits the length and gives the lease back (`LeaseCommit`, `keep: false`); the
//!   next try of the open goes through, and from then on every writer appends with
//!   `Append`.
//! - **Taken away** when a recalled lease did not come back within
//!   [`LEASE_RECALL_MS`] (its client is cut off or stuck): the holder's sessions of the
//!   file end as a vanished client's do, and the file is marked for the cut of what it
//!   placed past the committed length. The holder stopped placing appends by then: it
//!   may only while a `Recalls` call it sent less than [`proto::meta::LEASE_VALID_MS`]
//!   ago answered without recalling the file.
//! - **Ended** with the holder's last session of the file on its connection (whose
//!   close committed the length), and with its connection; a resume moves it with the
//!   sessions. A commit of what was placed under a lease (`LeaseCommit`) is refused
//!   `Stale` once the lease is gone: another writer may have appended over it.

use super::files::end_session;
use super::txn::Txn;
use super::{keys, ConnId, Namespace, State};
use crate::error::MetaError;
use proto::meta::{Commit, LEASE_RECALL_MS};
use proto::{Attr, InodeId, SessionId};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// One file's append lease.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lease {
    /// The holding connection.
    conn: ConnId,
    /// When another writer asked for the file, if one did.
    recalled_at: Option<Instant>,
}

/// What an open for writing finds of another connection's lease.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// No lease of another connection: go on.
    Free,
    /// Recalled: wait for the holder (`Busy`).
    Wait,
    /// The holder did not give it back in time: take it away.
    TakeAway(ConnId),
}

/// What an open for writing on `conn` at `now` does about `lease` (a pure function of
/// the lease and the time); sets the recall time at the first ask.
fn verdict(lease: Option<&mut Lease>, conn: ConnId, now: Instant) -> Verdict {
    let Some(l) = lease else {
        return Verdict::Free;
    };
    if l.conn == conn {
        return Verdict::Free;
    }
    let at = *l.recalled_at.get_or_insert(now);
    if now.saturating_duration_since(at) >= Duration::from_millis(LEASE_RECALL_MS) {
        Verdict::TakeAway(l.conn)
    } else {
        Verdict::Wait
    }
}

impl Namespace {
    /// Called by an open for writing of `ino` on `conn`, under the state lock and before
    /// anything is changed: another connection's lease is recalled (`Busy` until it
    /// comes back), or taken away if it did not come back in time (the holder's
    /// sessions of the file end and the file is marked for a cut, in `txn`).
    pub(super) fn recall_lease(
        &self,
        st: &mut State,
        txn: &mut Txn<'_>,
        ino: InodeId,
        conn: ConnId,
    ) -> Result<(), MetaError> {
        let now = self.clock.now();
        match verdict(st.leases.get_mut(&ino), conn, now) {
            Verdict::Free => Ok(()),
            Verdict::Wait => {
                self.recalls.notify_waiters();
                Err(MetaError::Busy(format!(
                    "{ino}: another client's append lease is being recalled"
                )))
            }
            Verdict::TakeAway(holder) => {
                tracing::warn!(%ino, conn = holder.0, "a recalled append lease did not come back in time: the holder's sessions of the file end");
                st.leases.remove(&ino);
                let ended: Vec<SessionId> = st
                    .sessions
                    .iter()
                    .filter(|(_, s)| s.ino == ino && s.conn == holder)
                    .map(|(&id, _)| id)
                    .collect();
                txn.put(keys::tail(ino), super::records::encode(&())?);
                for s in ended {
                    end_session(st, s);
                }
                Ok(())
            }
        }
    }

    /// `TakeLease`: the lease of `session`'s file for its connection `conn`, if the
    /// session writes a regular file and no other connection has it open for writing.
    pub fn take_lease(&self, session: SessionId, conn: ConnId) -> Result<bool, MetaError> {
        let mut st = self.state.lock();
        let s = match st.sessions.get(&session) {
            Some(s) if s.conn == conn => *s,
            _ => return Err(MetaError::Stale(format!("no {session} on this connection"))),
        };
        if !s.write || self.getattr(s.ino)?.kind != proto::FileKind::Regular {
            return Ok(false);
        }
        let other_writer = st
            .sessions
            .values()
            .any(|o| o.ino == s.ino && o.write && o.conn != conn);
        match st.leases.get(&s.ino) {
            Some(l) if l.conn == conn => Ok(l.recalled_at.is_none()),
            Some(_) => Ok(false),
            None if other_writer => Ok(false),
            None => {
                let lease = Lease {
                    conn,
                    recalled_at: None,
                };
                st.leases.insert(s.ino, lease);
                tracing::debug!(ino = %s.ino, conn = conn.0, "append lease granted");
                Ok(true)
            }
        }
    }

    /// `LeaseCommit`: commits what `conn` placed under its lease of `ino`, and gives
    /// the lease back unless `keep`. `Stale` if the lease is not `conn`'s (any more).
    pub fn lease_commit(
        &self,
        ino: InodeId,
        commit: Option<Commit>,
        keep: bool,
        conn: ConnId,
    ) -> Result<Option<Attr>, MetaError> {
        let mut st = self.state.lock();
        match st.leases.get(&ino) {
            Some(l) if l.conn == conn => {}
            // Given back already (a retry): fine, unless there is something to commit.
            None if commit.is_none() => return Ok(None),
            _ => {
                return Err(MetaError::Stale(format!(
                    "{ino}: the append lease was taken away from this client"
                )))
            }
        }
        let mut attr = None;
        if let Some(c) = commit {
            let mut txn = Txn::new(&*self.store, &st.sb);
            let rec = super::files::apply_commit(&mut txn, ino, c)?;
            Self::commit_txn(&mut st, txn)?;
            attr = Some(rec.attr(ino));
        }
        if !keep {
            st.leases.remove(&ino);
            tracing::debug!(%ino, conn = conn.0, "append lease given back");
        }
        Ok(attr)
    }

    /// The files whose leases held by `conn` were recalled.
    pub fn recalled(&self, conn: ConnId) -> Vec<InodeId> {
        let st = self.state.lock();
        let mut out: Vec<InodeId> = st
            .leases
            .iter()
            .filter(|(_, l)| l.conn == conn && l.recalled_at.is_some())
            .map(|(&ino, _)| ino)
            .collect();
        out.sort();
        out
    }

    /// Woken at every recall: the `Recalls` handler registers its wait on it, then
    /// looks at [`Namespace::recalled`], so no recall falls between the two.
    pub fn recall_notify(&self) -> &tokio::sync::Notify {
        &self.recalls
    }
}

/// A session of `ino` on `conn` ended: the connection's lease of the file goes with
/// its last one there.
pub(super) fn session_ended(st: &mut State, ino: InodeId, conn: ConnId) {
    if st.leases.get(&ino).is_none_or(|l| l.conn != conn) {
        return;
    }
    if !st.sessions.values().any(|s| s.ino == ino && s.conn == conn) {
        st.leases.remove(&ino);
        tracing::debug!(%ino, conn = conn.0, "append lease ended with the last session");
    }
}

/// Sessions moved from the connections `from` to `conn` (a resume): their leases too.
pub(super) fn moved(st: &mut State, from: &HashSet<ConnId>, conn: ConnId) {
    let State {
        leases, sessions, ..
    } = st;
    for (ino, l) in leases.iter_mut() {
        let moved = from.contains(&l.conn)
            && sessions.values().any(|s| s.ino == *ino && s.conn == conn)
            && !sessions.values().any(|s| s.ino == *ino && s.conn == l.conn);
        if moved {
            l.conn = conn;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a recalled lease blocking other writers forever, or being taken
    /// away before the holder had its time to give it back.
    #[test]
    fn a_recall_waits_for_the_holder_then_takes_the_lease_away() {
        let (holder, other) = (ConnId(1), ConnId(2));
        let t0 = Instant::now();
        assert_eq!(verdict(None, other, t0), Verdict::Free);
        let mut l = Lease {
            conn: holder,
            recalled_at: None,
        };
        assert_eq!(verdict(Some(&mut l), holder, t0), Verdict::Free);
        assert!(l.recalled_at.is_none(), "its own opens recall nothing");
        assert_eq!(verdict(Some(&mut l), other, t0), Verdict::Wait);
        assert_eq!(l.recalled_at, Some(t0));
        let almost = t0 + Duration::from_millis(LEASE_RECALL_MS - 1);
        assert_eq!(verdict(Some(&mut l), other, almost), Verdict::Wait);
        let late = t0 + Duration::from_millis(LEASE_RECALL_MS);
        assert_eq!(
            verdict(Some(&mut l), other, late),
            Verdict::TakeAway(holder)
        );
        assert_eq!(l.recalled_at, Some(t0), "counted from the first ask");
    }
}
