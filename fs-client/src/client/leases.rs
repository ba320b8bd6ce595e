//! Append leases (the server's side is `meta-server/src/namespace/leases.rs`): while
//! this client is the only one with a file open for writing, its `O_APPEND` writes go
//! at the end it knows, into the write buffers, as plain writes do; the length is
//! committed as for plain writes, with `LeaseCommit`, which the server refuses once
//! the lease was taken away.
//!
//! An `O_APPEND` open asks for the lease (`TakeLease`). While any is held, one task
//! keeps a `Recalls` call in flight; an answer that recalls nothing lets the leases be
//! used for `LEASE_VALID_MS` from when that call was sent. A recalled lease is given
//! back at once: the buffered writes are sent, the length committed and the lease
//! returned in one `LeaseCommit`. A lease whose time ran out, or that was taken on an
//! earlier metadata connection, is given back before the next append, which then asks
//! the server for its range (`Append`).

use super::Client;
use crate::error::{ClientError, Result};
use crate::file::{FileHandle, FileState};
use parking_lot::Mutex;
use proto::meta::{fs, LEASE_VALID_MS};
use proto::{ErrorCode, InodeId, Request, WireError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where [`Client::try_append_now`] placed an append under the lease.
pub(crate) enum Placed {
    /// Its bytes are buffered.
    Buffered,
    /// Its range is taken and its bytes are not buffered yet: they go there with
    /// [`Client::write_taken`].
    Taken(TakenRange),
}

/// The range of an append placed under the lease whose bytes are not buffered yet.
/// While it lives the append is still placing (`append_lock` is held shared): no commit
/// takes the file's length and no give-back starts, so none covers a range whose bytes
/// are not buffered (another writer could read zeros there, or have its own bytes
/// overwritten by these when they come).
pub(crate) struct TakenRange {
    /// Where the bytes go.
    at: u64,
    _placing: tokio::sync::OwnedRwLockReadGuard<()>,
}

/// How long the poller waits before it asks again after a failed `Recalls`.
const POLL_RETRY: Duration = Duration::from_millis(100);

/// Until when this client's leases may be used, and on which metadata connection.
#[derive(Default)]
pub(crate) struct LeaseClock {
    inner: Mutex<ClockInner>,
}

#[derive(Default)]
struct ClockInner {
    /// Leases may be used before this instant.
    valid_until: Option<Instant>,
    /// The metadata connection (`Link` count) the leases were taken on.
    conn: u64,
    /// A task keeps a `Recalls` call in flight.
    polling: bool,
}

impl LeaseClock {
    /// Whether leases may be used now.
    fn valid(&self) -> bool {
        let i = self.inner.lock();
        i.valid_until.is_some_and(|t| Instant::now() < t)
    }

    /// A call sent at `sent` on connection `conn` showed the leases held: they may be
    /// used for [`LEASE_VALID_MS`] from then. A call on another connection than the
    /// leases' proves nothing.
    fn confirmed(&self, sent: Instant, conn: u64) {
        let mut i = self.inner.lock();
        if i.conn == conn {
            let until = sent + Duration::from_millis(LEASE_VALID_MS);
            i.valid_until = Some(i.valid_until.map_or(until, |t| t.max(until)));
        }
    }

    /// Nothing more is confirmed: every lease is to be given back before use.
    fn expire(&self) {
        self.inner.lock().valid_until = None;
    }
}

impl Client {
    /// Asks for the append lease of `fh`'s file (an `O_APPEND` open for writing).
    /// Nothing fails for a refusal: appends then ask the server for their ranges.
    pub async fn take_append_lease(&self, fh: &FileHandle) {
        let Ok((conn, made)) = self.meta.get_counted(&self.ep).await else {
            return;
        };
        {
            let mut i = self.leases.inner.lock();
            if i.conn != made && self.open_files().iter().any(|f| f.leased()) {
                // Leases of an older connection are being given back: none on a new
                // one meanwhile (one connection's word confirms them all).
                return;
            }
            i.conn = made;
        }
        let sent = Instant::now();
        let req = Request::new(fs::TakeLease {
            session: fh.session,
        });
        let limit = self.ep.config().max_msg_bytes;
        match transport::rpc::call::<_, ClientError>(&conn, &req, limit).await {
            Ok(true) => {
                fh.state.set_leased(true);
                self.leases.confirmed(sent, made);
                self.start_lease_poll();
            }
            Ok(false) => {}
            Err(e) => tracing::debug!(ino = %fh.ino(), error = %e, "append lease refused"),
        }
    }

    /// Whether this client has a session of `ino` open.
    pub(crate) fn has_open(&self, ino: InodeId) -> bool {
        self.sessions.lock().values().any(|o| o.open.ino == ino)
    }

    /// Places an append under the file's lease, if it holds one that may be used:
    /// the bytes go where this client knows the end to be, through the write buffers.
    /// `None`: append with the server's range (a lease that may not be used was given
    /// back first).
    pub(crate) async fn append_leased(&self, fh: &FileHandle, data: &[u8]) -> Result<Option<u64>> {
        let st = &fh.state;
        if !st.leased() {
            return Ok(None);
        }
        if !self.leases.valid() {
            self.give_back(st).await?;
            return Ok(None);
        }
        let _placing = st.append_lock.read().await;
        if !st.leased() {
            return Ok(None);
        }
        fh.check_write_error()?;
        let at = st.reserve(data.len() as u64)?;
        self.appended_here(fh);
        self.write(fh, at, data).await?;
        Ok(Some(at))
    }

    /// [`Client::append_leased`] without waiting, for the FUSE thread: `None` if that
    /// would wait (or no lease may be used); else where the bytes went.
    pub(crate) fn try_append_now(&self, fh: &FileHandle, data: &[u8]) -> Option<Result<Placed>> {
        let st = &fh.state;
        if data.is_empty() || !st.leased() || fh.has_unreported_error() || !self.leases.valid() {
            return None;
        }
        let placing = st.append_lock.clone().try_read_owned().ok()?;
        if !st.leased() {
            return None;
        }
        let at = match st.reserve(data.len() as u64) {
            Ok(at) => at,
            Err(e) => return Some(Err(e)),
        };
        self.appended_here(fh);
        match self.try_write_now(fh, at, data) {
            Some(Ok(_)) => Some(Ok(Placed::Buffered)),
            Some(Err(e)) => Some(Err(e)),
            // Still placing: the range is taken, its bytes are not buffered yet.
            None => Some(Ok(Placed::Taken(TakenRange {
                at,
                _placing: placing,
            }))),
        }
    }

    /// Writes the bytes of an append whose range [`Client::try_append_now`] took, then
    /// lets commits and give-backs of the file go on. Returns where they went.
    pub(crate) async fn write_taken(
        &self,
        fh: &FileHandle,
        range: TakenRange,
        data: &[u8],
    ) -> Result<(u64, usize)> {
        let n = self.write(fh, range.at, data).await?;
        Ok((range.at, n))
    }

    /// An append moved the file's length without a request: the attributes kept from
    /// an earlier reply (a commit's) go, as an `Append` request's would make them go.
    fn appended_here(&self, fh: &FileHandle) {
        let req = fs::FsRequest::Append(fs::Append {
            ino: fh.ino(),
            len: 0,
        });
        self.dir_attrs.before(&req);
    }

    /// Gives back the lease of `st`'s file: sends its buffered writes, commits the
    /// length and returns the lease in one `LeaseCommit`. Refused `Stale` (the lease was
    /// taken away): what was placed under it is lost, and the file's handles fail.
    pub(crate) async fn give_back(&self, st: &Arc<FileState>) -> Result<()> {
        let placing = st.append_lock.write().await;
        self.give_back_held(st, placing).await
    }

    /// [`Client::give_back`] with no append placing bytes meanwhile (`_placing`).
    async fn give_back_held(
        &self,
        st: &Arc<FileState>,
        _placing: tokio::sync::RwLockWriteGuard<'_, ()>,
    ) -> Result<()> {
        if !st.leased() {
            return Ok(());
        }
        let pending = self.send_pending(st, st.pending_commit()).await;
        let req = fs::LeaseCommit {
            ino: st.ino,
            commit: pending.as_ref().map(|(c, _)| *c),
            keep: false,
        };
        match self.meta(req).await {
            Ok(attr) => {
                st.set_leased(false);
                if let (Some((_, generation)), Some(attr)) = (pending, attr) {
                    st.committed_with(generation, &attr);
                }
                tracing::debug!(ino = %st.ino, "append lease given back");
                Ok(())
            }
            Err(e) if e.code() == ErrorCode::Stale => {
                st.set_leased(false);
                self.lease_lost(st, &e);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// The lease of `st`'s file was taken away with writes placed under it
    /// uncommitted: another writer may have appended over them.
    pub(crate) fn lease_lost(&self, st: &FileState, e: &ClientError) {
        tracing::warn!(ino = %st.ino, error = %e, "the append lease was taken away: appends not committed before are lost");
        st.lose(WireError::new(
            ErrorCode::Io,
            format!("{}: the append lease was taken away: {e}", st.ino),
        ));
    }

    /// Starts the task that keeps a `Recalls` call in flight, unless it runs.
    fn start_lease_poll(&self) {
        {
            let mut i = self.leases.inner.lock();
            if i.polling {
                return;
            }
            i.polling = true;
        }
        let me = self.me.clone();
        self.rt.spawn(async move {
            while let Some(client) = me.upgrade() {
                if !client.poll_recalls().await {
                    return;
                }
            }
        });
    }

    /// One `Recalls` call, and what its answer asks for. `false` once no lease is
    /// held (the task ends).
    async fn poll_recalls(&self) -> bool {
        let leased: Vec<Arc<FileState>> = {
            let mut i = self.leases.inner.lock();
            let leased: Vec<_> = self
                .open_files()
                .into_iter()
                .filter(|f| f.leased())
                .collect();
            if leased.is_empty() {
                i.polling = false;
                return false;
            }
            leased
        };
        let sent = Instant::now();
        let answer = match self.meta.get_counted(&self.ep).await {
            Ok((conn, made)) => {
                let limit = self.ep.config().max_msg_bytes;
                let req = Request::new(fs::Recalls);
                let r = transport::rpc::call::<_, ClientError>(&conn, &req, limit).await;
                r.map(|inos| (inos, made))
            }
            Err(e) => Err(ClientError::from(e)),
        };
        let recalled: Vec<InodeId> = match answer {
            Ok((inos, made)) => {
                self.leases.confirmed(sent, made);
                if made != self.leases.inner.lock().conn {
                    // Taken on a connection that broke: given back on this one (the
                    // server moved them with the resume, or lost them).
                    self.leases.expire();
                    leased.iter().map(|f| f.ino).collect()
                } else {
                    inos
                }
            }
            Err(e) => {
                // The next append gives its lease back; a recall waits for the next
                // answer (the server waits `LEASE_RECALL_MS` for it).
                tracing::debug!(error = %e, "asking for recalls failed");
                self.leases.expire();
                tokio::time::sleep(POLL_RETRY).await;
                return true;
            }
        };
        for st in leased.into_iter().filter(|f| recalled.contains(&f.ino)) {
            let client = self.arc();
            self.rt.spawn(async move {
                // A give-back under way (an append's, an earlier answer's) is enough.
                let Ok(placing) = st.append_lock.try_write() else {
                    return;
                };
                if let Err(e) = client.give_back_held(&st, placing).await {
                    tracing::debug!(ino = %st.ino, error = %e, "giving an append lease back failed");
                }
            });
        }
        true
    }
}
