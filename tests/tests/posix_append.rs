//! `O_APPEND` writes on real mounts, queued and placed in batches (`fs-client/src/file/
//! append.rs`): records read back whole and in order, from one process and from two
//! mounts at once; this mount's reads, stats, plain writes and truncations see its
//! appends placed first; fsynced appends survive a `kill -9` of the mount; and a batch
//! that fails after its writes were answered is reported by fsync and close.
//! They need root and /dev/fuse, as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use tessera_tests::posix::User;
use tessera_tests::{Agent, ClusterOptions, ProcessCluster};

/// A mount whose appends are placed only when something needs them (a read, a stat, a
/// sync, a close...), never by the linger timer within a test: what these tests see is
/// the placement the operation asked for.
const NO_LINGER: &str = "append_linger_ms = 60000\n";

/// Record `seq` of writer `who`: its own bytes, of a length that varies with `seq`,
/// ending in a newline, so that a record cut or mixed with another is seen.
fn record(who: char, seq: usize) -> String {
    let len = 10 + (seq * 37) % 190;
    format!("{who}:{seq:06}:{len:03}:{}\n", who.to_string().repeat(len))
}

/// Checks one line made by [`record`]; returns its writer and number.
fn parse(line: &str) -> (char, usize) {
    let mut parts = line.splitn(4, ':');
    let who = parts.next().unwrap().chars().next().unwrap();
    let seq: usize = parts.next().unwrap().parse().unwrap();
    assert_eq!(format!("{line}\n"), record(who, seq), "record intact");
    (who, seq)
}

fn appender(path: &Path) -> File {
    OpenOptions::new().append(true).open(path).unwrap()
}

/// Guards the order of appends through two descriptors of one mount (one queue per
/// file, placed in order) and around a write larger than the queue (placed alone,
/// after the queue).
#[test]
fn appends_from_one_process_read_back_in_order() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount("m");
    let path = m.path.join("log");
    File::create(&path).unwrap();
    let (mut a, mut b) = (appender(&path), appender(&path));
    let mut want = String::new();
    for seq in 0..3000 {
        let (f, who) = if seq % 3 == 0 {
            (&mut b, 'b')
        } else {
            (&mut a, 'a')
        };
        let r = record(who, seq);
        f.write_all(r.as_bytes()).unwrap();
        want.push_str(&r);
        if seq == 1500 {
            // Larger than an append queue (1 MiB): it goes alone, after the queue.
            let big = format!("{}\n", "B".repeat(3 << 20));
            a.write_all(big.as_bytes()).unwrap();
            want.push_str(&big);
        }
    }
    drop((a, b));
    let got = fs::read_to_string(&path).unwrap();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the records read back in the order written");
}

/// Guards cross-client atomicity with batches: two mounts appending records at once,
/// every record is there once, whole, and each mount's in its own order.
#[test]
fn appends_from_two_mounts_are_whole_and_in_order() {
    const RECORDS: usize = 4000;
    let cluster = ProcessCluster::start(3);
    let (m1, m2) = (cluster.mount("one"), cluster.mount("two"));
    File::create(m1.path.join("log")).unwrap();
    let writers: Vec<_> = [('x', m1.path.join("log")), ('y', m2.path.join("log"))]
        .into_iter()
        .map(|(who, path)| {
            std::thread::spawn(move || {
                let mut f = appender(&path);
                for seq in 0..RECORDS {
                    f.write_all(record(who, seq).as_bytes()).unwrap();
                }
                f.sync_all().unwrap();
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    for m in [&m1, &m2] {
        let text = fs::read_to_string(m.path.join("log")).unwrap();
        assert!(text.ends_with('\n'), "the last record is whole");
        let mut next = [0usize; 2];
        for line in text.lines() {
            let (who, seq) = parse(line);
            let k = usize::from(who == 'y');
            assert_eq!(seq, next[k], "{who}'s records once each, in its order");
            next[k] += 1;
        }
        assert_eq!(next, [RECORDS; 2], "every record of both mounts");
    }
}

/// Guards that this mount's reads and stats see its appends at once, with no linger
/// timer to place them: `fstat`, `stat` by path, `SEEK_END`, a read through another
/// descriptor and through a new open.
#[test]
fn a_stat_or_read_after_an_append_sees_it() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount_with_config("m", NO_LINGER);
    let path = m.path.join("log");
    fs::write(&path, b"head\n").unwrap();
    let mut reader = File::open(&path).unwrap();
    let mut seen = String::new();
    reader.read_to_string(&mut seen).unwrap();
    assert_eq!(seen, "head\n");
    let mut a = appender(&path);
    let mut want = "head\n".to_string();
    for seq in 0..20 {
        let r = record('a', seq);
        a.write_all(r.as_bytes()).unwrap();
        want.push_str(&r);
        let len = want.len() as u64;
        assert_eq!(a.metadata().unwrap().len(), len, "fstat after append {seq}");
        assert_eq!(fs::metadata(&path).unwrap().len(), len, "stat after {seq}");
        let mut more = String::new();
        reader.read_to_string(&mut more).unwrap();
        seen.push_str(&more);
        assert_eq!(seen, want, "another descriptor reads append {seq}");
        let mut probe = File::open(&path).unwrap();
        assert_eq!(probe.seek(SeekFrom::End(0)).unwrap(), len, "SEEK_END");
    }
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        want,
        "a new open reads all"
    );
}

/// Guards the order of appends and what this mount does after them: a plain write
/// lands after (over) the appended bytes, a truncation cuts them, an `O_TRUNC` open
/// too, as on a local file system.
#[test]
fn plain_writes_and_truncations_come_after_earlier_appends() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount_with_config("m", NO_LINGER);
    let path = m.path.join("f");
    File::create(&path).unwrap();
    let mut a = appender(&path);
    let plain = OpenOptions::new().write(true).open(&path).unwrap();
    a.write_all(b"aaaa").unwrap();
    plain.write_all_at(b"B", 0).unwrap();
    a.write_all(b"cc").unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"Baaacc", "pwrite over an append");
    a.write_all(b"dd").unwrap();
    plain.set_len(2).unwrap();
    a.write_all(b"e").unwrap();
    assert_eq!(
        fs::read(&path).unwrap(),
        b"Bae",
        "truncate cuts earlier appends"
    );
    a.write_all(b"ff").unwrap();
    drop(
        OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap(),
    );
    a.write_all(b"g").unwrap();
    drop(a);
    assert_eq!(
        fs::read(&path).unwrap(),
        b"g",
        "O_TRUNC cuts earlier appends"
    );
}

/// Guards against fsync returning while appended bytes are only in the mount's memory:
/// after an fsync and a `kill -9` of the mount, every fsynced record is there.
#[test]
fn fsynced_appends_survive_a_kill_of_the_mount() {
    let cluster = ProcessCluster::start(3);
    let mut m = cluster.mount_with_config("m", NO_LINGER);
    let path = m.path.join("log");
    File::create(&path).unwrap();
    let mut a = appender(&path);
    let mut want = String::new();
    for seq in 0..500 {
        let r = record('s', seq);
        a.write_all(r.as_bytes()).unwrap();
        want.push_str(&r);
    }
    a.sync_all().unwrap();
    for seq in 500..600 {
        // Answered, never synced: may be lost with the mount.
        a.write_all(record('s', seq).as_bytes()).unwrap();
    }
    m.kill_client();
    drop(a);
    let again = cluster.mount("again");
    let got = fs::read_to_string(again.path.join("log")).unwrap();
    assert!(
        got.len() >= want.len() && got[..want.len()] == want,
        "every fsynced record, first: {} bytes of {}",
        got.len(),
        want.len()
    );
}

/// Guards against a batch of appends that fails after its writes were answered being
/// lost in silence: with every data server gone, fsync fails, and so does close. An
/// agent process holds the descriptors: a child another test of this process forks
/// would share them, and its close at `exec` would report the failure first (once per
/// open file, as on Linux).
#[test]
fn a_batch_that_fails_after_the_answer_is_reported_by_fsync_and_close() {
    let mut cluster = ProcessCluster::start_with(ClusterOptions {
        data_servers: 3,
        namespace_toml: "node_lease_ms = 1500\n".into(),
        heartbeat_ms: 200,
        ..ClusterOptions::default()
    });
    let m = cluster.mount_with_config("m", &format!("{NO_LINGER}failover_timeout_ms = 2000\n"));
    let mut agent = Agent::start(&User::root(), "appender");
    for name in ["synced", "closed"] {
        let path = m.path.join(name);
        fs::write(&path, b"head\n").unwrap();
        agent.expect(&format!("open {name} {} a", path.display()), "ok");
    }
    for i in 0..3 {
        cluster.kill_data(i);
    }
    // Queued: answered while no data server could take the bytes.
    agent.expect("pwrite synced 0 a-record-of-the-failed-batch", "ok 28");
    agent.expect("pwrite closed 0 a-record-of-the-failed-batch", "ok 28");
    agent.expect("fsync synced", "err EIO");
    agent.expect("close closed", "err EIO");
    agent.expect("close synced", "ok");
}

/// Guards against appends (and plain writes) made under a lock still waiting on their
/// mount when the lock is released: the next holder, on another mount, must find them,
/// as it did when every append was placed before its `write(2)` returned. With flock
/// and with an fcntl range lock, the linger timer kept out of it.
#[test]
fn what_was_written_under_a_lock_is_seen_by_its_next_holder() {
    use std::os::unix::io::AsRawFd;
    let cluster = ProcessCluster::start(3);
    let a = cluster.mount_with_config("a", NO_LINGER);
    let b = cluster.mount_with_config("b", NO_LINGER);
    fs::write(a.path.join("log"), b"").unwrap();
    fs::write(a.path.join("data"), vec![b'.'; 64]).unwrap();
    let log = appender(&a.path.join("log"));
    let data = OpenOptions::new()
        .write(true)
        .open(a.path.join("data"))
        .unwrap();
    let fcntl = |f: &File, kind: i32| {
        // SAFETY: plain data, zero is a valid bit pattern.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        // SAFETY: a valid descriptor and a valid struct flock.
        let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLKW, &fl) };
        assert_eq!(r, 0, "fcntl: {}", std::io::Error::last_os_error());
    };
    let flock = |f: &File, op: i32| {
        // SAFETY: a valid descriptor.
        let r = unsafe { libc::flock(f.as_raw_fd(), op) };
        assert_eq!(r, 0, "flock: {}", std::io::Error::last_os_error());
    };
    let mut want = String::new();
    for seq in 0..3 {
        let r = record('a', seq);
        flock(&log, libc::LOCK_EX);
        (&log).write_all(r.as_bytes()).unwrap();
        want.push_str(&r);
        flock(&log, libc::LOCK_UN);
        assert_eq!(
            fs::read_to_string(b.path.join("log")).unwrap(),
            want,
            "after flock's unlock {seq}"
        );
    }
    let r = record('a', 3);
    fcntl(&log, libc::F_WRLCK);
    (&log).write_all(r.as_bytes()).unwrap();
    want.push_str(&r);
    fcntl(&log, libc::F_UNLCK);
    assert_eq!(
        fs::read_to_string(b.path.join("log")).unwrap(),
        want,
        "after fcntl's unlock"
    );
    // A plain write under a lock, as an NFS client flushes it before the unlock.
    fcntl(&data, libc::F_WRLCK);
    data.write_all_at(b"written under the lock", 8).unwrap();
    fcntl(&data, libc::F_UNLCK);
    let seen = fs::read(b.path.join("data")).unwrap();
    assert_eq!(&seen[8..30], b"written under the lock");
}
