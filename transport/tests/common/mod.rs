//! A test application shared by the transport's integration tests: a handler whose
//! operations drive one-sided transfers against the caller's grants.
#![allow(dead_code)]
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use proto::{MrKey, RemoteBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use transport::{Backend, Connection, Endpoint, Handler, HandlerFuture, Listener, TransportConfig};

/// Application protocol version of the test endpoints.
pub const APP: u16 = 7;

/// Operations (byte 0 of a request).
pub mod op {
    /// Reply with the request.
    pub const ECHO: u8 = 0;
    /// WRITE a pattern (seed in the request) into the caller's slice; reply "ok".
    pub const WRITE: u8 = 1;
    /// READ the caller's slice; reply its FNV hash.
    pub const READ: u8 = 2;
    /// Never answer.
    pub const HANG: u8 = 3;
    /// Reply with `n` bytes (n in bytes 1..9).
    pub const BIG_REPLY: u8 = 4;
    /// Reply with the number of calls this handler has seen before (arrival order).
    pub const SEQ: u8 = 5;
    /// WRITE the caller's slice again and again until a write fails; report the failure
    /// on the handler's event channel.
    pub const WRITE_UNTIL_ERROR: u8 = 6;
}

/// The test handler; failures of `WRITE_UNTIL_ERROR` are sent on `events`.
pub struct TestHandler {
    /// The listener's endpoint: on `rdma` a connection reaches only memory registered
    /// in its endpoint's protection domain.
    pub ep: Endpoint,
    pub seq: AtomicU64,
    pub events: mpsc::UnboundedSender<String>,
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

pub fn encode_remote(op: u8, r: RemoteBuf, seed: u8) -> Bytes {
    let mut v = vec![op];
    v.extend_from_slice(&r.addr.to_le_bytes());
    v.extend_from_slice(&r.len.to_le_bytes());
    v.extend_from_slice(&r.key.0.to_le_bytes());
    v.push(seed);
    Bytes::from(v)
}

fn decode_remote(b: &[u8]) -> Option<(RemoteBuf, u8)> {
    let addr = u64::from_le_bytes(b.get(1..9)?.try_into().ok()?);
    let len = u64::from_le_bytes(b.get(9..17)?.try_into().ok()?);
    let key = MrKey(u32::from_le_bytes(b.get(17..21)?.try_into().ok()?));
    Some((RemoteBuf { addr, len, key }, *b.get(21)?))
}

impl TestHandler {
    async fn serve(self: Arc<Self>, conn: Connection, req: Bytes) -> Bytes {
        let seen = self.seq.fetch_add(1, Ordering::SeqCst);
        let ep = &self.ep;
        let remote = decode_remote(&req);
        match (req.first().copied(), remote) {
            (Some(op::ECHO), _) => req,
            (Some(op::WRITE), Some((remote, seed))) => {
                let mr = ep.register(remote.len as usize).unwrap();
                mr.lock()
                    .copy_from_slice(&pattern(remote.len as usize, seed));
                match conn.write(remote, &mr, 0).await {
                    Ok(()) => Bytes::from_static(b"ok"),
                    Err(e) => Bytes::from(format!("err {e}")),
                }
            }
            (Some(op::READ), Some((remote, _))) => {
                let mr = ep.register(remote.len as usize).unwrap();
                match conn.read(remote, &mr, 0).await {
                    Ok(()) => Bytes::from(fnv(&mr.lock()).to_le_bytes().to_vec()),
                    Err(e) => Bytes::from(format!("err {e}")),
                }
            }
            (Some(op::HANG), _) => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Bytes::new()
            }
            (Some(op::BIG_REPLY), _) => {
                let n = u64::from_le_bytes(req[1..9].try_into().unwrap());
                Bytes::from(vec![9u8; n as usize])
            }
            (Some(op::SEQ), _) => Bytes::from(seen.to_le_bytes().to_vec()),
            (Some(op::WRITE_UNTIL_ERROR), Some((remote, _))) => {
                let mr = ep.register(remote.len as usize).unwrap();
                for _ in 0..100_000 {
                    if let Err(e) = conn.write(remote, &mr, 0).await {
                        let _ = self.events.send(format!("err {e}"));
                        return Bytes::new();
                    }
                }
                let _ = self.events.send("never failed".into());
                Bytes::new()
            }
            _ => Bytes::from_static(b"unknown op"),
        }
    }
}

/// The handler as the transport holds it.
pub struct Shared(pub Arc<TestHandler>);

impl Handler for Shared {
    fn handle(&self, conn: Connection, req: Bytes) -> HandlerFuture {
        Box::pin(self.0.clone().serve(conn, req))
    }
}

/// A server of the test application, and what it reports.
pub struct Server {
    pub listener: Listener,
    pub addr: String,
    pub events: mpsc::UnboundedReceiver<String>,
}

/// An endpoint on `backend`.
pub fn endpoint(backend: Backend, config: TransportConfig) -> Endpoint {
    Endpoint::new(backend, config, APP).unwrap()
}

/// Starts the test application on `backend` at 127.0.0.1, port 0.
pub async fn server(backend: Backend, config: TransportConfig) -> Server {
    let (tx, rx) = mpsc::unbounded_channel();
    let ep = endpoint(backend, config);
    let handler = Arc::new(TestHandler {
        ep: ep.clone(),
        seq: AtomicU64::new(0),
        events: tx,
    });
    let listener = ep
        .listen("127.0.0.1:0", Arc::new(Shared(handler)))
        .await
        .unwrap();
    let addr = listener.local_addr().to_string();
    Server {
        listener,
        addr,
        events: rx,
    }
}

/// A server that never answers and reports how each of its connections ended.
pub struct Silent(pub mpsc::UnboundedSender<transport::Closed>);

impl Handler for Silent {
    fn handle(&self, _conn: Connection, _req: Bytes) -> HandlerFuture {
        Box::pin(async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Bytes::new()
        })
    }
    fn disconnected(&self, _conn: transport::ConnId, how: transport::Closed) {
        let _ = self.0.send(how);
    }
}
