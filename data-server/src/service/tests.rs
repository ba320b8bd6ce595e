//! Races between requests on one chunk, driven through a real listener on 127.0.0.1
//! and held at the service's pause points.

use super::pause::PausePoint;
use super::{call_peer, DataService, Pools};
use crate::cluster_view::ClusterView;
use crate::store::{ChunkStore, ReplicaFields};
use proto::data::{
    Moved, Placement, ReadChunk, ReadInline, ReplicaData, Replicate, MAX_INLINE_WRITE_BYTES,
};
use proto::meta::{ChainInfo, ClusterMap, Member, MemberState, NodeInfo, NodeState};
use proto::{ChainId, ChunkId, ErrorCode, InodeId, NodeId, PROTOCOL_VERSION};
use std::sync::Arc;
use std::time::Duration;
use transport::{Access, Backend, BufferPool, Connection, Endpoint, Listener, TransportConfig};

const CHUNK_SIZE: u32 = 1 << 20;
const LEN: usize = 4096;
const CHAIN: ChainId = ChainId(1);
const HEAD: NodeId = NodeId(1);
/// The server under test: the tail of `CHAIN`.
const ME: NodeId = NodeId(2);
const MAP_VERSION: u64 = 1;
const PLACE: Placement = Placement {
    chain: CHAIN,
    map_version: MAP_VERSION,
    replicas: 2,
};
const CHUNK: ChunkId = ChunkId {
    inode: InodeId(7),
    index: 0,
};
/// How long a request may take before the test calls it hung.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A data service on 127.0.0.1 serving `CHAIN` as its tail, with a client connected.
struct Served {
    service: DataService,
    store: Arc<ChunkStore>,
    client_ep: Endpoint,
    client: Connection,
    _listener: Listener,
    _dir: tempfile::TempDir,
}

fn map() -> ClusterMap {
    let node = |node, port| NodeInfo {
        node,
        addr: format!("127.0.0.1:{port}"),
        state: NodeState::Up,
    };
    let serving = |node| Member {
        node,
        state: MemberState::Serving,
    };
    ClusterMap {
        version: MAP_VERSION,
        nodes: vec![node(HEAD, 1), node(ME, 2)],
        chains: vec![ChainInfo {
            chain: CHAIN,
            members: vec![serving(HEAD), serving(ME)],
        }],
    }
}

/// Starts the service with `CHUNK` holding `LEN` bytes of `0xaa` at version 1.
async fn served() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(ChunkStore::open(dir.path(), 1 << 30).unwrap());
    store.write(CHUNK, CHUNK_SIZE, 0, &[0xaa; LEN]).unwrap();
    let fields = ReplicaFields {
        chain: CHAIN,
        version: 1,
        stale: false,
    };
    store.set_replica(CHUNK, fields).unwrap();
    let ep = Endpoint::new(Backend::Tcp, TransportConfig::default(), PROTOCOL_VERSION).unwrap();
    let pool = || BufferPool::new(&ep, 2, 64 << 10).unwrap();
    let pools = Pools {
        io: pool(),
        relay: pool(),
        tail: pool(),
    };
    // Every request names the map the view holds: the view never calls the metadata
    // server (nobody listens at its address).
    let view = Arc::new(ClusterView::new(ep.clone(), "127.0.0.1:1".into()));
    view.set_me(ME);
    view.offer(map());
    let max_msg_bytes = ep.config().max_msg_bytes;
    let service = DataService::new(store.clone(), pools, max_msg_bytes, view, None);
    let listener = ep
        .listen("127.0.0.1:0", Arc::new(service.clone()))
        .await
        .unwrap();
    let client_ep =
        Endpoint::new(Backend::Tcp, TransportConfig::default(), PROTOCOL_VERSION).unwrap();
    let client = client_ep
        .connect(&listener.local_addr().to_string())
        .await
        .unwrap();
    Served {
        service,
        store,
        client_ep,
        client,
        _listener: listener,
        _dir: dir,
    }
}

/// How a test reads: the bytes written into the client's buffer, or in the reply.
#[derive(Clone, Copy, Debug)]
enum Via {
    OneSided,
    Inline,
}

/// A read's outcome: the bytes moved, and the bytes the client got.
type ReadOutcome = (Result<u32, crate::DataError>, Vec<u8>);

impl Served {
    /// Reads `LEN` bytes of `CHUNK` in a task of its own.
    fn spawn_read(&self, via: Via) -> tokio::task::JoinHandle<ReadOutcome> {
        let conn = self.client.clone();
        match via {
            Via::OneSided => {
                let mr = self.client_ep.register(LEN).unwrap();
                let grant = self.client.grant(&mr, 0, LEN, Access::RemoteWrite).unwrap();
                let req = ReadChunk {
                    chunk: CHUNK,
                    place: PLACE,
                    chunk_size_bytes: CHUNK_SIZE,
                    offset: 0,
                    len: LEN as u32,
                    dest: grant.remote(),
                    grant: None,
                };
                tokio::spawn(async move {
                    let reply = tokio::time::timeout(CALL_TIMEOUT, call_peer(&conn, req))
                        .await
                        .expect("the read hung");
                    drop(grant);
                    let bytes = mr.lock()[..LEN].to_vec();
                    (reply.map(|m| m.len), bytes)
                })
            }
            Via::Inline => tokio::spawn(async move {
                let reply = tokio::time::timeout(CALL_TIMEOUT, call_peer(&conn, inline(LEN)))
                    .await
                    .expect("the read hung");
                match reply {
                    Ok(r) => (Ok(r.data.len() as u32), r.data),
                    Err(e) => (Err(e), Vec::new()),
                }
            }),
        }
    }
}

/// An inline read of `len` bytes at the start of `CHUNK`.
fn inline(len: usize) -> ReadInline {
    ReadInline {
        chunk: CHUNK,
        place: PLACE,
        chunk_size_bytes: CHUNK_SIZE,
        offset: 0,
        len: len as u32,
        grant: None,
    }
}

/// Guards against a read served from a copy that a replicated write marked stale after
/// the read checked it and before the read took the chunk's lock (issue 22, item 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_marked_stale_before_the_read_locks_is_not_read() {
    for via in [Via::OneSided, Via::Inline] {
        stale_before_the_read_locks(via).await;
    }
}

async fn stale_before_the_read_locks(via: Via) {
    let s = served().await;
    // The copy is readable as set up: a read gets its bytes.
    let (reply, bytes) = s.spawn_read(via).await.unwrap();
    assert!(
        matches!(reply, Ok(n) if n == LEN as u32),
        "{via:?}: {reply:?}"
    );
    assert!(
        bytes.iter().all(|&b| b == 0xaa),
        "the set-up bytes read back"
    );

    let mut pause = s.service.inner.pauses.arm(PausePoint::ReadLock);
    let read = s.spawn_read(via);
    pause.reached().await;
    // Version 3 on top of 2: this copy, at version 1, missed a write and goes stale.
    let replicate = Replicate {
        chunk: CHUNK,
        place: PLACE,
        chunk_size_bytes: CHUNK_SIZE,
        offset: 0,
        version: 3,
        base_version: 2,
        data: ReplicaData::Inline(vec![0xbb; LEN]),
    };
    let written = tokio::time::timeout(CALL_TIMEOUT, call_peer(&s.client, replicate))
        .await
        .expect("the replicated write hung behind the held read");
    assert!(matches!(written, Ok(Moved { .. })), "{written:?}");
    let meta = s.store.chunk_meta(CHUNK).unwrap().unwrap();
    assert!(
        meta.stale && meta.version == 3,
        "the write marked the copy stale: {meta:?}"
    );

    pause.release();
    let (reply, bytes) = read.await.unwrap();
    match reply {
        Err(e) if e.code() == ErrorCode::Stale => {}
        other => panic!(
            "{via:?}: a read of a copy marked stale answered {other:?} with bytes {:02x?}..",
            &bytes[..bytes.len().min(4)]
        ),
    }
}

/// Guards against a read served by a member that the newest map, learnt while the read
/// waited for the chunk's lock, no longer lets serve (issue 22, item 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_made_syncing_before_the_read_locks_does_not_serve_it() {
    for via in [Via::OneSided, Via::Inline] {
        syncing_before_the_read_locks(via).await;
    }
}

async fn syncing_before_the_read_locks(via: Via) {
    let s = served().await;
    let mut pause = s.service.inner.pauses.arm(PausePoint::ReadLock);
    let read = s.spawn_read(via);
    pause.reached().await;
    let mut newer = map();
    newer.version = MAP_VERSION + 1;
    newer.chains[0].members[1].state = MemberState::Syncing;
    s.service.inner.view.offer(newer);

    pause.release();
    let (reply, _) = read.await.unwrap();
    assert!(
        matches!(&reply, Err(e) if e.code() == ErrorCode::Stale),
        "{via:?}: a member made syncing served a read: {reply:?}"
    );
}

/// An inline read answers the chunk's bytes from its offset, zeros past its end, and
/// refuses what it must: more than the inline limit, a range outside the chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_read_answers_its_bytes_within_its_limits() {
    let s = served().await;
    let call = |req: ReadInline| {
        let conn = s.client.clone();
        async move {
            tokio::time::timeout(CALL_TIMEOUT, call_peer(&conn, req))
                .await
                .expect("the read hung")
        }
    };
    // A pattern after the set-up bytes, read from an offset, past the end.
    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    s.store
        .write(CHUNK, CHUNK_SIZE, LEN as u32, &pattern)
        .unwrap();
    let mut at = inline(2 * LEN);
    at.offset = 100;
    let got = call(at).await.expect("a read past the end").data;
    let mut want = vec![0xaa; LEN - 100];
    want.extend_from_slice(&pattern);
    want.resize(2 * LEN, 0);
    assert!(
        got == want,
        "the bytes at the offset, then zeros past the end"
    );

    let too_big = call(inline(MAX_INLINE_WRITE_BYTES + 1)).await;
    assert!(
        matches!(&too_big, Err(e) if e.code() == ErrorCode::TooBig),
        "{too_big:?}"
    );
    let mut outside = inline(LEN);
    outside.offset = CHUNK_SIZE - 1;
    let outside = call(outside).await;
    assert!(
        matches!(&outside, Err(e) if e.code() == ErrorCode::InvalidArgument),
        "{outside:?}"
    );
}
