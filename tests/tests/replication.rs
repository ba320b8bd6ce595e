//! Chain replication in one process: a data server dying mid-read and mid-write, a
//! server coming back and resyncing before it serves, a server that stays away being
//! replaced, and small writes carried inline down the chain; on `tcp`, and on `mem`
//! with a server cut off by a partition and messages dropped between chosen servers
//! (seeds printed, `TESSERA_REPLICATION_SEED` replays).
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use fs_client::{Client, FileHandle};
use proto::data::{Moved, Placement, WriteInline, MAX_INLINE_WRITE_BYTES};
use proto::meta::{Caller, ClusterMap};
use proto::{ErrorCode, InodeId, Request};
use std::time::Duration;
use tessera_tests::{pseudo_random, sha256_hex, InProcessCluster, Setup};
use transport::Backend;

const ROOT_CALLER: Caller = Caller::ROOT;
const MIB: usize = 1 << 20;
/// No call in these tests may take this long; a hang fails instead.
const DEADLINE: Duration = Duration::from_secs(120);

fn seed() -> u64 {
    tessera_tests::client_io::seed_from_env("TESSERA_REPLICATION_SEED")
}

async fn write_file(client: &Client, name: &[u8], data: &[u8]) {
    let name = std::str::from_utf8(name).expect("test names are text");
    tessera_tests::client_io::write_fsync(client, name, data)
        .await
        .unwrap();
}

async fn open(client: &Client, name: &[u8]) -> FileHandle {
    let attr = client.lookup(InodeId::ROOT, name).await.unwrap();
    client.open(attr.ino, false).await.unwrap().1
}

/// Reads the whole file in 1 MiB reads; `during(offset)` runs before each.
async fn read_all(
    client: &Client,
    name: &[u8],
    len: usize,
    mut during: impl FnMut(usize),
) -> Vec<u8> {
    let fh = open(client, name).await;
    let mut out = Vec::with_capacity(len);
    let mut at = 0;
    while at < len {
        during(at);
        let part = tokio::time::timeout(DEADLINE, client.read(&fh, at as u64, MIB))
            .await
            .expect("read ends")
            .unwrap_or_else(|e| panic!("read at {at}: {e}"));
        assert!(!part.is_empty(), "short file at {at}");
        at += part.len();
        out.extend_from_slice(&part);
    }
    client.release(&fh).await.unwrap();
    out
}

/// Stops every data server but `survivor` and waits until it is the only serving member
/// of every chain: reads then come from its copies alone.
async fn serve_alone(cluster: &InProcessCluster, survivor: usize) {
    for i in (0..cluster.data.len()).filter(|&i| i != survivor) {
        cluster.stop_data(i);
    }
    let node = cluster.data[survivor].node_id().expect("registered");
    await_map(cluster, "others never left", |map| {
        map.chains.iter().all(|c| c.readers(3) == vec![node])
    })
    .await;
}

/// Waits until the metadata server's cluster map satisfies `done`, and returns it.
async fn await_map(
    cluster: &InProcessCluster,
    what: &str,
    done: impl Fn(&ClusterMap) -> bool,
) -> ClusterMap {
    let ns = cluster.meta().namespace().clone();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let map = ns.cluster_map().unwrap();
        if done(&map) {
            return map;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {map:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_data_server_dying_during_a_sequential_read_is_invisible_to_the_reader() {
    let seed = seed();
    let cluster = InProcessCluster::start(3).await;
    let data = pseudo_random(256 * MIB, seed);
    let writer = cluster.client().await;
    write_file(&writer, b"big.bin", &data).await;
    let victim = (seed % 3) as usize;
    let kill_at = (64 + (seed % 128) as usize) * MIB;
    let reader = cluster.client().await;
    let back = read_all(&reader, b"big.bin", data.len(), |at| {
        if at == kill_at {
            eprintln!("stopping data server {victim} at {at}");
            cluster.stop_data(victim);
        }
    })
    .await;
    assert_eq!(sha256_hex(&back), sha256_hex(&data));
}

/// A client holding an old map is refused (`Stale`) by servers that know a newer one;
/// it fetches the new map and reads again, and counts the retries (which the round-trip
/// guard in `round_trips.rs` tells apart from the calls the path itself makes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_with_an_old_map_fetches_the_new_one_and_counts_its_retries() {
    let cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let data = pseudo_random(12 * MIB, 12);
    write_file(&client, b"old-map.bin", &data).await;
    let old = client.rpc_counts();
    let held = cluster.meta().namespace().cluster_map().unwrap().version;

    cluster.stop_data(2);
    let gone = cluster.data[2].node_id().expect("registered");
    let newer = await_map(&cluster, "server 2 never left", |map| {
        map.chains.iter().all(|c| !c.readers(3).contains(&gone))
    })
    .await
    .version;
    assert!(newer > held);
    // The survivors learn the new map with their next heartbeats (every 100 ms here);
    // until both have it, one could still take requests made with map `held`.
    for i in [0, 1] {
        cluster.wait_map_known(i, newer).await;
    }

    let back = read_all(&client, b"old-map.bin", data.len(), |_| {}).await;
    assert_eq!(sha256_hex(&back), sha256_hex(&data));
    let used = client.rpc_counts() - old;
    assert!(
        used.retries > 0,
        "reads with map {held} were not retried: {used:?}"
    );
    assert!(client.cluster_map().await.unwrap().version >= newer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_data_server_dying_during_a_write_loses_nothing_that_fsync_acknowledged() {
    let seed = seed();
    let cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let data = pseudo_random(96 * MIB, seed);
    let victim = (seed % 3) as usize;
    let kill_at = (8 + (seed % 64) as usize) * MIB;
    let (_, fh) = client
        .create(InodeId::ROOT, b"ckpt.bin", 0o644, ROOT_CALLER, true, false)
        .await
        .unwrap();
    let mut write_error = None;
    for (i, part) in data.chunks(MIB).enumerate() {
        if i * MIB == kill_at {
            eprintln!("stopping data server {victim} at {kill_at}");
            cluster.stop_data(victim);
        }
        if let Err(e) = client.write(&fh, (i * MIB) as u64, part).await {
            write_error = Some(e);
            break;
        }
    }
    let fsync = tokio::time::timeout(DEADLINE, client.fsync(&fh))
        .await
        .expect("fsync ends");
    let release = client.release(&fh).await;
    match (write_error, fsync) {
        (None, Ok(())) => {
            release.unwrap();
            let reader = cluster.client().await;
            let back = read_all(&reader, b"ckpt.bin", data.len(), |_| {}).await;
            assert_eq!(
                sha256_hex(&back),
                sha256_hex(&data),
                "fsync succeeded: every byte reads back"
            );
            eprintln!("fsync succeeded and every byte reads back");
        }
        (w, f) => {
            // Acceptable: the failure was reported. With two replicas left it should not
            // happen, so say it loudly.
            eprintln!("the write failed visibly: write {w:?}, fsync {f:?}");
            assert!(w.is_some() || f.is_err());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_comes_back_resyncs_before_it_serves_alone() {
    let seed = seed();
    let mut cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let before = pseudo_random(20 * MIB, seed);
    write_file(&client, b"old.bin", &before).await;
    let victim = (seed % 3) as usize;
    cluster.stop_data(victim);
    // While it is away: a new file, an overwrite, a truncation and a removal.
    let added = pseudo_random(12 * MIB, seed + 1);
    write_file(&client, b"new.bin", &added).await;
    let mut changed = before.clone();
    changed[5 * MIB..7 * MIB].copy_from_slice(&added[..2 * MIB]);
    changed.truncate(17 * MIB);
    let fh = open(&client, b"old.bin").await;
    client
        .write(&fh, 5 * MIB as u64, &added[..2 * MIB])
        .await
        .unwrap();
    client.fsync(&fh).await.unwrap();
    client.release(&fh).await.unwrap();
    let ino = client.lookup(InodeId::ROOT, b"old.bin").await.unwrap().ino;
    let cut = proto::SetAttr {
        size: Some(17 * MIB as u64),
        ..Default::default()
    };
    client.setattr(ino, cut).await.unwrap();
    write_file(&client, b"gone.bin", &added[..MIB]).await;
    client.unlink(InodeId::ROOT, b"gone.bin").await.unwrap();

    cluster.restart_data(victim).await;
    cluster.wait_healthy_within(DEADLINE).await;
    // Now the others go: the returned server alone serves every read.
    serve_alone(&cluster, victim).await;
    let reader = cluster.client().await;
    let back = read_all(&reader, b"old.bin", changed.len(), |_| {}).await;
    assert!(
        back == changed,
        "the overwritten and cut file reads back from the returned server"
    );
    let back = read_all(&reader, b"new.bin", added.len(), |_| {}).await;
    assert!(
        back == added,
        "the new file was copied to the returned server"
    );
    // Chunks of the removed file are gone from it too (by resync or by collection).
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let chunks = cluster.data[victim].store().usage().unwrap().chunks;
        // old.bin: 5 chunks of 4 MiB (17 MiB); new.bin: 3 chunks.
        if chunks == 8 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{chunks} chunks left, want 8"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_stays_away_is_replaced_and_its_chunks_copied_elsewhere() {
    let namespace = meta_server::NamespaceConfig {
        replace_after_ms: 2000,
        ..InProcessCluster::namespace_config()
    };
    let cluster = InProcessCluster::start_with(4, namespace).await;
    let client = cluster.client().await;
    let data = pseudo_random(40 * MIB, 5);
    write_file(&client, b"f.bin", &data).await;
    let ns = cluster.meta().namespace().clone();
    assert_eq!(ns.status().unwrap().under_replicated_chunks, 0);
    cluster.stop_data(3);
    // Under-replicated while it is down, then back to zero once replaced and copied.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut seen_under = 0;
    loop {
        let st = ns.status().unwrap();
        seen_under = seen_under.max(st.under_replicated_chunks);
        let gone = st.map.chains.iter().all(|c| {
            c.members
                .iter()
                .all(|m| Some(m.node) != cluster.data[3].node_id())
        });
        if gone && st.under_replicated_chunks == 0 && tessera_tests::healthy(&st.map) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never healed: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seen_under > 0,
        "the stopped server left chunks under-replicated"
    );
    let reader = cluster.client().await;
    let back = read_all(&reader, b"f.bin", data.len(), |_| {}).await;
    assert_eq!(sha256_hex(&back), sha256_hex(&data));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fsck_finds_a_damaged_and_a_missing_copy_and_repairs_them() {
    let cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let data = pseudo_random(9 * MIB, 11);
    write_file(&client, b"f.bin", &data).await;
    let report = client.fsck(false).await.unwrap();
    assert!(report.clean(), "{:?}", report.problems);
    assert_eq!((report.files, report.copies), (1, 9), "3 chunks x 3 copies");

    // Damage one copy's data and remove another chunk's copy elsewhere.
    let ino = client.lookup(InodeId::ROOT, b"f.bin").await.unwrap().ino;
    let chunk = |dir: &std::path::Path, index: u64| {
        tessera_tests::chunk_tree::chunk_file(dir, ino.0, index)
    };
    let damaged = chunk(&cluster.data_dirs[0], 0);
    let mut bytes = std::fs::read(&damaged).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x77;
    std::fs::write(&damaged, &bytes).unwrap();
    // Through the store, which also drops the file from its cache of open files.
    let lost = proto::ChunkId {
        inode: ino,
        index: 1,
    };
    assert!(cluster.data[1].store().delete_chunk(lost).unwrap());

    let report = client.fsck(false).await.unwrap();
    assert_eq!(report.problems.len(), 2, "{:?}", report.problems);
    assert!(
        report.problems.iter().any(|p| p.contains("Corrupt")),
        "{:?}",
        report.problems
    );
    assert!(
        report.problems.iter().any(|p| p.contains("missing")),
        "{:?}",
        report.problems
    );
    let fixed = client.fsck(true).await.unwrap();
    assert_eq!(fixed.repaired, 2, "{:?}", fixed.problems);
    let report = client.fsck(false).await.unwrap();
    assert!(report.clean(), "after repair: {:?}", report.problems);
    let reader = cluster.client().await;
    let back = read_all(&reader, b"f.bin", data.len(), |_| {}).await;
    assert!(back == data);
}

/// Writes a 24 MiB file (6 chunks) into a new directory asking for one copy; returns
/// the directory, the file and its bytes.
async fn one_copy_file(client: &Client, seed: u64) -> (InodeId, InodeId, Vec<u8>) {
    let d = client
        .mkdir(InodeId::ROOT, b"scratch", 0o755, ROOT_CALLER)
        .await
        .unwrap();
    let mode = proto::meta::XattrMode::Upsert;
    client
        .setxattr(d.ino, b"user.tessera.replicas", b"1", mode)
        .await
        .unwrap();
    let (attr, fh) = client
        .create(d.ino, b"one.bin", 0o644, ROOT_CALLER, true, false)
        .await
        .unwrap();
    let data = pseudo_random(24 * MIB, seed);
    client.write(&fh, 0, &data).await.unwrap();
    client.fsync(&fh).await.unwrap();
    client.release(&fh).await.unwrap();
    (d.ino, attr.ino, data)
}

/// Reads `one.bin` in `dir` whole through a new client.
async fn read_back(cluster: &InProcessCluster, dir: InodeId, len: usize) -> Vec<u8> {
    let reader = cluster.client().await;
    let attr = reader.lookup(dir, b"one.bin").await.unwrap();
    let (_, fh) = reader.open(attr.ino, false).await.unwrap();
    reader.read(&fh, 0, len).await.unwrap().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_directory_asking_for_one_copy_gets_one_copy_of_each_chunk() {
    let cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let (dir, ino, data) = one_copy_file(&client, 3).await;
    let copies: u64 = held(&cluster, ino, 6).iter().sum();
    assert_eq!(copies, 6, "six chunks, one copy each");
    assert!(read_back(&cluster, dir, data.len()).await == data);
}

/// Copies of `ino`'s first `chunks` chunks on each data server.
fn held(cluster: &InProcessCluster, ino: InodeId, chunks: u64) -> Vec<u64> {
    cluster
        .data
        .iter()
        .map(|s| {
            (0..chunks)
                .filter(|&index| {
                    let c = proto::ChunkId { inode: ino, index };
                    s.store().chunk_meta(c).unwrap().is_some()
                })
                .count() as u64
        })
        .collect()
}

/// A file with fewer copies than its chains have members lives on the first members
/// only: a server holding its one copy that restarts resyncs its chains from a member
/// that never had it, and must keep the copy, not take the source's lack of it for a
/// deletion it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_with_the_only_copy_keeps_it_through_a_restart() {
    let mut cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let (dir, ino, data) = one_copy_file(&client, 5).await;
    let before = held(&cluster, ino, 6);
    assert_eq!(before.iter().sum::<u64>(), 6, "one copy of each chunk");
    let victim = (0..3).find(|&i| before[i] > 0).unwrap();
    let node = cluster.data[victim].node_id().unwrap();
    cluster.stop_data(victim);
    // Away long enough to leave its chains (offline), so that it resyncs on return.
    await_map(&cluster, "the server is offline", |m| {
        m.chains.iter().any(|c| {
            c.members
                .iter()
                .any(|x| x.node == node && x.state == proto::meta::MemberState::Offline)
        })
    })
    .await;
    cluster.restart_data(victim).await;
    // Back, synced (serving again in each of its chains).
    await_map(&cluster, "the server serves again", |m| {
        m.chains
            .iter()
            .filter(|c| c.members.iter().any(|x| x.node == node))
            .all(|c| c.readers(3).contains(&node))
    })
    .await;
    cluster.wait_healthy().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        held(&cluster, ino, 6),
        before,
        "the copies are where they were"
    );
    let back = read_back(&cluster, dir, data.len()).await;
    assert!(back == data, "the file reads back whole");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_that_missed_a_write_is_marked_stale_and_copied_whole() {
    let cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let mut data = pseudo_random(4 * MIB, 8);
    write_file(&client, b"one.bin", &data).await;
    let ino = client.lookup(InodeId::ROOT, b"one.bin").await.unwrap().ino;
    let chunk = proto::ChunkId {
        inode: ino,
        index: 0,
    };
    let meta = cluster.data[0].store().chunk_meta(chunk).unwrap().unwrap();
    let map = client.cluster_map().await.unwrap();
    let tail_node = map.chain(meta.chain).unwrap().members[2].node;
    let tail = cluster
        .data
        .iter()
        .position(|s| s.node_id() == Some(tail_node))
        .unwrap();
    // The tail "missed" the write: other bytes, an older version.
    let store = cluster.data[tail].store();
    store.write(chunk, 4 << 20, 0, &vec![0xee; MIB]).unwrap();
    let old = data_server::store::ReplicaFields {
        chain: meta.chain,
        version: meta.version - 1,
        stale: false,
    };
    store.set_replica(chunk, old).unwrap();
    // The next write finds it on another version: stale, then copied whole.
    let (_, fh) = client.open(ino, false).await.unwrap();
    let patch = pseudo_random(MIB, 9);
    client.write(&fh, MIB as u64, &patch).await.unwrap();
    client.fsync(&fh).await.unwrap();
    client.release(&fh).await.unwrap();
    data[MIB..2 * MIB].copy_from_slice(&patch);
    repaired_copy_holds(&cluster, tail, chunk, meta.version + 1, b"one.bin", &data).await;
}

/// Waits until server `tail`'s copy of `chunk` is at `version` and no longer stale,
/// then checks that it alone serves `name` as `data`.
async fn repaired_copy_holds(
    cluster: &InProcessCluster,
    tail: usize,
    chunk: proto::ChunkId,
    version: u64,
    name: &[u8],
    data: &[u8],
) {
    let store = cluster.data[tail].store();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        // The repair rewrites the file in place under the service's chunk lock, which
        // this look at the store does not take: it may see the repair half done.
        let m = store.chunk_meta(chunk).unwrap();
        if m.as_ref().is_some_and(|m| m.version == version && !m.stale) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never repaired: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    serve_alone(cluster, tail).await;
    let reader = cluster.client().await;
    let back = read_all(&reader, name, data.len(), |_| {}).await;
    assert!(
        back == data,
        "the repaired copy holds every acknowledged byte"
    );
}

/// The chunk's state and bytes at every data server, in `cluster.data` order.
fn copies(cluster: &InProcessCluster, chunk: proto::ChunkId) -> Vec<(u64, bool, Vec<u8>)> {
    cluster
        .data
        .iter()
        .map(|s| {
            let (m, bytes) = s
                .store()
                .fetch(chunk)
                .unwrap()
                .expect("every server has a copy");
            (m.version, m.stale, bytes)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn small_writes_travel_inline_down_the_chain_and_a_copy_that_missed_one_is_caught() {
    let cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let mut data = pseudo_random(3000, 11);
    write_file(&client, b"small.bin", &data).await;
    let ino = client
        .lookup(InodeId::ROOT, b"small.bin")
        .await
        .unwrap()
        .ino;
    let chunk = proto::ChunkId {
        inode: ino,
        index: 0,
    };
    let before = copies(&cluster, chunk);
    for (version, stale, bytes) in &before {
        assert_eq!((*version, *stale), (before[0].0, false));
        assert!(bytes[..] == data[..], "every copy holds the file");
    }

    // A request with the bytes inside, on a connection that grants nothing: the head
    // has nothing to READ, so the bytes it stores and passes on are the request's.
    let meta = cluster.data[0].store().chunk_meta(chunk).unwrap().unwrap();
    let map = client.cluster_map().await.unwrap();
    let order = map.chain(meta.chain).unwrap().write_order(3);
    let index_of = |node| {
        cluster
            .data
            .iter()
            .position(|s| s.node_id() == Some(node))
            .unwrap()
    };
    let ep = cluster.endpoint();
    let head = ep
        .connect(cluster.data[index_of(order[0])].advertise())
        .await
        .unwrap();
    let inline = |offset, data| WriteInline {
        chunk,
        place: Placement {
            chain: meta.chain,
            map_version: map.version,
            replicas: 3,
        },
        chunk_size_bytes: meta.chunk_size_bytes,
        offset,
        data,
        grant: cluster.grant(chunk.inode, proto::grant::GrantMode::ReadWrite),
    };
    let patch = pseudo_random(500, 12);
    let req = Request::new(inline(1000, patch.clone()));
    let reply = head
        .call(Bytes::from(req.encode(4096).unwrap()))
        .await
        .unwrap();
    assert_eq!(
        req.decode_reply(&reply).unwrap().unwrap(),
        Moved { len: 500 }
    );
    data[1000..1500].copy_from_slice(&patch);
    for (version, stale, bytes) in copies(&cluster, chunk) {
        assert_eq!((version, stale), (before[0].0 + 1, false));
        assert!(bytes == data, "every copy took the inline write");
    }
    // More than the limit inline is refused, and nothing changes.
    let big = Request::new(inline(0, vec![1; MAX_INLINE_WRITE_BYTES + 1]));
    let reply = head
        .call(Bytes::from(big.encode(1 << 20).unwrap()))
        .await
        .unwrap();
    let err = big.decode_reply(&reply).unwrap().unwrap_err();
    assert_eq!(err.code, ErrorCode::TooBig);
    assert!(copies(&cluster, chunk).iter().all(|c| c.2 == data));

    // The tail "missed" a write: other bytes, an older version. The next small write
    // (inline, stored and recorded in one step at the tail) finds it stale, and the
    // copy is brought back whole.
    let tail = index_of(order[2]);
    let store = cluster.data[tail].store();
    store
        .write(chunk, meta.chunk_size_bytes, 0, &[0xee; 64])
        .unwrap();
    let old = data_server::store::ReplicaFields {
        chain: meta.chain,
        version: before[0].0,
        stale: false,
    };
    store.set_replica(chunk, old).unwrap();
    let (_, fh) = client.open(ino, false).await.unwrap();
    client.write(&fh, 2000, b"tail").await.unwrap();
    client.fsync(&fh).await.unwrap();
    client.release(&fh).await.unwrap();
    data[2000..2004].copy_from_slice(b"tail");
    let version = before[0].0 + 2;
    repaired_copy_holds(&cluster, tail, chunk, version, b"small.bin", &data).await;
}

// The same faults on the `mem` transport, where a server is cut off by a partition
// (every message to and from it lost, its process alive) rather than stopped, and
// where messages between chosen servers are dropped.

/// A cluster of `n` data servers on `mem`; calls time out after `call_timeout_ms`
/// (`None`: the transport's default).
async fn mem_cluster(n: usize, call_timeout_ms: Option<u64>) -> InProcessCluster {
    let mut setup = Setup::on(Backend::Mem);
    if let Some(ms) = call_timeout_ms {
        setup.limits.call_timeout_ms = ms;
        setup.limits.one_sided_timeout_ms = ms;
    }
    InProcessCluster::start_setup(n, setup).await
}

/// Waits until the metadata server has data server `i` down (its lease ran out).
async fn await_down(cluster: &InProcessCluster, i: usize) {
    let node = cluster.data[i].node_id().expect("registered");
    await_map(cluster, "the cut-off server never went down", |map| {
        map.nodes.iter().any(|n| n.node == node && !n.alive())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_mem_a_data_server_cut_off_during_a_sequential_read_is_invisible_to_the_reader() {
    let seed = seed();
    let cluster = mem_cluster(3, None).await;
    let data = pseudo_random(64 * MIB, seed);
    let writer = cluster.client().await;
    write_file(&writer, b"big.bin", &data).await;
    let victim = (seed % 3) as usize;
    let cut_at = (8 + (seed % 48) as usize) * MIB;
    let addr = cluster.data_addr(victim);
    let reader = cluster.client().await;
    let mut partition = None;
    let back = read_all(&reader, b"big.bin", data.len(), |at| {
        if at == cut_at {
            eprintln!("cutting data server {victim} ({addr}) off at {at}");
            partition = Some(transport::mem::drop_all(&addr));
        }
    })
    .await;
    assert!(partition.is_some(), "the partition was made");
    assert_eq!(sha256_hex(&back), sha256_hex(&data));
    // The fault was real: the metadata server lost the victim too.
    await_down(&cluster, victim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_mem_a_data_server_cut_off_during_a_write_loses_nothing_and_resyncs_once_healed() {
    let seed = seed();
    let cluster = mem_cluster(3, None).await;
    let client = cluster.client().await;
    let data = pseudo_random(48 * MIB, seed);
    let victim = (seed % 3) as usize;
    let cut_at = (4 + (seed % 36) as usize) * MIB;
    let (_, fh) = client
        .create(InodeId::ROOT, b"ckpt.bin", 0o644, ROOT_CALLER, true, false)
        .await
        .unwrap();
    let mut partition = None;
    for (i, part) in data.chunks(MIB).enumerate() {
        if i * MIB == cut_at {
            eprintln!("cutting data server {victim} off at {cut_at}");
            partition = Some(transport::mem::drop_all(&cluster.data_addr(victim)));
        }
        let wrote = tokio::time::timeout(DEADLINE, client.write(&fh, (i * MIB) as u64, part));
        wrote.await.expect("write ends").unwrap();
    }
    let fsync = tokio::time::timeout(DEADLINE, client.fsync(&fh));
    fsync.await.expect("fsync ends").unwrap();
    client.release(&fh).await.unwrap();
    await_down(&cluster, victim).await;
    let reader = cluster.client().await;
    let back = read_all(&reader, b"ckpt.bin", data.len(), |_| {}).await;
    assert_eq!(
        sha256_hex(&back),
        sha256_hex(&data),
        "fsync acknowledged it"
    );

    // Healed, the victim comes back syncing, copies what it missed, and then serves
    // every read alone.
    drop(partition);
    cluster.wait_healthy_within(DEADLINE).await;
    serve_alone(&cluster, victim).await;
    let back = read_all(&reader, b"ckpt.bin", data.len(), |_| {}).await;
    assert_eq!(sha256_hex(&back), sha256_hex(&data), "the victim resynced");
}

/// Every message between the metadata server and one data server (chosen by the seed)
/// is lost with probability 1/4: its heartbeats go unanswered for the call timeout, so
/// it flaps between down and syncing while a file is written, overwritten (while it is
/// down) and read; healed, it alone serves every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_mem_dropped_messages_between_a_data_server_and_the_metadata_server_lose_nothing() {
    let seed = seed();
    let cluster = mem_cluster(3, Some(2000)).await;
    let victim = (seed % 3) as usize;
    let ends = ([cluster.meta_addr()], [cluster.data_addr(victim)]);
    eprintln!(
        "dropping 1 in 4 messages between {} and {}",
        ends.0[0], ends.1[0]
    );
    let (drops, dropped) = tessera_tests::mem_faults::drop_between(&ends.0, &ends.1, 4, seed);
    let client = cluster.client().await;
    let mut data = pseudo_random(32 * MIB, seed);
    tokio::time::timeout(DEADLINE, write_file(&client, b"flap.bin", &data))
        .await
        .expect("the write ends");
    // Overwrites while the server is down, so that it misses them; then it comes back
    // (its next heartbeat passes) and goes down again (another is lost).
    let mut rng = tessera_tests::Rng::new(seed);
    for round in 0..3 {
        await_down(&cluster, victim).await;
        let at = rng.index(28) * MIB;
        let patch = pseudo_random(4 * MIB, seed + round + 1);
        let fh = open(&client, b"flap.bin").await;
        let write = async {
            client.write(&fh, at as u64, &patch).await.unwrap();
            client.fsync(&fh).await.unwrap();
            client.release(&fh).await.unwrap();
        };
        tokio::time::timeout(DEADLINE, write)
            .await
            .expect("the overwrite ends");
        data[at..at + patch.len()].copy_from_slice(&patch);
        let node = cluster.data[victim].node_id().expect("registered");
        await_map(&cluster, "the server never came back", |map| {
            map.nodes.iter().any(|n| n.node == node && n.alive())
        })
        .await;
    }
    let back = read_all(&client, b"flap.bin", data.len(), |_| {}).await;
    assert_eq!(sha256_hex(&back), sha256_hex(&data), "read while dropping");
    let lost = dropped.load(std::sync::atomic::Ordering::Relaxed);
    assert!(lost > 0, "no message was dropped");
    eprintln!("{lost} messages dropped");

    drop(drops);
    cluster.wait_healthy_within(DEADLINE).await;
    serve_alone(&cluster, victim).await;
    let back = read_all(&client, b"flap.bin", data.len(), |_| {}).await;
    assert_eq!(
        sha256_hex(&back),
        sha256_hex(&data),
        "the flapping server's copies"
    );
}
