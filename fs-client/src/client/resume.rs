//! Taking open files back after the metadata connection broke: the server keeps a
//! broken connection's sessions for its `session_grace_ms`, and the first thing this
//! client sends on each new connection is `Resume` with the sessions it has open. A
//! session the server ended meanwhile (the client stayed away too long, or the file is
//! gone) is lost: its file's uncommitted writes may have been cut by another client, so
//! they are never committed, and its writes, fsyncs and close fail with EIO. A server
//! that restarted meanwhile opens a session again as the caller that opened it may open
//! the file today (for writing if it was opened so), and answers with a grant for each.

use super::Client;
use crate::error::{ClientError, Result};
use crate::rpc;
use proto::meta::{fs, Caller, MAX_RESUMES};
use proto::Request;
use proto::{ErrorCode, SessionId, WireError};
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

/// How often a client with open files checks that its metadata connection still
/// stands, and reconnects and resumes if not: well within the server's grace.
pub(crate) const RESUME_CHECK: Duration = Duration::from_secs(1);

/// An open session as a resume names it, and whom it was opened for: a metadata server
/// that restarted since opens it again only if that caller may open it so today.
pub(crate) struct Opener {
    pub(crate) open: fs::OpenSession,
    pub(crate) caller: Caller,
}

/// The `Resume` calls that take back `openers`: one per caller (the call names it), of
/// at most [`MAX_RESUMES`] sessions each.
fn resume_calls<'a>(
    openers: impl Iterator<Item = &'a Opener>,
) -> Vec<(Caller, Vec<fs::OpenSession>)> {
    let mut groups: Vec<(Caller, Vec<fs::OpenSession>)> = Vec::new();
    for o in openers {
        let open = groups
            .iter_mut()
            .find(|(c, g)| *c == o.caller && g.len() < MAX_RESUMES);
        match open {
            Some((_, g)) => g.push(o.open.clone()),
            None => groups.push((o.caller.clone(), vec![o.open.clone()])),
        }
    }
    groups
}

impl Client {
    /// Records an open session (its handle exists now) and the caller it was opened
    /// for, for [`Client::resume_sessions`].
    pub(crate) fn session_opened(&self, open: fs::OpenSession, caller: Caller) {
        let session = open.session;
        let opener = Opener { open, caller };
        self.sessions.lock().insert(session, opener);
    }

    /// Forgets a session its handle ended (its file's grant is no longer renewed with it).
    pub(crate) fn session_closed(&self, session: SessionId) {
        self.sessions.lock().remove(&session);
        self.data.grants.ended(session);
    }

    /// Resumes this client's sessions if the metadata connection is a new one since
    /// the last resume (the first connection, which said hello, needs none). Fails when
    /// the server cannot be reached (the caller may wait for it); a refusal is logged and
    /// left for the next call to try again.
    pub(crate) async fn resume_sessions(&self) -> Result<()> {
        let (_, made) = self.meta.get_counted(&self.ep).await?;
        if made <= self.resumed.load(Ordering::Acquire) {
            return Ok(());
        }
        let _one = self.resume_lock.lock().await;
        if made <= self.resumed.load(Ordering::Acquire) {
            return Ok(());
        }
        // Changes answered early that the server may have lost land first (a resumed
        // session may be a create's).
        self.replay_held().await?;
        let calls = resume_calls(self.sessions.lock().values());
        let open: usize = calls.iter().map(|(_, o)| o.len()).sum();
        let mut lost = 0;
        for (caller, sessions) in calls {
            let req = Request::new(fs::Resume {
                client: self.id,
                sessions,
            })
            .with_caller(caller);
            match rpc::meta_call(&self.ep, &self.meta, &req).await {
                Ok(r) => {
                    // A restarted server sealed these afresh, writable for an open
                    // for writing it opened so again: its grant before may run out.
                    for (session, grant) in r.grants {
                        // Not for a session whose handle closed meanwhile.
                        if self.sessions.lock().contains_key(&session) {
                            self.data.grants.put(Some(grant), session);
                        }
                    }
                    // Lost as each call answers, so a later call's refusal drops none.
                    lost += r.lost.len();
                    for session in r.lost {
                        self.lose(session);
                    }
                }
                Err(e @ ClientError::Transport(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "resuming open files failed; trying again later");
                    return Ok(());
                }
            }
        }
        self.reclaim_locks().await?;
        self.resumed.store(made, Ordering::Release);
        tracing::info!(
            open,
            lost,
            "metadata connection made again, open files resumed"
        );
        Ok(())
    }

    /// A session the server no longer has: nothing more is committed for its file,
    /// and its handles fail from now on.
    fn lose(&self, session: SessionId) {
        let Some(ino) = self.sessions.lock().get(&session).map(|o| o.open.ino) else {
            return;
        };
        tracing::warn!(%session, %ino, "the metadata server ended this open while the client was cut off");
        if let Some(st) = self.open_file(ino) {
            st.lose(WireError::new(
                ErrorCode::Io,
                format!(
                    "{ino}: the metadata server ended this open while the client was cut \
                     off from it; writes not committed before may be lost"
                ),
            ));
        }
    }

    /// Checks the metadata connection every [`RESUME_CHECK`] while files are open, so a
    /// client that only reads and writes data (no metadata calls) still comes back
    /// within the server's grace. Ends with the client.
    pub(crate) fn spawn_resume_check(&self) {
        let me: Weak<Client> = self.me.clone();
        self.rt.spawn(async move {
            let mut tick = tokio::time::interval(RESUME_CHECK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(client) = me.upgrade() else { return };
                // With open files, or after early replies (a restarted server waits for
                // this client to settle before it serves others): reconnect now.
                if !client.sessions.lock().is_empty() || client.held.took_early() {
                    // Unreachable: the next tick, or the next call, tries again.
                    let _ = client.resume_sessions().await;
                }
                // Changes answered early and kept a while: settled, and sent again to
                // a server that restarted meanwhile.
                if let Err(e) = client.settle_old().await {
                    tracing::debug!(error = %e, "settling kept changes failed; trying again");
                }
            }
        });
    }
}
