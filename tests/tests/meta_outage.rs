//! A metadata server that goes away and comes back on its address (a crash and restart)
//! under a live mount: files the mount had closed stay closed (the server is not told
//! they are open, so their space is freed when they are removed), and files it has open
//! keep working: reads to the end, `fstat`, and then `fsync` and `close` that wait for
//! the server instead of failing. Real processes and a real FUSE mount.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};
use tessera_tests::agent::Agent;
use tessera_tests::posix::{chunk_files, wait_chunks, wait_until, User};
use tessera_tests::{pseudo_random, sha256_hex, ClusterOptions, Mount, ProcessCluster};

const MIB: usize = 1 << 20;
/// How long a mount may take to notice the restarted server and say so in its log.
const NOTICE: Duration = Duration::from_secs(20);

/// The metadata server's `grant_lifetime_ms` in the tests of grants across its absence.
const GRANT_LIFE_MS: u64 = 2000;

/// A cluster whose grants last [`GRANT_LIFE_MS`] and whose data servers take no clock
/// margin past it, nor wait long to notice a metadata server gone (heartbeats every
/// 200 ms, well within a grant's last half).
fn short_grants() -> ClusterOptions {
    ClusterOptions {
        data_servers: 1,
        meta_toml: format!("grant_lifetime_ms = {GRANT_LIFE_MS}"),
        data_toml: "grant_clock_skew_ms = 0".into(),
        heartbeat_ms: 200,
        ..ClusterOptions::default()
    }
}

/// The `open=N` of the mount's last "open files resumed" log line, if there is one.
fn last_resume_count(log: &str) -> Option<usize> {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("open files resumed"))?;
    let field = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("open="))?;
    field.parse().ok()
}

/// Guards against closes of read-only or untouched files that ended the session on the
/// server but left it in the mount's registry, so every metadata restart reopened them
/// all (58,348 after a `cp -a` of /usr/share/doc).
#[test]
fn files_closed_before_a_metadata_restart_are_not_resumed() {
    let mut cluster = ProcessCluster::start(3);
    let m = cluster.mount("m");
    for i in 0..30u8 {
        fs::write(m.path.join(format!("f{i}")), vec![i; 1000]).expect("write");
    }
    for i in 0..30u8 {
        // A read and a close: the quick close path, no commit.
        assert_eq!(
            fs::read(m.path.join(format!("f{i}"))).expect("read"),
            vec![i; 1000]
        );
    }
    let _ = fs::File::create(m.path.join("empty")).expect("create, close empty");
    cluster.restart_meta();
    // Any metadata call on the new connection resumes first.
    fs::create_dir(m.path.join("after")).expect("mkdir after the restart");
    wait_until("the mount resumed", NOTICE, || {
        last_resume_count(&m.log_text()).is_some()
    });
    assert_eq!(
        last_resume_count(&m.log_text()),
        Some(0),
        "nothing was open, nothing should be resumed:\n{}",
        m.log_text()
    );
}

/// Guards against a file read (and closed) before a metadata restart and removed after
/// it keeping its chunks on every data server: the restarted server took the mount's
/// stale registry for open files, so the removal waited for a close that never came.
#[test]
fn a_file_removed_after_a_metadata_restart_frees_its_chunks() {
    let mut cluster = ProcessCluster::start(3);
    let m = cluster.mount("m");
    let path = m.path.join("eight");
    fs::write(&path, pseudo_random(8 * MIB, 8)).expect("write 8 MiB");
    let ino = fs::metadata(&path).expect("stat").ino();
    assert_eq!(fs::read(&path).expect("read").len(), 8 * MIB);
    wait_chunks(cluster.dir(), Some(ino), 2);
    cluster.restart_meta();
    fs::remove_file(&path).expect("remove after the restart");
    wait_chunks(cluster.dir(), Some(ino), 0);
    assert_eq!(chunk_files(cluster.dir(), Some(ino)), 0);
}

/// Guards against changes answered early (before the metadata log held them) being lost
/// when the metadata server is killed while their mount lives: the mount sends them
/// again to the restarted server, which serves nobody else first. Every file, directory
/// and symlink is back with the inode number the mount's kernel saw, a small file
/// written whole with the length its close committed, one with the time and mode set
/// after its writes (as `tar x` does), a removal stays done, and a
/// second mount sees the same. The server holds every log write back 3 s
/// (`TESSERA_FAULT_LOG_DELAY_MS`), so the kill comes before any of them landed; its log
/// says it answered them from nothing it had.
#[test]
fn changes_answered_early_survive_a_metadata_kill() {
    let mut cluster = ProcessCluster::start(3);
    let m = cluster.mount("m");
    fs::write(m.path.join("old"), b"written before").expect("write");
    fs::create_dir(m.path.join("kept")).expect("mkdir");
    cluster.set_meta_env(&["TESSERA_FAULT_LOG_DELAY_MS=3000"]);
    cluster.restart_meta();
    // A create always reaches the server: the mount reconnects (and settles) here.
    fs::File::create(m.path.join("warm")).expect("create after the first restart");

    let started = Instant::now();
    fs::create_dir(m.path.join("d")).expect("mkdir d");
    for i in 0..5 {
        fs::File::create(m.path.join(format!("d/f{i}"))).expect("create");
    }
    // A small file written whole: its close commits the length, early too.
    let bytes = pseudo_random(4096, 9);
    fs::write(m.path.join("d/w"), &bytes).expect("write a small file");
    // As `tar x` ends a file: its time set before the close (with the commit of what
    // was written), then its mode.
    let stamp = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let mut t = fs::File::create(m.path.join("d/t")).expect("create d/t");
    std::io::Write::write_all(&mut t, &bytes[..100]).expect("write d/t");
    t.set_modified(stamp).expect("utime before the close");
    drop(t);
    fs::set_permissions(m.path.join("d/t"), fs::Permissions::from_mode(0o600)).expect("chmod");
    std::os::unix::fs::symlink("d/f0", m.path.join("link")).expect("symlink");
    fs::remove_file(m.path.join("old")).expect("unlink");
    fs::remove_dir(m.path.join("kept")).expect("rmdir");
    let names = [
        "warm", "d", "d/f0", "d/f1", "d/f2", "d/f3", "d/f4", "d/w", "d/t", "link",
    ];
    let inos: Vec<u64> = names
        .iter()
        .map(|n| fs::symlink_metadata(m.path.join(n)).expect("stat").ino())
        .collect();
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "the changes were answered before the log held them: {:?}",
        started.elapsed()
    );
    cluster.kill_meta();
    cluster.set_meta_env(&[]);
    cluster.restart_meta();

    // The mount's next call to the server reconnects, and sends its changes first.
    fs::File::create(m.path.join("after")).expect("create after the restart");
    let m2 = cluster.mount("m2");
    for (n, ino) in names.iter().zip(&inos) {
        let got = fs::symlink_metadata(m2.path.join(n))
            .unwrap_or_else(|e| panic!("{n} lost with the server: {e}"))
            .ino();
        assert_eq!(got, *ino, "{n} came back as another inode");
    }
    let target = fs::read_link(m2.path.join("link")).expect("readlink");
    assert_eq!(target, std::path::Path::new("d/f0"));
    let read = fs::read(m2.path.join("d/w")).expect("read the small file");
    assert_eq!(read.len(), bytes.len(), "the length its close committed");
    assert!(read == bytes, "the small file's bytes");
    let t = fs::metadata(m2.path.join("d/t")).expect("stat d/t");
    assert_eq!(
        (t.len(), t.mtime(), t.mode() & 0o7777),
        (100, 1_000_000, 0o600),
        "the length, time and mode set before the kill"
    );
    assert!(!m2.path.join("old").exists(), "the removal stays done");
    assert!(!m2.path.join("kept").exists(), "the rmdir stays done");
    // What the last start logged (the log file is appended to at each start).
    let whole = fs::read_to_string(cluster.dir().join("meta.log")).expect("meta log");
    let last = whole.rfind("metadata server started").expect("a start");
    let log = &whole[last..];
    assert!(
        log.contains("every client that took early replies before this start settled"),
        "the restarted server waited for the mount's changes"
    );
    // The server lost them: of the changes sent again, at most the first group (held
    // back 3 s from before the clock started) was answered from its record.
    let mount_log = m.log_text();
    let line = mount_log
        .lines()
        .rfind(|l| l.contains("changes answered early sent again"))
        .expect("the mount says it sent its changes again");
    assert!(line.contains("lost=0"), "{line}");
    let sent: usize = line
        .split("sent=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("sent=N");
    let from_records = log.matches("answered from its record").count();
    assert!(sent >= 15, "{line}");
    assert!(
        from_records <= 2,
        "{from_records} of {sent} were in the log"
    );
}

/// Guards against open files failing with EIO while the metadata server is away: a
/// read that reached the end of the file (the kernel asks for the size there), `fstat`,
/// `fsync` and `close` failed at once, and so did every `mkdir`, `stat` and `open`.
/// The open file lives in an agent process: a descriptor of written bytes held by the
/// test process itself would be flushed (a commit, waiting for the server) by the
/// fork and exec that start the metadata server again.
#[test]
fn open_files_and_new_calls_carry_on_across_a_metadata_restart() {
    let mut cluster = ProcessCluster::start(3);
    // Attributes expire at once, so that the kernel asks the mount for them.
    let m = cluster.mount_with_config("m", "attr_ttl_ms = 0\nentry_ttl_ms = 0\n");
    let path = m.path.join("open");
    let data = pseudo_random(3 * MIB + 123, 3);
    fs::write(&path, &data).expect("write");
    let mut a = Agent::start(&User::root(), "holder");
    a.expect(&format!("open f {} rw", path.display()), "ok");
    let len = data.len();
    a.expect(
        "pread f 0 4",
        &format!("ok {}", String::from_utf8_lossy(&data[..4])),
    );

    cluster.kill_meta();
    // `cat` to the end, with the server down: bytes come from the data servers, the
    // length from what the mount knows.
    let whole = format!("ok {} {len}", sha256_hex(&data));
    assert_eq!(
        a.ask("sha f"),
        whole,
        "reading to the end with the server down"
    );
    a.expect("fstat f", &format!("ok {len} 1"));
    a.expect(&format!("pwrite f {len} appended"), "ok 8");
    a.expect("fstat f", &format!("ok {} 1", len + 8));

    // fsync and close need the server: they wait for it (`meta_wait_ms`), as does a
    // mkdir sent while it is down.
    a.send("fsync f");
    let dir = m.path.join("made-while-away");
    let mkdir = std::thread::spawn(move || fs::create_dir(&dir));
    wait_until("the mount waits for the server", NOTICE, || {
        m.log_text()
            .contains("metadata server unreachable, waiting for it")
    });
    cluster.restart_meta();
    let log = || {
        let meta = fs::read_to_string(cluster.dir().join("meta.log")).unwrap_or_default();
        format!("{}\n-- meta.log:\n{meta}", m.log_text())
    };
    let synced = a.reply(Duration::from_secs(60));
    assert_eq!(
        synced.as_deref(),
        Some("ok"),
        "fsync across the restart\n{}",
        log()
    );
    a.expect("close f", "ok");
    let made = mkdir.join().expect("the mkdir thread");
    made.unwrap_or_else(|e| panic!("mkdir across the restart: {e}\n{}", log()));
    let after = fs::read(&path).expect("read back");
    assert_eq!(after.len(), len + 8);
    assert!(after[..len] == data[..] && after.ends_with(b"appended"));
}

/// Guards against files open for writing coming back read-only after a metadata server
/// restart (the resumed session was read-only): their writes failed with EACCES once
/// the grant they held before the restart ran out.
#[test]
fn a_file_open_for_writing_stays_writable_across_a_metadata_restart() {
    let mut cluster = ProcessCluster::start_with(short_grants());
    let m = cluster.mount("m");
    write_across_a_restart(&mut cluster, &m);
}

/// Guards against a scoped key losing its open files at a metadata server restart: the
/// server forgot which files the key had reached inside its scope and refused the
/// whole `Resume` with ENOENT (writes failed once the old grant ran out, and the close
/// could not commit). The grants the key holds show it.
#[test]
fn a_scoped_keys_open_file_stays_writable_across_a_metadata_restart() {
    let mut cluster = ProcessCluster::start_with(short_grants());
    fs::create_dir(cluster.mount("admin").path.join("teamA")).expect("mkdir /teamA");
    let key = cluster.dir().join("team-a.key");
    let key_arg = key.to_string_lossy().to_string();
    let create = [
        "key",
        "create",
        "team-a",
        "--path",
        "/teamA",
        "--no-root-squash",
    ];
    let (code, text) = cluster.tessera(&[&create[..], &["--out", &key_arg]].concat());
    assert_eq!(code, 0, "{text}");
    let m = cluster.mount_with_config("scoped", &format!("key_file = {key_arg:?}\n"));
    write_across_a_restart(&mut cluster, &m);
}

/// Opens a file in `m`, restarts the metadata server, and writes and syncs it until
/// every grant sealed before the restart has run out twice over; reads it back.
fn write_across_a_restart(cluster: &mut ProcessCluster, m: &Mount) {
    let path = m.path.join("w");
    let mut a = Agent::start(&User::root(), "writer");
    a.expect(&format!("open f {} c", path.display()), "ok");
    a.expect("pwrite f 0 before", "ok 6");
    a.expect("fsync f", "ok");
    cluster.restart_meta();
    wait_until("the mount resumed its open file", NOTICE, || {
        last_resume_count(&m.log_text()) == Some(1)
    });
    let until = Instant::now() + Duration::from_millis(2 * GRANT_LIFE_MS);
    let mut want = b"before".to_vec();
    while Instant::now() < until {
        a.expect(&format!("pwrite f {} after", want.len()), "ok 5");
        let synced = a.ask("fsync f");
        assert_eq!(
            synced,
            "ok",
            "fsync at {} bytes:\n{}",
            want.len(),
            m.log_text()
        );
        want.extend_from_slice(b"after");
    }
    a.expect("close f", "ok");
    assert_eq!(fs::read(&path).expect("read back"), want);
}

/// Guards against reads and writes of open files stopping with EACCES during a
/// metadata server outage longer than a grant's lifetime (nobody could renew their
/// grants), and shows they go on once it is back (renewed then). The file is open with
/// `O_DIRECT`, and the mount buffers no writes, so every read and write reaches the
/// data server.
#[test]
fn open_files_read_and_write_through_an_outage_longer_than_a_grant() {
    let mut cluster = ProcessCluster::start_with(short_grants());
    let config = "write_buffer_file_bytes = 0\nreadahead_max_bytes = 0\n";
    let m = cluster.mount_with_config("m", config);
    let path = m.path.join("o");
    let mut want: Vec<u8> = b"0123456789".repeat(1000);
    fs::write(&path, &want).expect("write");
    let mut a = Agent::start(&User::root(), "holder");
    a.expect(&format!("open f {} rwd", path.display()), "ok");
    let mut step = 0usize;
    let mut read_and_write = |a: &mut Agent, when: &str| {
        let off = (step * 37) % (want.len() - 4);
        step += 1;
        let text = format!("w{:03}", step % 1000);
        assert_eq!(a.ask(&format!("pwrite f {off} {text}")), "ok 4", "{when}");
        want[off..off + 4].copy_from_slice(text.as_bytes());
        let back = a.ask(&format!("pread f {off} 4"));
        assert_eq!(back, format!("ok {text}"), "{when}");
        let other = (off + 5000) % (want.len() - 4);
        let expect = String::from_utf8_lossy(&want[other..other + 4]).to_string();
        assert_eq!(
            a.ask(&format!("pread f {other} 4")),
            format!("ok {expect}"),
            "{when}"
        );
    };
    read_and_write(&mut a, "before the outage");

    cluster.kill_meta();
    let until = Instant::now() + Duration::from_millis(2 * GRANT_LIFE_MS);
    while Instant::now() < until {
        read_and_write(&mut a, "with the metadata server away");
    }
    cluster.restart_meta();
    wait_until("the mount resumed its open file", NOTICE, || {
        last_resume_count(&m.log_text()) == Some(1)
    });
    let until = Instant::now() + Duration::from_millis(2 * GRANT_LIFE_MS);
    while Instant::now() < until {
        read_and_write(&mut a, "with the metadata server back");
    }
    a.expect("close f", "ok");
    assert!(
        fs::read(&path).expect("read back") == want,
        "the file's bytes"
    );
}

/// Guards against `tessera fsck` reporting 0 problems while data servers hold chunks
/// of files that no longer exist (space that leaks until a sweep or a restart): the
/// chunks of a removed file are put back behind the servers' backs, as a deletion that
/// never reached them would leave them.
#[test]
fn fsck_reports_and_repairs_chunks_of_files_that_are_gone() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount("m");
    let path = m.path.join("gone");
    fs::write(&path, pseudo_random(6 * MIB, 6)).expect("write");
    let ino = fs::metadata(&path).expect("stat").ino();
    wait_chunks(cluster.dir(), Some(ino), 2);
    let saved = cluster.dir().join("saved");
    fs::create_dir_all(&saved).expect("saved dir");
    let copies: Vec<_> = tessera_tests::chunk_tree::cluster_chunk_files(cluster.dir(), Some(ino))
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(copies.len(), 6, "2 chunks x 3 servers");
    for (i, c) in copies.iter().enumerate() {
        fs::copy(c, saved.join(i.to_string())).expect("copy a chunk file");
    }
    fs::remove_file(&path).expect("remove");
    wait_chunks(cluster.dir(), Some(ino), 0);
    assert_eq!(
        cluster.tessera(&["fsck"]).0,
        0,
        "clean once the deletions are done"
    );
    for (i, c) in copies.iter().enumerate() {
        fs::create_dir_all(c.parent().expect("parent")).expect("inode directory");
        fs::copy(saved.join(i.to_string()), c).expect("put a chunk file back");
    }
    assert_eq!(chunk_files(cluster.dir(), Some(ino)), 2);
    // The servers report their deletions done with their next heartbeat: until then
    // the chunks count as queued for deletion, not left over.
    let mut out = String::new();
    wait_until("fsck finds the left chunks", NOTICE, || {
        out = cluster.tessera(&["fsck"]).1;
        out.contains("removed, but chunks are left")
    });
    let (code, out) = cluster.tessera(&["fsck", "--repair"]);
    assert_eq!(code, 1, "a repair run still reports what it found:\n{out}");
    assert_eq!(
        chunk_files(cluster.dir(), Some(ino)),
        0,
        "repair deletes them"
    );
    let (code, out) = cluster.tessera(&["fsck"]);
    assert_eq!(code, 0, "clean after the repair:\n{out}");
}
