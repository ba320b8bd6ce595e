//! Bad input to real servers: each gets a clear error, nothing panics, and the servers
//! keep serving the connection and everyone else.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use proto::data::{ReadChunk, WriteChunk};
use proto::grant::GrantMode;
use proto::meta::fs;
use proto::{codec, ChunkId, ErrorCode, InodeId, MrKey, RemoteBuf, Request, WireError};
use tessera_tests::InProcessCluster;
use transport::Access;

/// The code of an error reply. An error is encoded the same whatever the reply type
/// of the request, so it decodes as the error of a `()` reply.
fn error_of(reply: &[u8]) -> ErrorCode {
    match codec::decode::<Result<(), WireError>>(reply) {
        Ok(Err(e)) => e.code,
        other => panic!("expected a well-formed error reply, got {other:?}"),
    }
}

fn meta_error(reply: &[u8]) -> ErrorCode {
    error_of(reply)
}

fn data_error(reply: &[u8]) -> ErrorCode {
    error_of(reply)
}

/// The bytes of `req` in its envelope.
fn encoded<R: proto::Rpc>(req: R) -> Bytes {
    Bytes::from(Request::new(req).encode(1 << 20).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_and_unknown_messages_get_clear_errors() {
    let cluster = InProcessCluster::start(1).await;
    let ep = cluster.endpoint();
    let meta = ep.connect(&cluster.meta_addr()).await.unwrap();
    // A message type that does not exist.
    let reply = meta.call(Bytes::from_static(&[100, 1, 2])).await.unwrap();
    assert_eq!(meta_error(&reply), ErrorCode::UnknownMessage);
    // A truncated message.
    let good = encoded(fs::Lookup {
        parent: InodeId::ROOT,
        name: b"x".to_vec(),
    });
    let reply = meta.call(Bytes::copy_from_slice(&good[..2])).await.unwrap();
    assert_eq!(meta_error(&reply), ErrorCode::Malformed);
    // An empty message, and trailing garbage.
    let reply = meta.call(Bytes::new()).await.unwrap();
    assert_eq!(meta_error(&reply), ErrorCode::Malformed);
    let mut long = good.to_vec();
    long.extend_from_slice(b"junk");
    assert_eq!(
        meta_error(&meta.call(Bytes::from(long)).await.unwrap()),
        ErrorCode::Malformed
    );
    // Names no file system accepts.
    for name in [
        b"".to_vec(),
        b"a/b".to_vec(),
        vec![b'x'; 300],
        b"..".to_vec(),
    ] {
        let req = fs::Mkdir {
            parent: InodeId::ROOT,
            name,
            perm: 0o755,
        };
        let reply = meta.call(encoded(req)).await.unwrap();
        let code = meta_error(&reply);
        assert!(
            matches!(code, ErrorCode::InvalidArgument | ErrorCode::NameTooLong),
            "{code:?}"
        );
    }
    // Inodes that do not exist.
    let req = fs::GetAttr {
        ino: InodeId(u64::MAX),
    };
    let reply = meta.call(encoded(req)).await.unwrap();
    assert_eq!(meta_error(&reply), ErrorCode::NotFound);

    // The same connection, and a new client, are still served.
    let reply = meta.call(good).await.unwrap();
    assert_eq!(meta_error(&reply), ErrorCode::NotFound);
    let client = cluster.client().await;
    client
        .mkdir(
            InodeId::ROOT,
            b"still-alive",
            0o755,
            proto::meta::Caller::ROOT,
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_sided_accesses_with_bad_keys_or_bounds_are_refused_by_the_data_server() {
    let cluster = InProcessCluster::start(1).await;
    let map = cluster.client().await.cluster_map().await.unwrap();
    let place = proto::data::Placement {
        chain: map.chains[0].chain,
        map_version: map.version,
        replicas: 1,
    };
    let ep = cluster.endpoint();
    let data = ep.connect(cluster.data[0].advertise()).await.unwrap();
    let mr = ep.register(1 << 20).unwrap();
    let grant = data.grant(&mr, 0, 4096, Access::RemoteReadWrite).unwrap();
    let good = grant.remote();
    let chunk = ChunkId {
        inode: InodeId(777),
        index: 0,
    };
    let read = |dest: RemoteBuf, len: u32| ReadChunk {
        chunk,
        place,
        chunk_size_bytes: 4 << 20,
        offset: 0,
        len,
        dest,
        grant: cluster.grant(chunk.inode, GrantMode::ReadWrite),
    };
    let cases = [
        (
            "wrong key",
            read(
                RemoteBuf {
                    key: MrKey(good.key.0 ^ 0xffff),
                    ..good
                },
                4096,
            ),
        ),
        (
            "past the grant",
            read(RemoteBuf { len: 8192, ..good }, 8192),
        ),
        (
            "before the grant",
            read(
                RemoteBuf {
                    addr: good.addr - 4096,
                    ..good
                },
                4096,
            ),
        ),
    ];
    for (what, req) in cases {
        let reply = data.call(encoded(req)).await.unwrap();
        assert_eq!(data_error(&reply), ErrorCode::AccessViolation, "{what}");
    }
    let write = WriteChunk {
        chunk,
        place,
        chunk_size_bytes: 4 << 20,
        offset: 0,
        src: RemoteBuf {
            key: MrKey(good.key.0 ^ 1),
            ..good
        },
        grant: cluster.grant(chunk.inode, GrantMode::ReadWrite),
    };
    let reply = data.call(encoded(write)).await.unwrap();
    assert_eq!(data_error(&reply), ErrorCode::AccessViolation);
    // Bad chunk geometry is refused before any transfer.
    let bad = ReadChunk {
        chunk,
        place,
        chunk_size_bytes: 12345,
        offset: 0,
        len: 16,
        dest: good,
        grant: cluster.grant(chunk.inode, GrantMode::ReadWrite),
    };
    let reply = data.call(encoded(bad)).await.unwrap();
    assert_eq!(data_error(&reply), ErrorCode::InvalidArgument);
    let reply = data.call(Bytes::from_static(&[99])).await.unwrap();
    assert_eq!(data_error(&reply), ErrorCode::UnknownMessage);
    // A correct read on the same connection works: an unwritten chunk reads as zeros.
    mr.lock()[..4096].fill(0xee);
    let req = Request::new(read(good, 4096));
    let reply = data
        .call(Bytes::from(req.encode(4096).unwrap()))
        .await
        .unwrap();
    assert!(req.decode_reply(&reply).unwrap().is_ok());
    assert!(mr.lock()[..4096].iter().all(|&b| b == 0));
}

/// Guards against a subsystem's envelope whose payload is garbage (a known subsystem,
/// then an unknown request or a broken one) panicking a server or going unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_envelope_with_a_garbage_payload_is_refused_cleanly() {
    let cluster = InProcessCluster::start(1).await;
    let ep = cluster.endpoint();
    let meta = ep.connect(&cluster.meta_addr()).await.unwrap();
    // The metadata envelope: 0 file-system calls, 1 cluster calls, 2 admin calls. A
    // file-system call starts with its caller: uid 0, gid 0, no groups, umask 0
    // (`0, 0, 0, 0`).
    let cases: [(&'static [u8], ErrorCode); 8] = [
        (&[0, 0, 0, 0, 0, 100], ErrorCode::UnknownMessage),
        (&[1, 99, 1, 2, 3], ErrorCode::UnknownMessage),
        (&[2, 77], ErrorCode::UnknownMessage),
        (&[0, 0, 0, 0, 0, 1, 0xff, 0xff], ErrorCode::Malformed),
        // A caller cut short, and one naming more than `MAX_GROUPS` groups.
        (&[0, 100], ErrorCode::Malformed),
        (&[0, 0, 0, 65, 1, 2, 3], ErrorCode::Malformed),
        (&[1], ErrorCode::Malformed),
        (&[2, 0, 0xde, 0xad], ErrorCode::Malformed),
    ];
    for (bytes, want) in cases {
        let reply = meta.call(Bytes::from_static(bytes)).await.unwrap();
        assert_eq!(meta_error(&reply), want, "{bytes:?}");
    }
    // The data envelope: a read with its fields cut short, and trailing garbage.
    let data = ep.connect(cluster.data[0].advertise()).await.unwrap();
    let reply = data.call(Bytes::from_static(&[0, 5, 5])).await.unwrap();
    assert_eq!(data_error(&reply), ErrorCode::Malformed);
    let usage = encoded(proto::data::Usage);
    let mut long = usage.to_vec();
    long.extend_from_slice(&[0xff; 8]);
    let reply = data.call(Bytes::from(long)).await.unwrap();
    assert_eq!(data_error(&reply), ErrorCode::Malformed);
    // Both servers still answer well-formed requests on the same connections.
    let reply = data.call(usage).await.unwrap();
    let usage = Request::new(proto::data::Usage)
        .decode_reply(&reply)
        .unwrap();
    assert!(usage.is_ok(), "{usage:?}");
    let req = Request::new(proto::meta::admin::Status);
    let reply = meta
        .call(Bytes::from(req.encode(4096).unwrap()))
        .await
        .unwrap();
    let status = req.decode_reply(&reply).unwrap();
    assert!(status.is_ok(), "{status:?}");
}
