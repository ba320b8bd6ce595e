//! The engine of one `tcp` connection: a writer task that sends queued frames in batches,
//! and a reader task that dispatches what arrives and serves one-sided operations
//! against the connection's grants, without the application.
//!
//! Bulk bytes move between the socket and registered memory directly: a one-sided
//! payload is written from the region with one vectored `write` (header and bytes
//! together) and read from the socket straight into the target region. So a transfer
//! costs the two copies the kernel makes, as `iperf3` does, and no more.

use super::writer::{Payload, TcpWire};
use crate::config::TransportConfig;
use crate::conn::{Closed, Completion, ConnCore, Dest, Handler, Wire, PROTOCOL_ERROR};
use crate::error::TransportError;
use crate::frame::{Header, Hello, Kind, HEADER_LEN};
use crate::window::Access;
use bytes::{Bytes, BytesMut};
use proto::{ErrorCode, RemoteBuf};
use std::io::ErrorKind;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncReadExt, BufReader};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tracing::{debug, warn};

/// Bytes the reader buffers from the socket: enough for many small frames per `read`,
/// small enough that little of a bulk payload goes through it rather than straight
/// into its region.
const IO_BUFFER_BYTES: usize = 32 * 1024;
/// How long a closing connection may spend writing what it queued.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// Completions a peer may leave unread beyond its credits before it counts as flooding.
const RESPONSE_SLACK: usize = 16;

/// Starts the engine on an established, handshaken stream.
pub(super) fn start(
    stream: TcpStream,
    peer: String,
    theirs: &Hello,
    config: Arc<TransportConfig>,
    handler: Option<Arc<dyn Handler>>,
) -> Arc<ConnCore> {
    let (r, w) = stream.into_split();
    let peer_max = theirs.max_msg_bytes as usize;
    let tcp = Wire::Tcp(TcpWire::new(w));
    let core = Arc::new(ConnCore::new(peer, peer_max, config, handler, tcp));
    let writer = core.clone();
    let wt = tokio::spawn(async move {
        if let Err(e) = wire(&writer).run().await {
            writer.shutdown(format!("write failed: {e}"));
        }
    });
    let rt = tokio::spawn(reader_loop(core.clone(), r));
    core.tasks
        .lock()
        .extend([rt.abort_handle(), wt.abort_handle()]);
    core
}

fn wire(core: &ConnCore) -> &TcpWire {
    match &core.wire {
        Wire::Tcp(w) => w,
        _ => unreachable!("the tcp engine only runs tcp connections"),
    }
}

fn send(core: &ConnCore, header: Header, payload: Payload, response: bool) {
    wire(core).send(header, payload, response);
}

/// Sends a call and waits for its reply.
pub(crate) async fn call(
    core: &Arc<ConnCore>,
    request: Bytes,
) -> Result<Completion, TransportError> {
    let ticket = core.begin(None)?;
    let mut h = Header::new(Kind::Call, ticket.id);
    h.len = request.len() as u32;
    send(core, h, Payload::Bytes(request), false);
    ticket.wait().await
}

/// Posts a one-sided operation and waits for its completion.
pub(crate) async fn one_sided(
    core: &Arc<ConnCore>,
    op: Access,
    remote: RemoteBuf,
    local: Dest,
) -> Result<(), TransportError> {
    let len = local.len as u32;
    let (ticket, mut h, payload) = if op == Access::RemoteWrite {
        let t = core.begin(None)?;
        let mut h = Header::new(Kind::Write, t.id);
        h.len = len;
        (t, h, Payload::Region(local))
    } else {
        let t = core.begin(Some(local))?;
        let mut h = Header::new(Kind::Read, t.id);
        h.rlen = len;
        (t, h, Payload::Bytes(Bytes::new()))
    };
    h.key = remote.key.0;
    h.addr = remote.addr;
    send(core, h, payload, false);
    match ticket.wait().await? {
        Completion::Done => Ok(()),
        Completion::Reply(_) => Err(core.protocol_error("a one-sided operation got a reply")),
    }
}

/// Sends the answer to call `id`.
pub(crate) fn respond(core: &Arc<ConnCore>, id: u64, result: Result<Bytes, (ErrorCode, String)>) {
    let (mut h, payload) = match result {
        Ok(reply) => (Header::new(Kind::Reply, id), reply),
        Err((code, msg)) => {
            let mut h = Header::new(Kind::CallError, id);
            h.status = code.number();
            (h, Bytes::from(msg))
        }
    };
    h.len = payload.len() as u32;
    send(core, h, Payload::Bytes(payload), true);
}

/// Queues the frame that tells the peer this end gives the connection up while it lives
/// (see `Connection::abandon`); the close that follows sends it before the end of the
/// stream.
pub(crate) fn abandon(core: &ConnCore) {
    send(
        core,
        Header::new(Kind::Abandon, 0),
        Payload::Bytes(Bytes::new()),
        false,
    );
}

/// Stops the reader at once and lets the writer flush what is queued, for a while.
pub(crate) fn close(core: &ConnCore) {
    wire(core).close();
    let tasks = std::mem::take(&mut *core.tasks.lock());
    let Some((reader, writer)) = tasks.split_first().map(|(r, w)| (r.clone(), w.to_vec())) else {
        return;
    };
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

fn frame_limit(core: &ConnCore, kind: Option<Kind>) -> usize {
    match kind {
        Some(Kind::Write) | Some(Kind::ReadResp) => core.config.max_one_sided_bytes,
        Some(Kind::WriteAck) | Some(Kind::Read) | Some(Kind::Abandon) => 0,
        Some(Kind::Call) | Some(Kind::Reply) | Some(Kind::CallError) | None => {
            core.config.max_msg_bytes
        }
    }
}

fn refusal(core: &ConnCore, status: u16) -> TransportError {
    match ErrorCode::from(status) {
        ErrorCode::AccessViolation => TransportError::AccessViolation(format!(
            "{} refused the one-sided access (bad key, bounds or access)",
            core.peer
        )),
        code => TransportError::Refused {
            code,
            message: "one-sided access refused".into(),
        },
    }
}

type Reader = BufReader<OwnedReadHalf>;

async fn reader_loop(core: Arc<ConnCore>, reader: OwnedReadHalf) {
    let mut r = BufReader::with_capacity(IO_BUFFER_BYTES, reader);
    let (why, how) = loop {
        let mut hb = [0u8; HEADER_LEN];
        if let Err(e) = r.read_exact(&mut hb).await {
            break match e.kind() {
                ErrorKind::UnexpectedEof => {
                    ("peer closed the connection".to_string(), Closed::ByPeer)
                }
                _ => (format!("read failed: {e}"), Closed::Broken),
            };
        }
        if let Err(why) = dispatch(&core, &mut r, Header::decode(&hb)).await {
            warn!(peer = %core.peer, %why, "closing connection");
            break (why, Closed::Broken);
        }
    };
    core.shutdown_as(why, how);
}

/// Handles one frame from the peer; an `Err` closes the connection with that reason.
async fn dispatch(core: &Arc<ConnCore>, r: &mut Reader, h: Header) -> Result<(), String> {
    let kind = Kind::from_u8(h.kind);
    let limit = frame_limit(core, kind);
    if h.len as usize > limit {
        let why = format!(
            "{PROTOCOL_ERROR}: peer sent a frame (kind {}) of {} bytes, limit {limit}",
            h.kind, h.len
        );
        // Tell the peer why before closing: the stream cannot be resynchronised.
        respond(core, h.id, Err((ErrorCode::TooBig, why.clone())));
        return Err(why);
    }
    let responses = wire(core).queued_responses.load(Ordering::Relaxed);
    let allowed =
        core.config.max_inflight_calls + core.config.max_inflight_one_sided + RESPONSE_SLACK;
    if responses > allowed {
        return Err(format!(
            "{PROTOCOL_ERROR}: peer has {responses} completions unread, more than its \
             credits allow"
        ));
    }
    match kind {
        Some(Kind::Call) => core.serve_call(h.id, read_payload(r, h.len).await?),
        Some(Kind::Reply) => {
            let p = read_payload(r, h.len).await?;
            core.complete(h.id, Ok(Completion::Reply(p)))
        }
        Some(Kind::CallError) => {
            let p = read_payload(r, h.len).await?;
            let err = TransportError::Refused {
                code: ErrorCode::from(h.status),
                message: String::from_utf8_lossy(&p).into_owned(),
            };
            core.complete(h.id, Err(err))
        }
        Some(Kind::Write) => serve_write(core, r, &h).await?,
        Some(Kind::WriteAck) if h.status != 0 => core.complete(h.id, Err(refusal(core, h.status))),
        Some(Kind::WriteAck) => core.complete(h.id, Ok(Completion::Done)),
        Some(Kind::ReadResp) => read_response(core, r, &h).await?,
        Some(Kind::Read) => serve_read(core, &h),
        Some(Kind::Abandon) => {
            return Err(
                "the peer gave the connection up (a call on it timed out); it may \
                        come back on another"
                    .into(),
            )
        }
        None => {
            discard(r, h.len).await?;
            warn!(peer = %core.peer, kind = h.kind, "unknown frame kind");
            let msg = format!("unknown frame kind {}", h.kind);
            respond(core, h.id, Err((ErrorCode::UnknownMessage, msg)));
        }
    }
    Ok(())
}

async fn read_payload(r: &mut Reader, len: u32) -> Result<Bytes, String> {
    let len = len as usize;
    let mut payload = BytesMut::with_capacity(len);
    while payload.len() < len {
        let want = (len - payload.len()) as u64;
        match (&mut *r).take(want).read_buf(&mut payload).await {
            Ok(0) => return Err("peer closed the connection mid-frame".into()),
            Ok(_) => {}
            Err(e) => return Err(format!("read failed: {e}")),
        }
    }
    Ok(payload.freeze())
}

async fn discard(r: &mut Reader, len: u32) -> Result<(), String> {
    let n = tokio::io::copy(&mut (&mut *r).take(u64::from(len)), &mut tokio::io::sink())
        .await
        .map_err(|e| format!("read failed: {e}"))?;
    if n < u64::from(len) {
        return Err("peer closed the connection mid-frame".into());
    }
    Ok(())
}

/// Reads `d.len` payload bytes straight into `d.mr[d.off..]`: first what the reader has
/// buffered, then from the socket with the region locked only during each `read`.
async fn read_into(r: &mut Reader, d: &Dest) -> Result<(), String> {
    let (start, end) = (d.off, d.off + d.len);
    let buffered = r.buffer();
    let mut pos = start + buffered.len().min(d.len);
    if pos > start {
        d.mr.buf.lock()[start..pos].copy_from_slice(&buffered[..pos - start]);
        Pin::new(&mut *r).consume(pos - start);
    }
    while pos < end {
        r.get_ref()
            .readable()
            .await
            .map_err(|e| format!("read failed: {e}"))?;
        let got = r.get_ref().try_read(&mut d.mr.buf.lock()[pos..end]);
        match got {
            Ok(0) => return Err("peer closed the connection mid-frame".into()),
            Ok(n) => pos += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("read failed: {e}")),
        }
    }
    Ok(())
}

async fn serve_write(core: &Arc<ConnCore>, r: &mut Reader, h: &Header) -> Result<(), String> {
    let len = h.len as usize;
    let mut ack = Header::new(Kind::WriteAck, h.id);
    match core
        .windows
        .resolve(h.key, h.addr, len as u64, Access::RemoteWrite)
    {
        Some((mr, off)) => read_into(r, &Dest { mr, off, len }).await?,
        None => {
            discard(r, h.len).await?;
            debug!(peer = %core.peer, key = h.key, addr = h.addr, len, "write refused");
            ack.status = ErrorCode::AccessViolation.number();
        }
    }
    send(core, ack, Payload::Bytes(Bytes::new()), true);
    Ok(())
}

async fn read_response(core: &Arc<ConnCore>, r: &mut Reader, h: &Header) -> Result<(), String> {
    if h.status != 0 {
        discard(r, h.len).await?;
        core.complete(h.id, Err(refusal(core, h.status)));
        return Ok(());
    }
    match core.dest_of(h.id) {
        Some(d) if d.len == h.len as usize => {
            read_into(r, &d).await?;
            // Let go of the region before the waiter wakes (see `BufferPool`).
            drop(d);
            core.complete(h.id, Ok(Completion::Done));
        }
        Some(d) => {
            let (want, got) = (d.len, h.len);
            return Err(format!(
                "{PROTOCOL_ERROR}: read of {want} bytes answered with {got}"
            ));
        }
        // Nobody waits any more (timed out): the bytes have nowhere to go.
        None => discard(r, h.len).await?,
    }
    Ok(())
}

fn serve_read(core: &Arc<ConnCore>, h: &Header) {
    let mut resp = Header::new(Kind::ReadResp, h.id);
    let len = h.rlen as usize;
    let found = if len > core.config.max_one_sided_bytes {
        None
    } else {
        core.windows
            .resolve(h.key, h.addr, len as u64, Access::RemoteRead)
    };
    let payload = match found {
        Some((mr, off)) => Payload::Region(Dest { mr, off, len }),
        None => {
            debug!(peer = %core.peer, key = h.key, addr = h.addr, len, "read refused");
            resp.status = ErrorCode::AccessViolation.number();
            Payload::Bytes(Bytes::new())
        }
    };
    resp.len = payload.len() as u32;
    send(core, resp, payload, true);
}
