//! Failures of real processes: `kill -9` of data servers during a mixed workload, of the
//! metadata server during a burst of creates and renames, and a server that stays away
//! until it is replaced, watched through `tessera status`. `tessera fsck` must be clean
//! after each.

use fs_client::{Client, ClientConfig};
use proto::meta::{Caller, RenameMode};
use proto::InodeId;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_tests::client_io::{read_whole, write_fsync};
use tessera_tests::{pseudo_random, sha256_hex, wait_healthy, ClusterOptions, ProcessCluster, Rng};

const ROOT_CALLER: Caller = Caller::ROOT;
const MIB: usize = 1 << 20;
/// How long the cluster may take to heal after a restart.
const HEAL: Duration = Duration::from_secs(120);

/// Short leases and beats, so that a killed server leaves its chains within seconds.
fn fast(data_servers: usize, extra: &str) -> ClusterOptions {
    ClusterOptions {
        data_servers,
        namespace_toml: format!("node_lease_ms = 1500\n{extra}"),
        heartbeat_ms: 200,
        ..ClusterOptions::default()
    }
}

async fn client(cluster: &ProcessCluster) -> Arc<Client> {
    let config = ClientConfig {
        ..cluster.client_config()
    };
    Client::connect(config).await.expect("client connects")
}

fn fsck_clean(cluster: &ProcessCluster) {
    let (code, out) = cluster.tessera(&["fsck"]);
    assert_eq!(code, 0, "tessera fsck found problems:\n{out}");
    assert!(out.contains(" 0 problems"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_random_data_servers_during_writes_fsyncs_and_reads_loses_nothing_fsynced() {
    const ROUNDS: usize = 20;
    let mut rng = Rng::from_env("TESSERA_KILL_SEED");
    let mut cluster = ProcessCluster::start_with(fast(3, ""));
    let c = client(&cluster).await;
    wait_healthy(&c, HEAL).await;
    let mut acked: BTreeMap<String, String> = BTreeMap::new();
    let mut failed = 0;
    for round in 0..ROUNDS {
        let victim = rng.below(3) as usize;
        let kill_after = Duration::from_millis(rng.below(1500));
        let files = 2 + rng.below(4) as usize;
        let seed = rng.next_u64();
        // The workload runs while the victim is killed at a random moment.
        let worker = {
            let c = c.clone();
            let known: Vec<(String, String)> =
                acked.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            tokio::spawn(async move {
                let mut done = Vec::new();
                let mut failures = 0;
                for f in 0..files {
                    let name = format!("r{round:02}-f{f}");
                    let len = MIB / 2 + (seed.rotate_left(f as u32) % (6 * MIB as u64)) as usize;
                    let data = pseudo_random(len, seed ^ f as u64);
                    match write_fsync(&c, &name, &data).await {
                        Ok(()) => done.push((name, sha256_hex(&data))),
                        Err(e) => {
                            eprintln!("round {round}: {name} not acknowledged: {e}");
                            failures += 1;
                        }
                    }
                    // Read back an older acknowledged file meanwhile.
                    if let Some((old, sum)) = known.get((seed as usize + f) % known.len().max(1)) {
                        let back = read_whole(&c, old).await.expect("reading an fsynced file");
                        assert_eq!(&sha256_hex(&back), sum, "{old} in round {round}");
                    }
                }
                (done, failures)
            })
        };
        // A sleep on purpose: the kill lands at a random point of the workload.
        tokio::time::sleep(kill_after).await;
        eprintln!("round {round}: kill -9 data server {victim} after {kill_after:?}");
        cluster.kill_data(victim);
        let (done, failures) = tokio::time::timeout(HEAL, worker)
            .await
            .expect("the workload finishes")
            .expect("the workload does not panic");
        failed += failures;
        acked.extend(done);
        cluster.restart_data(victim);
        wait_healthy(&c, HEAL).await;
    }
    eprintln!("{} files acknowledged, {failed} not", acked.len());
    assert!(
        failed * 4 < acked.len(),
        "most writes must succeed with two replicas up"
    );
    let reader = client(&cluster).await;
    for (name, sum) in &acked {
        let back = read_whole(&reader, name).await.expect("read");
        assert_eq!(&sha256_hex(&back), sum, "{name}");
    }
    fsck_clean(&cluster);
}

/// Guards against a data server that hangs (SIGSTOP: its connections stay open, as
/// with a stuck disk) failing every write, fsync and read that reaches it: each waited
/// out the transport's 30 s call timeout, which is also the client's failover budget,
/// and failed (by hand: `dd` of 2 GiB failed with ETIMEDOUT). Once the server's lease
/// runs out, the client gives up its calls to it, a head gives up forwarding to it, and
/// the I/O goes on with the other members.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_data_server_that_hangs_is_left_behind_and_io_goes_on() {
    let cluster = ProcessCluster::start_with(fast(3, ""));
    let c = client(&cluster).await;
    wait_healthy(&c, HEAL).await;
    let before = pseudo_random(12 * MIB, 1);
    write_fsync(&c, "before", &before)
        .await
        .expect("write before");
    cluster.pause_data(1);
    // A file over every chain: server 1 heads one, follows the head in another and is
    // the tail of the third.
    let during = pseudo_random(24 * MIB, 2);
    write_fsync(&c, "during", &during)
        .await
        .expect("a write and fsync while a server hangs");
    // A client with nothing cached: some chunks are first asked of the hung server.
    let reader = client(&cluster).await;
    for (name, data) in [("before", &before), ("during", &during)] {
        let back = read_whole(&reader, name)
            .await
            .expect("a read while a server hangs");
        assert_eq!(sha256_hex(&back), sha256_hex(data), "{name}");
    }
    cluster.resume_data(1);
    wait_healthy(&c, HEAL).await;
    for (name, data) in [("before", &before), ("during", &during)] {
        let back = read_whole(&c, name).await.expect("read after the resync");
        assert_eq!(sha256_hex(&back), sha256_hex(data), "{name}");
    }
    fsck_clean(&cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_the_metadata_server_during_creates_and_renames_keeps_every_answer() {
    let mut rng = Rng::from_env("TESSERA_META_KILL_SEED");
    let mut cluster = ProcessCluster::start_with(fast(3, ""));
    let c = client(&cluster).await;
    wait_healthy(&c, HEAL).await;
    // Three writers of disjoint names: create fN (with a few bytes), then rename half of
    // them to gN; every answered operation is logged.
    let mut workers = Vec::new();
    for w in 0..3u32 {
        let c = client(&cluster).await;
        workers.push(tokio::spawn(async move {
            let mut log: Vec<(String, Option<String>)> = Vec::new();
            for i in 0.. {
                let f = format!("w{w}-f{i}");
                let Ok((_, fh)) = c
                    .create(InodeId::ROOT, f.as_bytes(), 0o644, ROOT_CALLER, true, false)
                    .await
                else {
                    break;
                };
                let wrote = c.write(&fh, 0, f.as_bytes()).await.is_ok();
                let closed = c.release(&fh).await.is_ok();
                if !(wrote && closed) {
                    log.push((f, None));
                    break;
                }
                let mut renamed = None;
                if i % 2 == 0 {
                    let g = format!("w{w}-g{i}");
                    let r = c
                        .rename(
                            InodeId::ROOT,
                            f.as_bytes(),
                            InodeId::ROOT,
                            g.as_bytes(),
                            RenameMode::Replace,
                        )
                        .await;
                    match r {
                        Ok(()) => renamed = Some(g),
                        Err(_) => {
                            log.push((f, Some("?".into())));
                            break;
                        }
                    }
                }
                log.push((f, renamed));
            }
            log
        }));
    }
    // A sleep on purpose: the kill lands at a random point of the renames.
    tokio::time::sleep(Duration::from_millis(300 + rng.below(1200))).await;
    eprintln!("kill -9 of the metadata server");
    cluster.kill_meta();
    let mut logs = Vec::new();
    for w in workers {
        logs.push(
            tokio::time::timeout(HEAL, w)
                .await
                .expect("writers stop")
                .unwrap(),
        );
    }
    cluster.restart_meta();
    let c = client(&cluster).await;
    wait_healthy(&c, HEAL).await;
    let mut checked = 0;
    for log in &logs {
        for (f, renamed) in log {
            let has = |name: &str| {
                let c = c.clone();
                let name = name.to_string();
                async move { c.lookup(InodeId::ROOT, name.as_bytes()).await.is_ok() }
            };
            match renamed.as_deref() {
                // Created and closed, rename never tried: present under its name.
                None => assert!(has(f).await, "{f} was created and is gone"),
                // The rename's answer was lost: one of the two names, never both.
                Some("?") => {
                    let g = f.replace("-f", "-g");
                    assert!(has(f).await ^ has(&g).await, "{f} or {g}, exactly one");
                }
                Some(g) => {
                    assert!(has(g).await, "{g} was answered and is gone");
                    assert!(!has(f).await, "{f} was renamed away and is back");
                }
            }
            checked += 1;
        }
    }
    eprintln!("{checked} answered operations checked after the restart");
    assert!(checked > 0, "the writers did some work before the kill");
    fsck_clean(&cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_data_server_that_stays_down_is_replaced_as_tessera_status_shows() {
    let mut cluster = ProcessCluster::start_with(fast(4, "replace_after_ms = 4000"));
    let c = client(&cluster).await;
    wait_healthy(&c, HEAL).await;
    let data = pseudo_random(24 * MIB, 77);
    write_fsync(&c, "f.bin", &data).await.unwrap();
    let (code, out) = cluster.tessera(&["status"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("under-replicated chunks: 0 of 6"), "{out}");
    let dead = c.cluster_map().await.unwrap().nodes[3].node;
    cluster.kill_data(3);
    let deadline = Instant::now() + HEAL;
    let mut saw_under = false;
    loop {
        let (code, out) = cluster.tessera(&["status"]);
        assert_eq!(code, 0, "{out}");
        saw_under |= !out.contains("under-replicated chunks: 0 of");
        let chains_without_dead = out
            .lines()
            .filter(|l| l.trim_start().starts_with("chain:"))
            .all(|l| !l.contains(&format!("{dead} ")));
        if saw_under && chains_without_dead && out.contains("under-replicated chunks: 0 of 6") {
            eprintln!("{out}");
            break;
        }
        assert!(Instant::now() < deadline, "never re-replicated:\n{out}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let back = read_whole(&c, "f.bin").await.unwrap();
    assert_eq!(sha256_hex(&back), sha256_hex(&data));
    fsck_clean(&cluster);
}
