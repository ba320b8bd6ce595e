//! Races between requests on one chunk, driven through a real listener on 127.0.0.1
//! and held at the service's pause points.

use super::pause::PausePoint;
use super::resync::Repaired;
use super::{call_peer, DataService, Pools};
use crate::cluster_view::ClusterView;
use crate::store::{ChunkStore, ReplicaFields};
use proto::data::{
    InlineRange, Moved, Placement, ReadChunk, ReadInline, ReplicaData, Replicate,
    MAX_INLINE_WRITE_BYTES, MAX_WRITE_RANGES,
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

/// Stores `CHUNK` as `LEN` bytes of `byte` in `CHAIN` at `version`, marked `stale` or not.
fn put_chunk(store: &ChunkStore, byte: u8, version: u64, stale: bool) {
    store.write(CHUNK, CHUNK_SIZE, 0, &[byte; LEN]).unwrap();
    let fields = ReplicaFields {
        chain: CHAIN,
        version,
        stale,
    };
    store.set_replica(CHUNK, fields).unwrap();
}

/// Starts the service with `CHUNK` holding `LEN` bytes of `0xaa` at version 1.
async fn served() -> Served {
    let (service, store, listener, dir) = chain_member(ME, TransportConfig::default()).await;
    put_chunk(&store, 0xaa, 1, false);
    // Every request names the map the view holds: the view never calls the metadata
    // server (nobody listens at its address).
    service.inner.view.offer(map());
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
    /// Sends this member a replicated write of `LEN` bytes of `byte` at `version` on
    /// top of `base`, and checks that it was answered as stored.
    async fn replicate(&self, version: u64, base: u64, byte: u8) {
        let req = Replicate {
            chunk: CHUNK,
            place: PLACE,
            chunk_size_bytes: CHUNK_SIZE,
            offset: 0,
            version,
            base_version: base,
            data: ReplicaData::Inline(vec![byte; LEN]),
        };
        let written = tokio::time::timeout(CALL_TIMEOUT, call_peer(&self.client, req))
            .await
            .expect("the replicated write hung");
        assert!(matches!(written, Ok(Moved { .. })), "{written:?}");
    }

    /// Reads `LEN` bytes of `CHUNK` and checks that all are `byte`.
    async fn reads_back(&self, via: Via, byte: u8) {
        let (reply, bytes) = self.spawn_read(via).await.unwrap();
        assert!(
            matches!(reply, Ok(n) if n == LEN as u32),
            "{via:?}: {reply:?}"
        );
        assert!(
            bytes.iter().all(|&b| b == byte),
            "{via:?}: the bytes read back"
        );
    }

    /// Reads `LEN` bytes of `CHUNK` in a task of its own.
    fn spawn_read(&self, via: Via) -> tokio::task::JoinHandle<ReadOutcome> {
        let conn = self.client.clone();
        match via {
            Via::OneSided => {
                let mr = self.client_ep.register(LEN).unwrap();
                let grant = self.client.grant(&mr, 0, LEN, Access::RemoteWrite).unwrap();
                let req = one_sided(grant.remote());
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

/// A one-sided read of `LEN` bytes at the start of `CHUNK` into `dest`.
fn one_sided(dest: proto::RemoteBuf) -> ReadChunk {
    ReadChunk {
        chunk: CHUNK,
        place: PLACE,
        chunk_size_bytes: CHUNK_SIZE,
        offset: 0,
        len: LEN as u32,
        dest,
        grant: None,
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

/// On a current-thread runtime, where `block_in_place` is not allowed, store work goes
/// to the blocking pool (`blocking`'s other path): a replicated write and both kinds of
/// read are answered.
#[tokio::test(flavor = "current_thread")]
async fn a_current_thread_runtime_serves_writes_and_reads() {
    let s = served().await;
    s.replicate(2, 1, 0xbb).await;
    let meta = s.store.chunk_meta(CHUNK).unwrap().unwrap();
    assert!(!meta.stale && meta.version == 2, "{meta:?}");
    for via in [Via::OneSided, Via::Inline] {
        s.reads_back(via, 0xbb).await;
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
    s.reads_back(via, 0xaa).await;

    let mut pause = s.service.inner.pauses.arm(PausePoint::ReadLock);
    let read = s.spawn_read(via);
    pause.reached().await;
    // Version 3 on top of 2: this copy, at version 1, missed a write and goes stale
    // (the write does not wait behind the held read).
    s.replicate(3, 2, 0xbb).await;
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

/// A replicated write of several ranges stores each of them and moves the version once;
/// ranges that are empty, overlap, run backwards, pass the chunk's end or are too many
/// are refused, and the copy stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_of_ranges_stores_each_once_and_refuses_bad_ranges() {
    let s = served().await;
    let range = |offset: u32, len: usize, b: u8| InlineRange {
        offset,
        data: vec![b; len],
    };
    let replicate = |version: u64, ranges: Vec<InlineRange>| Replicate {
        chunk: CHUNK,
        place: PLACE,
        chunk_size_bytes: CHUNK_SIZE,
        offset: ranges.first().map_or(0, |r| r.offset),
        version,
        base_version: version - 1,
        data: ReplicaData::Ranges(ranges),
    };
    let call = |req: Replicate| {
        let conn = s.client.clone();
        async move {
            tokio::time::timeout(CALL_TIMEOUT, call_peer(&conn, req))
                .await
                .expect("the write hung")
        }
    };
    // Two ranges in the first block (touching), one in the set-up bytes' last block,
    // one past them.
    let good = vec![
        range(10, 20, 1),
        range(30, 5, 2),
        range(LEN as u32 - 8, 4, 3),
        range(2 * LEN as u32, 100, 4),
    ];
    let moved = call(replicate(2, good))
        .await
        .expect("a good write of ranges");
    assert_eq!(moved.len, 129);
    let mut want = vec![0xaa; LEN];
    want[10..30].fill(1);
    want[30..35].fill(2);
    want[LEN - 8..LEN - 4].fill(3);
    want.resize(2 * LEN, 0);
    want.extend_from_slice(&[4; 100]);
    let read = || {
        let mut got = vec![0u8; want.len()];
        s.store.read(CHUNK, CHUNK_SIZE, 0, &mut got).unwrap();
        got
    };
    assert!(read() == want, "each range stored, the bytes between kept");
    let meta = s.store.chunk_meta(CHUNK).unwrap().unwrap();
    assert!(meta.version == 2 && !meta.stale, "{meta:?}");

    let too_many = (0..=MAX_WRITE_RANGES as u32)
        .map(|i| range(i * 2, 1, 5))
        .collect();
    let bad: Vec<(&str, Vec<InlineRange>)> = vec![
        ("none", vec![]),
        ("an empty one", vec![range(0, 1, 5), range(10, 0, 5)]),
        ("overlapping", vec![range(0, 10, 5), range(5, 10, 5)]),
        ("backwards", vec![range(100, 10, 5), range(0, 10, 5)]),
        ("past the end", vec![range(CHUNK_SIZE - 4, 5, 5)]),
        ("too many", too_many),
    ];
    for (what, ranges) in bad {
        let r = call(replicate(3, ranges)).await;
        assert!(
            matches!(&r, Err(e) if e.code() == ErrorCode::InvalidArgument),
            "{what}: {r:?}"
        );
    }
    let too_big = vec![
        range(0, MAX_INLINE_WRITE_BYTES, 5),
        range(MAX_INLINE_WRITE_BYTES as u32, 1, 5),
    ];
    let r = call(replicate(3, too_big)).await;
    assert!(
        matches!(&r, Err(e) if e.code() == ErrorCode::TooBig),
        "{r:?}"
    );
    assert!(read() == want, "refused writes changed nothing");
    let meta = s.store.chunk_meta(CHUNK).unwrap().unwrap();
    assert!(meta.version == 2 && !meta.stale, "{meta:?}");
}

/// A data service on 127.0.0.1 as `me` (of `HEAD` and `ME`), listening with `config`;
/// its view holds no map until one is offered.
async fn chain_member(
    me: NodeId,
    config: TransportConfig,
) -> (DataService, Arc<ChunkStore>, Listener, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(ChunkStore::open(dir.path(), 1 << 30).unwrap());
    let ep = Endpoint::new(Backend::Tcp, config, PROTOCOL_VERSION).unwrap();
    let pool = || BufferPool::new(&ep, 2, 64 << 10).unwrap();
    let pools = Pools {
        io: pool(),
        relay: pool(),
        tail: pool(),
    };
    let view = Arc::new(ClusterView::new(ep.clone(), "127.0.0.1:1".into()));
    view.set_me(me);
    let max_msg_bytes = ep.config().max_msg_bytes;
    let service = DataService::new(store.clone(), pools, max_msg_bytes, view, None);
    let listener = ep
        .listen("127.0.0.1:0", Arc::new(service.clone()))
        .await
        .unwrap();
    (service, store, listener, dir)
}

/// Guards against a batch of ranges that the head stored but could not pass to a
/// successor taking smaller requests (its `max_msg_bytes`): the head passes the ranges
/// one at a time, and the tail ends with every byte and the write's version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_passes_ranges_one_by_one_to_a_successor_taking_small_requests() {
    let small = TransportConfig {
        max_msg_bytes: 8192,
        ..TransportConfig::default()
    };
    let (head, head_store, head_l, _d1) = chain_member(HEAD, TransportConfig::default()).await;
    let (tail, tail_store, tail_l, _d2) = chain_member(ME, small).await;
    let mut m = map();
    m.nodes[0].addr = head_l.local_addr().to_string();
    m.nodes[1].addr = tail_l.local_addr().to_string();
    head.inner.view.offer(m.clone());
    tail.inner.view.offer(m);
    let client_ep =
        Endpoint::new(Backend::Tcp, TransportConfig::default(), PROTOCOL_VERSION).unwrap();
    let conn = client_ep
        .connect(&head_l.local_addr().to_string())
        .await
        .unwrap();
    // 3 x 5,000 bytes: too much for one 8 KiB request, each fits one.
    let ranges: Vec<InlineRange> = (0..3u32)
        .map(|i| InlineRange {
            offset: i * 10_000 + 7,
            data: vec![i as u8 + 1; 5_000],
        })
        .collect();
    let req = proto::data::WriteRanges {
        chunk: CHUNK,
        place: PLACE,
        chunk_size_bytes: CHUNK_SIZE,
        ranges: ranges.clone(),
        grant: None,
    };
    let moved = tokio::time::timeout(CALL_TIMEOUT, call_peer(&conn, req))
        .await
        .expect("the write hung")
        .expect("a write of ranges through a chain with a small successor");
    assert_eq!(moved.len, 15_000);
    for store in [&head_store, &tail_store] {
        let mut got = vec![0xEEu8; 30_000];
        store.read(CHUNK, CHUNK_SIZE, 0, &mut got).unwrap();
        for r in &ranges {
            let at = r.offset as usize;
            assert!(got[at..at + r.data.len()] == r.data[..], "range at {at}");
        }
        assert!(
            got[..7].iter().all(|&b| b == 0),
            "bytes before the first range"
        );
        let meta = store.chunk_meta(CHUNK).unwrap().unwrap();
        assert!(meta.version == 1 && !meta.stale, "{meta:?}");
    }
}

/// Guards against a syncing member copying forever from a serving member that was
/// brought back after missing writes (its version stays below the member's): the first
/// fetch is tried again, the same older version twice is copied over the newer one
/// (reported as such, so the pass checks again), and the next repair finds them equal;
/// but not from a source that no longer serves the chain in the member's map.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_newer_than_a_serving_source_that_stays_older_is_replaced() {
    let (_source, source_store, source_l, _d1) =
        chain_member(HEAD, TransportConfig::default()).await;
    let (member, member_store, _member_l, _d2) = chain_member(ME, TransportConfig::default()).await;
    put_chunk(&source_store, 0x11, 3, false);
    put_chunk(&member_store, 0x22, 5, false);
    let from = source_l.local_addr().to_string();
    let repair = || async {
        tokio::time::timeout(
            CALL_TIMEOUT,
            member.inner.repair_from(&from, CHUNK, CHAIN, true),
        )
        .await
        .expect("the repair hung")
    };
    let bytes = |store: &ChunkStore| {
        let mut got = vec![0u8; LEN];
        store.read(CHUNK, CHUNK_SIZE, 0, &mut got).unwrap();
        got
    };
    // The source has left the chain in the member's map: nothing is replaced.
    let mut m = map();
    m.nodes[0].addr = from.clone();
    m.chains[0].members[0].state = MemberState::Syncing;
    member.inner.view.offer(m.clone());
    let err = repair()
        .await
        .expect_err("a source that left is not copied");
    assert_eq!(err.code(), ErrorCode::Stale, "{err}");
    assert!(bytes(&member_store).iter().all(|&b| b == 0x22), "ours stay");
    // Serving: its copy replaces ours.
    m.version += 1;
    m.chains[0].members[0].state = MemberState::Serving;
    member.inner.view.offer(m);
    assert_eq!(repair().await.unwrap(), Repaired::ReplacedNewer);
    let meta = member_store.chunk_meta(CHUNK).unwrap().unwrap();
    assert!(meta.version == 3 && !meta.stale, "{meta:?}");
    assert!(
        bytes(&member_store).iter().all(|&b| b == 0x11),
        "the source's bytes"
    );
    assert_eq!(
        repair().await.unwrap(),
        Repaired::Copied,
        "equal: copied again"
    );
}

/// Guards against a head whose copy missed writes answering in a way that does not say
/// whether waiting helps: `Busy` (retried until the client's deadline) while another
/// member serves the chain to repair it from, `Unavailable` (retried once the map
/// changes) when none does; nothing is stored either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_head_refuses_writes_busy_only_while_another_member_can_repair_it() {
    for other in [MemberState::Serving, MemberState::Syncing] {
        let (head, store, listener, _dir) = chain_member(HEAD, TransportConfig::default()).await;
        put_chunk(&store, 0xaa, 4, true);
        let mut m = map();
        m.chains[0].members[1].state = other;
        head.inner.view.offer(m);
        let ep = Endpoint::new(Backend::Tcp, TransportConfig::default(), PROTOCOL_VERSION).unwrap();
        let conn = ep
            .connect(&listener.local_addr().to_string())
            .await
            .unwrap();
        let req = proto::data::WriteInline {
            chunk: CHUNK,
            place: PLACE,
            chunk_size_bytes: CHUNK_SIZE,
            offset: 0,
            data: vec![0xbb; 16],
            grant: None,
        };
        let err = tokio::time::timeout(CALL_TIMEOUT, call_peer(&conn, req))
            .await
            .expect("the write hung")
            .expect_err("a stale head refuses the write");
        let want = match other {
            MemberState::Serving => ErrorCode::Busy,
            _ => ErrorCode::Unavailable,
        };
        assert_eq!(err.code(), want, "other member {other:?}: {err}");
        let meta = store.chunk_meta(CHUNK).unwrap().unwrap();
        assert!(meta.version == 4 && meta.stale, "{meta:?}");
    }
}

/// A client's buffer that ends past the address space (a hostile or broken peer) gets a
/// clear error, not a panic in the handler or an address that wraps around, and the
/// server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffer_past_the_address_space_is_refused() {
    let s = served().await;
    let req = one_sided(proto::RemoteBuf {
        addr: u64::MAX - 10,
        len: LEN as u64,
        key: proto::MrKey(1),
    });
    let e = tokio::time::timeout(CALL_TIMEOUT, call_peer(&s.client, req))
        .await
        .expect("the read hung")
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("past the address space"), "{e}");
    let (got, bytes) = s.spawn_read(Via::OneSided).await.unwrap();
    assert_eq!(got.unwrap(), LEN as u32);
    assert!(bytes.iter().all(|&b| b == 0xaa));
}
