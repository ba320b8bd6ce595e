//! Endpoints: register memory, connect to peers, listen for them.

use crate::config::TransportConfig;
use crate::conn::{ConnCore, ConnId, Connection, Handler, Streams};
use crate::error::TransportError;
use crate::frame::{Hello, HELLO_LEN, TRANSPORT_VERSION};
use crate::mr::MemoryRegion;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

/// Largest single memory registration.
const MAX_REGION_BYTES: usize = 1 << 30;

/// Which wire a transport endpoint uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// One TCP stream per connection; one-sided operations are served by the peer's
    /// transport engine. Runs everywhere.
    #[default]
    Tcp,
}

/// A transport endpoint (like an RDMA device context plus protection domain): it
/// registers memory and makes connections that share its limits.
#[derive(Clone)]
pub struct Endpoint {
    backend: Backend,
    config: Arc<TransportConfig>,
    app_version: u16,
}

impl Endpoint {
    /// An endpoint on `backend` speaking application protocol `app_version`.
    pub fn new(
        backend: Backend,
        config: TransportConfig,
        app_version: u16,
    ) -> Result<Endpoint, TransportError> {
        config.validate().map_err(TransportError::InvalidArgument)?;
        Ok(Endpoint {
            backend,
            config: Arc::new(config),
            app_version,
        })
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The limits every connection of this endpoint obeys.
    pub fn config(&self) -> &TransportConfig {
        &self.config
    }

    /// Allocates and registers `len` zeroed bytes.
    pub fn register(&self, len: usize) -> Result<MemoryRegion, TransportError> {
        if len > MAX_REGION_BYTES {
            return Err(TransportError::TooBig {
                what: "memory registration",
                size: len,
                limit: MAX_REGION_BYTES,
            });
        }
        Ok(MemoryRegion::new(len))
    }

    fn hello(&self, status: u32) -> Hello {
        Hello {
            transport_version: TRANSPORT_VERSION,
            app_version: self.app_version,
            max_msg_bytes: self.config.max_msg_bytes as u32,
            status,
        }
    }

    fn mismatch(&self, peer: &str, theirs: &Hello) -> TransportError {
        TransportError::VersionMismatch {
            peer: peer.to_string(),
            their_transport: theirs.transport_version,
            their_app: theirs.app_version,
            our_transport: TRANSPORT_VERSION,
            our_app: self.app_version,
        }
    }

    /// Connects to a listening peer at `addr` (`host:port`).
    pub async fn connect(&self, addr: &str) -> Result<Connection, TransportError> {
        let ms = self.config.connect_timeout_ms;
        let attempt = async {
            let stream =
                TcpStream::connect(addr)
                    .await
                    .map_err(|source| TransportError::Connect {
                        addr: addr.to_string(),
                        source,
                    })?;
            tune(&stream);
            self.client_handshake(stream, addr).await
        };
        match tokio::time::timeout(Duration::from_millis(ms), attempt).await {
            Ok(r) => r,
            Err(_) => Err(TransportError::TimedOut {
                op: "connect",
                peer: addr.to_string(),
                ms,
            }),
        }
    }

    async fn client_handshake(
        &self,
        mut stream: TcpStream,
        addr: &str,
    ) -> Result<Connection, TransportError> {
        let fail = |why: String| TransportError::Handshake {
            peer: addr.to_string(),
            why,
        };
        stream
            .write_all(&self.hello(0).encode())
            .await
            .map_err(|e| fail(e.to_string()))?;
        let mut buf = [0u8; HELLO_LEN];
        stream
            .read_exact(&mut buf)
            .await
            .map_err(|e| fail(format!("no handshake answer: {e}")))?;
        let theirs =
            Hello::decode(&buf).ok_or_else(|| fail("not a Tessera endpoint (bad magic)".into()))?;
        if theirs.status != 0
            || theirs.transport_version != TRANSPORT_VERSION
            || theirs.app_version != self.app_version
        {
            return Err(self.mismatch(addr, &theirs));
        }
        let (r, w) = stream.into_split();
        let streams = Streams {
            reader: Box::new(r),
            writer: Box::new(w),
        };
        let peer_max = theirs.max_msg_bytes as usize;
        Ok(Connection::start(
            streams,
            addr.to_string(),
            peer_max,
            self.config.clone(),
            None,
            true,
        ))
    }

    /// Listens on `addr` (port 0 picks a free port); every call that arrives is handed to
    /// `handler`. Stops when the returned [`Listener`] is dropped.
    pub async fn listen(
        &self,
        addr: &str,
        handler: Arc<dyn Handler>,
    ) -> Result<Listener, TransportError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| TransportError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        let local_addr = listener.local_addr()?;
        let conns: Arc<Mutex<HashMap<ConnId, Weak<ConnCore>>>> = Arc::default();
        let ep = self.clone();
        let task = tokio::spawn(accept_loop(ep, listener, handler, conns.clone()));
        info!(%local_addr, backend = ?self.backend, "listening");
        Ok(Listener {
            local_addr,
            accept: task.abort_handle(),
            conns,
        })
    }

    async fn server_handshake(
        &self,
        stream: &mut TcpStream,
        peer: &str,
    ) -> Result<usize, TransportError> {
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
            theirs.transport_version == TRANSPORT_VERSION && theirs.app_version == self.app_version;
        let answer = self.hello(if ok { 0 } else { 1 });
        stream
            .write_all(&answer.encode())
            .await
            .map_err(|e| fail(e.to_string()))?;
        if !ok {
            return Err(self.mismatch(peer, &theirs));
        }
        Ok(theirs.max_msg_bytes as usize)
    }
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
    conns: Arc<Mutex<HashMap<ConnId, Weak<ConnCore>>>>,
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
            {
                let mut c = conns.lock();
                c.retain(|_, w| w.strong_count() > 0);
                if c.len() >= ep.config.max_connections {
                    warn!(%peer, limit = ep.config.max_connections, "too many connections");
                    return;
                }
            }
            let ms = ep.config.connect_timeout_ms;
            let hs = tokio::time::timeout(
                Duration::from_millis(ms),
                ep.server_handshake(&mut stream, &peer),
            )
            .await;
            let peer_max = match hs {
                Ok(Ok(m)) => m,
                Ok(Err(e)) => return debug!(%peer, error = %e, "handshake refused"),
                Err(_) => return debug!(%peer, "handshake timed out"),
            };
            let (r, w) = stream.into_split();
            let streams = Streams {
                reader: Box::new(r),
                writer: Box::new(w),
            };
            let conn = Connection::start(
                streams,
                peer,
                peer_max,
                ep.config.clone(),
                Some(handler),
                false,
            );
            conns.lock().insert(conn.id(), Arc::downgrade(conn.core()));
        });
    }
}

/// A listening endpoint. Dropping it stops accepting and closes every connection it
/// accepted.
pub struct Listener {
    local_addr: SocketAddr,
    accept: AbortHandle,
    conns: Arc<Mutex<HashMap<ConnId, Weak<ConnCore>>>>,
}

impl Listener {
    /// The address it listens on (with the port chosen for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and closes every accepted connection.
    pub fn shutdown(&self) {
        self.accept.abort();
        let conns: Vec<_> = self.conns.lock().drain().collect();
        for (_, c) in conns {
            if let Some(c) = c.upgrade() {
                c.shutdown("listener shut down".into());
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shutdown();
    }
}
