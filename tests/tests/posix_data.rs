//! POSIX point 3 on real mounts: truncate down and up (zeros, chunks freed on the data
//! servers), fallocate modes, O_APPEND from several writers on two mounts, O_TRUNC and
//! O_EXCL (also racing between two mounts).
//! They need root and /dev/fuse, as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tessera_tests::posix::{
    chunk_files, errno_of, fallocate, file_owned, open_to_all, statvfs, times, wait_chunks,
    wait_until, User, ALICE_UID, PYTHON,
};
use tessera_tests::{pseudo_random, sha256_hex, Agent, ProcessCluster};

const MIB: u64 = 1 << 20;

fn ino(p: &Path) -> u64 {
    fs::metadata(p).unwrap().ino()
}

fn rw(p: &Path) -> File {
    OpenOptions::new().read(true).write(true).open(p).unwrap()
}

/// Guards against truncation that leaves old bytes to come back when the file grows
/// again, holes that read as anything but zeros, and chunks left on the data servers
/// after a truncate or an unlink (space that would never be freed).
#[test]
fn truncate_down_and_up_reads_zeros_and_frees_chunks() {
    let cluster = ProcessCluster::start(3);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    let f = a.path.join("t");
    let data = pseudo_random(20 << 20, 7);
    fs::write(&f, &data).unwrap();
    let i = ino(&f);
    assert_eq!(
        chunk_files(cluster.dir(), Some(i)),
        5,
        "20 MiB in 4 MiB chunks"
    );
    // Down into chunk 1, mid-block: chunks 2..4 go at once (truncation is synchronous).
    let cut = (5 * MIB + 12_345) as usize;
    let h = rw(&f);
    h.set_len(cut as u64).unwrap();
    assert_eq!(chunk_files(cluster.dir(), Some(i)), 2);
    // Up again: the cut bytes must not come back.
    h.set_len(13 * MIB).unwrap();
    h.write_at(b"tail", 15 * MIB).unwrap();
    drop(h);
    let mut want = data[..cut].to_vec();
    want.resize((15 * MIB) as usize, 0);
    want.extend_from_slice(b"tail");
    let back = fs::read(&f).unwrap();
    assert_eq!(back.len(), want.len());
    assert!(
        back[cut..(15 * MIB) as usize].iter().all(|&x| x == 0),
        "holes read zeros"
    );
    assert_eq!(sha256_hex(&back), sha256_hex(&want));
    assert_eq!(
        sha256_hex(&fs::read(b.path.join("t")).unwrap()),
        sha256_hex(&want)
    );
    // A truncate by path on the other mount, to zero: no chunk is left.
    File::options()
        .write(true)
        .open(b.path.join("t"))
        .unwrap()
        .set_len(0)
        .unwrap();
    assert_eq!(chunk_files(cluster.dir(), Some(i)), 0);
    assert_eq!(fs::read(b.path.join("t")).unwrap(), b"");
    // Unlinked: its chunks go through the deletion queue (heartbeats), with a deadline.
    fs::write(&f, pseudo_random(9 << 20, 8)).unwrap();
    assert_eq!(chunk_files(cluster.dir(), Some(i)), 3);
    fs::remove_file(&f).unwrap();
    wait_chunks(cluster.dir(), Some(i), 0);
    wait_chunks(cluster.dir(), None, 0);
}

/// Guards against fallocate modes that change the wrong thing: the default mode grows
/// the file (never shrinks it), KEEP_SIZE keeps the length, PUNCH_HOLE|KEEP_SIZE zeroes
/// exactly its range (across chunk boundaries, clamped at the end of the file) and is
/// seen by another mount, ZERO_RANGE zeroes and grows unless KEEP_SIZE; modes that are not implemented fail with EOPNOTSUPP instead of
/// pretending.
#[test]
fn fallocate_modes_grow_keep_and_punch() {
    let cluster = ProcessCluster::start(3);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    let f = a.path.join("grow");
    let h = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&f)
        .unwrap();
    fallocate(&h, 0, 0, 10 * MIB).unwrap();
    assert_eq!(h.metadata().unwrap().len(), 10 * MIB);
    fallocate(&h, libc::FALLOC_FL_KEEP_SIZE, 0, 20 * MIB).unwrap();
    assert_eq!(h.metadata().unwrap().len(), 10 * MIB, "KEEP_SIZE");
    fallocate(&h, 0, 12 * MIB, MIB).unwrap();
    fallocate(&h, 0, 0, MIB).unwrap();
    assert_eq!(h.metadata().unwrap().len(), 13 * MIB, "grown, never shrunk");
    drop(h);
    let zeros = fs::read(b.path.join("grow")).unwrap();
    assert_eq!(zeros.len() as u64, 13 * MIB);
    assert!(zeros.iter().all(|&x| x == 0));

    let g = a.path.join("punch");
    let mut want = pseudo_random(10 << 20, 4);
    fs::write(&g, &want).unwrap();
    let h = rw(&g);
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    let (start, len) = (3 * MIB + 100, 6 * MIB);
    fallocate(&h, punch, start, len).unwrap();
    want[start as usize..(start + len) as usize].fill(0);
    // Past the end: only the part inside the file is zeroed, the length stays.
    fallocate(&h, punch, 9 * MIB + MIB / 2, 4 * MIB).unwrap();
    want[(9 * MIB + MIB / 2) as usize..].fill(0);
    assert_eq!(h.metadata().unwrap().len(), 10 * MIB);
    let mut back = vec![0u8; want.len()];
    h.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(
        sha256_hex(&back),
        sha256_hex(&want),
        "this mount reads the holes"
    );
    // ZERO_RANGE zeroes like a punch; without KEEP_SIZE it also grows the file.
    let zero = libc::FALLOC_FL_ZERO_RANGE;
    fallocate(&h, zero, 100, 4 * MIB).unwrap();
    want[100..(4 * MIB + 100) as usize].fill(0);
    fallocate(&h, zero | libc::FALLOC_FL_KEEP_SIZE, 10 * MIB - 10, MIB).unwrap();
    assert_eq!(
        h.metadata().unwrap().len(),
        10 * MIB,
        "ZERO_RANGE|KEEP_SIZE"
    );
    fallocate(&h, zero, 10 * MIB - 10, MIB).unwrap();
    want.resize((11 * MIB - 10) as usize, 0);
    assert_eq!(
        h.metadata().unwrap().len(),
        11 * MIB - 10,
        "ZERO_RANGE grows"
    );
    let mut back = vec![0u8; want.len()];
    h.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(sha256_hex(&back), sha256_hex(&want), "zeroed ranges");
    for (name, mode) in [
        ("COLLAPSE_RANGE", libc::FALLOC_FL_COLLAPSE_RANGE),
        ("INSERT_RANGE", libc::FALLOC_FL_INSERT_RANGE),
        ("PUNCH_HOLE alone", libc::FALLOC_FL_PUNCH_HOLE),
    ] {
        let e = fallocate(&h, mode, 0, MIB);
        assert_eq!(errno_of(name, e), libc::EOPNOTSUPP, "{name}");
    }
    drop(h);
    let other = fs::read(b.path.join("punch")).unwrap();
    assert_eq!(sha256_hex(&other), sha256_hex(&want), "the other mount too");
}

/// Guards against an `fallocate` of more than the free space succeeding (it only grew
/// the file, so a program that reserved its output ran out of space mid-write).
#[test]
fn fallocate_beyond_the_free_space_fails_with_enospc() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let s = statvfs(&m.path);
    let free = s.f_bavail * s.f_frsize;
    assert!(free > 64 * MIB, "free space {free}");
    let h = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(m.path.join("big"))
        .unwrap();
    fallocate(&h, 0, 0, MIB).unwrap();
    for (name, mode) in [
        ("grow", 0),
        ("KEEP_SIZE", libc::FALLOC_FL_KEEP_SIZE),
        ("ZERO_RANGE", libc::FALLOC_FL_ZERO_RANGE),
    ] {
        let e = fallocate(&h, mode, 0, free + 64 * MIB);
        assert_eq!(errno_of(name, e), libc::ENOSPC, "{name}");
        assert_eq!(h.metadata().unwrap().len(), MIB, "{name} left the length");
    }
    // What the file already covers needs no new space, and what fits is granted.
    fallocate(&h, 0, 0, MIB).unwrap();
    fallocate(&h, 0, MIB, free / 2).unwrap();
    assert_eq!(h.metadata().unwrap().len(), MIB + free / 2);
    // Punching holes frees space: never refused.
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fallocate(&h, punch, 0, free + 64 * MIB).unwrap();
}

/// One appender: `n` records of varying length, each one `write` on an O_APPEND fd.
const APPENDER: &str = r#"
import os, sys
path, w, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
for i in range(n):
    ln = (i * 37 + w * 11) % 3000 + 1
    rec = ("<%d:%04d:%05d:" % (w, i, ln)).encode() + bytes([97 + w]) * ln + b">\n"
    assert os.write(fd, rec) == len(rec)
os.close(fd)
"#;

fn spawn_appender(user: &User, path: &Path, writer: usize, records: usize) -> Child {
    user.command(PYTHON)
        .arg("-I")
        .arg("-c")
        .arg(APPENDER)
        .arg(path)
        .arg(writer.to_string())
        .arg(records.to_string())
        .stdin(Stdio::null())
        .spawn()
        .expect("appender starts")
}

/// Parses the records of the appenders; panics at the first byte out of place.
fn parse_records(data: &[u8], writers: usize) -> Vec<Vec<usize>> {
    let mut seen = vec![Vec::new(); writers];
    let mut pos = 0;
    while pos < data.len() {
        let head = std::str::from_utf8(&data[pos..(pos + 14).min(data.len())])
            .unwrap_or_else(|_| panic!("garbage at {pos}"));
        let f: Vec<&str> = head.trim_start_matches('<').split(':').collect();
        assert!(
            head.starts_with('<') && f.len() >= 3,
            "bad header at {pos}: {head:?}"
        );
        let (w, i, ln): (usize, usize, usize) = (
            f[0].parse().unwrap(),
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
        );
        let body = &data[pos + 14..pos + 14 + ln];
        assert!(
            body.iter().all(|&c| c == b'a' + w as u8),
            "record {w}:{i} mixed up"
        );
        assert_eq!(
            &data[pos + 14 + ln..pos + 16 + ln],
            b">\n",
            "record {w}:{i} cut"
        );
        seen[w].push(i);
        pos += 16 + ln;
    }
    seen
}

/// Guards against appends from several processes on two mounts overwriting each other
/// (logs and shared journals lose records) or leaving gaps: every record must be there
/// once, whole, in each writer's order. Half of the writers are an unprivileged user.
#[test]
fn o_append_writers_on_two_mounts_lose_and_overlap_nothing() {
    const WRITERS: usize = 4;
    const RECORDS: usize = 150;
    let cluster = ProcessCluster::start(3);
    open_to_all(cluster.dir());
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    file_owned(&a.path.join("log"), b"", 0o666, 0, 0);
    let alice = User::plain(ALICE_UID);
    let mut children: Vec<Child> = (0..WRITERS)
        .map(|w| {
            let (user, m) = match w % 2 {
                0 => (User::root(), &a),
                _ => (alice.clone(), &b),
            };
            spawn_appender(&user, &m.path.join("log"), w, RECORDS)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    for c in &mut children {
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                assert!(s.success(), "appender failed: {s}");
                break;
            }
            if Instant::now() > deadline {
                children.iter_mut().for_each(|c| drop(c.kill()));
                panic!("appenders still running after 120 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let data = fs::read(a.path.join("log")).unwrap();
    let want_len: usize = (0..WRITERS)
        .flat_map(|w| (0..RECORDS).map(move |i| (i * 37 + w * 11) % 3000 + 1 + 16))
        .sum();
    assert_eq!(data.len(), want_len, "no record lost, no gap");
    let seen = parse_records(&data, WRITERS);
    for (w, s) in seen.iter().enumerate() {
        assert_eq!(*s, (0..RECORDS).collect::<Vec<_>>(), "writer {w}'s records");
    }
    assert_eq!(
        fs::read(b.path.join("log")).unwrap(),
        data,
        "both mounts agree"
    );
}

/// Guards against O_TRUNC that leaves old bytes or chunks, does not move the times, or
/// that the other mount does not see; and against O_TRUNC without write permission.
#[test]
fn o_trunc_empties_the_file_for_both_mounts() {
    let cluster = ProcessCluster::start(3);
    open_to_all(cluster.dir());
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    let f = a.path.join("f");
    file_owned(&f, &pseudo_random(9 << 20, 1), 0o644, 0, 0);
    let i = ino(&f);
    let before = times(&f);
    let script = r#"t("trunc", os.open, sys.argv[1], os.O_RDONLY | os.O_TRUNC)"#;
    User::plain(ALICE_UID)
        .py(script, &[f.as_path()])
        .expect(&[("trunc", "EACCES")]);
    assert_eq!(
        fs::metadata(&f).unwrap().len(),
        9 * MIB,
        "the refused open cut nothing"
    );
    let h = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(b.path.join("f"))
        .unwrap();
    assert_eq!(h.metadata().unwrap().len(), 0);
    assert_eq!(
        chunk_files(cluster.dir(), Some(i)),
        0,
        "O_TRUNC cut the chunks"
    );
    let after = times(&b.path.join("f"));
    assert!(after.mtime > before.mtime && after.ctime > before.ctime);
    h.write_all_at(b"new", 0).unwrap();
    drop(h);
    wait_until(
        "mount a to see the new length",
        Duration::from_secs(5),
        || fs::metadata(&f).unwrap().len() == 3,
    );
    assert_eq!(fs::read(&f).unwrap(), b"new");
}

/// Guards against O_EXCL creating over an existing name or through a dangling symlink,
/// and against two mounts both winning a race to create one name (lock files and
/// "claim this job" markers rely on exactly one winner).
#[test]
fn o_excl_refuses_existing_names_and_one_mount_wins_a_race() {
    let cluster = ProcessCluster::start(1);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    let excl = |p: &Path| OpenOptions::new().write(true).create_new(true).open(p);
    fs::write(a.path.join("f"), b"f").unwrap();
    assert_eq!(
        errno_of("O_EXCL on a file", excl(&a.path.join("f"))),
        libc::EEXIST
    );
    std::os::unix::fs::symlink("nowhere", a.path.join("dangling")).unwrap();
    let e = excl(&a.path.join("dangling"));
    assert_eq!(errno_of("O_EXCL on a dangling symlink", e), libc::EEXIST);
    assert!(
        !a.path.join("nowhere").exists(),
        "the symlink was not followed"
    );
    for round in 0..20 {
        let name = format!("race-{round}");
        let gate = Arc::new(Barrier::new(2));
        let racers: Vec<_> = [&a.path, &b.path]
            .into_iter()
            .map(|m| {
                let (p, gate) = (m.join(&name), gate.clone());
                std::thread::spawn(move || {
                    gate.wait();
                    OpenOptions::new().write(true).create_new(true).open(p)
                })
            })
            .collect();
        let results: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
        let wins = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(wins, 1, "round {round}: {results:?}");
        let loser = results.into_iter().find_map(Result::err).unwrap();
        assert_eq!(loser.raw_os_error(), Some(libc::EEXIST));
    }
}

/// Takes an fcntl write lock on all of `f` without waiting; the errno on refusal.
fn try_lock(f: &File) -> Result<(), i32> {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed `flock` is a valid value; the fields that matter are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: `fl` lives across the call and the descriptor is open.
    match unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &fl) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)),
    }
}

/// Guards against a dead client's bytes showing up where zeros belong: a writer whose
/// mount was killed before it closed the file (so before its length was committed)
/// leaves chunks past the file's end; a truncation upwards and a write past the end on
/// another mount must read zeros there, not those bytes (they did before the fix: the
/// whole first 8 MiB read back as the dead writer's `S`). The writer is a process of
/// its own: a descriptor of this test process would be closed, and the file flushed and
/// committed, whenever another test forks a child.
#[test]
fn bytes_a_killed_writer_left_past_the_end_never_show() {
    let cluster = ProcessCluster::start(2);
    let a = cluster.mount("a");
    let mut b = cluster.mount("b");
    fs::write(a.path.join("lock"), b"").unwrap();
    let mut writer = Agent::start(&User::root(), "writer");
    writer.expect(
        &format!("open l {} rw", b.path.join("lock").display()),
        "ok",
    );
    writer.expect("lock l ex 0 0", "ok");
    writer.expect(&format!("open f {} c", b.path.join("f").display()), "ok");
    // 24 MiB: more than a file's write buffer, so most of it reaches the data servers.
    let block = "S".repeat(MIB as usize);
    for k in 0..24 {
        writer.expect(
            &format!("pwrite f {} {block}", k * MIB),
            &format!("ok {MIB}"),
        );
    }
    let i = ino(&a.path.join("f"));
    wait_until(
        "the writer's chunks on the data servers",
        Duration::from_secs(30),
        || chunk_files(cluster.dir(), Some(i)) >= 4,
    );
    assert_eq!(
        fs::metadata(a.path.join("f")).unwrap().len(),
        0,
        "nothing committed"
    );

    b.kill_client();
    // The metadata server drops a dead client's locks after it marked its files.
    let lock_a = rw(&a.path.join("lock"));
    wait_until("b's lock to go", Duration::from_secs(30), || {
        try_lock(&lock_a).is_ok()
    });
    drop(writer);

    let g = rw(&a.path.join("f"));
    g.set_len(8 * MIB).unwrap();
    let mut got = vec![1u8; (8 * MIB) as usize];
    g.read_exact_at(&mut got, 0).unwrap();
    assert!(
        got.iter().all(|&x| x == 0),
        "a truncation upwards reads zeros"
    );
    g.write_all_at(b"end", 12 * MIB).unwrap();
    drop(g);
    let all = fs::read(a.path.join("f")).unwrap();
    assert_eq!(all.len() as u64, 12 * MIB + 3);
    assert!(
        all[..(12 * MIB) as usize].iter().all(|&x| x == 0),
        "a write past the end leaves zeros before it"
    );
    assert_eq!(&all[(12 * MIB) as usize..], b"end");
    assert_eq!(
        chunk_files(cluster.dir(), Some(i)),
        1,
        "the dead writer's chunks are gone"
    );
}
