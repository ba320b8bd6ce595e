//! What only the `tcp` backend has: a wire that a peer can fill with malformed frames.
//! The contract every backend shares is in `conformance.rs`.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use common::{endpoint, server, APP};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use transport::frame::{Header, Hello, Kind, HEADER_LEN, HELLO_LEN, TRANSPORT_VERSION};
use transport::{Backend, Endpoint, TransportConfig, TransportError};

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
    let s = server(Backend::Tcp, TransportConfig::default()).await;
    let addr = s.addr.clone();
    let good = endpoint(Backend::Tcp, TransportConfig::default())
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
    let mismatched = Endpoint::new(Backend::Tcp, TransportConfig::default(), APP + 1).unwrap();
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
    let srv = server(Backend::Tcp, cfg).await;
    let (mut s, _) = raw_handshake(&srv.addr, APP).await;
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

/// Guards against idle connections keeping every slot of a listener (one local process
/// could open `max_connections` and sit on them): when all are taken, the connection
/// idle longest past `idle_close_ms` is closed for the new one; busy ones stay.
#[tokio::test]
async fn a_full_listener_closes_its_idlest_connection_for_a_new_one() {
    let cfg = TransportConfig {
        max_connections: 3,
        idle_close_ms: 300,
        ..TransportConfig::default()
    };
    let srv = server(Backend::Tcp, cfg).await;
    let ep = endpoint(Backend::Tcp, TransportConfig::default());
    let echo = || Bytes::from_static(&[common::op::ECHO, 1]);
    let mut conns = Vec::new();
    for _ in 0..3 {
        let c = ep.connect(&srv.addr).await.unwrap();
        c.call(echo()).await.unwrap();
        conns.push(c);
    }
    // Full, and nobody has been idle long enough: the new connection is refused.
    assert!(
        ep.connect(&srv.addr).await.is_err(),
        "a fourth connection fit"
    );
    // The first goes idle while the others keep calling.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for c in &conns[1..] {
            c.call(echo()).await.unwrap();
        }
    }
    let fresh = ep
        .connect(&srv.addr)
        .await
        .expect("room made for a new connection");
    fresh.call(echo()).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !conns[0].is_closed() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the idle connection stays"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for c in &conns[1..] {
        c.call(echo()).await.expect("busy connections are kept");
    }
}

/// Guards against a server killed while a connection waited in its listener's queue
/// failing the call that reconnected (the kernel took the connection, the process never
/// answered the handshake): that was a protocol error (EPROTO through a mount), not a
/// server that is away, so the client neither tried again nor moved on to its standby.
/// A peer that answers with something else than a handshake is still a protocol error.
#[tokio::test]
async fn a_connection_closed_before_the_handshake_answer_was_never_made() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move {
        // The first connection is closed unanswered, the second answered with garbage.
        let (s, _) = listener.accept().await.unwrap();
        drop(s);
        let (mut s, _) = listener.accept().await.unwrap();
        let mut b = [0u8; HELLO_LEN];
        s.read_exact(&mut b).await.unwrap();
        s.write_all(&[0x5a; HELLO_LEN]).await.unwrap();
        s
    });
    let ep = endpoint(Backend::Tcp, TransportConfig::default());
    let e = ep.connect(&addr).await.unwrap_err();
    assert!(e.never_connected(), "{e:?}");
    assert_eq!(e.code(), proto::ErrorCode::Unavailable, "{e}");
    assert!(e.to_string().contains("during the handshake"), "{e}");
    let e = ep.connect(&addr).await.unwrap_err();
    assert!(matches!(e, TransportError::Handshake { .. }), "{e:?}");
    assert!(!e.never_connected(), "{e:?}");
    drop(server.await.unwrap());
}

/// A pooled buffer whose one-sided read timed out while the response was still arriving
/// is not handed out again until the response's last byte has landed in it: a late
/// peer's bytes never reach a buffer another request took meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_read_keeps_its_pooled_buffer_until_the_late_bytes_land() {
    use std::sync::Arc;
    use transport::{BufferPool, Connection, Handler, HandlerFuture};

    struct OneBuffer(Arc<BufferPool>);
    impl Handler for OneBuffer {
        fn handle(&self, conn: Connection, _req: Bytes) -> HandlerFuture {
            let pool = Arc::clone(&self.0);
            Box::pin(async move {
                let buf = pool.take().await;
                buf.mr().lock().fill(0x11);
                let remote = proto::RemoteBuf {
                    addr: 0x1000,
                    len: 64,
                    key: proto::MrKey(5),
                };
                let read = conn.read(remote, buf.mr(), 0).await;
                assert!(
                    matches!(read, Err(TransportError::TimedOut { .. })),
                    "{read:?}"
                );
                drop(buf);
                // The only buffer still receives the late response: nobody gets it.
                let early = tokio::time::timeout(Duration::from_millis(300), pool.take()).await;
                let held = u8::from(early.is_err() && pool.held() == 1);
                // Once the response ends, it comes back, holding the response whole.
                let back = tokio::time::timeout(Duration::from_secs(10), pool.take()).await;
                let mut reply = vec![held, u8::from(back.is_ok())];
                if let Ok(b) = back {
                    reply.extend_from_slice(&b.mr().lock()[..64]);
                }
                Bytes::from(reply)
            })
        }
    }

    // The timeout leaves the server's reader ample time to take the response's header
    // (the buffer is held only once it has), on a loaded machine too.
    let cfg = TransportConfig {
        one_sided_timeout_ms: 1000,
        ..TransportConfig::default()
    };
    let ep = Endpoint::new(Backend::Tcp, cfg, APP).unwrap();
    let pool = Arc::new(BufferPool::new(&ep, 1, 64 * 1024).unwrap());
    let l = ep
        .listen("127.0.0.1:0", Arc::new(OneBuffer(pool)))
        .await
        .unwrap();
    let addr = l.local_addr().to_string();
    let (mut s, _) = raw_handshake(&addr, APP).await;
    let mut call = Header::new(Kind::Call, 1);
    call.len = 1;
    s.write_all(&call.encode()).await.unwrap();
    s.write_all(&[0]).await.unwrap();
    let (read, _) = read_frame(&mut s).await;
    assert_eq!(read.kind, Kind::Read as u8);
    // The response's header and 8 of its 64 bytes, the rest well past the timeout and
    // the handler's first look.
    let mut resp = Header::new(Kind::ReadResp, read.id);
    resp.len = 64;
    s.write_all(&resp.encode()).await.unwrap();
    s.write_all(&[0xbb; 8]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    s.write_all(&[0xbb; 56]).await.unwrap();
    let (reply, body) = read_frame(&mut s).await;
    assert_eq!(
        reply.kind,
        Kind::Reply as u8,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(
        body[0], 1,
        "the buffer was handed out while the late response ran"
    );
    assert_eq!(body[1], 1, "the buffer never came back");
    assert_eq!(&body[2..], &[0xbb; 64][..]);
}

/// A handler that panics, at once or after waiting, answers its call with an error; the
/// connection goes on serving the next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_answers_with_an_error_and_the_connection_serves_on() {
    use std::sync::Arc;
    use transport::{Connection, Handler, HandlerFuture};

    struct Panicky;
    impl Handler for Panicky {
        fn handle(&self, _conn: Connection, req: Bytes) -> HandlerFuture {
            Box::pin(async move {
                match req.first() {
                    Some(1) => panic!("a handler's bug, at once"),
                    Some(2) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        panic!("a handler's bug, after waiting")
                    }
                    _ => req,
                }
            })
        }
    }

    let ep = Endpoint::new(Backend::Tcp, TransportConfig::default(), APP).unwrap();
    let l = ep.listen("127.0.0.1:0", Arc::new(Panicky)).await.unwrap();
    let client = endpoint(Backend::Tcp, TransportConfig::default())
        .connect(&l.local_addr().to_string())
        .await
        .unwrap();
    for bad in [1u8, 2] {
        let e = client.call(Bytes::from(vec![bad])).await.unwrap_err();
        assert_eq!(e.code(), proto::ErrorCode::Io, "{e}");
        let echo = client.call(Bytes::from_static(&[0, 7])).await.unwrap();
        assert_eq!(&echo[..], &[0, 7]);
    }
}
