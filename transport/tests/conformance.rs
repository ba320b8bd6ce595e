//! The transport's contract, written once and run against every backend: `tcp`,
//! `mem`, and `rdma`. A backend this machine cannot run is reported as ignored with the
//! reason ("skipped: no RDMA device (ENOSYS)"), never as passed.
//!
//! Run one backend: `cargo test -p transport --test conformance -- mem::`.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use common::{encode_remote, endpoint, fnv, op, pattern, server};
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use proto::{ErrorCode, MrKey, RemoteBuf};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};
use transport::{Access, Backend, Endpoint, TransportConfig, TransportError};

type Case = fn(Backend) -> Pin<Box<dyn Future<Output = ()> + Send>>;

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        [$((stringify!($name), (|b| Box::pin($name(b))) as Case)),*]
    };
}

fn main() {
    let args = Arguments::from_args();
    let cases = cases![
        calls_are_answered_in_order_and_matched_under_concurrency,
        message_size_limits_are_enforced_both_ways,
        one_sided_write_and_read_are_correct_from_1_byte_to_16_mib,
        bad_keys_bounds_and_access_are_refused,
        a_key_is_refused_on_another_connection,
        deregistered_memory_and_revoked_grants_are_unreachable,
        many_concurrent_operations_complete,
        a_dead_peer_fails_calls_within_the_timeout,
        a_peer_dying_mid_transfer_fails_the_transfer_not_hangs,
        calls_beyond_the_servers_credits_are_refused,
        another_application_version_is_refused,
        a_connection_given_up_is_broken_for_the_peer,
        a_refused_key_is_told_to_the_client,
        lent_memory_is_written_in_place_and_given_back,
    ];
    let mut trials = Vec::new();
    for backend in [Backend::Tcp, Backend::Mem, Backend::Rdma] {
        let skip = skip_reason(backend);
        if backend == Backend::Rdma && skip.is_none() {
            // Which documented path the device's attributes chose (memory windows or
            // a registration per grant), so a run says what it covered.
            match Endpoint::new(backend, cfg(), common::APP) {
                Ok(ep) => println!("rdma cases: {}", ep.describe()),
                Err(e) => println!("rdma endpoint: {e}"),
            }
        }
        for (name, case) in cases {
            let skip = skip.clone();
            let name = format!("{backend}::{name}");
            trials.push(Trial::ignorable_test(name, move || {
                run(backend, case, skip)
            }));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}

/// Why `backend` cannot run here, as the trial reports it.
fn skip_reason(backend: Backend) -> Option<String> {
    if backend != Backend::Rdma {
        return None;
    }
    match transport::rdma_probe(&TransportConfig::default()) {
        Ok(()) => None,
        Err(why) if why.contains("ENOSYS") => Some("skipped: no RDMA device (ENOSYS)".into()),
        Err(why) => Some(format!("skipped: {why}")),
    }
}

fn run(backend: Backend, case: Case, skip: Option<String>) -> Result<Completion, Failed> {
    if let Some(why) = skip {
        return Ok(Completion::ignored_with(why));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failed::from(e.to_string()))?;
    // Every case must finish well within this; a hang is a failure, not a stuck run.
    let limit = Duration::from_secs(120);
    match rt.block_on(async { tokio::time::timeout(limit, case(backend)).await }) {
        Ok(()) => Ok(Completion::Completed),
        Err(_) => Err(Failed::from(format!("hung for more than {limit:?}"))),
    }
}

fn cfg() -> TransportConfig {
    TransportConfig::default()
}

async fn calls_are_answered_in_order_and_matched_under_concurrency(b: Backend) {
    let s = server(b, cfg()).await;
    let conn = endpoint(b, cfg()).connect(&s.addr).await.unwrap();
    // One after another: the server sees them in the order they were made.
    let mut last = None;
    for _ in 0..50 {
        let r = conn.call(Bytes::from_static(&[op::SEQ])).await.unwrap();
        let n = u64::from_le_bytes(r[..8].try_into().unwrap());
        assert!(last.is_none_or(|l| n == l + 1), "{last:?} then {n}");
        last = Some(n);
    }
    // Many at once: every reply reaches the call that asked for it.
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let c = conn.clone();
        tasks.push(tokio::spawn(async move {
            let mut msg = vec![op::ECHO];
            msg.extend_from_slice(&i.to_le_bytes());
            let reply = c.call(Bytes::from(msg.clone())).await.unwrap();
            assert_eq!(&reply[..], &msg[..]);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

async fn message_size_limits_are_enforced_both_ways(b: Backend) {
    let small = TransportConfig {
        max_msg_bytes: 8192,
        ..cfg()
    };
    let s = server(b, small.clone()).await;
    let conn = endpoint(b, small).connect(&s.addr).await.unwrap();
    let r = conn.call(Bytes::from(vec![0u8; 8193])).await;
    assert!(matches!(r, Err(TransportError::TooBig { .. })), "{r:?}");
    // The largest allowed request passes.
    let max = conn.call(Bytes::from(vec![0u8; 8192])).await.unwrap();
    assert_eq!(max.len(), 8192);
    // A reply over the limit is refused by the server's engine with a clear code.
    let mut req = vec![op::BIG_REPLY];
    req.extend_from_slice(&9000u64.to_le_bytes());
    match conn.call(Bytes::from(req)).await {
        Err(TransportError::Refused { code, .. }) => assert_eq!(code, ErrorCode::TooBig),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // One-sided transfers have their own limit.
    let ep = endpoint(b, cfg());
    let mr = ep.register(8192).unwrap();
    let remote = RemoteBuf {
        addr: 0,
        len: (64 << 20) + 1,
        key: MrKey(1),
    };
    let r = conn.read(remote, &mr, 0).await;
    assert!(matches!(r, Err(TransportError::TooBig { .. })), "{r:?}");
    assert_eq!(
        &conn.call(Bytes::from_static(&[0, 1])).await.unwrap()[..],
        &[0, 1]
    );
}

async fn one_sided_write_and_read_are_correct_from_1_byte_to_16_mib(b: Backend) {
    let s = server(b, cfg()).await;
    let ep = endpoint(b, cfg());
    let conn = ep.connect(&s.addr).await.unwrap();
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
        let reply = conn.call(encode_remote(op::WRITE, g.remote(), seed)).await;
        assert_eq!(&reply.unwrap()[..], b"ok");
        {
            let buf = mr.lock();
            assert_eq!(&buf[off..off + len], &pattern(len, seed)[..], "len {len}");
            assert!(buf[..off].iter().all(|&x| x == 0xAA), "bytes before kept");
            assert_eq!(buf.get(off + len).copied().unwrap_or(0xAA), 0xAA);
        }
        // The server READs from our buffer.
        let g = conn.grant(&mr, off, len, Access::RemoteRead).unwrap();
        let reply = conn.call(encode_remote(op::READ, g.remote(), 0)).await;
        assert_eq!(&reply.unwrap()[..], &fnv(&pattern(len, seed)).to_le_bytes());
    }
}

/// Whether the server's one-sided access was refused. On `rdma` a refused access also
/// moves the reliable-connected queue pairs to the error state (verbs semantics), so the
/// caller may see its connection close instead of the server's answer.
fn refused(b: Backend, reply: &Result<Bytes, TransportError>) -> bool {
    match reply {
        Ok(r) => r.starts_with(b"err access refused"),
        Err(TransportError::Disconnected { .. }) => b == Backend::Rdma,
        Err(_) => false,
    }
}

async fn bad_keys_bounds_and_access_are_refused(b: Backend) {
    let s = server(b, cfg()).await;
    let ep = endpoint(b, cfg());
    let mr = ep.register(8192).unwrap();
    type Spoil = fn(RemoteBuf) -> RemoteBuf;
    let cases: [(&str, Spoil); 4] = [
        ("wrong key", |g| RemoteBuf {
            key: MrKey(g.key.0 ^ 1),
            ..g
        }),
        ("before the slice", |g| RemoteBuf {
            addr: g.addr - 1,
            ..g
        }),
        ("past the slice", |g| RemoteBuf {
            len: g.len + 1,
            ..g
        }),
        ("overflow", |g| RemoteBuf {
            addr: u64::MAX - 2,
            len: 8,
            ..g
        }),
    ];
    // Each case on its own connection: on rdma a refusal ends the connection.
    for (what, bad) in cases {
        let conn = ep.connect(&s.addr).await.unwrap();
        let g = conn.grant(&mr, 4096, 4096, Access::RemoteWrite).unwrap();
        let reply = conn
            .call(encode_remote(op::WRITE, bad(g.remote()), 1))
            .await;
        assert!(refused(b, &reply), "{what}: {reply:?}");
    }
    // A write-only grant cannot be read.
    let conn = ep.connect(&s.addr).await.unwrap();
    let g = conn.grant(&mr, 4096, 4096, Access::RemoteWrite).unwrap();
    let reply = conn.call(encode_remote(op::READ, g.remote(), 0)).await;
    assert!(refused(b, &reply), "{reply:?}");
    assert!(mr.lock().iter().all(|&x| x == 0), "no refused write landed");
    // The exact slice works.
    let conn = ep.connect(&s.addr).await.unwrap();
    let good = conn.grant(&mr, 4096, 4096, Access::RemoteWrite).unwrap();
    let reply = conn.call(encode_remote(op::WRITE, good.remote(), 3)).await;
    let reply = reply.unwrap();
    assert_eq!(&reply[..], b"ok");
    assert_eq!(&mr.lock()[4096..], &pattern(4096, 3)[..]);
}

async fn a_key_is_refused_on_another_connection(b: Backend) {
    let s = server(b, cfg()).await;
    let ep = endpoint(b, cfg());
    let conn = ep.connect(&s.addr).await.unwrap();
    let other = ep.connect(&s.addr).await.unwrap();
    let mr = ep.register(4096).unwrap();
    let g = conn.grant(&mr, 0, 4096, Access::RemoteReadWrite).unwrap();
    let reply = other.call(encode_remote(op::WRITE, g.remote(), 1)).await;
    assert!(refused(b, &reply), "{reply:?}");
    let other = ep.connect(&s.addr).await.unwrap();
    let reply = other.call(encode_remote(op::READ, g.remote(), 1)).await;
    assert!(refused(b, &reply), "{reply:?}");
    assert!(mr.lock().iter().all(|&x| x == 0));
}

async fn deregistered_memory_and_revoked_grants_are_unreachable(b: Backend) {
    let s = server(b, cfg()).await;
    let ep = endpoint(b, cfg());
    let conn = ep.connect(&s.addr).await.unwrap();
    // A dropped grant is revoked.
    let mr = ep.register(4096).unwrap();
    let g = conn.grant(&mr, 0, 4096, Access::RemoteWrite).unwrap();
    let remote = g.remote();
    drop(g);
    let reply = conn.call(encode_remote(op::WRITE, remote, 1)).await;
    assert!(refused(b, &reply), "{reply:?}");
    assert!(mr.lock().iter().all(|&x| x == 0));
    // Deregistered memory is unreachable through a grant that is still alive.
    let conn = ep.connect(&s.addr).await.unwrap();
    let mr2 = ep.register(4096).unwrap();
    let g2 = conn.grant(&mr2, 0, 4096, Access::RemoteReadWrite).unwrap();
    drop(mr2);
    let reply = conn.call(encode_remote(op::WRITE, g2.remote(), 1)).await;
    assert!(refused(b, &reply), "{reply:?}");
    let reply = conn.call(encode_remote(op::READ, g2.remote(), 1)).await;
    assert!(refused(b, &reply), "{reply:?}");
}

async fn lent_memory_is_written_in_place_and_given_back(b: Backend) {
    let s = server(b, cfg()).await;
    let ep = endpoint(b, cfg());
    let conn = ep.connect(&s.addr).await.unwrap();
    let (len, off) = (65_537, 3);
    let memory = vec![0xAAu8; off + len + 5];
    let at = memory.as_ptr() as u64;
    let mr = ep.lend(memory).unwrap();
    assert_eq!(mr.addr(), at, "the region is the lent memory itself");
    let g = conn.grant(&mr, off, len, Access::RemoteWrite).unwrap();
    let reply = conn.call(encode_remote(op::WRITE, g.remote(), 9)).await;
    assert_eq!(&reply.unwrap()[..], b"ok");
    drop(g);
    // Refused while another clone lives, or for another type; the region comes back.
    let clone = mr.clone();
    let mr = mr.reclaim::<Vec<u8>>().unwrap_err();
    drop(clone);
    let mr = mr.reclaim::<Box<[u8]>>().unwrap_err();
    let memory: Vec<u8> = mr.reclaim().unwrap();
    assert_eq!(memory.as_ptr() as u64, at);
    assert_eq!(&memory[off..off + len], &pattern(len, 9)[..]);
    assert!(memory[..off]
        .iter()
        .chain(&memory[off + len..])
        .all(|&x| x == 0xAA));
    // Memory the transport allocated is not lent: it cannot be taken.
    assert!(ep.register(4096).unwrap().reclaim::<Vec<u8>>().is_err());
}

async fn many_concurrent_operations_complete(b: Backend) {
    let config = TransportConfig {
        max_inflight_one_sided: 8,
        ..cfg()
    };
    let s = server(b, config.clone()).await;
    let ep = endpoint(b, config);
    let conn = ep.connect(&s.addr).await.unwrap();
    let slice = 64 * 1024;
    let n = 64;
    let mr = ep.register(slice * n).unwrap();
    // More operations than credits: the extra ones wait for a credit, none fails.
    let mut tasks = Vec::new();
    for i in 0..n {
        let g = conn
            .grant(&mr, i * slice, slice, Access::RemoteWrite)
            .unwrap();
        let c = conn.clone();
        tasks.push(tokio::spawn(async move {
            let r = c.call(encode_remote(op::WRITE, g.remote(), i as u8)).await;
            assert_eq!(&r.unwrap()[..], b"ok");
            drop(g);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let buf = mr.lock();
    for i in 0..n {
        let got = &buf[i * slice..(i + 1) * slice];
        assert_eq!(got, &pattern(slice, i as u8)[..], "slice {i}");
    }
}

async fn a_dead_peer_fails_calls_within_the_timeout(b: Backend) {
    let s = server(b, cfg()).await;
    let short = TransportConfig {
        call_timeout_ms: 300,
        ..cfg()
    };
    let conn = endpoint(b, short).connect(&s.addr).await.unwrap();
    // A peer that never answers: the call times out.
    let t = Instant::now();
    let r = conn.call(Bytes::from_static(&[op::HANG])).await;
    assert!(matches!(r, Err(TransportError::TimedOut { .. })), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    // A peer that dies mid-call: the call fails as soon as the connection drops.
    let c2 = conn.clone();
    let pending = tokio::spawn(async move { c2.call(Bytes::from_static(&[op::HANG])).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let addr = s.addr.clone();
    drop(s);
    let r = tokio::time::timeout(Duration::from_secs(5), pending).await;
    assert!(r.unwrap().unwrap().is_err());
    let r = conn.call(Bytes::from_static(&[op::ECHO])).await;
    assert!(
        matches!(r, Err(TransportError::Disconnected { .. })),
        "{r:?}"
    );
    // Connecting to nobody fails fast, and as a connection never made (refused, or
    // reset if the closing listener's socket still took the connection).
    drop(conn);
    let t = Instant::now();
    let r = endpoint(b, cfg()).connect(&addr).await;
    assert!(matches!(&r, Err(e) if e.never_connected()), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

async fn a_peer_dying_mid_transfer_fails_the_transfer_not_hangs(b: Backend) {
    let mut s = server(b, cfg()).await;
    let ep = endpoint(b, cfg());
    let conn = ep.connect(&s.addr).await.unwrap();
    let mr = ep.register(4 << 20).unwrap();
    let g = conn.grant(&mr, 0, 4 << 20, Access::RemoteWrite).unwrap();
    let c2 = conn.clone();
    let req = encode_remote(op::WRITE_UNTIL_ERROR, g.remote(), 0);
    let call = tokio::spawn(async move { c2.call(req).await });
    // Let the server's writes get going, then the client dies.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    conn.close();
    let r = tokio::time::timeout(Duration::from_secs(5), call).await;
    assert!(r.expect("the call ends").unwrap().is_err());
    let event = tokio::time::timeout(Duration::from_secs(10), s.events.recv()).await;
    let event = event.expect("the server's write fails in time").unwrap();
    assert!(event.starts_with("err "), "{event}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

async fn calls_beyond_the_servers_credits_are_refused(b: Backend) {
    let two = TransportConfig {
        max_inflight_calls: 2,
        call_timeout_ms: 2000,
        ..cfg()
    };
    let s = server(b, two).await;
    let conn = endpoint(b, cfg()).connect(&s.addr).await.unwrap();
    let mut hung = Vec::new();
    for _ in 0..2 {
        let c = conn.clone();
        hung.push(tokio::spawn(async move {
            c.call(Bytes::from_static(&[op::HANG])).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    match conn.call(Bytes::from_static(&[op::ECHO])).await {
        Err(TransportError::Refused { code, .. }) => assert_eq!(code, ErrorCode::Overloaded),
        other => panic!("expected Overloaded, got {other:?}"),
    }
    for h in hung {
        h.abort();
    }
}

async fn another_application_version_is_refused(b: Backend) {
    let s = server(b, cfg()).await;
    let other = transport::Endpoint::new(b, cfg(), common::APP + 1).unwrap();
    let r = other.connect(&s.addr).await;
    assert!(
        matches!(r, Err(TransportError::VersionMismatch { .. })),
        "{r:?}"
    );
}

/// Guards against a client's given-up connection reaching the server as closed by an
/// ended process (which ends its open files and locks at once, where a client that lives
/// on needs them kept for its grace): a connection abandoned after a call timed out is
/// broken for the peer, on every backend (rdma: a byte on the side channel); a plain
/// close is closed by the peer.
async fn a_connection_given_up_is_broken_for_the_peer(b: Backend) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let server_ep = endpoint(b, cfg());
    let listener = server_ep
        .listen("127.0.0.1:0", std::sync::Arc::new(common::Silent(tx)))
        .await
        .unwrap();
    let addr = listener.local_addr().to_string();
    let short = TransportConfig {
        call_timeout_ms: 200,
        ..cfg()
    };
    let ep = endpoint(b, short);
    let conn = ep.connect(&addr).await.unwrap();
    let r = conn.call(Bytes::from_static(b"x")).await;
    assert!(matches!(r, Err(TransportError::TimedOut { .. })), "{r:?}");
    conn.abandon();
    let how = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert_eq!(how.unwrap(), Some(transport::Closed::Broken));
    let conn = ep.connect(&addr).await.unwrap();
    conn.close();
    drop(conn);
    let how = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert_eq!(how.unwrap(), Some(transport::Closed::ByPeer));
}

/// Guards against a refused key reaching the client as a closed connection (on rdma the
/// connection closed before the refusal was sent): a client would then take the server
/// for one that is away, and wait for it, where it must fail at once with why. A key of
/// another cluster is refused, on every backend, as an authentication failure; the
/// server's own key gets in.
async fn a_refused_key_is_told_to_the_client(b: Backend) {
    use proto::auth::{Caps, KeyId};
    use transport::auth::KeyRecord;
    use transport::{ClientKeyFile, Credentials, Key, KeyTable};
    let cluster = Key::from_hex(&"c1".repeat(32)).unwrap();
    let table = std::sync::Arc::new(KeyTable::new(cluster.clone()));
    let alice = ClientKeyFile::derive(&cluster, "alice", KeyId([1; 16]), Caps::default());
    table.insert(
        "alice",
        KeyRecord {
            key_id: alice.claim.key_id,
            caps: alice.claim.caps.clone(),
            revoked: false,
        },
    );
    let server_ep = endpoint(b, cfg()).with_verifier(table);
    let s = server_ep
        .listen(
            "127.0.0.1:0",
            std::sync::Arc::new(common::Silent(tokio::sync::mpsc::unbounded_channel().0)),
        )
        .await
        .unwrap();
    let addr = s.local_addr().to_string();
    let other = Key::from_hex(&"d2".repeat(32)).unwrap();
    let forged = ClientKeyFile::derive(&other, "alice", KeyId([1; 16]), Caps::default());
    let t = Instant::now();
    let r = endpoint(b, cfg())
        .with_credentials(Credentials::client(forged))
        .connect(&addr)
        .await;
    assert!(matches!(&r, Err(TransportError::Auth { .. })), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    endpoint(b, cfg())
        .with_credentials(Credentials::client(alice))
        .connect(&addr)
        .await
        .expect("the cluster's own key gets in");
}
