//! The `tcp` backend: one TCP stream per connection, a handshake, then frames (see
//! [`crate::frame`]). One-sided operations are served by the peer's engine
//! ([`engine`]), never by its application.

mod engine;
mod writer;

pub(crate) use engine::{abandon, call, close, one_sided, respond};
pub(crate) use writer::TcpWire;

use crate::conn::{Connection, Handler};
use crate::endpoint::{ConnSet, Endpoint, Listener};
use crate::error::TransportError;
use crate::frame::{Hello, HELLO_LEN, TRANSPORT_VERSION};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

fn hello(ep: &Endpoint, status: u32) -> Hello {
    Hello {
        transport_version: TRANSPORT_VERSION,
        app_version: ep.app_version(),
        max_msg_bytes: ep.config().max_msg_bytes as u32,
        status,
    }
}

fn mismatch(ep: &Endpoint, peer: &str, theirs: &Hello) -> TransportError {
    TransportError::VersionMismatch {
        peer: peer.to_string(),
        their_transport: theirs.transport_version,
        their_app: theirs.app_version,
        our_transport: TRANSPORT_VERSION,
        our_app: ep.app_version(),
    }
}

/// Connects to a listening peer at `addr` (`host:port`), handshake included.
pub(crate) async fn connect(ep: &Endpoint, addr: &str) -> Result<Connection, TransportError> {
    let ms = ep.config().connect_timeout_ms;
    let attempt = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| TransportError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        tune(&stream);
        client_handshake(ep, stream, addr).await
    };
    match tokio::time::timeout(Duration::from_millis(ms), attempt).await {
        Ok(r) => r,
        Err(_) => Err(TransportError::TimedOut {
            op: crate::error::OP_CONNECT,
            peer: addr.to_string(),
            ms,
        }),
    }
}

async fn client_handshake(
    ep: &Endpoint,
    mut stream: TcpStream,
    addr: &str,
) -> Result<Connection, TransportError> {
    stream
        .write_all(&hello(ep, 0).encode())
        .await
        .map_err(|e| TransportError::cut_in_handshake(addr, e))?;
    let mut buf = [0u8; HELLO_LEN];
    stream
        .read_exact(&mut buf)
        .await
        .map_err(|e| TransportError::cut_in_handshake(addr, e))?;
    let theirs = Hello::decode(&buf).ok_or_else(|| TransportError::Handshake {
        peer: addr.to_string(),
        why: "not a Tessera endpoint (bad magic)".into(),
    })?;
    if theirs.status != 0
        || theirs.transport_version != TRANSPORT_VERSION
        || theirs.app_version != ep.app_version()
    {
        return Err(mismatch(ep, addr, &theirs));
    }
    let core = engine::start(stream, addr.to_string(), &theirs, ep.config_arc(), None);
    Ok(Connection::new(core, true))
}

/// Listens on `addr`; every accepted connection is served by `handler`.
pub(crate) async fn listen(
    ep: &Endpoint,
    addr: &str,
    handler: Arc<dyn Handler>,
) -> Result<Listener, TransportError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| TransportError::Listen {
            addr: addr.to_string(),
            source,
        })?;
    let local_addr = listener.local_addr()?;
    let conns = ConnSet::for_endpoint(ep);
    let task = tokio::spawn(accept_loop(ep.clone(), listener, handler, conns.clone()));
    info!(%local_addr, backend = "tcp", "listening");
    Ok(Listener::new(
        local_addr,
        Some(task.abort_handle()),
        conns,
        None,
    ))
}

async fn server_handshake(
    ep: &Endpoint,
    stream: &mut TcpStream,
    peer: &str,
) -> Result<Hello, TransportError> {
    let fail = |why: String| TransportError::Handshake {
        peer: peer.to_string(),
        why,
    };
    let mut buf = [0u8; HELLO_LEN];
    stream
        .read_exact(&mut buf)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let theirs =
        Hello::decode(&buf).ok_or_else(|| fail("not a Tessera peer (bad magic)".into()))?;
    let ok =
        theirs.transport_version == TRANSPORT_VERSION && theirs.app_version == ep.app_version();
    let answer = hello(ep, if ok { 0 } else { 1 });
    stream
        .write_all(&answer.encode())
        .await
        .map_err(|e| fail(e.to_string()))?;
    if !ok {
        return Err(mismatch(ep, peer, &theirs));
    }
    Ok(theirs)
}

fn tune(stream: &TcpStream) {
    // Small calls must not wait for Nagle; dead peers are found by the operation
    // timeouts, keepalive only reclaims idle sockets whose peer vanished.
    let _ = stream.set_nodelay(true);
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10));
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&ka);
}

async fn accept_loop(
    ep: Endpoint,
    listener: TcpListener,
    handler: Arc<dyn Handler>,
    conns: ConnSet,
) {
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Usually EMFILE: back off rather than spin.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        tune(&stream);
        let (ep, handler, conns) = (ep.clone(), handler.clone(), conns.clone());
        tokio::spawn(async move {
            let peer = peer.to_string();
            if !conns.has_room(ep.config()) {
                let limit = ep.config().max_connections;
                warn!(%peer, limit, "too many connections");
                return;
            }
            let ms = ep.config().connect_timeout_ms;
            let hs = tokio::time::timeout(
                Duration::from_millis(ms),
                server_handshake(&ep, &mut stream, &peer),
            )
            .await;
            let theirs = match hs {
                Ok(Ok(h)) => h,
                Ok(Err(e)) => return debug!(%peer, error = %e, "handshake refused"),
                Err(_) => return debug!(%peer, "handshake timed out"),
            };
            let core = engine::start(stream, peer, &theirs, ep.config_arc(), Some(handler));
            conns.insert(&core);
        });
    }
}
