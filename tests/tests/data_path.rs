//! The client's data path through the `Client` API: write-behind (buffered writes sent in
//! the background), readahead (prefetched segments), and how both keep bytes correct
//! for the same open file, for other clients, and when a data server fails.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use fs_client::{Client, FileHandle};
use proto::meta::Caller;
use proto::{InodeId, SetAttr};
use std::sync::Arc;
use std::time::Duration;
use tessera_tests::{pseudo_random, sha256_hex, InProcessCluster, Rng};

const ROOT_CALLER: Caller = Caller::ROOT;
const MIB: usize = 1 << 20;
/// No data-path call in these tests may take this long; a hang fails instead.
const DEADLINE: Duration = Duration::from_secs(60);

async fn create(client: &Client, name: &[u8]) -> FileHandle {
    let (_, fh) = client
        .create(InodeId::ROOT, name, 0o644, ROOT_CALLER, true, false)
        .await
        .unwrap();
    fh
}

async fn open(client: &Client, name: &[u8]) -> (u64, FileHandle) {
    let attr = client.lookup(InodeId::ROOT, name).await.unwrap();
    let (attr, fh) = client.open(attr.ino, false).await.unwrap();
    (attr.size, fh)
}

/// Opens `name` with `client`, which holds nothing of it, and checks it holds `want`.
/// The results of `tasks`, all of which must end within [`DEADLINE`] (`what` says
/// otherwise) without panicking.
async fn finish_within_deadline<T>(tasks: Vec<tokio::task::JoinHandle<T>>, what: &str) -> Vec<T> {
    let all = async {
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    };
    tokio::time::timeout(DEADLINE, all).await.expect(what)
}

/// A client of `cluster` whose write buffers hold `file_bytes` per file and writer and
/// `mount_bytes` in all.
async fn with_write_budget(
    cluster: &InProcessCluster,
    file_bytes: u64,
    mount_bytes: u64,
) -> Arc<Client> {
    let config = fs_client::ClientConfig {
        write_buffer_file_bytes: file_bytes,
        write_buffer_mount_bytes: mount_bytes,
        ..cluster.client_config()
    };
    Client::connect(config).await.unwrap()
}

async fn reads_back(client: &Client, name: &[u8], want: &[u8]) {
    let (size, fh) = open(client, name).await;
    assert_eq!(size, want.len() as u64);
    let back = client.read(&fh, 0, want.len()).await.unwrap();
    assert_eq!(sha256_hex(&back), sha256_hex(want));
    client.release(&fh).await.unwrap();
}

/// Guards against buffered writes being lost or reordered on their way out, and against
/// a read of the writing handle missing bytes still in the client's buffers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn write_behind_of_48_mib_reads_back_on_the_writer_and_on_another_client() {
    let cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let data = pseudo_random(48 * MIB + 4321, 48);
    let fh = create(&client, b"wb.bin").await;
    // Odd-sized writes, so that writes straddle segment and chunk boundaries.
    for (i, part) in data.chunks(300_007).enumerate() {
        let at = (i * 300_007) as u64;
        assert_eq!(client.write(&fh, at, part).await.unwrap(), part.len());
    }
    // Before any flush: the writer reads its own bytes back, buffered or not.
    let back = client.read(&fh, 0, data.len() + MIB).await.unwrap();
    assert_eq!(back.len(), data.len());
    assert_eq!(sha256_hex(&back), sha256_hex(&data));
    assert_eq!(
        client.getattr(fh.ino()).await.unwrap().size,
        data.len() as u64
    );
    client.release(&fh).await.unwrap();

    let other = cluster.client().await;
    let (size, fh) = open(&other, b"wb.bin").await;
    assert_eq!(
        size,
        data.len() as u64,
        "the release committed the buffered length"
    );
    let back = other.read(&fh, 0, data.len()).await.unwrap();
    assert_eq!(sha256_hex(&back), sha256_hex(&data));
    other.release(&fh).await.unwrap();
}

/// Guards against writers of disjoint ranges of one file losing each other's bytes when
/// they share a segment buffer (the ranges here do not end on segment boundaries).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_concurrent_writers_of_disjoint_ranges_build_one_file() {
    let cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let part_len = 9 * MIB + 777;
    let data = Arc::new(pseudo_random(4 * part_len, 4));
    drop(create(&client, b"shared.bin").await);
    let ino = client
        .lookup(InodeId::ROOT, b"shared.bin")
        .await
        .unwrap()
        .ino;
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (client, data) = (client.clone(), data.clone());
            tokio::spawn(async move {
                let (_, fh) = client.open(ino, false).await.unwrap();
                let range = w * part_len..(w + 1) * part_len;
                // Writers take turns within the range, 64 KiB at a time, from both ends.
                let pieces: Vec<_> = data[range.clone()].chunks(65_536).enumerate().collect();
                for (i, piece) in pieces.iter().rev() {
                    let at = (range.start + i * 65_536) as u64;
                    client.write(&fh, at, piece).await.unwrap();
                }
                client.flush(&fh).await.unwrap();
                client.release(&fh).await.unwrap();
            })
        })
        .collect();
    finish_within_deadline(writers, "the writers finish").await;

    let other = cluster.client().await;
    let (size, fh) = open(&other, b"shared.bin").await;
    assert_eq!(size, data.len() as u64);
    let back = other.read(&fh, 0, data.len()).await.unwrap();
    assert_eq!(sha256_hex(&back), sha256_hex(&data));
    other.release(&fh).await.unwrap();
}

/// Guards against a write that failed in the background being lost silently: with every
/// data server gone, fsync reports the failure, and so does the close of another handle
/// that was open then; each handle reports it once (as Linux reports a writeback error
/// once per open file), so once the servers are back the same handle writes and syncs
/// again (before, every later call failed until the close).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_background_write_failure_is_reported_once_per_handle_and_the_handle_goes_on() {
    let mut cluster = InProcessCluster::start(3).await;
    let config = fs_client::ClientConfig {
        failover_timeout_ms: 2000,
        ..cluster.client_config()
    };
    let client = Client::connect(config).await.unwrap();
    let data = pseudo_random(24 * MIB, 24);
    let fh = create(&client, b"lost.bin").await;
    let (_, other) = open(&client, b"lost.bin").await;
    client.write(&fh, 0, &data[..2 * MIB]).await.unwrap();
    for i in 0..3 {
        cluster.stop_data(i);
    }
    // Later writes are buffered (and may already fail with the failure of earlier ones).
    let mut write_failed = false;
    for (i, part) in data[2 * MIB..].chunks(MIB).enumerate() {
        let at = (2 * MIB + i * MIB) as u64;
        if client.write(&fh, at, part).await.is_err() {
            write_failed = true;
            break;
        }
    }
    eprintln!("a write failed first: {write_failed}");
    let fsync = tokio::time::timeout(DEADLINE, client.fsync(&fh)).await;
    assert!(
        fsync.expect("fsync ends").is_err(),
        "fsync succeeded with every data server down"
    );
    // The other handle has not reported it yet: its close does.
    let flush = tokio::time::timeout(DEADLINE, client.flush(&other)).await;
    assert!(
        flush.expect("flush ends").is_err(),
        "the other handle's close missed the failure"
    );
    let again = tokio::time::timeout(DEADLINE, client.flush(&other)).await;
    assert!(again.expect("flush ends").is_ok(), "reported twice");
    client.release(&other).await.unwrap();

    for i in 0..3 {
        cluster.restart_data(i).await;
    }
    cluster.wait_healthy_within(DEADLINE).await;
    // The writer was told: it writes the lost range again, and this time it holds.
    let redo = async {
        client.write(&fh, 0, &data).await?;
        client.fsync(&fh).await
    };
    tokio::time::timeout(DEADLINE, redo)
        .await
        .expect("the rewrite ends")
        .expect("the handle goes on once the servers are back");
    client.release(&fh).await.unwrap();
    reads_back(&*cluster.client().await, b"lost.bin", &data).await;
}

/// Reads `len` at `offset` and compares with the expected file bytes.
async fn check(client: &Client, fh: &FileHandle, want: &[u8], offset: usize, len: usize) {
    let got = client.read(fh, offset as u64, len).await.unwrap();
    let end = (offset + len).min(want.len()).max(offset.min(want.len()));
    assert_eq!(
        got.len(),
        end - offset.min(want.len()),
        "length at {offset}+{len}"
    );
    assert!(
        got == want[offset.min(want.len())..end],
        "bytes at {offset}+{len}"
    );
}

/// Guards against prefetched segments serving wrong bytes: the wrong segment, bytes
/// past a short last segment, or a window that skips a range, for every access pattern.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readahead_serves_the_right_bytes_sequentially_backward_randomly_and_at_eof() {
    let cluster = InProcessCluster::start(3).await;
    let data = pseudo_random(37 * MIB + 12_345, 37);
    {
        let writer = cluster.client().await;
        let fh = create(&writer, b"ra.bin").await;
        writer.write(&fh, 0, &data).await.unwrap();
        writer.release(&fh).await.unwrap();
    }
    let client = cluster.client().await;

    // Sequential, from a non-aligned start, in reads that straddle segment boundaries.
    let (_, fh) = open(&client, b"ra.bin").await;
    let mut at = 777;
    while at < data.len() {
        check(&client, &fh, &data, at, 1_000_003).await;
        at += 1_000_003;
    }
    check(&client, &fh, &data, data.len(), MIB).await;
    client.release(&fh).await.unwrap();

    // Sequential in whole 1 MiB reads, as the kernel sends them, the last one short.
    let (_, fh) = open(&client, b"ra.bin").await;
    for at in (0..data.len()).step_by(MIB) {
        check(&client, &fh, &data, at, MIB).await;
    }
    client.release(&fh).await.unwrap();

    // Backward, from the end.
    let (_, fh) = open(&client, b"ra.bin").await;
    let mut end = data.len();
    while end > 0 {
        let at = end.saturating_sub(700_001);
        check(&client, &fh, &data, at, end - at).await;
        end = at;
    }
    client.release(&fh).await.unwrap();

    // Random, with short sequential runs mixed in, and reads across the end of the file.
    let (_, fh) = open(&client, b"ra.bin").await;
    let mut rng = Rng::new(0x5EED);
    for _ in 0..200 {
        let at = rng.below(data.len() as u64 + MIB as u64) as usize;
        let len = 1 + rng.below(2 * MIB as u64) as usize;
        check(&client, &fh, &data, at, len).await;
        if rng.below(4) == 0 {
            check(&client, &fh, &data, at + len, len).await;
        }
    }
    for at in [
        4 * MIB - 1,
        8 * MIB - 100,
        36 * MIB,
        data.len() - 1,
        data.len() - 5000,
    ] {
        check(&client, &fh, &data, at, 10_000).await;
    }
    client.release(&fh).await.unwrap();
}

/// Guards against close-to-open breaking with cached segments: a reader that prefetched
/// a file (and still holds it open) sees the bytes of a writer that closed since, on
/// its next open.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_sees_the_new_bytes_of_a_writer_that_closed_on_its_next_open() {
    let cluster = InProcessCluster::start(3).await;
    let (a, b) = (cluster.client().await, cluster.client().await);
    let v1 = pseudo_random(20 * MIB + 5, 1);
    let v2 = pseudo_random(20 * MIB + 5, 2);
    let fh = create(&a, b"ctoo.bin").await;
    a.write(&fh, 0, &v1).await.unwrap();
    a.release(&fh).await.unwrap();

    let (_, held) = open(&b, b"ctoo.bin").await;
    let back = b.read(&held, 0, v1.len()).await.unwrap();
    assert_eq!(sha256_hex(&back), sha256_hex(&v1));

    // A rewrites every byte (the length stays) while B keeps its first open.
    let (_, fh) = open(&a, b"ctoo.bin").await;
    a.write(&fh, 0, &v2).await.unwrap();
    // Not yet closed: B's view is not promised anything; after the close it is.
    a.release(&fh).await.unwrap();

    let (_, again) = open(&b, b"ctoo.bin").await;
    let back = b.read(&again, 0, v2.len()).await.unwrap();
    assert_eq!(
        sha256_hex(&back),
        sha256_hex(&v2),
        "B served its old prefetched bytes"
    );
    b.release(&again).await.unwrap();
    b.release(&held).await.unwrap();

    // And grown: the new tail is visible too.
    let (_, fh) = open(&a, b"ctoo.bin").await;
    a.write(&fh, v2.len() as u64, &v1[..3 * MIB]).await.unwrap();
    a.release(&fh).await.unwrap();
    let (size, fh) = open(&b, b"ctoo.bin").await;
    assert_eq!(size, (v2.len() + 3 * MIB) as u64);
    let back = b
        .read(&fh, v2.len() as u64 - 10, 3 * MIB + 10)
        .await
        .unwrap();
    assert_eq!(back[..10], v2[v2.len() - 10..]);
    assert!(back[10..] == v1[..3 * MIB]);
    b.release(&fh).await.unwrap();
}

/// Guards against cached or buffered segments disagreeing with what the file holds when
/// writes, reads, truncation, hole punching and fsync interleave on one open file:
/// every read is checked against a model of the file, then another client reads it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleaved_writes_reads_truncates_and_punches_match_a_model() {
    let cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let fh = create(&client, b"model.bin").await;
    let mut model: Vec<u8> = Vec::new();
    let mut rng = Rng::new(0xC0FFEE);
    const SPAN: u64 = 24 << 20;
    for step in 0..300u64 {
        match rng.below(10) {
            0..=3 => {
                let at = rng.below(SPAN) as usize;
                let len = 1 + rng.below(3 * MIB as u64) as usize;
                let bytes = pseudo_random(len, step);
                client.write(&fh, at as u64, &bytes).await.unwrap();
                if model.len() < at + len {
                    model.resize(at + len, 0);
                }
                model[at..at + len].copy_from_slice(&bytes);
            }
            4..=6 => {
                let at = rng.below(model.len() as u64 + 1) as usize;
                let len = 1 + rng.below(2 * MIB as u64) as usize;
                check(&client, &fh, &model, at, len).await;
            }
            7 => {
                let size = rng.below(SPAN);
                let set = SetAttr {
                    size: Some(size),
                    ..SetAttr::default()
                };
                client.setattr(fh.ino(), set).await.unwrap();
                model.resize(size as usize, 0);
            }
            8 => {
                let at = rng.below(model.len() as u64 + 1);
                let len = 1 + rng.below(2 * MIB as u64);
                let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                client.fallocate(&fh, at, len, mode).await.unwrap();
                let end = ((at + len) as usize).min(model.len());
                if (at as usize) < end {
                    model[at as usize..end].fill(0);
                }
            }
            _ => client.fsync(&fh).await.unwrap(),
        }
        let size = client.getattr(fh.ino()).await.unwrap().size;
        assert_eq!(size, model.len() as u64, "length after step {step}");
    }
    check(&client, &fh, &model, 0, model.len()).await;
    client.release(&fh).await.unwrap();

    reads_back(&*cluster.client().await, b"model.bin", &model).await;
}

/// Guards against an in-place rewrite (read a block, write it back changed, read the
/// next: databases, bonnie++'s rewrite, tools that patch files) sending its buffered
/// writes before every read and fetching the segment again after each: a read beside
/// buffered bytes reads from the servers as they are, one call each, and still returns
/// the right bytes; a read over buffered bytes returns them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_beside_buffered_writes_do_not_send_them() {
    const BLOCK: usize = 8 << 10;
    const ROUNDS: usize = 64;
    let cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let mut model = pseudo_random(8 * MIB, 7);
    let fh = create(&client, b"rewrite.bin").await;
    client.write(&fh, 0, &model).await.unwrap();
    client.release(&fh).await.unwrap();

    let (_, fh) = open(&client, b"rewrite.bin").await;
    let before = client.rpc_counts();
    for i in 0..ROUNDS {
        let at = i * BLOCK;
        let got = client.read(&fh, at as u64, BLOCK).await.unwrap();
        assert!(got == model[at..at + BLOCK], "block {i} read back wrong");
        let changed: Vec<u8> = got.iter().map(|b| b ^ 0x5a).collect();
        client.write(&fh, at as u64, &changed).await.unwrap();
        model[at..at + BLOCK].copy_from_slice(&changed);
    }
    let calls = client.rpc_counts() - before;
    // One read call per block, and the first read's readahead (this file's two
    // segments); sending the writes before each read took at least two per block.
    assert!(
        calls.data_calls <= (ROUNDS + 2) as u64,
        "{ROUNDS} rewritten blocks took {} data calls ({} retries)",
        calls.data_calls,
        calls.retries
    );
    // A read over buffered bytes still sees them.
    check(&client, &fh, &model, BLOCK / 2, 4 * BLOCK).await;
    check(&client, &fh, &model, 0, model.len()).await;
    client.release(&fh).await.unwrap();
    reads_back(&*cluster.client().await, b"rewrite.bin", &model).await;
}

/// Guards against a deadlock, or lost bytes, when the mount's write buffers are all in
/// use: writers of six files, with a budget of two segments for the whole mount and
/// writers that pause with half-filled segments, all finish, and every byte lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_of_many_files_finish_when_the_mount_write_budget_is_full() {
    let cluster = InProcessCluster::start(3).await;
    let client = with_write_budget(&cluster, 4 << 20, 8 << 20).await;
    let writers: Vec<_> = (0..6u64)
        .map(|w| {
            let client = client.clone();
            tokio::spawn(async move {
                let name = format!("budget-{w}");
                let fh = create(&client, name.as_bytes()).await;
                let mut model = vec![0u8; 12 * MIB];
                let mut rng = Rng::new(w + 1);
                for i in 0..120 {
                    let at = rng.below((12 * MIB - 65_536) as u64) as usize;
                    let bytes = pseudo_random(1 + rng.below(65_536) as usize, w * 1000 + i);
                    client.write(&fh, at as u64, &bytes).await.unwrap();
                    model[at..at + bytes.len()].copy_from_slice(&bytes);
                    if rng.below(8) == 0 {
                        // A pause with a half-filled segment held.
                        tokio::time::sleep(Duration::from_millis(30)).await;
                    }
                }
                // The last byte, so that the length is the model's.
                client
                    .write(&fh, (12 * MIB - 1) as u64, &model[12 * MIB - 1..])
                    .await
                    .unwrap();
                client.release(&fh).await.unwrap();
                (name, model)
            })
        })
        .collect();
    let files = finish_within_deadline(writers, "no writer waits forever").await;

    let other = cluster.client().await;
    for (name, model) in files {
        let (size, fh) = open(&other, name.as_bytes()).await;
        assert_eq!(size, model.len() as u64, "{name}");
        let back = other.read(&fh, 0, model.len()).await.unwrap();
        assert!(back == model, "{name} differs");
        other.release(&fh).await.unwrap();
    }
}

/// Guards the write budget that grows with a file's writers (`write_buffer_file_bytes`
/// per handle open for writing, within the mount's): four handles writing disjoint
/// ranges of one file, as sharded checkpoint savers do, with a budget of two segments
/// per handle and four for the mount, all finish and every byte lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_of_disjoint_ranges_of_one_file_share_a_budget_that_grows_with_them() {
    const RANGE: usize = 24 * MIB;
    let cluster = InProcessCluster::start(3).await;
    let client = with_write_budget(&cluster, 8 << 20, 16 << 20).await;
    let first = create(&client, b"shards").await;
    first.mark_writer().await;
    let mut handles = vec![Arc::new(first)];
    for _ in 1..4 {
        let (_, fh) = open(&client, b"shards").await;
        fh.mark_writer().await;
        handles.push(Arc::new(fh));
    }
    let data = pseudo_random(4 * RANGE, 17);
    let writers: Vec<_> = handles
        .iter()
        .enumerate()
        .map(|(w, fh)| {
            let (client, fh, data) = (client.clone(), fh.clone(), data.clone());
            tokio::spawn(async move {
                for at in (w * RANGE..(w + 1) * RANGE).step_by(MIB) {
                    let n = client
                        .write(&fh, at as u64, &data[at..at + MIB])
                        .await
                        .unwrap();
                    assert_eq!(n, MIB);
                }
                client.fsync(&fh).await.unwrap();
            })
        })
        .collect();
    finish_within_deadline(writers, "no writer waits forever").await;
    for fh in &handles {
        client.release(fh).await.unwrap();
    }
    reads_back(&*cluster.client().await, b"shards", &data).await;
}

/// Guards against a writer waiting forever for write-buffer memory held by an idle
/// writer: with one segment for the whole mount, two writers wait for it at once; the
/// one that gets it writes a few bytes and goes quiet, and the other must still finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writer_never_waits_forever_for_a_buffer_an_idle_writer_holds() {
    let cluster = InProcessCluster::start(3).await;
    let client = with_write_budget(&cluster, 4 << 20, 4 << 20).await;
    let a = create(&client, b"idle-a").await;
    // Almost a whole segment: held, not yet sent, and slow enough to send that both
    // writers below are waiting before it is gone.
    let big = pseudo_random(4 * MIB - 1, 7);
    client.write(&a, 0, &big).await.unwrap();
    let (b, c) = (
        create(&client, b"idle-b").await,
        create(&client, b"idle-c").await,
    );
    let writes = async {
        let (rb, rc) = tokio::join!(client.write(&b, 0, b"bee"), client.write(&c, 0, b"sea"));
        rb.unwrap();
        rc.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(10), writes)
        .await
        .expect("a writer waited for a buffer nobody was going to free");
    for (fh, want) in [(&a, &big[..]), (&b, &b"bee"[..]), (&c, &b"sea"[..])] {
        client.release(fh).await.unwrap();
        let other = cluster.client().await;
        let (_, fh2) = other.open(fh.ino(), false).await.unwrap();
        assert!(other.read(&fh2, 0, want.len() + 1).await.unwrap() == want);
        other.release(&fh2).await.unwrap();
    }
}
