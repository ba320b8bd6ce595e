//! Files that programs on two mounts share, as they would on one machine: a name that
//! one mount removed and the other still knows, opened with `O_CREAT` there; a file
//! read after taking a lock on it, while another mount wrote it under its own; and
//! SQLite, which relies on both (its journal is made and removed at each transaction,
//! and it reads the database after each lock).
//! They need root, /dev/fuse and python3, as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::process::Command;
use tessera_tests::posix::{check_output, PYTHON};
use tessera_tests::ProcessCluster;

/// Takes (`kind` `F_RDLCK` or `F_WRLCK`) or drops (`F_UNLCK`) a POSIX lock on the whole
/// of `file`, waiting for it.
fn lock(file: &fs::File, kind: i32) {
    // SAFETY: a zeroed flock is a valid value; the fields that matter are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: the descriptor is open for the call and `fl` a valid flock.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLKW, &fl) };
    assert_eq!(r, 0, "fcntl: {}", std::io::Error::last_os_error());
}

/// Guards against `open(O_CREAT)` failing through a name one mount still knew after
/// another removed the file (ENOENT from the kernel's kept entry, or a write into the
/// removed file while it was still open elsewhere): the open makes the file anew,
/// as on a local disk.
#[test]
fn a_create_through_a_name_removed_by_another_mount_makes_the_file() {
    let cluster = ProcessCluster::start(1);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    for (name, keep_open) in [("gone", false), ("orphan", true)] {
        let on_a = a.path.join(name);
        fs::write(&on_a, b"old").unwrap();
        // b's kernel keeps the name and its inode.
        let on_b = b.path.join(name);
        assert_eq!(fs::read(&on_b).unwrap(), b"old");
        let held = keep_open.then(|| fs::File::open(&on_a).unwrap());
        fs::remove_file(&on_a).unwrap();
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&on_b)
            .unwrap_or_else(|e| panic!("{name}: open(O_CREAT) on the other mount: {e}"));
        let mut now = Vec::new();
        f.read_to_end(&mut now).unwrap();
        assert!(now.is_empty(), "{name}: a new file, not the removed one");
        f.write_all(b"new").unwrap();
        drop(f);
        assert_eq!(
            fs::read(&on_a).unwrap(),
            b"new",
            "{name}: the new file by name"
        );
        drop(held);
    }
    // The mount that has an unlinked file open still reopens it through its descriptor.
    let f = a.path.join("kept");
    fs::write(&f, b"kept").unwrap();
    let open = fs::File::open(&f).unwrap();
    fs::remove_file(&f).unwrap();
    let again = fs::read(format!("/proc/self/fd/{}", open.as_raw_fd())).unwrap();
    assert_eq!(
        again, b"kept",
        "a reopen of an unlinked file through /proc/self/fd"
    );
    // And of a file made with no name (`O_TMPFILE`).
    let mut tmp = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(&a.path)
        .unwrap();
    tmp.write_all(b"unnamed").unwrap();
    let again = fs::read(format!("/proc/self/fd/{}", tmp.as_raw_fd())).unwrap();
    assert_eq!(
        again, b"unnamed",
        "a reopen of an O_TMPFILE through /proc/self/fd"
    );
}

/// Guards against a mount reading a file from its cache after taking a lock on it,
/// when another mount changed the file under its own lock: the reader sees the
/// writer's bytes once its lock is granted, as over NFS.
#[test]
fn a_lock_brings_what_another_mount_wrote_under_its_lock() {
    let cluster = ProcessCluster::start(1);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    fs::write(a.path.join("shared"), b"0000").unwrap();
    // The reader keeps the file open (no open to notice the change) and read-write, as
    // a database does, and has its first bytes in its page cache.
    let mut reader = OpenOptions::new()
        .read(true)
        .write(true)
        .open(b.path.join("shared"))
        .unwrap();
    let mut seen = String::new();
    reader.read_to_string(&mut seen).unwrap();
    assert_eq!(seen, "0000");
    for round in 1..=3u8 {
        // Each turn a new length, and a stat of the reader's mount between: what the
        // stat shows must not pass for what the reader's pages hold.
        let text = round.to_string().repeat(4 + usize::from(round));
        let writer = OpenOptions::new()
            .write(true)
            .open(a.path.join("shared"))
            .unwrap();
        lock(&writer, libc::F_WRLCK);
        writer.set_len(0).unwrap();
        writer.write_all_at(text.as_bytes(), 0).unwrap();
        lock(&writer, libc::F_UNLCK);
        drop(writer);
        std::thread::sleep(std::time::Duration::from_millis(1100));
        fs::metadata(b.path.join("shared")).unwrap();
        lock(&reader, libc::F_RDLCK);
        let mut got = String::new();
        reader.seek(SeekFrom::Start(0)).unwrap();
        reader.read_to_string(&mut got).unwrap();
        lock(&reader, libc::F_UNLCK);
        assert_eq!(got, text, "round {round}: the reader after its lock");
    }
}

/// Guards against SQLite losing or refusing transactions when two processes on two
/// mounts write one database (rollback journal, its default): every row of both is
/// there and the database is intact.
#[test]
fn sqlite_on_two_mounts_keeps_every_transaction() {
    let cluster = ProcessCluster::start(1);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    let script = r#"
import sqlite3, sys
c = sqlite3.connect(sys.argv[2], timeout=60)
c.execute("create table if not exists t(k integer primary key, v text)")
c.commit()
for i in range(100):
    c.execute("insert into t(v) values (?)", (sys.argv[1] + str(i),))
    c.commit()
    c.execute("select count(*) from t").fetchone()
"#;
    let db = |m: &tessera_tests::Mount| m.path.join("t.db");
    // The table first, so that neither writer races the other to make it.
    let first = Command::new(PYTHON)
        .args(["-c", script, "x"])
        .arg(db(&a))
        .output()
        .unwrap();
    check_output("the first writer", &first);
    let writers: Vec<_> = [("a", &a), ("b", &b)]
        .into_iter()
        .map(|(w, m)| {
            Command::new(PYTHON)
                .args(["-c", script, w])
                .arg(db(m))
                .spawn()
                .unwrap()
        })
        .collect();
    for mut w in writers {
        assert!(w.wait().unwrap().success(), "a writer failed");
    }
    let check = r#"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
print(c.execute("select count(*) from t").fetchone()[0], c.execute("pragma integrity_check").fetchone()[0])
"#;
    for m in [&a, &b] {
        let out = Command::new(PYTHON)
            .args(["-c", check])
            .arg(db(m))
            .output()
            .unwrap();
        assert_eq!(check_output("the count", &out).trim(), "300 ok");
    }
}

/// Guards against lost updates when processes on two mounts take turns with a counter
/// under `flock`, each reading it by name and replacing it by a rename: a mount's
/// kernel kept the replaced file's name, and a second process of that mount holding
/// the old file open let the open reach it (counts went missing: 356 of 400).
#[test]
fn a_counter_replaced_by_rename_under_a_lock_counts_every_turn() {
    let cluster = ProcessCluster::start(1);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    let script = r#"
import fcntl, os, sys
d = sys.argv[1]
for i in range(50):
    with open(os.path.join(d, "c.lock"), "a+") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        p = os.path.join(d, "counter")
        try:
            with open(p) as f:
                n = int(f.read() or 0)
        except FileNotFoundError:
            n = 0
        tmp = p + ".tmp.%d" % os.getpid()
        with open(tmp, "w") as f:
            f.write(str(n + 1))
        os.rename(tmp, p)
        fcntl.flock(lk, fcntl.LOCK_UN)
"#;
    let workers: Vec<_> = [&a, &b, &a, &b]
        .into_iter()
        .map(|m| {
            Command::new(PYTHON)
                .args(["-c", script])
                .arg(&m.path)
                .spawn()
                .unwrap()
        })
        .collect();
    for mut w in workers {
        assert!(w.wait().unwrap().success(), "a worker failed");
    }
    for m in [&a, &b] {
        assert_eq!(fs::read_to_string(m.path.join("counter")).unwrap(), "200");
    }
}
