//! Taking open files back after the metadata connection broke: the server keeps a
//! broken connection's sessions for its `session_grace_ms`, and the first thing this
//! client sends on each new connection is `Resume` with the sessions it has open. A
//! session the server ended meanwhile (the client stayed away too long, or the file is
//! gone) is lost: its file's uncommitted writes may have been cut by another client, so
//! they are never committed, and its writes, fsyncs and close fail with EIO.

use super::Client;
use crate::error::{ClientError, Result};
use crate::rpc;
use proto::meta::{fs, MAX_RELEASES};
use proto::Request;
use proto::{ErrorCode, InodeId, SessionId, WireError};
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

/// How often a client with open files checks that its metadata connection still
/// stands, and reconnects and resumes if not: well within the server's grace.
pub(crate) const RESUME_CHECK: Duration = Duration::from_secs(1);

impl Client {
    /// Records an open session (its handle exists now), for [`Client::resume_sessions`].
    pub(crate) fn session_opened(&self, session: SessionId, ino: InodeId) {
        self.sessions.lock().insert(session, ino);
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
        let open: Vec<(SessionId, InodeId)> =
            self.sessions.lock().iter().map(|(&s, &i)| (s, i)).collect();
        let mut lost = Vec::new();
        for part in open.chunks(MAX_RELEASES) {
            let req = Request::new(fs::Resume {
                client: self.id,
                sessions: part.to_vec(),
            });
            match rpc::meta_call(&self.ep, &self.meta, &req).await {
                Ok(l) => lost.extend(l),
                Err(e @ ClientError::Transport(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "resuming open files failed; trying again later");
                    return Ok(());
                }
            }
        }
        self.resumed.store(made, Ordering::Release);
        tracing::info!(
            open = open.len(),
            lost = lost.len(),
            "metadata connection made again, open files resumed"
        );
        for session in lost {
            self.lose(session);
        }
        Ok(())
    }

    /// A session the server no longer has: nothing more is committed for its file,
    /// and its handles fail from now on.
    fn lose(&self, session: SessionId) {
        let Some(ino) = self.sessions.lock().get(&session).copied() else {
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
                if !client.sessions.lock().is_empty() {
                    // Unreachable: the next tick, or the next call, tries again.
                    let _ = client.resume_sessions().await;
                }
            }
        });
    }
}
