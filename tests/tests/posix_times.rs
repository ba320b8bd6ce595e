//! POSIX point 1 on real mounts, continued: the times each operation moves (atime as
//! `relatime` does), link counts of files and directories, and `statfs` totals.
//! They need root and /dev/fuse, as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;
use tessera_tests::posix::{
    chunk_files, open_to_all, setxattr, statvfs, times, wait_until, Times, User, ALICE_UID,
};
use tessera_tests::{pseudo_random, ProcessCluster};

/// Asserts which of the three times moved forward between `before` and `after`:
/// `which` names them (`a`, `m`, `c`, e.g. "mc"); the others must be exactly equal.
#[track_caller]
fn moved(what: &str, before: Times, after: Times, which: &str) {
    let check = |name: &str, b: i128, a: i128, should: bool| {
        if should {
            assert!(a > b, "{what}: {name} did not move ({b} -> {a})");
        } else {
            assert_eq!(a, b, "{what}: {name} moved");
        }
    };
    check("atime", before.atime, after.atime, which.contains('a'));
    check("mtime", before.mtime, after.mtime, which.contains('m'));
    check("ctime", before.ctime, after.ctime, which.contains('c'));
}

fn write_at_end(p: &Path, data: &[u8]) {
    let mut f = fs::OpenOptions::new().append(true).open(p).unwrap();
    f.write_all(data).unwrap();
}

fn read_all(p: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    fs::File::open(p).unwrap().read_to_end(&mut v).unwrap();
    v
}

/// Guards against file times that move on the wrong operations (`make`, `rsync` and
/// backup programs trust them): writes and truncation move mtime and ctime; chmod and
/// xattrs only ctime; reads move atime only as `relatime` says (when it is not newer
/// than mtime and ctime); utimensat sets what it is told and moves ctime.
#[test]
fn writes_chmod_xattrs_and_reads_move_the_times_ext4_moves() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let f = m.path.join("f");
    fs::write(&f, b"hello").unwrap();
    let t0 = times(&f);
    write_at_end(&f, b" world");
    let t1 = times(&f);
    moved("write", t0, t1, "mc");
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    let t2 = times(&f);
    moved("chmod", t1, t2, "c");
    assert_eq!(read_all(&f), b"hello world");
    let t3 = times(&f);
    moved("first read after a change", t2, t3, "a");
    assert_eq!(read_all(&f), b"hello world");
    let t4 = times(&f);
    moved("read of an unchanged file (relatime)", t3, t4, "");
    write_at_end(&f, b"!");
    let t5 = times(&f);
    moved("second write", t4, t5, "mc");
    read_all(&f);
    let t6 = times(&f);
    moved("read after the write", t5, t6, "a");
    setxattr(&f, "user.k", b"v", 0).unwrap();
    let t7 = times(&f);
    moved("setxattr", t6, t7, "c");
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(2)
        .unwrap();
    let t8 = times(&f);
    moved("truncate", t7, t8, "mc");
    let out = User::root().py(
        "t('touch', os.utime, sys.argv[1], (1000000000, 1200000000))",
        &[f.as_path()],
    );
    out.expect(&[("touch", "OK")]);
    let t9 = times(&f);
    assert_eq!(t9.atime, 1_000_000_000 * 1_000_000_000);
    assert_eq!(t9.mtime, 1_200_000_000 * 1_000_000_000);
    assert!(t9.ctime > t8.ctime, "utimes moves ctime");
}

/// Guards against name operations that move the wrong times: rename, link and unlink
/// move the inode's ctime only; each directory whose entries change moves mtime and
/// ctime; listing a changed directory moves its atime once (`relatime`, as ext4 does).
#[test]
fn renames_links_and_listings_move_the_times_ext4_moves() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let (d1, d2) = (m.path.join("d1"), m.path.join("d2"));
    fs::create_dir(&d1).unwrap();
    fs::create_dir(&d2).unwrap();
    let f = d1.join("f");
    fs::write(&f, b"hello").unwrap();
    let (t0, dir1, dir2) = (times(&f), times(&d1), times(&d2));
    let g = d2.join("g");
    fs::rename(&f, &g).unwrap();
    let t1 = times(&g);
    moved("rename of the file", t0, t1, "c");
    moved("rename source dir", dir1, times(&d1), "mc");
    moved("rename target dir", dir2, times(&d2), "mc");
    let dir1 = times(&d1);
    fs::hard_link(&g, d1.join("h")).unwrap();
    let t2 = times(&g);
    moved("link", t1, t2, "c");
    moved("link dir", dir1, times(&d1), "mc");
    fs::remove_file(d1.join("h")).unwrap();
    moved("unlink of the other name", t2, times(&g), "c");
    let dir2 = times(&d2);
    assert_eq!(fs::read_dir(&d2).unwrap().count(), 1);
    let listed = times(&d2);
    moved("first listing after a change", dir2, listed, "a");
    assert_eq!(fs::read_dir(&d2).unwrap().count(), 1);
    moved("second listing", listed, times(&d2), "");
    fs::create_dir(d2.join("sub")).unwrap();
    moved("mkdir in dir", listed, times(&d2), "mc");
}

/// Guards against an unprivileged user's operations moving times differently from
/// root's (the server must not take them from the caller's identity): the user's write
/// moves mtime and ctime, its read moves atime once.
#[test]
fn an_unprivileged_users_writes_and_reads_move_times_too() {
    let cluster = ProcessCluster::start(1);
    open_to_all(cluster.dir());
    let m = cluster.mount("mnt");
    let f = m.path.join("f");
    fs::write(&f, b"abc").unwrap();
    tessera_tests::posix::chown(&f, ALICE_UID, ALICE_UID).unwrap();
    let alice = User::plain(ALICE_UID);
    let t0 = times(&f);
    alice
        .py("t('w', wr, sys.argv[1], b'xyz')", &[f.as_path()])
        .expect(&[("w", "OK")]);
    let t1 = times(&f);
    moved("user's write", t0, t1, "mc");
    alice
        .py("t('r', rd, sys.argv[1])", &[f.as_path()])
        .expect(&[("r", "OK 3")]);
    moved("user's read", t1, times(&f), "a");
}

fn nlink(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().nlink()
}

/// Guards against wrong link counts (`find` and backup tools use a directory's count
/// to skip its files, `rm` and `du` look at files'): a file counts its names, a
/// directory 2 plus its subdirectories, through link, unlink, mkdir, rmdir and renames
/// of directories between parents, as seen by this mount and by a second one.
#[test]
fn link_counts_of_files_and_directories() {
    let cluster = ProcessCluster::start(1);
    let a = cluster.mount("a");
    let p = a.path.as_path();
    fs::create_dir_all(p.join("d")).unwrap();
    fs::create_dir_all(p.join("e/empty")).unwrap();
    fs::write(p.join("d/f"), b"f").unwrap();
    assert_eq!(nlink(&p.join("d/f")), 1);
    fs::hard_link(p.join("d/f"), p.join("d/f2")).unwrap();
    fs::hard_link(p.join("d/f"), p.join("e/f3")).unwrap();
    assert_eq!(nlink(&p.join("d/f")), 3);
    assert_eq!(nlink(&p.join("e/f3")), 3);
    fs::remove_file(p.join("d/f2")).unwrap();
    assert_eq!(nlink(&p.join("e/f3")), 2);
    assert_eq!(nlink(&p.join("d")), 2, "files do not count");
    for s in ["a", "b", "c"] {
        fs::create_dir(p.join("d").join(s)).unwrap();
    }
    assert_eq!(nlink(&p.join("d")), 5);
    assert_eq!(nlink(&p.join("d/a")), 2);
    fs::remove_dir(p.join("d/c")).unwrap();
    assert_eq!(nlink(&p.join("d")), 4);
    fs::rename(p.join("d/b"), p.join("e/b")).unwrap();
    assert_eq!((nlink(&p.join("d")), nlink(&p.join("e"))), (3, 4));
    // A directory renamed over an empty one: the target's link goes, the parent gains
    // the mover's.
    fs::rename(p.join("d/a"), p.join("e/empty")).unwrap();
    assert_eq!((nlink(&p.join("d")), nlink(&p.join("e"))), (2, 4));
    assert_eq!(nlink(p), 2 + 2, "root: d and e");
    let b = cluster.mount("b");
    let q = b.path.as_path();
    assert_eq!(
        [
            nlink(q),
            nlink(&q.join("d")),
            nlink(&q.join("e")),
            nlink(&q.join("e/f3"))
        ],
        [4, 2, 4, 2],
        "a second mount sees the same counts"
    );
}

/// Guards against `statfs` answers made up or zero (`df`, installers and trainers check
/// free space before writing): blocks are the data servers' capacity divided by the
/// copies each chunk gets, free space falls by what is written (not by its copies) and comes back when it is deleted, and the inode count follows
/// creates and unlinks.
#[test]
fn statfs_reports_capacity_free_space_and_inodes() {
    const SERVERS: u64 = 2;
    let cluster = ProcessCluster::start(SERVERS as usize);
    let m = cluster.mount("mnt");
    let s = statvfs(&m.path);
    assert!(s.f_frsize > 0 && s.f_bsize > 0, "{}", s.f_frsize);
    // Three copies by default, capped at the two servers: every byte is stored twice.
    assert_eq!(
        s.f_blocks * s.f_frsize,
        16 << 30,
        "capacity of the data servers over the copies"
    );
    assert!(s.f_bfree > 0 && s.f_bfree <= s.f_blocks && s.f_bavail <= s.f_bfree);
    assert!(s.f_files > 0 && s.f_ffree > 0 && s.f_ffree <= s.f_files);
    assert_eq!(s.f_namemax, 255);
    let used_inodes = |s: &libc::statvfs| s.f_files - s.f_ffree;
    for i in 0..10 {
        fs::write(m.path.join(format!("f{i}")), b"").unwrap();
    }
    assert_eq!(used_inodes(&statvfs(&m.path)), used_inodes(&s) + 10);
    let free_bytes = |s: &libc::statvfs| s.f_bfree * s.f_frsize;
    let data = pseudo_random(32 << 20, 3);
    fs::write(m.path.join("big"), &data).unwrap();
    wait_until(
        "free space to fall by 32 MiB",
        Duration::from_secs(30),
        || free_bytes(&statvfs(&m.path)) + (32 << 20) <= free_bytes(&s),
    );
    assert!(
        free_bytes(&statvfs(&m.path)) + (40 << 20) > free_bytes(&s),
        "32 MiB of file data counted once, not per copy"
    );
    fs::remove_file(m.path.join("big")).unwrap();
    for i in 0..10 {
        fs::remove_file(m.path.join(format!("f{i}"))).unwrap();
    }
    assert_eq!(used_inodes(&statvfs(&m.path)), used_inodes(&s));
    wait_until("free space to come back", Duration::from_secs(30), || {
        chunk_files(cluster.dir(), None) == 0
            && free_bytes(&statvfs(&m.path)) + (1 << 20) >= free_bytes(&s)
    });
}

/// Guards against the mount's atime option being ignored (every mount behaved as
/// `relatime`): with `noatime` neither reads nor listings move atime, with `relatime`
/// only the first after a change does, with `strictatime` every open that reads and
/// every listing does; an `O_NOATIME` open's reads never do.
#[test]
fn reads_and_listings_move_atime_as_the_mount_option_says() {
    let cluster = ProcessCluster::start(1);
    for mode in ["noatime", "relatime", "strictatime"] {
        let m = cluster.mount_with_config(mode, &format!("atime = \"{mode}\""));
        // One namespace: each mount has its own names.
        let (f, d) = (
            m.path.join(format!("f-{mode}")),
            m.path.join(format!("d-{mode}")),
        );
        fs::write(&f, b"some bytes").unwrap();
        fs::create_dir(&d).unwrap();
        fs::write(d.join("e"), b"").unwrap();
        let (first, again) = match mode {
            "noatime" => ("", ""),
            "relatime" => ("a", ""),
            _ => ("a", "a"),
        };
        // O_NOATIME (the owner's, as here): this open's reads move nothing whatever
        // the option (LTP's open12).
        let tn = times(&f);
        let mut v = Vec::new();
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOATIME)
            .open(&f)
            .unwrap()
            .read_to_end(&mut v)
            .unwrap();
        assert_eq!(v, b"some bytes");
        let t0 = times(&f);
        moved(&format!("{mode}: O_NOATIME read"), tn, t0, "");
        assert_eq!(read_all(&f), b"some bytes");
        let t1 = times(&f);
        moved(&format!("{mode}: first read"), t0, t1, first);
        assert_eq!(read_all(&f), b"some bytes");
        let t2 = times(&f);
        moved(&format!("{mode}: second read"), t1, t2, again);
        let list = || fs::read_dir(&d).unwrap().count();
        let l0 = times(&d);
        assert_eq!(list(), 1);
        let l1 = times(&d);
        moved(&format!("{mode}: first listing"), l0, l1, first);
        assert_eq!(list(), 1);
        let l2 = times(&d);
        moved(&format!("{mode}: second listing"), l1, l2, again);
    }
}
