//! A connection and the engine that serves it: calls, replies, and one-sided operations
//! against registered memory, framed on one byte stream.

use crate::config::TransportConfig;
use crate::error::TransportError;
use crate::frame::{Header, Kind, HEADER_LEN};
use crate::mr::{MemoryRegion, MrInner};
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use proto::{ErrorCode, MrKey, RemoteBuf};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::AbortHandle;
use tracing::{debug, warn};

/// The future a [`Handler`] returns: the encoded reply.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Bytes> + Send + 'static>>;

/// The application side of a listening endpoint: turns each request into a reply.
pub trait Handler: Send + Sync + 'static {
    /// Answers one call. `conn` is the connection it came on; one-sided operations on it
    /// reach the caller's granted memory.
    fn handle(&self, conn: Connection, request: Bytes) -> HandlerFuture;

    /// The connection is gone (peer closed, died, or broke the protocol).
    fn disconnected(&self, _conn: ConnId) {}
}

/// Identifies one connection within this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// What a peer may do with a granted slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The peer may RDMA READ it (the slice holds a payload for the peer).
    RemoteRead,
    /// The peer may RDMA WRITE it (the slice receives bytes from the peer).
    RemoteWrite,
    /// Both.
    RemoteReadWrite,
}

impl Access {
    fn allows(self, op: Access) -> bool {
        self == Access::RemoteReadWrite || self == op
    }
}

/// A slice of registered memory exposed to one peer on one connection.
struct Window {
    mr: Weak<MrInner>,
    addr: u64,
    len: u64,
    access: Access,
}

enum Completion {
    Reply(Bytes),
    Ack,
    Data(Bytes),
}

type Waiter = oneshot::Sender<Result<Completion, TransportError>>;

struct State {
    pending: HashMap<u64, Waiter>,
    /// Why the connection closed; `Some` once it has.
    closed: Option<String>,
}

enum Out {
    Frame {
        header: Header,
        payload: Bytes,
        /// Queued by the engine (a completion), counted against the peer's credits.
        response: bool,
    },
    /// Write what is queued, then close the stream.
    Close,
}

pub(crate) struct ConnCore {
    id: ConnId,
    peer: String,
    config: Arc<TransportConfig>,
    /// Largest message the peer accepts (from its handshake).
    peer_max_msg_bytes: usize,
    out: mpsc::UnboundedSender<Out>,
    queued_responses: AtomicUsize,
    state: Mutex<State>,
    next_id: AtomicU64,
    call_credits: Semaphore,
    one_sided_credits: Semaphore,
    incoming_calls: Arc<Semaphore>,
    windows: Mutex<HashMap<u32, Window>>,
    tasks: Mutex<Vec<AbortHandle>>,
    handler: Option<Arc<dyn Handler>>,
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
        self.0.shutdown("closed by its owner".into());
    }
}

/// A slice of registered memory granted to the peer of one connection. The key works
/// only on that connection and only until the grant is dropped (like an RDMA memory
/// window that is invalidated).
pub struct Grant {
    remote: RemoteBuf,
    core: Weak<ConnCore>,
}

impl Grant {
    /// The name of the slice to send to the peer.
    pub fn remote(&self) -> RemoteBuf {
        self.remote
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if let Some(core) = self.core.upgrade() {
            core.windows.lock().remove(&self.remote.key.0);
        }
    }
}

pub(crate) struct Streams {
    pub(crate) reader: Box<dyn AsyncRead + Send + Unpin>,
    pub(crate) writer: Box<dyn AsyncWrite + Send + Unpin>,
}

const IO_BUFFER_BYTES: usize = 256 * 1024;
/// How long a closing connection may spend writing what it queued.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

impl Connection {
    /// Starts the engine on an established, handshaken stream.
    pub(crate) fn start(
        streams: Streams,
        peer: String,
        peer_max_msg_bytes: usize,
        config: Arc<TransportConfig>,
        handler: Option<Arc<dyn Handler>>,
        owned: bool,
    ) -> Connection {
        let (tx, rx) = mpsc::unbounded_channel();
        let core = Arc::new(ConnCore {
            id: ConnId(NEXT_CONN.fetch_add(1, Ordering::Relaxed)),
            peer,
            peer_max_msg_bytes: peer_max_msg_bytes.min(config.max_msg_bytes),
            out: tx,
            queued_responses: AtomicUsize::new(0),
            state: Mutex::new(State {
                pending: HashMap::new(),
                closed: None,
            }),
            next_id: AtomicU64::new(1),
            call_credits: Semaphore::new(config.max_inflight_calls),
            one_sided_credits: Semaphore::new(config.max_inflight_one_sided),
            incoming_calls: Arc::new(Semaphore::new(config.max_inflight_calls)),
            windows: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
            handler,
            config,
        });
        let w = tokio::spawn(writer_loop(core.clone(), rx, streams.writer));
        let r = tokio::spawn(reader_loop(core.clone(), streams.reader));
        core.tasks
            .lock()
            .extend([r.abort_handle(), w.abort_handle()]);
        let owner = owned.then(|| Arc::new(Owner(core.clone())));
        Connection {
            core,
            _owner: owner,
        }
    }

    pub(crate) fn core(&self) -> &Arc<ConnCore> {
        &self.core
    }

    /// This connection's id.
    pub fn id(&self) -> ConnId {
        self.core.id
    }

    /// The peer's address.
    pub fn peer(&self) -> &str {
        &self.core.peer
    }

    /// Whether the connection has closed; every operation on it fails from then on.
    pub fn is_closed(&self) -> bool {
        self.core.state.lock().closed.is_some()
    }

    /// Closes the connection; operations in flight fail with `Disconnected`.
    pub fn close(&self) {
        self.core.shutdown("closed locally".into());
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
        let ms = core.config.call_timeout_ms;
        let op = async {
            let _credit = core.call_credits.acquire().await.map_err(|_| core.gone())?;
            let mut h = Header::new(Kind::Call, 0);
            h.len = request.len() as u32;
            match core.submit(h, request).await? {
                Completion::Reply(b) => Ok(b),
                _ => Err(core.protocol_error("a call completed without a reply")),
            }
        };
        core.with_timeout("call", ms, op).await
    }

    /// Exposes `mr[offset..offset + len]` to the peer of this connection.
    pub fn grant(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Grant, TransportError> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= mr.len())
            .ok_or_else(|| {
                TransportError::InvalidArgument(format!(
                    "grant of {len} bytes at {offset} outside a region of {} bytes",
                    mr.len()
                ))
            })?;
        let mut windows = self.core.windows.lock();
        let key = loop {
            let k: u32 = rand::random();
            if k != 0 && !windows.contains_key(&k) {
                break k;
            }
        };
        let remote = RemoteBuf {
            addr: mr.addr() + offset as u64,
            len: (end - offset) as u64,
            key: MrKey(key),
        };
        windows.insert(
            key,
            Window {
                mr: Arc::downgrade(&mr.inner),
                addr: remote.addr,
                len: remote.len,
                access,
            },
        );
        Ok(Grant {
            remote,
            core: Arc::downgrade(&self.core),
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
        let payload = Bytes::copy_from_slice(&local.lock()[local_offset..local_offset + len]);
        let op = async {
            let _credit = core
                .one_sided_credits
                .acquire()
                .await
                .map_err(|_| core.gone())?;
            let mut h = Header::new(Kind::Write, 0);
            h.key = remote.key.0;
            h.addr = remote.addr;
            h.len = len as u32;
            match core.submit(h, payload).await? {
                Completion::Ack => Ok(()),
                _ => Err(core.protocol_error("a write completed without an ack")),
            }
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
        let op = async {
            let _credit = core
                .one_sided_credits
                .acquire()
                .await
                .map_err(|_| core.gone())?;
            let mut h = Header::new(Kind::Read, 0);
            h.key = remote.key.0;
            h.addr = remote.addr;
            h.rlen = len as u32;
            match core.submit(h, Bytes::new()).await? {
                Completion::Data(b) if b.len() == len => Ok(b),
                Completion::Data(b) => {
                    Err(core.protocol_error(&format!("read of {len} bytes returned {}", b.len())))
                }
                _ => Err(core.protocol_error("a read completed without data")),
            }
        };
        let data = core
            .with_timeout("read", core.config.one_sided_timeout_ms, op)
            .await?;
        local.lock()[local_offset..local_offset + len].copy_from_slice(&data);
        Ok(())
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Connection({}, {})", self.core.id.0, self.core.peer)
    }
}

impl ConnCore {
    fn gone(&self) -> TransportError {
        let why = self.state.lock().closed.clone().unwrap_or_default();
        TransportError::Disconnected {
            peer: self.peer.clone(),
            why,
        }
    }

    fn protocol_error(&self, why: &str) -> TransportError {
        self.shutdown(format!("protocol error: {why}"));
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

    /// Registers a waiter, sends the frame, and waits for its completion. The waiter is
    /// removed again if the caller gives up (timeout): late completions are dropped.
    async fn submit(&self, mut h: Header, payload: Bytes) -> Result<Completion, TransportError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        h.id = id;
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.state.lock();
            if st.closed.is_some() {
                drop(st);
                return Err(self.gone());
            }
            st.pending.insert(id, tx);
        }
        struct Forget<'a>(&'a ConnCore, u64);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                self.0.state.lock().pending.remove(&self.1);
            }
        }
        let _forget = Forget(self, id);
        self.send(h, payload, false);
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(self.gone()),
        }
    }

    fn send(&self, header: Header, payload: Bytes, response: bool) {
        if response {
            self.queued_responses.fetch_add(1, Ordering::Relaxed);
        }
        // A send fails only once the writer is gone, and then the connection is closed.
        let _ = self.out.send(Out::Frame {
            header,
            payload,
            response,
        });
    }

    fn complete(&self, id: u64, result: Result<Completion, TransportError>) {
        let waiter = self.state.lock().pending.remove(&id);
        match waiter {
            Some(w) => {
                let _ = w.send(result);
            }
            None => {
                debug!(peer = %self.peer, id, "completion for an operation no longer waited on")
            }
        }
    }

    /// Closes the connection once: fails every waiter, revokes every grant, stops the
    /// reader, lets the writer flush what is queued (bounded by a grace period).
    pub(crate) fn shutdown(&self, why: String) {
        let pending = {
            let mut st = self.state.lock();
            if st.closed.is_some() {
                return;
            }
            debug!(peer = %self.peer, conn = self.id.0, %why, "connection closed");
            st.closed = Some(why.clone());
            std::mem::take(&mut st.pending)
        };
        for (_, w) in pending {
            let _ = w.send(Err(TransportError::Disconnected {
                peer: self.peer.clone(),
                why: why.clone(),
            }));
        }
        self.windows.lock().clear();
        let _ = self.out.send(Out::Close);
        let tasks = std::mem::take(&mut *self.tasks.lock());
        if let Some((reader, writer)) = tasks.split_first().map(|(r, w)| (r.clone(), w.to_vec())) {
            reader.abort();
            if tokio::runtime::Handle::try_current().is_ok() {
                tokio::spawn(async move {
                    tokio::time::sleep(CLOSE_GRACE).await;
                    writer.iter().for_each(|w| w.abort());
                });
            } else {
                writer.iter().for_each(|w| w.abort());
            }
        }
        if let Some(h) = &self.handler {
            h.disconnected(self.id);
        }
    }

    fn frame_limit(&self, kind: Option<Kind>) -> usize {
        match kind {
            Some(Kind::Write) | Some(Kind::ReadResp) => self.config.max_one_sided_bytes,
            Some(Kind::WriteAck) | Some(Kind::Read) => 0,
            Some(Kind::Call) | Some(Kind::Reply) | Some(Kind::CallError) | None => {
                self.config.max_msg_bytes
            }
        }
    }

    /// Handles one frame from the peer; an `Err` closes the connection with that reason.
    fn dispatch(self: &Arc<Self>, h: Header, payload: Bytes) -> Result<(), String> {
        let responses = self.queued_responses.load(Ordering::Relaxed);
        let allowed = self.config.max_inflight_calls + self.config.max_inflight_one_sided + 16;
        if responses > allowed {
            return Err(format!(
                "peer has {responses} completions unread, more than its credits allow"
            ));
        }
        let status_err = |code: u16, msg: String| TransportError::Refused {
            code: ErrorCode::from(code),
            message: msg,
        };
        match Kind::from_u8(h.kind) {
            Some(Kind::Call) => self.serve_call(h.id, payload),
            Some(Kind::Reply) => self.complete(h.id, Ok(Completion::Reply(payload))),
            Some(Kind::CallError) => {
                let msg = String::from_utf8_lossy(&payload).into_owned();
                self.complete(h.id, Err(status_err(h.status, msg)))
            }
            Some(Kind::Write) => {
                let status = self.serve_write(&h, &payload);
                let mut ack = Header::new(Kind::WriteAck, h.id);
                ack.status = status;
                self.send(ack, Bytes::new(), true);
            }
            Some(Kind::WriteAck) | Some(Kind::ReadResp) if h.status != 0 => {
                let code = ErrorCode::from(h.status);
                let err = match code {
                    ErrorCode::AccessViolation => TransportError::AccessViolation(format!(
                        "{} refused the one-sided access (bad key, bounds or access)",
                        self.peer
                    )),
                    _ => status_err(h.status, "one-sided access refused".into()),
                };
                self.complete(h.id, Err(err))
            }
            Some(Kind::WriteAck) => self.complete(h.id, Ok(Completion::Ack)),
            Some(Kind::ReadResp) => self.complete(h.id, Ok(Completion::Data(payload))),
            Some(Kind::Read) => self.serve_read(&h),
            None => {
                warn!(peer = %self.peer, kind = h.kind, "unknown frame kind");
                let mut e = Header::new(Kind::CallError, h.id);
                e.status = ErrorCode::UnknownMessage.number();
                let msg = format!("unknown frame kind {}", h.kind);
                e.len = msg.len() as u32;
                self.send(e, Bytes::from(msg), true);
            }
        }
        Ok(())
    }

    fn serve_call(self: &Arc<Self>, id: u64, payload: Bytes) {
        let refuse = |code: ErrorCode, msg: String| {
            let mut e = Header::new(Kind::CallError, id);
            e.status = code.number();
            e.len = msg.len() as u32;
            self.send(e, Bytes::from(msg), true);
        };
        let Some(handler) = self.handler.clone() else {
            return refuse(
                ErrorCode::UnknownMessage,
                "this endpoint serves no calls".into(),
            );
        };
        let Ok(permit) = self.incoming_calls.clone().try_acquire_owned() else {
            let n = self.config.max_inflight_calls;
            return refuse(
                ErrorCode::Overloaded,
                format!("more than {n} calls in flight"),
            );
        };
        let core = self.clone();
        let conn = Connection {
            core: self.clone(),
            _owner: None,
        };
        tokio::spawn(async move {
            let reply = handler.handle(conn, payload).await;
            drop(permit);
            if reply.len() > core.config.max_msg_bytes {
                let msg = format!(
                    "reply of {} bytes exceeds the limit of {}",
                    reply.len(),
                    core.config.max_msg_bytes
                );
                warn!(peer = %core.peer, %msg, "reply dropped");
                let mut e = Header::new(Kind::CallError, id);
                e.status = ErrorCode::TooBig.number();
                e.len = msg.len() as u32;
                core.send(e, Bytes::from(msg), true);
                return;
            }
            let mut h = Header::new(Kind::Reply, id);
            h.len = reply.len() as u32;
            core.send(h, reply, true);
        });
    }

    /// Finds the window a one-sided access targets and checks key, access and bounds.
    fn window_offset(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        op: Access,
    ) -> Option<(Arc<MrInner>, usize)> {
        let windows = self.windows.lock();
        let w = windows.get(&key)?;
        let end = addr.checked_add(len)?;
        if !w.access.allows(op) || addr < w.addr || end > w.addr + w.len {
            return None;
        }
        let mr = w.mr.upgrade()?;
        Some((mr.clone(), (addr - mr.addr) as usize))
    }

    fn serve_write(&self, h: &Header, payload: &[u8]) -> u16 {
        let len = payload.len() as u64;
        match self.window_offset(h.key, h.addr, len, Access::RemoteWrite) {
            Some((mr, off)) => {
                mr.buf.lock()[off..off + payload.len()].copy_from_slice(payload);
                0
            }
            None => {
                debug!(peer = %self.peer, key = h.key, addr = h.addr, len, "write refused");
                ErrorCode::AccessViolation.number()
            }
        }
    }

    fn serve_read(&self, h: &Header) {
        let mut resp = Header::new(Kind::ReadResp, h.id);
        let len = h.rlen as usize;
        let found = if len > self.config.max_one_sided_bytes {
            None
        } else {
            self.window_offset(h.key, h.addr, len as u64, Access::RemoteRead)
        };
        let payload = match found {
            Some((mr, off)) => Bytes::copy_from_slice(&mr.buf.lock()[off..off + len]),
            None => {
                debug!(peer = %self.peer, key = h.key, addr = h.addr, len, "read refused");
                resp.status = ErrorCode::AccessViolation.number();
                Bytes::new()
            }
        };
        resp.len = payload.len() as u32;
        self.send(resp, payload, true);
    }
}

async fn reader_loop(core: Arc<ConnCore>, reader: Box<dyn AsyncRead + Send + Unpin>) {
    let mut r = BufReader::with_capacity(IO_BUFFER_BYTES, reader);
    let why = loop {
        let mut hb = [0u8; HEADER_LEN];
        if let Err(e) = r.read_exact(&mut hb).await {
            break match e.kind() {
                std::io::ErrorKind::UnexpectedEof => "peer closed the connection".to_string(),
                _ => format!("read failed: {e}"),
            };
        }
        let h = Header::decode(&hb);
        let kind = Kind::from_u8(h.kind);
        let limit = core.frame_limit(kind);
        if h.len as usize > limit {
            let why = format!(
                "peer sent a frame (kind {}) of {} bytes, limit {limit}",
                h.kind, h.len
            );
            warn!(peer = %core.peer, %why, "closing connection");
            // Tell the peer why before closing: the stream cannot be resynchronised.
            let mut e = Header::new(Kind::CallError, h.id);
            e.status = ErrorCode::TooBig.number();
            e.len = why.len() as u32;
            core.send(e, Bytes::from(why.clone()), true);
            break why;
        }
        let mut payload = BytesMut::with_capacity(h.len as usize);
        while payload.len() < h.len as usize {
            let want = h.len as usize - payload.len();
            match (&mut r).take(want as u64).read_buf(&mut payload).await {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if payload.len() < h.len as usize {
            break "peer closed the connection mid-frame".to_string();
        }
        if let Err(why) = core.dispatch(h, payload.freeze()) {
            warn!(peer = %core.peer, %why, "closing connection");
            break why;
        }
    };
    core.shutdown(why);
}

async fn writer_loop(
    core: Arc<ConnCore>,
    mut rx: mpsc::UnboundedReceiver<Out>,
    writer: Box<dyn AsyncWrite + Send + Unpin>,
) {
    let mut w = BufWriter::with_capacity(IO_BUFFER_BYTES, writer);
    let result: std::io::Result<()> = async {
        while let Some(mut next) = rx.recv().await {
            loop {
                match next {
                    Out::Close => {
                        w.flush().await?;
                        return w.shutdown().await;
                    }
                    Out::Frame {
                        header,
                        payload,
                        response,
                    } => {
                        w.write_all(&header.encode()).await?;
                        w.write_all(&payload).await?;
                        if response {
                            core.queued_responses.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                }
                match rx.try_recv() {
                    Ok(n) => next = n,
                    Err(_) => break,
                }
            }
            w.flush().await?;
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        core.shutdown(format!("write failed: {e}"));
    }
}
