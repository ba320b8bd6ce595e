//! A metadata server that is away for a moment (restarting, or its connection broken):
//! metadata calls wait up to `meta_wait_ms` for it, resuming the open files on each new
//! connection before the call itself, and what this client knows of an open file
//! answers `fstat` (and the kernel's size check at the end of a read) meanwhile.

use super::Client;
use crate::error::{ClientError, Result};
use crate::file::FileState;
use crate::rpc::{self, MetaCall};
use proto::meta::fs::{self, FsRequest};
use proto::meta::MetaRequest;
use proto::{Attr, InodeId, Request};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first pause before trying an unreachable server again; it doubles up to
/// [`MAX_PAUSE`]. A restarted server is found within about one pause of its start.
const FIRST_PAUSE: Duration = Duration::from_millis(20);
/// The longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// Tries of one call while the server is away: one at once (a connection that broke
/// under an idle client), then with growing pauses until the deadline.
struct Patience {
    start: Instant,
    deadline: Instant,
    pause: Duration,
    tries: u32,
}

impl Patience {
    fn new(wait: Duration) -> Patience {
        let start = Instant::now();
        Patience {
            start,
            deadline: start + wait,
            pause: Duration::ZERO,
            tries: 0,
        }
    }

    /// Waits before the next try, or says there is none left.
    async fn again(&mut self, e: &ClientError) -> bool {
        if self.tries > 0 && Instant::now() + self.pause > self.deadline {
            return false;
        }
        if self.tries == 1 {
            let wait_ms = self
                .deadline
                .saturating_duration_since(self.start)
                .as_millis();
            tracing::warn!(error = %e, wait_ms, "metadata server unreachable, waiting for it");
        }
        self.tries += 1;
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).clamp(FIRST_PAUSE, MAX_PAUSE);
        true
    }

    /// Says that the server answered again, if this call had to wait for it.
    fn answered(&self) {
        if self.tries > 1 {
            let waited_ms = self.start.elapsed().as_millis();
            tracing::info!(waited_ms, "metadata server reachable again");
        }
    }
}

impl Client {
    /// How long metadata calls wait for an unreachable server (`meta_wait_ms`).
    pub(crate) fn meta_wait(&self) -> Duration {
        Duration::from_millis(self.config.meta_wait_ms)
    }

    /// Sends `req`, on a connection whose open files were resumed, waiting up to `wait`
    /// while the server cannot be reached (see [`rpc::server_away`]).
    pub(crate) async fn meta_waiting<R: MetaCall>(
        &self,
        req: &Request<R>,
        wait: Duration,
    ) -> Result<(R::Reply, u64)> {
        let mut patience = Patience::new(wait);
        // A change with an id is sent again as such: the server then answers from its
        // record if the first try was applied (see `proto::meta::OpId`).
        let mut again: Option<Request<R>> = None;
        let mut tried = false;
        loop {
            let e = match self.resume_sessions().await {
                // Nothing of `req` was sent yet: safe to try again whatever it is.
                Err(e) => e,
                Ok(()) => {
                    // A try again, once the resume told whether the open was lost (a
                    // first try's commit never names a lost open: `send_written`).
                    if let Some(lost) = tried.then(|| self.lost_commit(req.envelope())).flatten() {
                        return Err(lost);
                    }
                    match self.meta_once(again.as_ref().unwrap_or(req)).await {
                        Err(e) if rpc::server_away::<R>(&e, req.envelope()) => e,
                        r => {
                            patience.answered();
                            return r;
                        }
                    }
                }
            };
            tried = true;
            if !rpc::unreachable(&e) || !patience.again(&e).await {
                return Err(e);
            }
            self.ep.count_retry();
            if again.is_none() {
                again = req.retried();
            }
        }
    }

    /// A length commit of a file whose open the server ended while this client was
    /// away (found by the resume before a retry): sending it again would commit a
    /// length over bytes another client may have cut, so it fails instead.
    fn lost_commit(&self, req: &MetaRequest) -> Option<ClientError> {
        let MetaRequest::Fs(call) = req else {
            return None;
        };
        let ino = match &call.req {
            FsRequest::Commit(fs::Commit { ino, .. }) => *ino,
            FsRequest::SetAttr(fs::SetAttr {
                ino,
                commit: Some(_),
                ..
            }) => *ino,
            _ => return None,
        };
        let st = self.live_file(ino).filter(|st| st.is_lost())?;
        let why = format!(
            "{}: the open was lost while the metadata server was away",
            st.ino
        );
        Some(ClientError::OpenLost(why))
    }

    /// Waits up to `meta_wait_ms` for a connection whose open files were resumed: a
    /// commit must know first whether its open was lost while the client was away.
    pub(crate) async fn resume_waiting(&self) -> Result<()> {
        let mut patience = Patience::new(self.meta_wait());
        loop {
            match self.resume_sessions().await {
                Ok(()) => {
                    patience.answered();
                    return Ok(());
                }
                Err(e) if rpc::unreachable(&e) && patience.again(&e).await => {
                    self.ep.count_retry();
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends `req` about `open`'s file without waiting for a server that is away: then
    /// it answers `Err(state)`, for the caller to answer from what the client knows.
    /// With no open file it waits up to `meta_wait_ms`, as every call does.
    async fn meta_or_known<R: MetaCall>(
        &self,
        req: &Request<R>,
        open: Option<Arc<FileState>>,
    ) -> Result<std::result::Result<R::Reply, Arc<FileState>>> {
        let wait = match open {
            Some(_) => Duration::ZERO,
            None => self.meta_wait(),
        };
        // Not through `meta_sent`: the wait for removals on their way is here.
        if let MetaRequest::Fs(call) = req.envelope() {
            self.removes_fence(&call.req).await;
        }
        match (self.meta_waiting(req, wait).await, open) {
            (Ok((reply, _)), _) => Ok(Ok(reply)),
            (Err(e), Some(st)) if rpc::unreachable(&e) => {
                tracing::debug!(ino = %st.ino, error = %e, "server away: answered from the open file");
                Ok(Err(st))
            }
            (Err(e), _) => Err(e),
        }
    }

    /// The attributes of `ino`. A file this client has open is answered from what the
    /// client knows of it while the server is away, without waiting: `fstat`, and the
    /// kernel's size check when a read reaches the end, go on through a restart.
    pub async fn getattr(&self, ino: InodeId) -> Result<Attr> {
        // The length shown includes this mount's appends: placed first.
        if let Some(st) = self.live_file(ino) {
            self.place_appends(&st).await;
        }
        if let Some(attr) = self.take_kept_attr(ino) {
            return Ok(attr);
        }
        let req = Request::new(fs::GetAttr { ino }).with_caller(super::caller::current());
        match self.meta_or_known(&req, self.live_file(ino)).await? {
            Ok(attr) => Ok(self.overlay(attr)),
            Err(st) => Ok(st.known_attr()),
        }
    }

    /// The attributes of `ino` as the metadata server has them now: no copy kept from a
    /// reply of this client's, and none of this client's uncommitted writes laid over
    /// them (what another client sees).
    pub async fn getattr_asked(&self, ino: InodeId) -> Result<Attr> {
        self.meta(fs::GetAttr { ino }).await
    }

    /// Sends a `GetXattr`; see [`Client::getxattr`]. While the server is away, the
    /// capability check the kernel makes before writes is answered "none" for an open
    /// file known to have no extended attributes, without waiting. Says whether the
    /// answer was guessed that way.
    pub(crate) async fn getxattr_call(
        &self,
        ino: InodeId,
        req: &Request<fs::GetXattr>,
        capability: bool,
    ) -> (Result<Vec<u8>>, bool) {
        let open = self.live_file(ino).filter(|_| capability);
        match self.meta_or_known(req, open).await {
            Ok(Ok(value)) => (Ok(value), false),
            Ok(Err(st)) if st.known_attr().xattr_count == 0 => {
                (Err(ClientError::NoXattr(format!("{ino}"))), true)
            }
            Ok(Err(st)) => {
                let why = format!("{}: the metadata server is away", st.ino);
                (Err(ClientError::MetaAway(why)), false)
            }
            Err(e) => (Err(e), false),
        }
    }
}
