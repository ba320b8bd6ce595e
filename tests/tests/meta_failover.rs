//! A standby metadata server on the same etcd: a cluster whose data servers and mount
//! know two metadata addresses (`A,B`) goes on when A is killed (`kill -9`) and B is
//! started on A's etcd prefix: the open file keeps writing and its `fsync` succeeds,
//! new files are made, what was written before reads back, and the data servers
//! heartbeat to B. Real processes, a real FUSE mount, a real etcd on 127.0.0.1 with its
//! data on /dev/shm.

use meta_server::kv::etcd::local::LocalEtcd;
use meta_server::kv::{EtcdConfig, StoreKind};
use meta_server::server::{MetaConfig, MetaServer};
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};
use tessera_tests::{pseudo_random, sha256_hex, ClusterOptions, ProcessCluster};

/// The metadata servers' node lease (a data server not heard from for this long is
/// down), short so that the test sees past B's load-time grace.
const NODE_LEASE_MS: u64 = 1000;
const MIB: usize = 1 << 20;
/// How long any one file operation may take across the failover: the mount waits
/// `meta_wait_ms` for a metadata server to answer, and B needs a start.
const OP_LIMIT: Duration = Duration::from_secs(60);
/// How long B may take to see all three data servers' heartbeats.
const REGISTER_LIMIT: Duration = Duration::from_secs(30);

/// The owner lease of the test's metadata servers: B, started right after A's kill,
/// waits it out.
const OWNER_LEASE_MS: u64 = 2000;

/// Starts one more metadata server on `etcd`'s prefix, in this process, refusing at
/// once if the owner key is held; returns its start error.
fn second_server_refused(etcd: EtcdConfig) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = MetaConfig {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.path().join("meta-c"),
        store: StoreKind::Etcd,
        etcd: EtcdConfig {
            owner_wait_ms: 0,
            ..etcd
        },
        insecure: true,
        ..MetaConfig::default()
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    match rt.block_on(MetaServer::start(config)) {
        Ok(_) => panic!("a second metadata server started on a served prefix"),
        Err(e) => format!("{:?}", anyhow::Error::from(e)),
    }
}

/// A cluster whose metadata server and its standby share a one-member etcd started for
/// the test, owner lease [`OWNER_LEASE_MS`], data servers heartbeating every 200 ms;
/// `None`, after saying so, where no etcd binary is installed (never under CI). The
/// etcd is returned to be kept (it stops when dropped).
fn etcd_cluster(
    data_servers: usize,
    namespace_toml: String,
    data_toml: String,
) -> Option<(LocalEtcd, EtcdConfig, ProcessCluster)> {
    if !LocalEtcd::present_for_tests() {
        return None;
    }
    let etcd = LocalEtcd::start(1).expect("etcd");
    let etcd_config = EtcdConfig {
        owner_lease_ms: OWNER_LEASE_MS,
        ..etcd.config()
    };
    let cluster = ProcessCluster::start_with(ClusterOptions {
        data_servers,
        meta_toml: tessera_tests::etcd_meta_toml(&etcd_config),
        namespace_toml,
        data_toml,
        heartbeat_ms: 200,
        standby_meta: true,
        ..ClusterOptions::default()
    });
    Some((etcd, etcd_config, cluster))
}

#[test]
fn a_standby_metadata_server_on_the_same_etcd_takes_over() {
    // A short node lease: B counts every data server live for one lease when it loads
    // (membership's grace), so only "up" well past it shows heartbeats reached B.
    let namespace = format!("node_lease_ms = {NODE_LEASE_MS}");
    let Some((_etcd, etcd_config, mut cluster)) = etcd_cluster(3, namespace, String::new()) else {
        return;
    };
    let a = cluster.meta_addr().to_string();
    let addrs = cluster.meta_addrs().to_string();
    assert!(addrs.starts_with(&format!("{a},")), "{addrs}");
    let m = cluster.mount("m");

    // Closed files, and one file open for writing across the failover.
    let closed: Vec<Vec<u8>> = (0..8u64).map(|i| pseudo_random(MIB + 100, i)).collect();
    for (i, data) in closed.iter().enumerate() {
        fs::write(m.path.join(format!("f{i}")), data).expect("write");
    }
    let first = pseudo_random(6 * MIB, 100);
    let second = pseudo_random(5 * MIB + 7, 101);
    let open_path = m.path.join("open.bin");
    let mut open = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&open_path)
        .expect("create open.bin");
    open.write_all(&first).expect("write before");
    open.sync_all().expect("fsync before");

    let t = Instant::now();
    cluster.fail_over_meta();
    let b_listening = Instant::now();
    eprintln!("A killed, B listening after {:?}", t.elapsed());
    let b = cluster.meta_addr().to_string();
    assert_ne!(a, b);
    assert!(addrs.ends_with(&format!(",{b}")), "{addrs}");
    // B waited out A's lease (A died holding it) before it listened.
    let b_log = fs::read_to_string(cluster.dir().join("meta-b.log")).expect("B's log");
    assert!(b_log.contains("owner key held: waiting"), "{b_log}");
    // While B serves, a third server on the prefix is refused, naming B.
    let refused = second_server_refused(etcd_config.clone());
    assert!(refused.contains(&format!("served by {b}")), "{refused}");

    // The open file writes on and its fsync succeeds, through B.
    let second_copy = second.clone();
    let open = tessera_tests::bounded("write and fsync of the open file", OP_LIMIT, move || {
        open.seek(SeekFrom::End(0)).expect("seek");
        open.write_all(&second_copy)
            .expect("write after the failover");
        open.sync_all().expect("fsync after the failover");
        open
    });
    // New files are made.
    let made: Vec<Vec<u8>> = (0..4u64).map(|i| pseudo_random(300_000, 200 + i)).collect();
    let root = m.path.clone();
    let copies = made.clone();
    tessera_tests::bounded("creates after the failover", OP_LIMIT, move || {
        for (i, data) in copies.iter().enumerate() {
            fs::write(root.join(format!("g{i}")), data).expect("create after the failover");
        }
    });
    // What was written before reads back, the open file's bytes before its close too.
    let mut head = vec![0; 4096];
    open.read_exact_at(&mut head, 0)
        .expect("read the open file");
    assert_eq!(head, first[..4096]);
    drop(open);
    for (i, data) in closed.iter().enumerate() {
        let back = fs::read(m.path.join(format!("f{i}"))).expect("read back");
        assert_eq!(sha256_hex(&back), sha256_hex(data), "f{i}");
    }
    let whole = fs::read(&open_path).expect("read open.bin");
    assert_eq!(whole.len(), first.len() + second.len());
    assert_eq!(sha256_hex(&whole[..first.len()]), sha256_hex(&first));
    assert_eq!(sha256_hex(&whole[first.len()..]), sha256_hex(&second));
    for (i, data) in made.iter().enumerate() {
        let back = fs::read(m.path.join(format!("g{i}"))).expect("read new file");
        assert_eq!(sha256_hex(&back), sha256_hex(data), "g{i}");
    }
    let names = fs::read_dir(&m.path).expect("list").count();
    assert_eq!(names, closed.len() + 1 + made.len());

    // B has only the heartbeats it received itself once its load-time grace (one node
    // lease) is over: all three up after it means all three moved on to it.
    let past_grace = b_listening + 3 * Duration::from_millis(NODE_LEASE_MS);
    std::thread::sleep(past_grace.saturating_duration_since(Instant::now()));
    let deadline = Instant::now() + REGISTER_LIMIT;
    loop {
        let up = cluster.up_nodes(&b);
        if up == Some(3) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "data servers up on B after {REGISTER_LIMIT:?}: {up:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("three data servers up on B after {:?}", t.elapsed());
    // The mount moved to B and took its open file along.
    let log = m.log_text();
    assert!(log.contains("connected to another address"), "{log}");
    let resumed = log
        .lines()
        .rfind(|l| l.contains("open files resumed"))
        .unwrap_or_else(|| panic!("no resume in the mount's log:\n{log}"));
    assert!(resumed.contains("lost=0"), "{resumed}");
}

/// The call timeout of the mount and the data servers in
/// [`a_metadata_server_that_hangs_is_passed_over_for_its_standby`]: a server that
/// answers nothing holds a call this long before the link moves on.
const CALL_TIMEOUT_MS: u64 = 3000;

/// Guards against clients and data servers staying on a metadata server that stopped
/// answering without closing its connections (SIGSTOP here; a hung process or a paused
/// machine alike) while a standby serves: each call timed out after the call timeout,
/// on the same connection, for as long as the server stayed stopped. Now a call that
/// times out moves the link to the next address. Also: the stopped server, let run
/// again, finds its lease lost and exits, and its writes are fenced meanwhile (what B
/// made is intact).
#[test]
fn a_metadata_server_that_hangs_is_passed_over_for_its_standby() {
    let limits = format!("[transport_limits]\ncall_timeout_ms = {CALL_TIMEOUT_MS}\n");
    let namespace = format!("node_lease_ms = {NODE_LEASE_MS}");
    let Some((_etcd, _, mut cluster)) = etcd_cluster(3, namespace, limits.clone()) else {
        return;
    };
    let m = cluster.mount_with_config("m", &limits);
    let before = pseudo_random(2 * MIB + 3, 300);
    fs::write(m.path.join("before"), &before).expect("write before");

    let t = Instant::now();
    cluster.pause_and_fail_over_meta();
    eprintln!("A stopped, B listening after {:?}", t.elapsed());
    let b = cluster.meta_addr().to_string();

    // A file made and synced through B: the mount's calls to A time out once, then it
    // connects to B. A change that timed out is sent again under its id (B applies it,
    // or answers from A's record): the first attempt succeeds.
    let after = pseudo_random(MIB + 5, 301);
    let root = m.path.clone();
    let copy = after.clone();
    let took = Instant::now();
    let tries = tessera_tests::bounded(
        "create, write and fsync with A stopped",
        OP_LIMIT,
        move || {
            for attempt in 1..=3 {
                let made = fs::File::create(root.join("after")).and_then(|mut f| {
                    f.write_all(&copy)?;
                    f.sync_all()
                });
                match made {
                    Ok(()) => return attempt,
                    Err(e) => eprintln!("attempt {attempt}: {e}"),
                }
            }
            panic!("no create went through B in three attempts");
        },
    );
    eprintln!("made through B after {:?}, attempt {tries}", took.elapsed());
    assert_eq!(tries, 1, "a change that timed out on A failed");
    assert_eq!(fs::read(m.path.join("after")).expect("read"), after);
    assert_eq!(fs::read(m.path.join("before")).expect("read"), before);
    let log = m.log_text();
    assert!(log.contains("a call timed out"), "{log}");

    // The data servers moved on too: all three up on B by their own heartbeats.
    let deadline = Instant::now() + REGISTER_LIMIT;
    while cluster.up_nodes(&b) != Some(3) {
        assert!(Instant::now() < deadline, "data servers not all up on B");
        std::thread::sleep(Duration::from_millis(200));
    }

    // A runs again: its lease is gone, so it stops by itself, writing nothing.
    let status = cluster.resume_paused_meta(Duration::from_secs(20));
    let status = status.expect("A still runs 20 s after it was let run again");
    assert!(!status.success(), "A exited with {status}");
    let a_log = fs::read_to_string(cluster.dir().join("meta.log")).expect("A's log");
    assert!(a_log.contains("owner key"), "{a_log}");
    assert_eq!(fs::read(m.path.join("after")).expect("read"), after);
    let names = fs::read_dir(&m.path).expect("list").count();
    assert_eq!(names, 2);
}

/// The lock grace of [`locks_are_still_held_by_their_owners_after_a_failover`]'s
/// servers: new locks are refused this long after B starts.
const LOCK_GRACE_MS: u64 = 3000;

/// Guards against locks lost with their metadata server (they lived only in its
/// memory): a byte-range lock and a whole-file lock held through one mount stay held
/// across a `kill -9` of the serving server and the standby's start (the holder's
/// mount takes them back on its new connection), another mount cannot take them
/// meanwhile nor after, and the holder's unlock frees them.
#[test]
fn locks_are_still_held_by_their_owners_after_a_failover() {
    use tessera_tests::posix::User;
    use tessera_tests::Agent;
    let namespace = format!("replicas = 1\nlock_grace_ms = {LOCK_GRACE_MS}");
    let Some((_etcd, _, mut cluster)) = etcd_cluster(1, namespace, String::new()) else {
        return;
    };
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    fs::write(a.path.join("f"), b"lock me").expect("write");
    fs::write(a.path.join("g"), b"and me").expect("write");
    let open = |name: &str, m: &tessera_tests::Mount, file: &str| {
        let mut ag = Agent::start(&User::root(), name);
        ag.expect(&format!("open f {} rw", m.path.join(file).display()), "ok");
        ag
    };
    let mut holder = open("holder", &a, "f");
    let mut flocker = open("flocker", &a, "g");
    let mut other = open("other", &b, "f");
    let mut other_g = open("other-g", &b, "g");
    holder.expect("lock f ex 0 100", "ok");
    flocker.expect("flock f ex nb", "ok");
    other.expect("lock f ex 50 10", "err EAGAIN");
    other_g.expect("flock f ex nb", "err EAGAIN");

    let t = Instant::now();
    cluster.fail_over_meta();
    eprintln!("A killed, B listening after {:?}", t.elapsed());
    // At once (B in its lock grace, or the holder's mount already back), and again
    // past the grace: the locks are held.
    other.expect("lock f ex 50 10", "err EAGAIN");
    other_g.expect("flock f ex nb", "err EAGAIN");
    std::thread::sleep(Duration::from_millis(LOCK_GRACE_MS + 500));
    other.expect("lock f ex 50 10", "err EAGAIN");
    other_g.expect("flock f ex nb", "err EAGAIN");
    // Outside the held range nothing is locked.
    other.expect("lock f ex 100 10", "ok");
    // The holders' mount took them back, and their owners can unlock them.
    let log = a.log_text();
    assert!(log.contains("locks taken back"), "{log}");
    holder.expect("lock f un 0 100", "ok");
    flocker.expect("flock f un", "ok");
    other.expect("lock f ex 50 10", "ok");
    other_g.expect("flock f ex nb", "ok");
}

/// Iterations of [`changes_in_flight_when_their_server_dies_are_applied_once`]'s loop.
const CHANGE_LOOPS: usize = 400;
/// Iterations done before the server is killed.
const LOOPS_BEFORE_KILL: usize = 40;

/// Guards against a change that was under way when its metadata server died failing
/// with EIO (the mount could not tell whether it was applied, so it did not send it
/// again) or, sent again, being applied twice. Every change now carries an id, and the
/// server records its answer with it in the engine: the standby answers a change A
/// applied from that record, and applies one A never applied. A loop of exclusive
/// creates, renames, unlinks, mkdirs and `O_APPEND` writes through the mount runs across
/// a `kill -9` of A (stopped first, so that a call is under way); every call succeeds (a create or mkdir applied twice would fail
/// `EEXIST`, a rename or unlink `ENOENT`, an append would leave a line twice) and the
/// namespace is what the loop made, once.
#[test]
fn changes_in_flight_when_their_server_dies_are_applied_once() {
    use tessera_tests::change_loop::ChangeLoop;
    let Some((_etcd, _, mut cluster)) = etcd_cluster(1, "replicas = 1".into(), String::new())
    else {
        return;
    };
    let m = cluster.mount("m");
    let run = ChangeLoop::start(&m.path, CHANGE_LOOPS, LOOPS_BEFORE_KILL, OP_LIMIT);
    let t = Instant::now();
    // The loop's next call reaches A and waits; then A dies under it.
    cluster.freeze_then_fail_over_meta(Duration::from_millis(300));
    eprintln!("A killed, B listening after {:?}", t.elapsed());
    let (longest, what) = run.finish(2 * OP_LIMIT);
    eprintln!("the longest call: {what}, {longest:?}");
    eprintln!("loop done {:?} after the kill", t.elapsed());
    let waited = m
        .log_text()
        .lines()
        .filter(|l| l.contains("waiting for it"))
        .count();
    let b_log = fs::read_to_string(cluster.dir().join("meta-b.log")).expect("B's log");
    let replayed = b_log
        .lines()
        .filter(|l| l.contains("answered from its record"))
        .count();
    eprintln!("calls that waited for B: {waited}, answered from a record: {replayed}");
}
