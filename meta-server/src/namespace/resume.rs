//! Sessions that outlive a broken connection: a client cut off by the network (its
//! connection reset or timed out, see [`transport::Closed::Broken`]) keeps its open
//! files and locks for `session_grace_ms`, and takes them back with `Resume` on its next
//! connection. Only when the grace runs out do they end as a vanished client's do
//! (orphans freed, files marked for the cut of what it left past their length, locks
//! dropped). A connection its peer closed in order (the client's process ended) ends at
//! once, as before: nobody can come back for it.
//!
//! Why: ending the sessions of a client that lives on lets another client's open cut
//! bytes it wrote past the committed length and will commit at its close, and frees a
//! file it holds open after an unlink; both lose data without telling anyone.

use super::txn::Reads;
use super::{opens, ConnId, Namespace, Session, State};
use crate::error::MetaError;
use proto::meta::fs::OpenSession;
use proto::meta::{Caller, OpenAccess};
use proto::{ClientId, InodeId, SessionId};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// What a [`Namespace::resume`] did.
#[derive(Debug, Default)]
pub struct Resumption {
    /// The sessions taken back, with their files and whether each is open for writing
    /// (their grants are sealed from these).
    pub kept: Vec<(SessionId, InodeId, bool)>,
    /// The sessions the server no longer has.
    pub lost: Vec<SessionId>,
}

impl Namespace {
    /// A connection broke under a client that may be alive: its sessions and locks
    /// stay until [`Namespace::expire_detached`] finds the grace over, unless the client
    /// resumes them first. With no grace configured they end now.
    pub fn connection_broken(&self, conn: ConnId) {
        if self.stopping.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        // Its early-reply mark goes too: the delete is logged after the client's
        // changes, so a crash that loses it loses nothing the client must send again
        // (a client that comes back marks itself at its next change).
        self.unmark_conn(conn);
        let grace = Duration::from_millis(self.config.session_grace_ms);
        if grace.is_zero() {
            return self.connection_closed(conn);
        }
        let mut st = self.state.lock();
        let open = st.sessions.values().filter(|s| s.conn == conn).count();
        if open == 0 && !self.locks.lock().holds_conn(conn) {
            return;
        }
        st.detached.insert(conn, self.clock.now() + grace);
        tracing::info!(
            conn = conn.0,
            open,
            grace_ms = self.config.session_grace_ms,
            "a client's connection broke: its sessions wait for it to resume"
        );
    }

    /// Ends the sessions and locks of broken connections whose grace ran out by `now`
    /// (those no client resumed). Returns how many connections it ended. `now` comes
    /// from the caller's clock: the server's periodic task passes the system time, a
    /// test [`Namespace::now`] of its manual clock.
    pub fn expire_detached(&self, now: Instant) -> usize {
        let due: Vec<ConnId> = {
            let mut st = self.state.lock();
            let due: Vec<ConnId> = st
                .detached
                .iter()
                .filter(|(_, &deadline)| deadline <= now)
                .map(|(&c, _)| c)
                .collect();
            for c in &due {
                st.detached.remove(c);
            }
            due
        };
        for &conn in &due {
            tracing::info!(
                conn = conn.0,
                "no client resumed a broken connection's sessions: they end"
            );
            self.connection_closed(conn);
        }
        due.len()
    }

    /// Moves `client`'s sessions (and its locks) from their broken connections to
    /// `conn`, its new connection. A session this server ended already is returned as
    /// lost. One opened before this server started is opened again if its file still
    /// exists, the caller may open it (for writing if the client says it was opened so
    /// and the caller may write it now; else for reading), and nobody is cutting its
    /// tail: a restart ends no session on purpose, so nothing was cut for it.
    ///
    /// A session still on a live connection is not taken: the resume fails `Busy` and
    /// changes nothing (the client tries again; its old connection is either found
    /// broken, and waits for it, or closed, and its sessions are lost). Whoever named
    /// `client` was checked to be its key ([`Namespace::may_name_client`]), but one key
    /// may serve several mounts.
    pub fn resume(
        &self,
        client: ClientId,
        sessions: &[OpenSession],
        conn: ConnId,
        caller: &Caller,
    ) -> Result<Resumption, MetaError> {
        self.resume_taking(client, sessions, conn, caller, false)
    }

    /// [`Namespace::resume`]; with `taking`, a session of `client` still on a standing
    /// connection is moved too (the asker proved it is the session's: it sent the
    /// id of the create that opened it, see `once`).
    pub(super) fn resume_taking(
        &self,
        client: ClientId,
        sessions: &[OpenSession],
        conn: ConnId,
        caller: &Caller,
        taking: bool,
    ) -> Result<Resumption, MetaError> {
        if sessions.len() > proto::meta::MAX_RESUMES {
            return Err(MetaError::InvalidArgument(format!(
                "{} sessions in one resume, at most {}",
                sessions.len(),
                proto::meta::MAX_RESUMES
            )));
        }
        let reopen = self.reopen_modes(caller, sessions)?;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let live = sessions.iter().find_map(|o| {
            let s = st.sessions.get(&o.session)?;
            let mine = s.client == client && s.ino == o.ino;
            (mine && s.conn != conn && !st.detached.contains_key(&s.conn)).then_some(o.session)
        });
        if let Some(session) = live.filter(|_| !taking) {
            return Err(MetaError::Busy(format!(
                "{session} is open on a connection that still stands"
            )));
        }
        // Locks move only off a broken connection (or one whose sessions move).
        let mut from: HashSet<ConnId> = st.detached.keys().copied().collect();
        let mut r = Resumption::default();
        // On a shared engine any server may have held a session since (the client
        // went there and came back): the file's key says whether it still stands.
        let shared = self.checked.is_some();
        for o in sessions {
            let (session, ino) = (o.session, o.ino);
            let here = st.sessions.get(&session).copied();
            match here {
                Some(s) if s.client == client && s.ino == ino => {
                    if !self.reclaim_opener(st, ino, session, s.write)? {
                        // Ended on the server the client went to meanwhile.
                        super::files::end_session(st, session);
                        r.lost.push(session);
                        continue;
                    }
                    // Locks move with a broken connection's sessions; a session taken
                    // from a standing one (`taking`) leaves its locks there.
                    if !taking || st.detached.contains_key(&s.conn) {
                        from.insert(s.conn);
                    }
                    if let Some(s) = st.sessions.get_mut(&session) {
                        s.conn = conn;
                    }
                    r.kept.push((session, ino, s.write));
                }
                // Another client's, or another file's: never taken over.
                Some(_) => r.lost.push(session),
                // One of a previous start (on a shared engine, of any server: ids are
                // not ordered by the servers' starts).
                None if (shared || session.0 < st.boot_floor) && !st.cutting.contains_key(&ino) => {
                    // Its open mode died with the previous start: the client names it,
                    // and the checks of today decide (`reopen_mode`).
                    let Some(write) = reopen.get(&session).copied().flatten() else {
                        r.lost.push(session);
                        continue;
                    };
                    if !self.reclaim_opener(st, ino, session, write)? {
                        r.lost.push(session);
                        continue;
                    }
                    let s = Session {
                        ino,
                        conn,
                        client,
                        write,
                    };
                    st.sessions.insert(session, s);
                    *st.open_counts.entry(ino).or_insert(0) += 1;
                    r.kept.push((session, ino, write));
                }
                None => r.lost.push(session),
            }
        }
        // A connection whose sessions all moved has nothing left to end.
        for &c in &from {
            if c != conn && !st.sessions.values().any(|s| s.conn == c) {
                st.detached.remove(&c);
            }
        }
        drop(guard);
        self.move_client_locks(client, conn, &from);
        let (kept, lost) = (r.kept.len(), r.lost.len());
        tracing::info!(%client, conn = conn.0, resumed = kept, lost, "client resumed its sessions");
        Ok(r)
    }

    /// On a shared engine, takes a session over in its file's openers (`opens`): from
    /// now on this server holds it, and the one that held it, if it still runs, no
    /// longer ends it there when its grace runs out. Whether the session may be kept:
    /// the file is still there and its key still names the session (not, if it was
    /// closed, or ended with a server that died). Off a shared engine always (memory is
    /// the truth there). An engine that does not answer, or this server's live key
    /// gone, fails the resume: the session may stand, and the client tries again (on
    /// another server).
    fn reclaim_opener(
        &self,
        st: &mut State,
        ino: InodeId,
        session: SessionId,
        write: bool,
    ) -> Result<bool, MetaError> {
        if self.checked.is_none() {
            return Ok(true);
        }
        self.retry_conflicts("taking back a session", || {
            let mut txn = self.begin(st);
            if txn.try_inode(ino)?.is_none() || !opens::take_over(&mut txn, ino, session, write)? {
                txn.check_reads()?;
                return Ok(false);
            }
            Self::commit_txn(st, txn)?;
            Ok(true)
        })
    }

    /// The time by the namespace's clock, the one graces and leases are measured on.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Broken connections whose sessions wait for their client (for status and tests).
    pub fn waiting_resume(&self) -> usize {
        self.state.lock().detached.len()
    }

    /// How a session of a previous start may be opened again for `caller` (a resume
    /// must not open what an `Open` would refuse): `Some(true)` for writing if it was
    /// opened so and the caller may open the file for writing now, else `Some(false)`
    /// if it may open it for reading, `None` if neither or the file is gone. A
    /// read-only key's caller never gets here with a write: the handler clears it.
    fn reopen_mode(&self, caller: &Caller, o: &OpenSession) -> Result<Option<bool>, MetaError> {
        if !self
            .inodes_exist(&[o.ino])?
            .first()
            .copied()
            .unwrap_or(false)
        {
            return Ok(None);
        }
        // `append`: the session's own open was checked for `O_APPEND` when it was made.
        let how = |access| super::access::OpenHow {
            access,
            truncate: false,
            append: true,
        };
        let may = |access| match self.may_open(caller, o.ino, how(access)) {
            Ok(()) => Ok(true),
            // Refused now (a mode, or an immutable flag set since): not so.
            Err(
                MetaError::PermissionDenied(_)
                | MetaError::NotPermitted(_)
                | MetaError::NotFound(_),
            ) => Ok(false),
            Err(e) => Err(e),
        };
        if o.writes && may(OpenAccess::Write)? {
            return Ok(Some(true));
        }
        Ok(may(OpenAccess::Read)?.then_some(false))
    }

    /// [`Self::reopen_mode`] of each session of a previous start in `sessions` (on a
    /// shared engine of each session: one this server does not have may be another
    /// server's, whatever its id). The checks read the store: made before the state
    /// lock is taken.
    fn reopen_modes(
        &self,
        caller: &Caller,
        sessions: &[OpenSession],
    ) -> Result<HashMap<SessionId, Option<bool>>, MetaError> {
        let floor = self.boot_floor();
        let shared = self.checked.is_some();
        let mut reopen = HashMap::new();
        for o in sessions {
            if (shared || o.session.0 < floor) && !reopen.contains_key(&o.session) {
                reopen.insert(o.session, self.reopen_mode(caller, o)?);
            }
        }
        Ok(reopen)
    }

    /// Sessions of ids below this are of a previous start.
    fn boot_floor(&self) -> u64 {
        self.state.lock().boot_floor
    }
}
