//! Fault injection at the transport seam of the `mem` backend: drop, delay, partition
//! and kill, as tests of the servers and the client use them. Each test uses its own
//! listen addresses, so filters of tests running at the same time do not meet.

mod common;

use bytes::Bytes;
use common::{encode_remote, endpoint, op, server};
use std::time::{Duration, Instant};
use transport::mem::{self, OpKind, Packet, Verdict};
use transport::{Access, Backend, TransportConfig, TransportError};

const MEM: Backend = Backend::Mem;

fn quick() -> TransportConfig {
    TransportConfig {
        call_timeout_ms: 300,
        one_sided_timeout_ms: 300,
        connect_timeout_ms: 300,
        ..TransportConfig::default()
    }
}

#[tokio::test]
async fn dropped_calls_time_out_and_the_connection_recovers_when_healed() {
    let s = server(MEM, TransportConfig::default()).await;
    let conn = endpoint(MEM, quick()).connect(&s.addr).await.unwrap();
    let guard = mem::drop_all(&s.addr);
    let t = Instant::now();
    let r = conn.call(Bytes::from_static(&[op::ECHO, 1])).await;
    assert!(matches!(r, Err(TransportError::TimedOut { .. })), "{r:?}");
    assert!(t.elapsed() >= Duration::from_millis(300));
    drop(guard);
    let r = conn.call(Bytes::from_static(&[op::ECHO, 2])).await.unwrap();
    assert_eq!(&r[..], &[op::ECHO, 2]);
}

#[tokio::test]
async fn delays_slow_each_direction() {
    let s = server(MEM, TransportConfig::default()).await;
    let conn = endpoint(MEM, TransportConfig::default())
        .connect(&s.addr)
        .await
        .unwrap();
    let _slow = mem::delay(&s.addr, Duration::from_millis(50));
    let t = Instant::now();
    conn.call(Bytes::from_static(&[op::ECHO])).await.unwrap();
    // The call and its reply are each delayed.
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn a_partition_cuts_both_ways_and_connects_time_out() {
    let a = server(MEM, TransportConfig::default()).await;
    let b = server(MEM, TransportConfig::default()).await;
    // `b`'s own endpoint connects to `a`: that connection carries b's address.
    let ep_b = endpoint(MEM, quick());
    let _l = ep_b
        .listen(
            "127.0.0.1:0",
            std::sync::Arc::new(common::Shared(handler())),
        )
        .await
        .unwrap();
    let b_name = _l.local_addr().to_string();
    let conn = ep_b.connect(&a.addr).await.unwrap();
    let cut = mem::partition(&[&a.addr], &[&b_name]);
    let r = conn.call(Bytes::from_static(&[op::ECHO])).await;
    assert!(matches!(r, Err(TransportError::TimedOut { .. })), "{r:?}");
    // A timed-out call may have reached the peer; a timed-out connect sent nothing (the
    // client waits for a metadata server whose connects time out: it used not to).
    assert!(!r.unwrap_err().never_connected());
    let r = ep_b.connect(&a.addr).await;
    assert!(matches!(r, Err(TransportError::TimedOut { .. })), "{r:?}");
    assert!(r.err().is_some_and(|e| e.never_connected()));
    // Others are not affected.
    let other = endpoint(MEM, quick()).connect(&b.addr).await.unwrap();
    other.call(Bytes::from_static(&[op::ECHO])).await.unwrap();
    drop(cut);
    conn.call(Bytes::from_static(&[op::ECHO])).await.unwrap();
}

fn handler() -> std::sync::Arc<common::TestHandler> {
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    std::sync::Arc::new(common::TestHandler {
        ep: endpoint(MEM, TransportConfig::default()),
        seq: Default::default(),
        events: tx,
    })
}

#[tokio::test]
async fn killing_a_server_mid_transfer_fails_the_transfer_at_once() {
    let s = server(MEM, TransportConfig::default()).await;
    let ep = endpoint(MEM, TransportConfig::default());
    let conn = ep.connect(&s.addr).await.unwrap();
    let mr = ep.register(1 << 20).unwrap();
    let g = conn.grant(&mr, 0, 1 << 20, Access::RemoteWrite).unwrap();
    // The server's first WRITE kills the connection, as a data server dying mid-read.
    let addr = s.addr.clone();
    let _kill = mem::add_filter(move |p: &Packet<'_>| match p.kind {
        OpKind::Write if p.from == addr => Verdict::Kill,
        _ => Verdict::Deliver,
    });
    let t = Instant::now();
    let r = conn.call(encode_remote(op::WRITE, g.remote(), 1)).await;
    assert!(
        matches!(r, Err(TransportError::Disconnected { .. })),
        "{r:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(mr.lock().iter().all(|&b| b == 0), "nothing landed");
    assert!(conn.is_closed());
}

#[tokio::test]
async fn kill_closes_every_connection_of_an_address_and_it_can_be_reached_again() {
    let s = server(MEM, TransportConfig::default()).await;
    let ep = endpoint(MEM, TransportConfig::default());
    let c1 = ep.connect(&s.addr).await.unwrap();
    let c2 = ep.connect(&s.addr).await.unwrap();
    assert_eq!(mem::kill(&s.addr), 2);
    assert!(c1.is_closed() && c2.is_closed());
    let r = c1.call(Bytes::from_static(&[op::ECHO])).await;
    assert!(
        matches!(r, Err(TransportError::Disconnected { .. })),
        "{r:?}"
    );
    let c3 = ep.connect(&s.addr).await.unwrap();
    c3.call(Bytes::from_static(&[op::ECHO])).await.unwrap();
}

#[tokio::test]
async fn kill_between_breaks_the_connections_of_two_ends_and_no_others() {
    let s = server(MEM, TransportConfig::default()).await;
    // `b` listens too, so its connections carry its address; `other` does not.
    let ep_b = endpoint(MEM, TransportConfig::default());
    let l = ep_b
        .listen(
            "127.0.0.1:0",
            std::sync::Arc::new(common::Shared(handler())),
        )
        .await
        .unwrap();
    let b_name = l.local_addr().to_string();
    let from_b = ep_b.connect(&s.addr).await.unwrap();
    let other = endpoint(MEM, TransportConfig::default())
        .connect(&s.addr)
        .await
        .unwrap();
    assert_eq!(mem::kill_between(&b_name, &s.addr), 1);
    assert!(from_b.is_closed());
    assert!(!other.is_closed(), "another client's connection stays");
    other.call(Bytes::from_static(&[op::ECHO])).await.unwrap();
    let again = ep_b.connect(&s.addr).await.unwrap();
    again.call(Bytes::from_static(&[op::ECHO])).await.unwrap();
}

#[tokio::test]
async fn listen_addresses_are_virtual_and_unique() {
    let a = server(MEM, TransportConfig::default()).await;
    let b = server(MEM, TransportConfig::default()).await;
    assert_ne!(a.addr, b.addr);
    let r = endpoint(MEM, TransportConfig::default())
        .listen(&a.addr, std::sync::Arc::new(common::Shared(handler())))
        .await;
    assert!(
        matches!(r, Err(TransportError::Listen { .. })),
        "address in use"
    );
    let addr = a.addr.clone();
    drop(a);
    let r = endpoint(MEM, quick()).connect(&addr).await;
    assert!(matches!(r, Err(TransportError::Connect { .. })), "{r:?}");
}
