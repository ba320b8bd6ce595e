//! The etcd cluster under a metadata server failing, with a file-system workload on a
//! real mount: `kill -9` of etcd's leader is a pause (no error, nothing lost, held locks
//! still held, the same metadata server serving); with two of three members stopped a
//! call waits and then fails with a clear error within the configured retry time, and
//! the file system goes on once a member returns; the leader's kill is a pause too for
//! two metadata servers serving one prefix at once. Real processes, real FUSE mounts, a
//! 3-member etcd on 127.0.0.1 with its data on /dev/shm.

use meta_server::kv::etcd::local::LocalEtcd;
use meta_server::kv::EtcdConfig;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tessera_tests::posix::User;
use tessera_tests::{pseudo_random, sha256_hex, Agent, ClusterOptions, ProcessCluster};

/// Operations of the workload in [`a_killed_etcd_leader_is_a_pause_for_the_file_system`]
/// (bounded in count and, by [`WORKLOAD_LIMIT`], in time).
const OPS: usize = 150;
/// How long the whole workload may take, the leader's kill included.
const WORKLOAD_LIMIT: Duration = Duration::from_secs(180);
/// How long one file operation may take while etcd elects a new leader.
const PAUSE_LIMIT: Duration = Duration::from_secs(20);
/// Bytes appended to the file held open across the kill, every fifth operation.
const APPEND: usize = 64 * 1024;

/// How long a cluster may take to have every chain's members serving, at its start and
/// after the faults (before `fsck`, which counts a syncing copy as a problem).
const HEAL_LIMIT: Duration = Duration::from_secs(60);

/// A 3-member etcd and a cluster (3 data servers) whose metadata server uses it with
/// `tune` applied to its etcd settings (where `tune` sets `shared`, a second metadata
/// server serves the prefix beside the first); `None`, after saying so, where no etcd binary is
/// installed (never under CI).
fn cluster_on_three_members(
    tune: impl FnOnce(&mut EtcdConfig),
    namespace_toml: &str,
) -> Option<(LocalEtcd, ProcessCluster)> {
    if !LocalEtcd::present_for_tests() {
        return None;
    }
    let etcd = LocalEtcd::start(3).expect("3 etcd members");
    etcd.wait_ready().expect("etcd ready");
    wait_for_leader(&etcd);
    let mut config = etcd.config();
    tune(&mut config);
    let mut cluster = ProcessCluster::start_with(ClusterOptions {
        data_servers: 3,
        meta_toml: tessera_tests::etcd_meta_toml(&config),
        namespace_toml: namespace_toml.to_owned(),
        heartbeat_ms: 200,
        standby_meta: config.shared,
        ..ClusterOptions::default()
    });
    if config.shared {
        cluster.start_peer_meta();
    }
    // Chains start with their members syncing; a heartbeat stuck on the store would
    // hold back the report that makes them serve.
    cluster.wait_healthy(HEAL_LIMIT);
    Some((etcd, cluster))
}

/// Waits (at most 30 s) until the running etcd members have a leader.
fn wait_for_leader(etcd: &LocalEtcd) {
    etcd.wait_for_leader(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The bytes of workload file `i`.
fn file_bytes(i: usize) -> Vec<u8> {
    pseudo_random(4096 + 37 * i, 1000 + i as u64)
}

/// The name file `i` has once the workload is done: every third is renamed.
fn final_name(i: usize) -> String {
    if i % 3 == 1 {
        format!("r{i}")
    } else {
        format!("f{i}")
    }
}

/// One operation of the workload: make file `i` (create, write, fsync, close), rename
/// the one before it on every third, append to the open file and fsync it on every
/// fifth.
fn workload_op(dir: &Path, open: &mut fs::File, i: usize) -> std::io::Result<()> {
    let mut f = fs::File::create_new(dir.join(format!("f{i}")))?;
    f.write_all(&file_bytes(i))?;
    f.sync_all()?;
    drop(f);
    if i % 3 == 2 {
        let j = i - 1;
        fs::rename(dir.join(format!("f{j}")), dir.join(format!("r{j}")))?;
    }
    if i.is_multiple_of(5) {
        open.write_all(&pseudo_random(APPEND, 5000 + i as u64))?;
        open.sync_all()?;
    }
    Ok(())
}

/// Runs [`OPS`] workload operations on a thread of its own, counting them in `done`;
/// returns each operation's time, or the first error with its operation.
fn start_workload(
    dir: PathBuf,
    mut open: fs::File,
    done: Arc<AtomicUsize>,
) -> mpsc::Receiver<Result<Vec<Duration>, String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut times = Vec::with_capacity(OPS);
        let mut result = Ok(());
        for i in 0..OPS {
            if started.elapsed() > WORKLOAD_LIMIT {
                result = Err(format!("workload past {WORKLOAD_LIMIT:?} at operation {i}"));
                break;
            }
            let t = Instant::now();
            if let Err(e) = workload_op(&dir, &mut open, i) {
                result = Err(format!("operation {i}, after {:?}: {e}", t.elapsed()));
                break;
            }
            times.push(t.elapsed());
            done.store(i + 1, Ordering::SeqCst);
        }
        let _ = tx.send(result.map(|()| times));
    });
    rx
}

/// Guards against an error, a lost change or a lost lock when etcd's leader dies under
/// a file-system workload: creates with fsync, renames, appends with fsync to a file
/// held open, and a byte-range lock held by another process, through one mount. The
/// leader is killed (`kill -9`) a third of the way in; every operation must succeed
/// (at most a pause), every answered change be there afterwards, the lock still be
/// held by its owner, the same metadata server still serving, and `fsck` be clean.
#[test]
fn a_killed_etcd_leader_is_a_pause_for_the_file_system() {
    let Some((mut etcd, mut cluster)) = cluster_on_three_members(
        |c| {
            c.request_timeout_ms = 2_000;
            c.retry_for_ms = 20_000;
            // An election slowed by a loaded machine must not cost the server its key.
            c.owner_lease_ms = 15_000;
        },
        "",
    ) else {
        return;
    };
    let m = cluster.mount("m");
    let dir = m.path.join("w");
    fs::create_dir(&dir).expect("mkdir");
    fs::write(m.path.join("locked"), b"lock me").expect("write");
    let mut holder = Agent::start(&User::root(), "holder");
    let mut other = Agent::start(&User::root(), "other");
    let locked = m.path.join("locked");
    holder.expect(&format!("open f {} rw", locked.display()), "ok");
    other.expect(&format!("open f {} rw", locked.display()), "ok");
    holder.expect("lock f ex 0 100", "ok");
    other.expect("lock f ex 10 10", "err EAGAIN");

    let open_path = m.path.join("open.bin");
    let open = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&open_path)
        .expect("create open.bin");
    let done = Arc::new(AtomicUsize::new(0));
    let results = start_workload(dir.clone(), open, done.clone());

    // A third of the way in, the leader goes.
    let deadline = Instant::now() + WORKLOAD_LIMIT;
    while done.load(Ordering::SeqCst) < OPS / 3 {
        assert!(Instant::now() < deadline, "workload stuck before the kill");
        if let Ok(ended) = results.try_recv() {
            panic!("the workload ended before the kill: {ended:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let leader = etcd.leader().expect("a leader");
    etcd.kill(leader);
    let killed_at = done.load(Ordering::SeqCst);
    eprintln!("etcd member {leader} (the leader) killed after operation {killed_at}");

    let times = results
        .recv_timeout(WORKLOAD_LIMIT + Duration::from_secs(10))
        .expect("the workload ended")
        .unwrap_or_else(|e| {
            cluster.print_log_tails(60);
            panic!("an operation failed with etcd's leader killed: {e}")
        });
    let (longest_at, longest) = times
        .iter()
        .enumerate()
        .max_by_key(|(_, t)| **t)
        .map(|(i, t)| (i, *t))
        .expect("operations");
    eprintln!("longest operation: {longest_at}, {longest:?}");
    assert!(
        longest < PAUSE_LIMIT,
        "operation {longest_at} took {longest:?}"
    );
    assert!(cluster.meta_running(), "the metadata server exited");

    // Every answered change is there, with its bytes.
    let mut want: Vec<String> = (0..OPS).map(final_name).collect();
    want.sort();
    let mut names: Vec<String> = fs::read_dir(&dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    names.sort();
    assert_eq!(names, want);
    for i in 0..OPS {
        let back = fs::read(dir.join(final_name(i))).expect("read back");
        assert_eq!(sha256_hex(&back), sha256_hex(&file_bytes(i)), "file {i}");
    }
    let appended: Vec<u8> = (0..OPS)
        .filter(|i| i.is_multiple_of(5))
        .flat_map(|i| pseudo_random(APPEND, 5000 + i as u64))
        .collect();
    let whole = fs::read(&open_path).expect("read open.bin");
    assert_eq!(sha256_hex(&whole), sha256_hex(&appended), "open.bin");
    // The lock is still its owner's.
    other.expect("lock f ex 10 10", "err EAGAIN");
    holder.expect("lock f un 0 100", "ok");
    other.expect("lock f ex 10 10", "ok");

    // The killed member comes back and the cluster takes changes, `fsck` clean.
    etcd.restart(leader).expect("restart the member");
    etcd.wait_ready().expect("etcd ready");
    fs::write(m.path.join("after"), b"after the restart").expect("write after");
    cluster.wait_healthy(HEAL_LIMIT);
    let (code, out) = cluster.tessera(&["fsck"]);
    assert_eq!(code, 0, "fsck: {out}");
}

/// Iterations of each mount's loop in
/// [`a_killed_etcd_leader_is_a_pause_for_two_servers_serving_one_prefix`].
const SHARED_LOOPS: usize = 150;

/// Guards against an error, a lost or doubled change, or a metadata server that stops,
/// when etcd's leader dies under two metadata servers serving one prefix at once
/// (`etcd.shared`): a loop of exclusive creates, renames, unlinks, mkdirs and appends
/// through each of two mounts, one per server, with the leader killed a third of the
/// way in. Both loops must succeed with each change there once, both servers still
/// run (their live keys outlast the election), both mounts read the same, and after the
/// member's restart a new file is made and `fsck` is clean.
#[test]
fn a_killed_etcd_leader_is_a_pause_for_two_servers_serving_one_prefix() {
    use tessera_tests::change_loop::ChangeLoop;
    let Some((mut etcd, mut cluster)) = cluster_on_three_members(
        |c| {
            c.request_timeout_ms = 2_000;
            c.retry_for_ms = 20_000;
            // The servers' live keys: an election slowed by a loaded machine must not
            // cost a server its key.
            c.owner_lease_ms = 15_000;
            c.shared = true;
        },
        "",
    ) else {
        return;
    };
    let (a, b) = (
        cluster.meta_addr().to_string(),
        cluster.peer_meta_addr().to_string(),
    );
    let m1 = cluster.mount_at("m1", &format!("{a},{b}"));
    let m2 = cluster.mount_at("m2", &format!("{b},{a}"));
    fs::create_dir(m1.path.join("one")).expect("mkdir through A");
    fs::create_dir(m2.path.join("two")).expect("mkdir through B");
    let third = SHARED_LOOPS / 3;
    let first = ChangeLoop::start(&m1.path.join("one"), SHARED_LOOPS, third, WORKLOAD_LIMIT);
    let second = ChangeLoop::start(&m2.path.join("two"), SHARED_LOOPS, third, WORKLOAD_LIMIT);
    let leader = etcd.leader().expect("a leader");
    let t = Instant::now();
    etcd.kill(leader);
    eprintln!("etcd member {leader} (the leader) killed");
    for (m, run) in [("first", first), ("second", second)] {
        let (longest, what) = run.finish(WORKLOAD_LIMIT);
        eprintln!("the {m} mount's longest call: {what}, {longest:?}");
        assert!(longest < PAUSE_LIMIT, "{what} took {longest:?}");
    }
    eprintln!("both loops done {:?} after the kill", t.elapsed());
    // How often the election left a commit unanswered (settled by reading it back).
    for log in ["meta.log", "meta-b.log"] {
        let text = fs::read_to_string(cluster.dir().join(log)).unwrap_or_default();
        let settled = text.matches("an unanswered commit").count();
        eprintln!("{log}: {settled} unanswered commits settled");
    }
    assert!(cluster.meta_running(), "metadata server A exited");
    assert!(cluster.peer_meta_running(), "metadata server B exited");
    tessera_tests::change_loop::listed_alike(&m1.path, &m2.path, &["one/w", "two/w"]);

    etcd.restart(leader).expect("restart the member");
    etcd.wait_ready().expect("etcd ready");
    fs::write(m2.path.join("after"), b"after the restart").expect("write after");
    assert_eq!(
        fs::read(m1.path.join("after")).expect("read"),
        b"after the restart"
    );
    cluster.wait_healthy(HEAL_LIMIT);
    let (code, out) = cluster.tessera_at(&b, &["fsck"]);
    assert_eq!(code, 0, "fsck: {out}");
    drop((m1, m2));
}

/// The metadata server's etcd call settings in
/// [`calls_fail_clearly_without_an_etcd_quorum_and_go_on_when_it_returns`]: each
/// attempt this long, retried for this long.
const REQUEST_TIMEOUT_MS: u64 = 1_000;
const RETRY_FOR_MS: u64 = 4_000;
/// The owner lease: longer than the outage, so the server keeps serving through it.
const LONG_OWNER_LEASE_MS: u64 = 30_000;

/// The data servers' lease in that test: well inside the outage.
const NODE_LEASE_MS: u64 = 2_000;
/// How long etcd stays without a quorum: four leases.
const OUTAGE: Duration = Duration::from_secs(8);

/// Changes of the cluster map the metadata server has logged so far.
fn map_changes(cluster: &ProcessCluster) -> usize {
    let log = fs::read_to_string(cluster.dir().join("meta.log")).expect("meta log");
    log.matches("cluster map changed").count()
}

/// Guards against a call that hangs past the configured timeout, a server that stops
/// for good, or a change lost, when etcd loses its quorum: with two of three members
/// stopped, a create through the mount waits and then fails with EIO within about
/// `retry_for_ms` (the metadata server's log says its store is unavailable); a member
/// started again brings the quorum back and the next create succeeds, and what was
/// written before is intact. The data servers, whose heartbeats wait on the store
/// through the outage, are not taken for dead: the cluster map does not change.
#[test]
fn calls_fail_clearly_without_an_etcd_quorum_and_go_on_when_it_returns() {
    let Some((mut etcd, mut cluster)) = cluster_on_three_members(
        |c| {
            c.request_timeout_ms = REQUEST_TIMEOUT_MS;
            c.retry_for_ms = RETRY_FOR_MS;
            c.owner_lease_ms = LONG_OWNER_LEASE_MS;
        },
        &format!("node_lease_ms = {NODE_LEASE_MS}"),
    ) else {
        return;
    };
    let m = cluster.mount("m");
    let before = pseudo_random(300_000, 7);
    fs::write(m.path.join("before"), &before).expect("write before");

    let changes_before = map_changes(&cluster);
    etcd.kill(0);
    etcd.kill(1);
    let t = Instant::now();
    let path = m.path.join("during");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(fs::write(path, b"no quorum"));
    });
    // The server's retries end after RETRY_FOR_MS (and one attempt's timeout); the
    // mount waits at most its call timeout (30 s) in any case.
    let result = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the create answered within 30 s");
    let took = t.elapsed();
    eprintln!("create without a quorum: {result:?} after {took:?}");
    let err = result.expect_err("a create without an etcd quorum succeeded");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(
        took >= Duration::from_millis(RETRY_FOR_MS / 2),
        "failed at once ({took:?}), without waiting for the quorum"
    );
    if took >= Duration::from_millis(RETRY_FOR_MS + 4 * REQUEST_TIMEOUT_MS) {
        cluster.print_log_tails(60);
        panic!("failed only after {took:?}");
    }
    // The metadata server says why, for its operator.
    let log = fs::read_to_string(cluster.dir().join("meta.log")).expect("meta log");
    assert!(log.contains("etcd store unavailable"), "{log}");
    assert!(cluster.meta_running(), "the metadata server exited");

    // The outage outlasts the data servers' lease (heartbeats wait on the store
    // meanwhile): that silence is the store's, and must not take them out of service.
    std::thread::sleep(OUTAGE.saturating_sub(t.elapsed()));

    // One member back: a quorum of two again, and the file system goes on.
    etcd.restart(1).expect("restart member 1");
    etcd.wait_ready().expect("etcd ready");
    // The two elect a leader (about a second); a call made before waits for it only as
    // long as `retry_for_ms`, kept short here.
    wait_for_leader(&etcd);
    let root = m.path.clone();
    let (tx, rx) = mpsc::channel();
    let t = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(fs::write(root.join("after"), b"quorum back"));
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the create answered within 30 s")
        .unwrap_or_else(|e| {
            let log = fs::read_to_string(cluster.dir().join("meta.log")).unwrap_or_default();
            panic!("a create with the quorum back: {e}; the metadata server's log:\n{log}")
        });
    eprintln!("create with the quorum back: {:?}", t.elapsed());
    assert!(cluster.meta_running(), "the metadata server exited");
    // A few heartbeats later: no data server was marked offline, no map changed.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        map_changes(&cluster),
        changes_before,
        "the cluster map changed"
    );
    assert_eq!(
        fs::read(m.path.join("after")).expect("read"),
        b"quorum back"
    );
    assert_eq!(
        sha256_hex(&fs::read(m.path.join("before")).expect("read")),
        sha256_hex(&before)
    );
    cluster.wait_healthy(HEAL_LIMIT);
    let (code, out) = cluster.tessera(&["fsck"]);
    assert_eq!(code, 0, "fsck: {out}");
}
