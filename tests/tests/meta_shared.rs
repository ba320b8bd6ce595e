//! Two metadata servers serving one etcd prefix at once (`etcd.shared`), each with a
//! mount of its own: what one mount writes and closes the other reads, names change
//! through either; then the server of the first mount (the leader, which the data
//! servers heartbeat to) is killed with SIGKILL: the first mount goes on through the
//! other server (its open file keeps writing and its `fsync` succeeds, its lock is
//! still its own), the other server leads and hears every data server. Real processes,
//! two real FUSE mounts, a real etcd on 127.0.0.1 with its data on /dev/shm. A data
//! server that asks the follower first is sent on to the leader.

use meta_server::kv::etcd::local::LocalEtcd;
use meta_server::kv::EtcdConfig;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use tessera_tests::{pseudo_random, sha256_hex, ClusterOptions, ProcessCluster};

const MIB: usize = 1 << 20;
/// The servers' live-key lease: the survivor leads this long (and some) after the kill.
const LEASE_MS: u64 = 2000;
/// The servers' session grace: what a dead server held and no client took back
/// elsewhere ends this long after its live key went.
const GRACE_MS: u64 = 5000;
/// How long any one file operation may take across the failover.
const OP_LIMIT: Duration = Duration::from_secs(60);
/// How long the surviving server may take to lead.
const TAKE_OVER_LIMIT: Duration = Duration::from_secs(30);

/// Tries an exclusive `flock` without waiting: whether it was taken.
fn try_flock(f: &fs::File) -> bool {
    // SAFETY: a plain syscall on an open descriptor.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Two metadata servers A and B serving one prefix of a one-member etcd started for the
/// test (lease [`LEASE_MS`]), three data servers heartbeating every 200 ms; `None`,
/// after saying so, where no etcd binary is installed (never under CI). The etcd is
/// returned to be kept (it stops when dropped), then the cluster and A's and B's
/// addresses.
fn shared_cluster() -> Option<(LocalEtcd, ProcessCluster, String, String)> {
    if !LocalEtcd::present_for_tests() {
        return None;
    }
    let etcd = LocalEtcd::start(1).expect("etcd");
    let etcd_config = EtcdConfig {
        owner_lease_ms: LEASE_MS,
        shared: true,
        ..etcd.config()
    };
    let mut cluster = ProcessCluster::start_with(ClusterOptions {
        data_servers: 3,
        meta_toml: tessera_tests::etcd_meta_toml(&etcd_config),
        // A short node lease and grace: the survivor sees the data servers' beats
        // soon, and ends what the dead server held soon.
        namespace_toml: format!("node_lease_ms = 1000\nsession_grace_ms = {GRACE_MS}"),
        heartbeat_ms: 200,
        standby_meta: true,
        ..ClusterOptions::default()
    });
    cluster.start_peer_meta();
    let (a, b) = (
        cluster.meta_addr().to_string(),
        cluster.peer_meta_addr().to_string(),
    );
    Some((etcd, cluster, a, b))
}

#[test]
fn two_metadata_servers_serve_one_namespace_and_one_survives_the_others_kill() {
    let Some((_etcd, mut cluster, a, b)) = shared_cluster() else {
        return;
    };
    // A data server that asks the follower first is sent on to the leader.
    cluster.restart_data_at(2, &format!("{b},{a}"));
    let deadline = Instant::now() + TAKE_OVER_LIMIT;
    while !fs::read_to_string(cluster.dir().join("data-2.log"))
        .unwrap_or_default()
        .contains("sent this data server elsewhere")
    {
        assert!(
            Instant::now() < deadline,
            "the follower did not send data server 2 on"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster.wait_healthy(Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        cluster.up_nodes(&a),
        Some(3),
        "the leader does not hear data server 2"
    );
    let m1 = cluster.mount_at("m1", &format!("{a},{b}"));
    let m2 = cluster.mount_at("m2", &format!("{b},{a}"));

    // Close-to-open, both ways, and names changed through either server.
    let one = pseudo_random(3 * MIB + 5, 1);
    fs::write(m1.path.join("one"), &one).expect("write through A");
    assert_eq!(fs::read(m2.path.join("one")).expect("read through B"), one);
    let two = pseudo_random(MIB + 17, 2);
    fs::write(m2.path.join("two"), &two).expect("write through B");
    assert_eq!(fs::read(m1.path.join("two")).expect("read through A"), two);
    fs::create_dir(m2.path.join("d")).expect("mkdir through B");
    fs::rename(m1.path.join("one"), m1.path.join("d/one")).expect("rename through A");
    // B's mount may answer from what it knew for the entry lifetime (`entry_ttl_ms`,
    // 1 s: the kernel's names, and its own list of `d`, which it made empty), as a
    // second mount of one server does.
    let lifetimes = Duration::from_secs(5);
    let gone = || !m2.path.join("one").exists();
    tessera_tests::wait_until_blocking("B to see the old name gone", lifetimes, gone);
    let there = || m2.path.join("d/one").exists();
    tessera_tests::wait_until_blocking("B to see the new name", lifetimes, there);
    assert_eq!(fs::read(m2.path.join("d/one")).expect("read renamed"), one);
    // Only one of two exclusive creates of one name wins.
    let excl = |p: std::path::PathBuf| fs::OpenOptions::new().write(true).create_new(true).open(p);
    let first = excl(m1.path.join("x"));
    let second = excl(m2.path.join("x"));
    assert!(first.is_ok(), "{first:?}");
    assert_eq!(
        second.unwrap_err().kind(),
        std::io::ErrorKind::AlreadyExists
    );

    // A file open for writing through A, locked, across A's death.
    let before = pseudo_random(4 * MIB, 3);
    let after = pseudo_random(2 * MIB + 9, 4);
    let mut open = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(m1.path.join("open.bin"))
        .expect("create open.bin");
    assert!(try_flock(&open), "lock through A");
    let other = fs::File::open(m2.path.join("open.bin")).expect("open through B");
    assert!(!try_flock(&other), "B's client took a lock A's holds");
    open.write_all(&before).expect("write before");
    open.sync_all().expect("fsync before");

    let t = Instant::now();
    cluster.kill_meta();
    eprintln!("killed the metadata server at {a} (the leader)");
    let written = after.clone();
    let mut open = tessera_tests::bounded("write and fsync after the kill", OP_LIMIT, move || {
        open.write_all(&written).expect("write after");
        open.sync_all().expect("fsync after");
        open
    });
    let p = m1.path.join("new-after");
    tessera_tests::bounded(
        "create through A's mount after the kill",
        OP_LIMIT,
        move || fs::write(p, b"made after").expect("create after"),
    );
    // B leads once A's live key is gone (a lease after the kill), and from then on
    // hears the data servers: a leader that did not would take them for dead one node
    // lease (1 s) after it began to lead.
    let log = cluster.dir().join("meta-b.log");
    let deadline = Instant::now() + TAKE_OVER_LIMIT;
    while !fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("this metadata server leads")
    {
        assert!(
            Instant::now() < deadline,
            "the survivor does not lead {TAKE_OVER_LIMIT:?} after the kill"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("{b} leads {:?} after the kill", t.elapsed());
    let led = Instant::now();
    // The lock is still its owner's past the time B ends what A held and no client
    // took back (A's lease, then the session grace): the mount took it back on B.
    let ended = Duration::from_millis(LEASE_MS + GRACE_MS + 1500);
    std::thread::sleep(ended.saturating_sub(t.elapsed()));
    assert!(!try_flock(&other), "the lock was lost with its server");
    // SAFETY: a plain syscall on an open descriptor.
    assert_eq!(unsafe { libc::flock(open.as_raw_fd(), libc::LOCK_UN) }, 0);
    assert!(try_flock(&other), "the released lock is not free");
    drop(other);

    // Everything answered before and after is there, read through either mount.
    open.seek(SeekFrom::Start(0)).expect("seek");
    let mut back = Vec::new();
    open.read_to_end(&mut back).expect("read back");
    drop(open);
    let whole: Vec<u8> = [before, after].concat();
    assert_eq!(sha256_hex(&back), sha256_hex(&whole));
    let through_b = fs::read(m2.path.join("open.bin")).expect("read through B");
    assert_eq!(sha256_hex(&through_b), sha256_hex(&whole));
    assert_eq!(
        fs::read(m2.path.join("new-after")).expect("read"),
        b"made after"
    );
    assert_eq!(fs::read(m1.path.join("d/one")).expect("read"), one);

    std::thread::sleep(Duration::from_millis(3000).saturating_sub(led.elapsed()));
    assert_eq!(
        cluster.up_nodes(&b),
        Some(3),
        "the leader does not hear the data servers"
    );
    let (code, out) = cluster.tessera_at(&b, &["fsck"]);
    assert_eq!(code, 0, "fsck: {out}");
    drop((m1, m2));
}

/// Iterations of each mount's loop in
/// [`changes_under_way_through_both_servers_when_one_dies_are_applied_once`].
const CHANGE_LOOPS: usize = 300;

/// Creates, renames, unlinks, mkdirs and appends through both mounts, one per server,
/// across a `kill -9` of A (stopped first, so that a call of the first mount is under
/// way): every call of both loops succeeds and each change is there once (the first
/// mount's changes go to B under their ids), each folder read the same through both
/// mounts, and `tessera fsck` is clean.
#[test]
fn changes_under_way_through_both_servers_when_one_dies_are_applied_once() {
    use tessera_tests::change_loop::ChangeLoop;
    let Some((_etcd, mut cluster, a, b)) = shared_cluster() else {
        return;
    };
    let m1 = cluster.mount_at("m1", &format!("{a},{b}"));
    let m2 = cluster.mount_at("m2", &format!("{b},{a}"));
    fs::create_dir(m1.path.join("one")).expect("mkdir through A");
    fs::create_dir(m2.path.join("two")).expect("mkdir through B");
    let first = ChangeLoop::start(&m1.path.join("one"), CHANGE_LOOPS, 30, OP_LIMIT);
    let second = ChangeLoop::start(&m2.path.join("two"), CHANGE_LOOPS, 30, OP_LIMIT);
    let t = Instant::now();
    cluster.freeze_then_kill_meta(Duration::from_millis(300));
    for (m, run) in [("first", first), ("second", second)] {
        let ended =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.finish(2 * OP_LIMIT)));
        let (longest, what) = ended.unwrap_or_else(|e| {
            eprintln!("the {m} mount's loop failed");
            cluster.print_log_tails(80);
            std::panic::resume_unwind(e)
        });
        eprintln!("the {m} mount's longest call: {what}, {longest:?}");
    }
    eprintln!("both loops done {:?} after the kill", t.elapsed());
    tessera_tests::change_loop::listed_alike(&m1.path, &m2.path, &["one/w", "two/w"]);
    let (code, out) = cluster.tessera_at(&b, &["fsck"]);
    assert_eq!(code, 0, "fsck: {out}");
    drop((m1, m2));
}

/// Calls of each mount's loop in
/// [`concurrent_creates_renames_and_unlinks_through_two_servers_equal_one_serial_order`].
const RACE_CALLS: usize = 1500;
/// The names both loops race on: few, so that most calls meet the other's.
const RACE_NAMES: [&str; 8] = [
    "d0/n0", "d0/n1", "d0/n2", "d0/n3", "d1/n0", "d1/n1", "d1/n2", "d1/n3",
];

/// One mount's loop: seeded exclusive creates (each writing a token of its own),
/// renames (over the target when there is one, within and across two folders) and
/// unlinks of [`RACE_NAMES`], each timed from `origin`. Any answer but success, EEXIST
/// or ENOENT fails the test.
fn race(
    root: std::path::PathBuf,
    client: u64,
    seed: u64,
    origin: Instant,
) -> Vec<tessera_tests::serial::Call> {
    use std::io::ErrorKind;
    use tessera_tests::serial::{Answer, Call, Change};
    let mut rng = tessera_tests::Rng::new(seed);
    let mut calls = Vec::with_capacity(RACE_CALLS);
    let at = |name: &str| root.join(name);
    for i in 0..RACE_CALLS {
        let one = rng.index(RACE_NAMES.len());
        let name = RACE_NAMES[one].to_string();
        let change = match rng.below(100) {
            0..=39 => Change::Create {
                name,
                token: client << 32 | i as u64,
            },
            40..=74 => {
                let mut other = rng.index(RACE_NAMES.len());
                while other == one {
                    other = rng.index(RACE_NAMES.len());
                }
                // Client 0 renames to a later name of the list, client 1 to an earlier
                // one (see the test).
                let (from, to) = match (one < other) == (client == 0) {
                    true => (one, other),
                    false => (other, one),
                };
                Change::Rename {
                    from: RACE_NAMES[from].to_string(),
                    to: RACE_NAMES[to].to_string(),
                }
            }
            _ => Change::Unlink { name },
        };
        let start = origin.elapsed().as_nanos() as u64;
        let result = match &change {
            Change::Create { name, token } => fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(at(name))
                .and_then(|mut f| f.write_all(token.to_string().as_bytes())),
            Change::Rename { from, to } => fs::rename(at(from), at(to)),
            Change::Unlink { name } => fs::remove_file(at(name)),
        };
        let end = origin.elapsed().as_nanos() as u64;
        let answer = match result {
            Ok(()) => Answer::Done,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Answer::Exists,
            Err(e) if e.kind() == ErrorKind::NotFound => Answer::Missing,
            Err(e) => panic!("client {client} call {i} {change:?}: {e}"),
        };
        calls.push(Call {
            change,
            answer,
            start,
            end,
        });
    }
    calls
}

/// The names under `root` (of [`RACE_NAMES`]'s two folders) and the token each holds.
fn race_names(root: &std::path::Path) -> tessera_tests::serial::Names {
    let mut names = tessera_tests::serial::Names::new();
    for dir in ["d0", "d1"] {
        for e in fs::read_dir(root.join(dir)).expect("list") {
            let name = format!("{dir}/{}", e.expect("entry").file_name().to_string_lossy());
            let text = fs::read_to_string(root.join(&name)).expect("read");
            let token = text
                .parse()
                .unwrap_or_else(|_| panic!("{name} holds {text:?}"));
            names.insert(name, token);
        }
    }
    names
}

/// Two mounts, one per server, race seeded exclusive creates, renames and unlinks of
/// the same eight names ([`RACE_CALLS`] calls each; `TESSERA_SHARED_SEED` replays a
/// run): the names at the end, and every answer, are those of one serial order of the
/// calls that keeps real time (no two creates of one name both won, no rename lost or
/// doubled a file); both mounts list the same names; `tessera fsck` is clean. The
/// mounts keep no names or attributes (lifetimes 0), so each call is the servers'.
///
/// One answer is the kernel's own: a rename whose two names it looked up (one after
/// the other) as one file succeeds without asking the file system (`vfs_rename`: the
/// same inode at both ends), which no serial order explains when the other mount moved
/// the file from the first name to the second between the two lookups; any file system
/// shared by two kernels answers so. So the first mount renames only to a name later
/// in [`RACE_NAMES`], the second only to an earlier one: neither can move a file from
/// one of the other's rename's names to its other name, however many renames it makes.
#[test]
fn concurrent_creates_renames_and_unlinks_through_two_servers_equal_one_serial_order() {
    let Some((_etcd, cluster, a, b)) = shared_cluster() else {
        return;
    };
    let fresh = "entry_ttl_ms = 0\nattr_ttl_ms = 0\n";
    let m1 = cluster.mount_with("m1", fresh, &a);
    let m2 = cluster.mount_with("m2", fresh, &b);
    fs::create_dir(m1.path.join("d0")).expect("mkdir");
    fs::create_dir(m2.path.join("d1")).expect("mkdir");
    let seed = tessera_tests::client_io::seed_from_env("TESSERA_SHARED_SEED");
    let origin = Instant::now();
    let running: Vec<_> = [&m1, &m2]
        .iter()
        .enumerate()
        .map(|(c, m)| {
            let root = m.path.clone();
            let seed = seed.wrapping_add(c as u64);
            std::thread::spawn(move || race(root, c as u64, seed, origin))
        })
        .collect();
    let loops: Vec<_> = tessera_tests::bounded("the racing loops", 4 * OP_LIMIT, move || {
        running
            .into_iter()
            .map(|l| l.join().expect("a racing loop"))
            .collect()
    });
    eprintln!("{} calls in {:?}", 2 * RACE_CALLS, origin.elapsed());
    let end = race_names(&m1.path);
    assert_eq!(race_names(&m2.path), end, "the mounts list different names");
    let answered = loops
        .iter()
        .flatten()
        .filter(|c| c.answer == tessera_tests::serial::Answer::Done)
        .count();
    assert!(answered > RACE_CALLS / 2, "too few calls changed anything");
    let t = Instant::now();
    let order = tessera_tests::serial::serial_order(&loops, &Default::default(), &end);
    if let Err(why) = &order {
        panic!("seed {seed}: {why}");
    }
    eprintln!(
        "{answered} changes, {} names at the end, one serial order found in {:?}",
        end.len(),
        t.elapsed()
    );
    let (code, out) = cluster.tessera_at(&a, &["fsck"]);
    assert_eq!(code, 0, "fsck: {out}");
    drop((m1, m2));
}
