//! A connection: the public API and what every backend shares (waiters, credits,
//! timeouts, grants, serving calls with a bounded number in flight, closing once). How
//! bytes travel is the backend's [`Wire`].

use crate::auth::PeerIdentity;
use crate::config::TransportConfig;
use crate::error::TransportError;
use crate::mr::{MemoryRegion, MrInner};
use crate::window::{Access, Grant, WindowTable};
use bytes::Bytes;
use parking_lot::Mutex;
use proto::{ErrorCode, RemoteBuf};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::AbortHandle;
use tracing::{debug, warn};

/// How the reason of a connection closed for breaking the protocol begins.
pub(crate) const PROTOCOL_ERROR: &str = "protocol error";

/// The future a [`Handler`] returns: the encoded reply.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Bytes> + Send + 'static>>;

/// The application side of a listening endpoint: turns each request into a reply.
pub trait Handler: Send + Sync + 'static {
    /// Answers one call. `conn` is the connection it came on; one-sided operations on it
    /// reach the caller's granted memory. The future is polled once inside the
    /// connection's reader before it gets a task of its own: one that blocks its thread
    /// (`block_in_place`, see [`multi_thread_runtime`]) yields first.
    fn handle(&self, conn: Connection, request: Bytes) -> HandlerFuture;

    /// The connection is gone; `how` tells a peer that closed it (its process ended or
    /// let go of it) from a connection that broke under a live peer, as far as this end
    /// can tell.
    fn disconnected(&self, _conn: ConnId, _how: Closed) {}
}

/// Whether the running code is on a multi-threaded tokio runtime, where a task may block
/// its worker through `tokio::task::block_in_place` (the worker's other tasks move to
/// another thread); on a current-thread runtime that call panics.
pub fn multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// How a connection ended, as its [`Handler`] is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// The peer closed it in order (TCP end of stream): its process exited, was killed,
    /// or dropped the connection. Nothing more will come from that peer on it.
    ByPeer,
    /// This end closed it (the server is stopping, or the owner dropped it).
    Locally,
    /// It failed: a reset, a timeout, a protocol error, a fault injected in a test; or
    /// it was idle and a full listener closed it to make room for a new one. The peer
    /// may be alive and reconnect.
    Broken,
}

/// Identifies one connection within this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

impl ConnId {
    pub(crate) fn next() -> ConnId {
        ConnId(NEXT_CONN.fetch_add(1, Ordering::Relaxed))
    }
}

/// How an operation completed.
pub(crate) enum Completion {
    /// The reply to a call.
    Reply(Bytes),
    /// A one-sided operation finished (a read's bytes are already in place).
    Done,
}

/// Where the bytes of a one-sided read land: the engine places them there directly.
#[derive(Clone)]
pub(crate) struct Dest {
    pub(crate) mr: Arc<MrInner>,
    pub(crate) off: usize,
    pub(crate) len: usize,
}

type Waiter = oneshot::Sender<Result<Completion, TransportError>>;

struct Pending {
    tx: Waiter,
    dest: Option<Dest>,
}

struct State {
    pending: HashMap<u64, Pending>,
    /// Why the connection closed; `Some` once it has.
    closed: Option<String>,
}

/// The backend-specific half of a connection.
pub(crate) enum Wire {
    Tcp(crate::tcp::TcpWire),
    Mem(crate::mem::MemWire),
    #[cfg(feature = "rdma")]
    Rdma(crate::rdma::RdmaWire),
}

pub(crate) struct ConnCore {
    pub(crate) id: ConnId,
    pub(crate) peer: String,
    pub(crate) config: Arc<TransportConfig>,
    /// Largest message the peer accepts (from its handshake).
    pub(crate) peer_max_msg_bytes: usize,
    state: Mutex<State>,
    next_id: AtomicU64,
    call_credits: Semaphore,
    one_sided_credits: Semaphore,
    incoming_calls: Arc<Semaphore>,
    pub(crate) windows: WindowTable,
    pub(crate) tasks: Mutex<Vec<AbortHandle>>,
    handler: Option<Arc<dyn Handler>>,
    pub(crate) wire: Wire,
    /// When a call last arrived or an operation last started ([`since_start_ms`]): a
    /// full listener closes the connection idle longest to make room (`ConnSet`).
    last_active_ms: AtomicU64,
    /// Who the peer proved to be; unset until the handshake succeeds (and always on an
    /// endpoint without keys).
    identity: OnceLock<Arc<PeerIdentity>>,
    /// Who the peer proved its key as, set before its revocation is checked and before
    /// `identity`: a revocation closes the connections claimed by the revoked key, so
    /// one that proved it while the revocation was under way is closed too.
    claimed: OnceLock<Arc<PeerIdentity>>,
    /// The server side's handshake progress (see `auth::Gate`).
    pub(crate) auth_step: Mutex<AuthStep>,
    /// Set when the connection must close once the current reply is sent (a refused
    /// handshake); `closing` says how. A flag, so the common path reads one atomic.
    closing_flag: AtomicBool,
    closing: Mutex<Option<Closing>>,
}

/// What a server knows of a handshake under way on one connection.
#[derive(Clone, Debug, Default)]
pub(crate) enum AuthStep {
    /// Nothing yet: a `Hello` is due.
    #[default]
    Fresh,
    /// `Challenge` sent: a `Proof` is due.
    Challenged {
        name: String,
        claim: Option<proto::auth::Claim>,
        nonce_c: [u8; 32],
        nonce_s: [u8; 32],
    },
    /// Done, or failed: nothing more is accepted as a handshake.
    Over,
}

/// How a connection closes after its current reply.
struct Closing {
    /// Sent instead of the reply, as a refusal with a stable code.
    refusal: Option<(ErrorCode, String)>,
    /// Why it closes, for the log.
    why: String,
}

/// Milliseconds since this process first asked, a clock for idle times.
pub(crate) fn since_start_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// One connection to a peer. Cheap to clone; the connection closes when the owner's last
/// clone is dropped (connections handed to a [`Handler`] belong to their listener).
#[derive(Clone)]
pub struct Connection {
    core: Arc<ConnCore>,
    _owner: Option<Arc<Owner>>,
}

struct Owner(Arc<ConnCore>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0
            .shutdown_as("closed by its owner".into(), Closed::Locally);
    }
}

/// A registered waiter; dropping it (the caller gave up) forgets the operation, so a
/// late completion is discarded.
pub(crate) struct Ticket<'a> {
    core: &'a ConnCore,
    pub(crate) id: u64,
    rx: Option<oneshot::Receiver<Result<Completion, TransportError>>>,
}

impl Ticket<'_> {
    pub(crate) async fn wait(mut self) -> Result<Completion, TransportError> {
        let rx = self.rx.take().expect("a ticket is waited on once");
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(self.core.gone()),
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.core.state.lock().pending.remove(&self.id);
    }
}

impl Connection {
    /// Wraps a started core; `owned` connections close when their last clone drops.
    pub(crate) fn new(core: Arc<ConnCore>, owned: bool) -> Connection {
        let owner = owned.then(|| Arc::new(Owner(core.clone())));
        Connection {
            core,
            _owner: owner,
        }
    }

    /// This connection's id.
    pub fn id(&self) -> ConnId {
        self.core.id
    }

    /// The peer's address.
    pub fn peer(&self) -> &str {
        &self.core.peer
    }

    /// Largest request the peer takes (its receive buffers, as agreed at the handshake),
    /// and largest reply this end takes: the smaller of both ends' message limits.
    pub fn max_request_bytes(&self) -> usize {
        self.core.peer_max_msg_bytes
    }

    /// Who the peer proved to be in the handshake: on a server, the client's or server's
    /// name and role; on a client, the server (role `Server`, named by its address).
    /// `None` on an endpoint without keys (insecure mode).
    pub fn peer_identity(&self) -> Option<Arc<PeerIdentity>> {
        self.core.identity().cloned()
    }

    pub(crate) fn set_identity(&self, who: Arc<PeerIdentity>) {
        let _ = self.core.identity.set(who);
    }

    /// Marks the connection as the peer's before the last check of its key (see
    /// `ConnCore::claimed`).
    pub(crate) fn set_claimed(&self, who: Arc<PeerIdentity>) {
        let _ = self.core.claimed.set(who);
    }

    pub(crate) fn core(&self) -> &Arc<ConnCore> {
        &self.core
    }

    /// Whether `other` is a handle of this same connection.
    pub fn same_as(&self, other: &Connection) -> bool {
        Arc::ptr_eq(&self.core, &other.core)
    }

    /// Whether the connection has closed; every operation on it fails from then on.
    pub fn is_closed(&self) -> bool {
        self.core.state.lock().closed.is_some()
    }

    /// Gives the connection up while this process lives on (a call on it timed out):
    /// as [`Connection::close`], but the peer is told, so that it takes the connection
    /// for broken ([`Closed::Broken`]) rather than closed by an ended process, and keeps
    /// what it holds for this peer (a metadata server: open files and locks, for the
    /// grace) until it comes back on another (tcp: an `Abandon` frame; rdma: a byte on
    /// the side channel).
    pub fn abandon(&self) {
        if self.is_closed() {
            return;
        }
        match &self.core.wire {
            Wire::Tcp(_) => crate::tcp::abandon(&self.core),
            Wire::Mem(w) => w.abandon(),
            #[cfg(feature = "rdma")]
            Wire::Rdma(w) => w.abandon(),
        }
        self.core
            .shutdown_as("given up: a call on it timed out".into(), Closed::Locally);
    }

    /// Closes the connection; operations in flight fail with `Disconnected`.
    pub fn close(&self) {
        self.core
            .shutdown_as("closed locally".into(), Closed::Locally);
    }

    /// Sends a request and waits for its reply (two-sided).
    pub async fn call(&self, request: Bytes) -> Result<Bytes, TransportError> {
        let core = &self.core;
        if request.len() > core.peer_max_msg_bytes {
            return Err(TransportError::TooBig {
                what: "request",
                size: request.len(),
                limit: core.peer_max_msg_bytes,
            });
        }
        let op = async {
            let _credit = core.call_credits.acquire().await.map_err(|_| core.gone())?;
            core.wire_call(request).await
        };
        core.with_timeout(crate::error::OP_CALL, core.config.call_timeout_ms, op)
            .await
    }

    /// Exposes `mr[offset..offset + len]` to the peer of this connection.
    pub fn grant(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Grant, TransportError> {
        if self.is_closed() {
            return Err(self.core.gone());
        }
        #[cfg(feature = "rdma")]
        if let Wire::Rdma(w) = &self.core.wire {
            return w.grant(&self.core, mr, offset, len, access);
        }
        let remote = self.core.windows.insert(mr, offset, len, access)?;
        Ok(Grant {
            remote,
            core: Arc::downgrade(&self.core),
            hw: None,
        })
    }

    /// One-sided WRITE: stores `local[local_offset..local_offset + remote.len]` into the
    /// peer's granted slice `remote`.
    pub async fn write(
        &self,
        remote: RemoteBuf,
        local: &MemoryRegion,
        local_offset: usize,
    ) -> Result<(), TransportError> {
        let core = &self.core;
        let len = core.check_one_sided(remote, local, local_offset)?;
        let src = Dest {
            mr: local.inner.clone(),
            off: local_offset,
            len,
        };
        let op = async {
            let _credit = core.one_sided_credits.acquire().await;
            let _credit = _credit.map_err(|_| core.gone())?;
            core.wire_one_sided(Access::RemoteWrite, remote, src).await
        };
        core.with_timeout("write", core.config.one_sided_timeout_ms, op)
            .await
    }

    /// One-sided READ: fetches the peer's granted slice `remote` into
    /// `local[local_offset..local_offset + remote.len]`.
    pub async fn read(
        &self,
        remote: RemoteBuf,
        local: &MemoryRegion,
        local_offset: usize,
    ) -> Result<(), TransportError> {
        let core = &self.core;
        let len = core.check_one_sided(remote, local, local_offset)?;
        let dest = Dest {
            mr: local.inner.clone(),
            off: local_offset,
            len,
        };
        let op = async {
            let _credit = core.one_sided_credits.acquire().await;
            let _credit = _credit.map_err(|_| core.gone())?;
            core.wire_one_sided(Access::RemoteRead, remote, dest).await
        };
        core.with_timeout("read", core.config.one_sided_timeout_ms, op)
            .await
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Connection({}, {})", self.core.id.0, self.core.peer)
    }
}

impl ConnCore {
    /// A core for a connection to `peer` whose wire is ready.
    pub(crate) fn new(
        peer: String,
        peer_max_msg_bytes: usize,
        config: Arc<TransportConfig>,
        handler: Option<Arc<dyn Handler>>,
        wire: Wire,
    ) -> ConnCore {
        ConnCore {
            id: ConnId::next(),
            peer,
            peer_max_msg_bytes: peer_max_msg_bytes.min(config.max_msg_bytes),
            state: Mutex::new(State {
                pending: HashMap::new(),
                closed: None,
            }),
            next_id: AtomicU64::new(1),
            call_credits: Semaphore::new(config.max_inflight_calls),
            one_sided_credits: Semaphore::new(config.max_inflight_one_sided),
            incoming_calls: Arc::new(Semaphore::new(config.max_inflight_calls)),
            windows: WindowTable::default(),
            tasks: Mutex::new(Vec::new()),
            handler,
            wire,
            config,
            last_active_ms: AtomicU64::new(since_start_ms()),
            identity: OnceLock::new(),
            claimed: OnceLock::new(),
            auth_step: Mutex::new(AuthStep::Fresh),
            closing_flag: AtomicBool::new(false),
            closing: Mutex::new(None),
        }
    }

    /// Who the peer proved to be, if it has.
    pub(crate) fn identity(&self) -> Option<&Arc<PeerIdentity>> {
        self.identity.get()
    }

    /// Who the peer proved its key as, even if its last check is still under way.
    pub(crate) fn claimed(&self) -> Option<&Arc<PeerIdentity>> {
        self.claimed.get()
    }

    /// Closes the connection once the reply being computed is sent; with `refusal`,
    /// that is sent instead of the reply.
    pub(crate) fn close_after_reply(&self, refusal: Option<(ErrorCode, String)>, why: String) {
        *self.closing.lock() = Some(Closing { refusal, why });
        self.closing_flag.store(true, Ordering::Release);
    }

    /// How long nothing has happened on this connection, or `None` while something
    /// is under way (an operation waits for completion, a call is being served).
    pub(crate) fn idle_ms(&self, now_ms: u64) -> Option<u64> {
        let serving = self.incoming_calls.available_permits() < self.config.max_inflight_calls;
        if serving || !self.state.lock().pending.is_empty() {
            return None;
        }
        Some(now_ms.saturating_sub(self.last_active_ms.load(Ordering::Relaxed)))
    }

    fn touch(&self) {
        self.last_active_ms
            .store(since_start_ms(), Ordering::Relaxed);
    }

    pub(crate) fn gone(&self) -> TransportError {
        let why = self.state.lock().closed.clone().unwrap_or_default();
        TransportError::Disconnected {
            peer: self.peer.clone(),
            why,
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.state.lock().closed.is_some()
    }

    /// Closes the connection for breaking the protocol and returns the error to report.
    pub(crate) fn protocol_error(&self, why: &str) -> TransportError {
        self.shutdown(format!("{PROTOCOL_ERROR}: {why}"));
        self.gone()
    }

    async fn with_timeout<T>(
        &self,
        op: &'static str,
        ms: u64,
        fut: impl Future<Output = Result<T, TransportError>>,
    ) -> Result<T, TransportError> {
        match tokio::time::timeout(Duration::from_millis(ms), fut).await {
            Ok(r) => r,
            Err(_) => Err(TransportError::TimedOut {
                op,
                peer: self.peer.clone(),
                ms,
            }),
        }
    }

    fn check_one_sided(
        &self,
        remote: RemoteBuf,
        local: &MemoryRegion,
        local_offset: usize,
    ) -> Result<usize, TransportError> {
        let limit = self.config.max_one_sided_bytes;
        let len = usize::try_from(remote.len).unwrap_or(usize::MAX);
        if len > limit {
            return Err(TransportError::TooBig {
                what: "one-sided transfer",
                size: len,
                limit,
            });
        }
        match local_offset.checked_add(len) {
            Some(end) if end <= local.len() => Ok(len),
            _ => Err(TransportError::InvalidArgument(format!(
                "{len} bytes at offset {local_offset} do not fit the local region of {} bytes",
                local.len()
            ))),
        }
    }

    /// Registers a waiter for a new operation; `dest` is where a read's bytes go.
    pub(crate) fn begin(&self, dest: Option<Dest>) -> Result<Ticket<'_>, TransportError> {
        self.touch();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut st = self.state.lock();
        if st.closed.is_some() {
            drop(st);
            return Err(self.gone());
        }
        st.pending.insert(id, Pending { tx, dest });
        Ok(Ticket {
            core: self,
            id,
            rx: Some(rx),
        })
    }

    /// Where the bytes of pending read `id` go; `None` if nobody waits for it any more.
    pub(crate) fn dest_of(&self, id: u64) -> Option<Dest> {
        self.state
            .lock()
            .pending
            .get(&id)
            .and_then(|p| p.dest.clone())
    }

    /// Completes operation `id`; a completion nobody waits for is dropped.
    pub(crate) fn complete(&self, id: u64, result: Result<Completion, TransportError>) {
        let waiter = self.state.lock().pending.remove(&id);
        match waiter {
            Some(Pending { tx, dest }) => {
                // The region goes before the waiter wakes: a pooled buffer dropped right
                // after its operation must find no clone here (`BufferPool`).
                drop(dest);
                let _ = tx.send(result);
            }
            None => {
                debug!(peer = %self.peer, id, "completion for an operation no longer waited on")
            }
        }
    }

    /// Whether this end serves calls (the accepting end of a listener's connection).
    pub(crate) fn serves_calls(&self) -> bool {
        self.handler.is_some()
    }

    /// Closes a connection that failed (see [`Closed::Broken`]).
    pub(crate) fn shutdown(&self, why: String) {
        self.shutdown_as(why, Closed::Broken);
    }

    /// Closes the connection once: fails every waiter, revokes every grant, stops the
    /// wire, and tells the handler how it ended.
    pub(crate) fn shutdown_as(&self, why: String, how: Closed) {
        let pending = {
            let mut st = self.state.lock();
            if st.closed.is_some() {
                return;
            }
            debug!(peer = %self.peer, conn = self.id.0, %why, ?how, "connection closed");
            st.closed = Some(why.clone());
            std::mem::take(&mut st.pending)
        };
        for (_, Pending { tx, dest }) in pending {
            // As in `complete`: the region goes before the waiter wakes.
            drop(dest);
            let _ = tx.send(Err(TransportError::Disconnected {
                peer: self.peer.clone(),
                why: why.clone(),
            }));
        }
        self.windows.clear();
        self.wire_close(&why);
        if let Some(h) = &self.handler {
            h.disconnected(self.id, how);
        }
    }

    /// Serves one incoming call: refuses it when no handler or no credit is left,
    /// otherwise runs the handler in its own task and sends what it returns.
    pub(crate) fn serve_call(self: &Arc<Self>, id: u64, payload: Bytes) {
        self.touch();
        let Some(handler) = self.handler.clone() else {
            let msg = "this endpoint serves no calls".to_string();
            return self.respond(id, Err((ErrorCode::UnknownMessage, msg)));
        };
        let Ok(permit) = self.incoming_calls.clone().try_acquire_owned() else {
            let n = self.config.max_inflight_calls;
            let msg = format!("more than {n} calls in flight");
            return self.respond(id, Err((ErrorCode::Overloaded, msg)));
        };
        let conn = Connection {
            core: self.clone(),
            _owner: None,
        };
        // Poll once here: a handler that needs no waiting (an echo, a cached answer) is
        // answered without a hand-off to another task, which is a good part of a small
        // call's round trip. A spawned task polls it again with a real waker. A handler
        // that panics, here or there, answers its call with an error: unwinding through
        // the connection's reader would leave the connection open and deaf, its calls
        // and the sessions the peer holds on it never ended.
        use futures::FutureExt;
        let mut reply = Box::pin(
            std::panic::AssertUnwindSafe(async move { handler.handle(conn, payload).await })
                .catch_unwind(),
        );
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if let std::task::Poll::Ready(r) = reply.as_mut().poll(&mut cx) {
            drop(permit);
            return self.answer_call(id, r);
        }
        let core = self.clone();
        tokio::spawn(async move {
            let r = reply.await;
            drop(permit);
            core.answer_call(id, r);
        });
    }

    /// Answers call `id` with its handler's reply, or with an error if the handler
    /// panicked (the panic was printed as it happened).
    fn answer_call(self: &Arc<Self>, id: u64, reply: std::thread::Result<Bytes>) {
        let Ok(reply) = reply else {
            warn!(peer = %self.peer, id, "a request's handler panicked: answered with an error");
            let msg = "the server failed on this request (see its log)".to_string();
            return self.respond(id, Err((ErrorCode::Io, msg)));
        };
        self.finish_call(id, reply);
    }

    fn finish_call(self: &Arc<Self>, id: u64, reply: Bytes) {
        if self.closing_flag.load(Ordering::Acquire) {
            if let Some(c) = self.closing.lock().take() {
                let answer = match c.refusal {
                    Some(refusal) => Err(refusal),
                    None => Ok(reply),
                };
                return self.respond_then_shutdown(id, answer, c.why);
            }
        }
        // The smaller of both sides' limits: the peer's receive buffers hold no more.
        let limit = self.peer_max_msg_bytes;
        if reply.len() > limit {
            let msg = format!(
                "reply of {} bytes exceeds the limit of {limit}",
                reply.len()
            );
            warn!(peer = %self.peer, %msg, "reply dropped");
            return self.respond(id, Err((ErrorCode::TooBig, msg)));
        }
        self.respond(id, Ok(reply));
    }

    async fn wire_call(self: &Arc<Self>, request: Bytes) -> Result<Bytes, TransportError> {
        let done = match &self.wire {
            Wire::Tcp(_) => crate::tcp::call(self, request).await?,
            Wire::Mem(_) => crate::mem::call(self, request).await?,
            #[cfg(feature = "rdma")]
            Wire::Rdma(w) => w.call(self, request).await?,
        };
        match done {
            Completion::Reply(b) => Ok(b),
            Completion::Done => Err(self.protocol_error("a call completed without a reply")),
        }
    }

    async fn wire_one_sided(
        self: &Arc<Self>,
        op: Access,
        remote: RemoteBuf,
        local: Dest,
    ) -> Result<(), TransportError> {
        match &self.wire {
            Wire::Tcp(_) => crate::tcp::one_sided(self, op, remote, local).await,
            Wire::Mem(_) => crate::mem::one_sided(self, op, remote, local).await,
            #[cfg(feature = "rdma")]
            Wire::Rdma(w) => w.one_sided(self, op, remote, local).await,
        }
    }

    /// Sends the answer to incoming call `id`.
    pub(crate) fn respond(self: &Arc<Self>, id: u64, result: Result<Bytes, (ErrorCode, String)>) {
        match &self.wire {
            Wire::Tcp(_) => crate::tcp::respond(self, id, result),
            Wire::Mem(_) => crate::mem::respond(self, id, result),
            #[cfg(feature = "rdma")]
            Wire::Rdma(w) => w.respond(self, id, result),
        }
    }

    /// Sends the last answer of a connection that is closing, then closes it: on rdma
    /// once the peer has read it (see `RdmaWire::respond_then_shutdown`); tcp and mem
    /// deliver what was sent before the close on their one stream.
    fn respond_then_shutdown(
        self: &Arc<Self>,
        id: u64,
        result: Result<Bytes, (ErrorCode, String)>,
        why: String,
    ) {
        match &self.wire {
            #[cfg(feature = "rdma")]
            Wire::Rdma(w) => w.respond_then_shutdown(self, id, result, why),
            _ => {
                self.respond(id, result);
                self.shutdown(why);
            }
        }
    }

    fn wire_close(&self, why: &str) {
        match &self.wire {
            Wire::Tcp(_) => crate::tcp::close(self),
            Wire::Mem(w) => w.close(why),
            #[cfg(feature = "rdma")]
            Wire::Rdma(w) => w.close(self, why),
        }
    }
}
