//! The `tcp` backend against its contract: calls, one-sided operations, limits, keys,
//! dead peers and malformed input. Servers listen on 127.0.0.1 port 0.

use bytes::Bytes;
use proto::{MrKey, RemoteBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use transport::frame::{Header, Hello, Kind, HEADER_LEN, HELLO_LEN, TRANSPORT_VERSION};
use transport::{
    Access, Backend, Connection, Endpoint, Handler, HandlerFuture, Listener, TransportConfig,
    TransportError,
};

const APP: u16 = 7;

/// Test protocol: byte 0 is the operation.
/// 0 echo; 1 WRITE a pattern into the caller's buffer; 2 READ the caller's buffer and reply
/// its hash; 3 never answer; 4 reply with `n` bytes (n in bytes 1..9).
struct TestHandler;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn encode_remote(op: u8, r: RemoteBuf, seed: u8) -> Bytes {
    let mut v = vec![op];
    v.extend_from_slice(&r.addr.to_le_bytes());
    v.extend_from_slice(&r.len.to_le_bytes());
    v.extend_from_slice(&r.key.0.to_le_bytes());
    v.push(seed);
    Bytes::from(v)
}

fn decode_remote(b: &[u8]) -> (RemoteBuf, u8) {
    let addr = u64::from_le_bytes(b[1..9].try_into().unwrap());
    let len = u64::from_le_bytes(b[9..17].try_into().unwrap());
    let key = MrKey(u32::from_le_bytes(b[17..21].try_into().unwrap()));
    (RemoteBuf { addr, len, key }, b[21])
}

impl Handler for TestHandler {
    fn handle(&self, conn: Connection, req: Bytes) -> HandlerFuture {
        Box::pin(async move {
            let ep = Endpoint::new(Backend::Tcp, TransportConfig::default(), APP).unwrap();
            match req.first() {
                Some(0) => req,
                Some(1) => {
                    let (remote, seed) = decode_remote(&req);
                    let mr = ep.register(remote.len as usize).unwrap();
                    mr.lock()
                        .copy_from_slice(&pattern(remote.len as usize, seed));
                    match conn.write(remote, &mr, 0).await {
                        Ok(()) => Bytes::from_static(b"ok"),
                        Err(e) => Bytes::from(format!("err {e}")),
                    }
                }
                Some(2) => {
                    let (remote, _) = decode_remote(&req);
                    let mr = ep.register(remote.len as usize).unwrap();
                    match conn.read(remote, &mr, 0).await {
                        Ok(()) => Bytes::from(fnv(&mr.lock()).to_le_bytes().to_vec()),
                        Err(e) => Bytes::from(format!("err {e}")),
                    }
                }
                Some(3) => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Bytes::new()
                }
                Some(4) => {
                    let n = u64::from_le_bytes(req[1..9].try_into().unwrap());
                    Bytes::from(vec![9u8; n as usize])
                }
                _ => Bytes::from_static(b"unknown op"),
            }
        })
    }
}

fn endpoint(config: TransportConfig) -> Endpoint {
    Endpoint::new(Backend::Tcp, config, APP).unwrap()
}

async fn server(config: TransportConfig) -> (Listener, String) {
    let l = endpoint(config)
        .listen("127.0.0.1:0", Arc::new(TestHandler))
        .await
        .unwrap();
    let addr = l.local_addr().to_string();
    (l, addr)
}

#[tokio::test]
async fn calls_round_trip_and_run_concurrently() {
    let (_l, addr) = server(TransportConfig::default()).await;
    let conn = endpoint(TransportConfig::default())
        .connect(&addr)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let c = conn.clone();
        tasks.push(tokio::spawn(async move {
            let mut msg = vec![0u8];
            msg.extend_from_slice(&i.to_le_bytes());
            let reply = c.call(Bytes::from(msg.clone())).await.unwrap();
            assert_eq!(&reply[..], &msg[..]);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn message_size_limits_are_enforced_both_ways() {
    let cfg = TransportConfig {
        max_msg_bytes: 8192,
        ..TransportConfig::default()
    };
    let (_l, addr) = server(cfg.clone()).await;
    let conn = endpoint(cfg).connect(&addr).await.unwrap();
    let big = Bytes::from(vec![0u8; 8193]);
    assert!(matches!(
        conn.call(big).await,
        Err(TransportError::TooBig { .. })
    ));
    // A reply over the limit is refused by the server's engine with a clear code.
    let mut req = vec![4u8];
    req.extend_from_slice(&9000u64.to_le_bytes());
    match conn.call(Bytes::from(req)).await {
        Err(TransportError::Refused { code, .. }) => assert_eq!(code, proto::ErrorCode::TooBig),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The connection still works.
    assert_eq!(
        &conn.call(Bytes::from_static(&[0, 1])).await.unwrap()[..],
        &[0, 1]
    );
}

#[tokio::test]
async fn one_sided_write_and_read_are_correct_from_1_byte_to_16_mib() {
    let (_l, addr) = server(TransportConfig::default()).await;
    let ep = endpoint(TransportConfig::default());
    let conn = ep.connect(&addr).await.unwrap();
    let mr = ep.register(16 << 20 | 4096).unwrap();
    for (i, len) in [1usize, 7, 4096, 65_537, 1 << 20, 16 << 20]
        .into_iter()
        .enumerate()
    {
        let off = (i * 977) % 4096;
        let seed = i as u8;
        // The server WRITEs into our buffer at an offset.
        mr.lock().fill(0xAA);
        let g = conn.grant(&mr, off, len, Access::RemoteWrite).unwrap();
        let reply = conn.call(encode_remote(1, g.remote(), seed)).await.unwrap();
        assert_eq!(&reply[..], b"ok");
        {
            let buf = mr.lock();
            assert_eq!(&buf[off..off + len], &pattern(len, seed)[..], "len {len}");
            assert!(
                buf[..off].iter().all(|&b| b == 0xAA),
                "bytes before the slice kept"
            );
            assert_eq!(buf.get(off + len).copied().unwrap_or(0xAA), 0xAA);
        }
        // The server READs from our buffer.
        let g = conn.grant(&mr, off, len, Access::RemoteRead).unwrap();
        let reply = conn.call(encode_remote(2, g.remote(), 0)).await.unwrap();
        assert_eq!(&reply[..], &fnv(&pattern(len, seed)).to_le_bytes());
    }
}

#[tokio::test]
async fn bad_keys_bounds_access_and_revoked_grants_are_refused() {
    let (_l, addr) = server(TransportConfig::default()).await;
    let ep = endpoint(TransportConfig::default());
    let conn = ep.connect(&addr).await.unwrap();
    let other = ep.connect(&addr).await.unwrap();
    let mr = ep.register(8192).unwrap();
    let g = conn.grant(&mr, 4096, 4096, Access::RemoteWrite).unwrap();
    let good = g.remote();
    let cases = [
        (
            "wrong key",
            RemoteBuf {
                key: MrKey(good.key.0 ^ 1),
                ..good
            },
        ),
        (
            "before the slice",
            RemoteBuf {
                addr: good.addr - 1,
                ..good
            },
        ),
        (
            "past the slice",
            RemoteBuf {
                len: good.len + 1,
                ..good
            },
        ),
        (
            "address overflow",
            RemoteBuf {
                addr: u64::MAX - 2,
                len: 8,
                ..good
            },
        ),
    ];
    for (what, r) in cases {
        let reply = conn.call(encode_remote(1, r, 1)).await.unwrap();
        assert!(
            reply.starts_with(b"err access refused"),
            "{what}: {reply:?}"
        );
    }
    // A write-only grant cannot be read.
    let reply = conn.call(encode_remote(2, good, 0)).await.unwrap();
    assert!(reply.starts_with(b"err access refused"), "{reply:?}");
    // The key is valid only on the connection it was granted on.
    let reply = other.call(encode_remote(1, good, 1)).await.unwrap();
    assert!(reply.starts_with(b"err access refused"), "{reply:?}");
    // A dropped grant is revoked.
    drop(g);
    let reply = conn.call(encode_remote(1, good, 1)).await.unwrap();
    assert!(reply.starts_with(b"err access refused"), "{reply:?}");
    // Deregistered memory is no longer reachable through a live grant.
    let mr2 = ep.register(4096).unwrap();
    let g2 = conn.grant(&mr2, 0, 4096, Access::RemoteWrite).unwrap();
    drop(mr2);
    let reply = conn.call(encode_remote(1, g2.remote(), 1)).await.unwrap();
    assert!(reply.starts_with(b"err access refused"), "{reply:?}");
    assert!(mr.lock().iter().all(|&b| b == 0), "no refused write landed");
}

#[tokio::test]
async fn a_dead_peer_fails_calls_within_the_timeout_never_hangs() {
    let (l, addr) = server(TransportConfig::default()).await;
    let cfg = TransportConfig {
        call_timeout_ms: 300,
        ..TransportConfig::default()
    };
    let conn = endpoint(cfg).connect(&addr).await.unwrap();
    // A peer that never answers: the call times out.
    let t = Instant::now();
    let r = conn.call(Bytes::from_static(&[3])).await;
    assert!(matches!(r, Err(TransportError::TimedOut { .. })), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    // A peer that dies mid-call: the call fails as soon as the connection drops.
    let c2 = conn.clone();
    let pending = tokio::spawn(async move { c2.call(Bytes::from_static(&[3])).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(l);
    let r = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .unwrap()
        .unwrap();
    assert!(r.is_err(), "{r:?}");
    let r = conn.call(Bytes::from_static(&[0])).await;
    assert!(
        matches!(r, Err(TransportError::Disconnected { .. })),
        "{r:?}"
    );
    // Connecting to nobody fails fast.
    drop(conn);
    let r = endpoint(TransportConfig::default()).connect(&addr).await;
    assert!(matches!(r, Err(TransportError::Connect { .. })), "{r:?}");
}

async fn raw_handshake(addr: &str, app: u16) -> (TcpStream, Hello) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let hello = Hello {
        transport_version: TRANSPORT_VERSION,
        app_version: app,
        max_msg_bytes: 1 << 20,
        status: 0,
    };
    s.write_all(&hello.encode()).await.unwrap();
    let mut b = [0u8; HELLO_LEN];
    s.read_exact(&mut b).await.unwrap();
    (s, Hello::decode(&b).unwrap())
}

async fn read_frame(s: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).await.unwrap();
    let h = Header::decode(&hb);
    let mut p = vec![0u8; h.len as usize];
    s.read_exact(&mut p).await.unwrap();
    (h, p)
}

#[tokio::test]
async fn malformed_frames_get_clear_errors_and_the_server_keeps_serving() {
    let (_l, addr) = server(TransportConfig::default()).await;
    let good = endpoint(TransportConfig::default())
        .connect(&addr)
        .await
        .unwrap();

    // An unknown frame kind: refused with UnknownMessage, the connection stays usable.
    let (mut s, hello) = raw_handshake(&addr, APP).await;
    assert_eq!(hello.status, 0);
    let mut h = Header::new(Kind::Call, 5);
    h.kind = 99;
    s.write_all(&h.encode()).await.unwrap();
    let (resp, msg) = read_frame(&mut s).await;
    assert_eq!((resp.kind, resp.id), (Kind::CallError as u8, 5));
    assert_eq!(resp.status, proto::ErrorCode::UnknownMessage.number());
    assert!(String::from_utf8_lossy(&msg).contains("unknown frame kind 99"));
    let mut call = Header::new(Kind::Call, 6);
    call.len = 2;
    s.write_all(&call.encode()).await.unwrap();
    s.write_all(&[0, 42]).await.unwrap();
    let (resp, msg) = read_frame(&mut s).await;
    assert_eq!(
        (resp.kind, resp.id, msg),
        (Kind::Reply as u8, 6, vec![0, 42])
    );

    // An oversized frame: a TooBig error, then the connection is closed.
    let mut huge = Header::new(Kind::Call, 7);
    huge.len = u32::MAX;
    s.write_all(&huge.encode()).await.unwrap();
    let (resp, msg) = read_frame(&mut s).await;
    assert_eq!(resp.status, proto::ErrorCode::TooBig.number());
    assert!(String::from_utf8_lossy(&msg).contains("limit"));
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    assert_eq!(n.unwrap().unwrap(), 0, "closed after the error");

    // Garbage instead of a handshake, and a version mismatch: refused.
    let mut g = TcpStream::connect(&addr).await.unwrap();
    g.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), g.read_to_end(&mut rest)).await;
    assert!(rest.is_empty());
    let (_s, hello) = raw_handshake(&addr, APP + 1).await;
    assert_eq!(hello.status, 1);
    let e = endpoint(TransportConfig::default());
    let mismatched = Endpoint::new(Backend::Tcp, TransportConfig::default(), APP + 1).unwrap();
    drop(e);
    let r = mismatched.connect(&addr).await;
    assert!(
        matches!(r, Err(TransportError::VersionMismatch { .. })),
        "{r:?}"
    );

    // Through all of it the well-behaved client was served.
    assert_eq!(
        &good.call(Bytes::from_static(&[0, 9])).await.unwrap()[..],
        &[0, 9]
    );
}

#[tokio::test]
async fn a_peer_flooding_past_its_credits_is_refused_not_buffered() {
    let cfg = TransportConfig {
        max_inflight_calls: 2,
        ..TransportConfig::default()
    };
    let (_l, addr) = server(cfg).await;
    let (mut s, _) = raw_handshake(&addr, APP).await;
    // Three calls that never finish: the third exceeds the server's two credits.
    for id in 1..=3u64 {
        let mut h = Header::new(Kind::Call, id);
        h.len = 1;
        s.write_all(&h.encode()).await.unwrap();
        s.write_all(&[3]).await.unwrap();
    }
    let (resp, _) = read_frame(&mut s).await;
    assert_eq!((resp.kind, resp.id), (Kind::CallError as u8, 3));
    assert_eq!(resp.status, proto::ErrorCode::Overloaded.number());
}
