//! Scattered small writes on a real mount: many small ranges of one chunk go to the data
//! servers together, as one chain write (`WriteRanges`), and must land as if each had
//! gone alone: newest last, every copy the same, across a chunk boundary, beside large
//! writes, and through a data server's `kill -9`. They need root (writing
//! `/proc/sys/vm/drop_caches`) and /dev/fuse, as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};
use tessera_tests::{pseudo_random, ClusterOptions, ProcessCluster, Rng};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Writes of each round of the kill test: a few seconds of them, so the kill lands in
/// the middle.
const WRITES_PER_ROUND: u64 = 20_000;

/// Drops the kernel's page cache, so reads reach the data servers.
fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", "3").expect("dropping the kernel's caches");
}

/// Writes `data` at `at` to the file and to its model.
fn put(f: &File, model: &mut Vec<u8>, at: u64, data: &[u8]) {
    f.write_all_at(data, at).unwrap();
    let end = at as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[at as usize..end].copy_from_slice(data);
}

/// Waits until `tessera fsck` finds every copy in place and alike (members that joined
/// or came back sync first), at most two minutes.
fn settled(cluster: &ProcessCluster) {
    let limit = Instant::now() + Duration::from_secs(120);
    loop {
        let (code, out) = cluster.tessera(&["fsck"]);
        if code == 0 && out.contains(" 0 problems") {
            return;
        }
        assert!(
            Instant::now() < limit,
            "tessera fsck found problems:\n{out}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `tessera fsck` finds every copy in place and alike now: on a settled cluster a write
/// that missed a member shows, before a resync could copy it over.
fn fsck_clean(cluster: &ProcessCluster) {
    let (code, out) = cluster.tessera(&["fsck"]);
    assert_eq!(code, 0, "tessera fsck found problems:\n{out}");
    assert!(out.contains(" 0 problems"), "{out}");
}

/// What a second mount reads of `name`, with the kernel's caches dropped first.
fn read_elsewhere(cluster: &ProcessCluster, name: &str) -> Vec<u8> {
    drop_caches();
    let other = cluster.mount("reader");
    let back = fs::read(other.path.join(name)).unwrap();
    other.unmount();
    back
}

/// Guards against batched small writes landing out of order, in the wrong place, or on
/// only some copies: 512 bytes at every other KiB across the 4 MiB chunk boundary (more
/// ranges than one segment holds), then overlapping rewrites, bytes sharing one block,
/// and a write too large to travel in a request beside them.
#[test]
fn scattered_small_writes_land_in_order_on_every_copy() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount("mnt");
    fs::write(m.path.join("first"), b"placed").unwrap();
    settled(&cluster);
    let p = m.path.join("scattered");
    let f = File::create(&p).unwrap();
    let mut model = Vec::new();
    let mut seed = 1;
    let mut next = |len: u64| {
        seed += 1;
        pseudo_random(len as usize, seed)
    };
    for i in 0..2048u64 {
        put(&f, &mut model, 3 * MIB + 2 * i * KIB, &next(512));
    }
    // Rewrites over earlier ranges and the gaps between them: the newest must win.
    for i in 0..300u64 {
        put(&f, &mut model, 3 * MIB + 512 * KIB + i * 3000, &next(100));
    }
    // Single bytes sharing one block, and 70 KiB beside them (not sent inline).
    for i in 0..8u64 {
        put(&f, &mut model, 4 * MIB + 64 * KIB + 7 * i, &next(1));
    }
    put(&f, &mut model, 4 * MIB + 200 * KIB, &next(70 * KIB));
    f.sync_all().unwrap();
    drop(f);
    assert!(
        fs::read(&p).unwrap() == model,
        "the writing mount reads the model back"
    );
    let back = read_elsewhere(&cluster, "scattered");
    assert_eq!(back.len(), model.len());
    assert!(back == model, "another mount, cold, reads the model back");
    m.unmount();
    fsck_clean(&cluster);
}

/// Guards against a batch of ranges lost or half-applied when a chain member dies under
/// it: rounds of scattered writes and fsyncs, each to a file of its own, while one data
/// server is killed and brought back; every file reads back whole at the end, after the
/// later rounds' kills and resyncs, and the copies agree once healed. The cluster
/// settles first: a chain formed while the servers register has one serving member
/// until the others have copied it, and a kill of that one loses what only it held (a
/// known gap, README "Not yet"), which is not what this test is about.
#[test]
fn scattered_writes_survive_a_data_servers_kill_9() {
    let mut cluster = ProcessCluster::start_with(ClusterOptions {
        data_servers: 4,
        namespace_toml: "node_lease_ms = 1500\n".into(),
        heartbeat_ms: 200,
        ..ClusterOptions::default()
    });
    let m = cluster.mount("mnt");
    fs::write(m.path.join("first"), b"placed").unwrap();
    settled(&cluster);
    let mut rng = Rng::from_env("TESSERA_KILL_SEED");
    let mut models = Vec::new();
    for round in 0..3u64 {
        let f = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(m.path.join(format!("round{round}")))
            .unwrap();
        let victim = rng.below(4) as usize;
        let seed = rng.next_u64();
        let writer = std::thread::spawn(move || {
            let started = Instant::now();
            let deadline = started + Duration::from_secs(90);
            let mut model = Vec::new();
            for i in 0..WRITES_PER_ROUND {
                assert!(Instant::now() < deadline, "round {round}: writes hung");
                let at = (seed.rotate_left(i as u32) ^ i) % (6 * MIB);
                let data = pseudo_random(1 + (i % 700) as usize, seed ^ i);
                put(&f, &mut model, at, &data);
                if i % 2000 == 1999 {
                    f.sync_all().unwrap();
                }
            }
            f.sync_all().unwrap();
            eprintln!("round {round}: written in {:?}", started.elapsed());
            model
        });
        // A sleep on purpose: the kill lands somewhere in the round's writes.
        std::thread::sleep(Duration::from_millis(100 + rng.below(500)));
        eprintln!("round {round}: kill -9 data server {victim}");
        cluster.kill_data(victim);
        let model = writer
            .join()
            .expect("the round's writes and fsyncs succeed");
        cluster.restart_data(victim);
        // Copies agree again before the next round's kill, which would otherwise find
        // a chain still copying to the server just brought back.
        settled(&cluster);
        models.push(model);
    }
    for (round, model) in models.iter().enumerate() {
        let back = read_elsewhere(&cluster, &format!("round{round}"));
        assert_eq!(back.len(), model.len(), "round {round}: the length");
        let first = back.iter().zip(model).position(|(a, b)| a != b);
        assert_eq!(first, None, "round {round}: the first byte that differs");
    }
    settled(&cluster);
    m.unmount();
}
