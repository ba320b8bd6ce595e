//! Real FUSE mounts of a cluster of real processes, driven by the tools users run.
//! They need root and /dev/fuse, as CI has.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tessera_tests::posix::check_output;
use tessera_tests::{pseudo_random, sha256_hex, ProcessCluster};

fn sh(cmd: &str, cwd: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(cwd)
        .output()
        .expect("sh runs");
    check_output(cmd, &out)
}

fn sha256_file(p: &Path) -> String {
    let out = sh(&format!("sha256sum '{}'", p.display()), Path::new("/"));
    out.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The harness's watchdog, which keeps a deadlocked mount from hanging the whole suite:
/// it aborts the mount's FUSE connection once its limit passes, and never when its
/// guard is dropped in time (it once did, at every drop).
#[test]
fn a_test_watchdog_aborts_its_mount_at_the_limit_and_not_when_dropped() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let dev = fs::metadata(&m.path).unwrap().dev();
    fs::write(m.path.join("before"), b"x").unwrap();
    drop(m.watchdog(Duration::from_secs(1)));
    // A sleep on purpose: past the dropped watchdog's limit, to see it did not fire.
    std::thread::sleep(Duration::from_secs(2));
    let now = fs::metadata(&m.path).map(|a| a.dev());
    assert_eq!(
        now.ok(),
        Some(dev),
        "a dropped watchdog took the mount down"
    );
    // A create always reaches the mount process: no kernel cache answers it.
    fs::write(m.path.join("after-drop"), b"y").unwrap();
    assert_eq!(fs::read(m.path.join("before")).unwrap(), b"x");
    // Once aborted, the mount's requests fail and the mount process unmounts itself:
    // the path then names the directory underneath.
    let _dog = m.watchdog(Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(30);
    while fs::metadata(&m.path).map(|a| a.dev()).ok() == Some(dev) {
        assert!(Instant::now() < deadline, "the watchdog never fired");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!m.path.join("before").exists());
}

#[test]
fn mkdir_p_dd_100_mib_and_sha256_after_a_remount() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount("mnt");
    sh("mkdir -p a/b/c/d && mkdir -p a/b/e", &m.path);
    assert!(m.path.join("a/b/c/d").is_dir() && m.path.join("a/b/e").is_dir());
    let src = cluster.dir().join("src.bin");
    fs::write(&src, pseudo_random(100 << 20, 9)).unwrap();
    let want = sha256_file(&src);
    sh(
        &format!(
            "dd if='{}' of=a/b/c/d/big bs=1M status=none conv=fsync",
            src.display()
        ),
        &m.path,
    );
    assert_eq!(sha256_file(&m.path.join("a/b/c/d/big")), want);
    let path = m.path.clone();
    let log = m.unmount();
    assert!(
        !fs_client::cli::local_cluster::is_mounted(&path),
        "unmounted; log:\n{log}"
    );
    let m = cluster.mount("mnt");
    assert_eq!(
        fs::metadata(m.path.join("a/b/c/d/big")).unwrap().len(),
        100 << 20
    );
    assert_eq!(sha256_file(&m.path.join("a/b/c/d/big")), want);
}

#[test]
fn ls_l_shows_sizes_and_mtimes_and_rename_replaces_a_file() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount("mnt");
    let p = &m.path;
    let before = std::time::SystemTime::now();
    fs::write(p.join("five"), b"12345").unwrap();
    fs::write(p.join("big"), vec![7u8; 5 << 20]).unwrap();
    sh("touch -d @1600000000 old", p);
    let ls = sh("ls -l --time-style=+%s five big old", p);
    let fields: Vec<Vec<&str>> = ls.lines().map(|l| l.split_whitespace().collect()).collect();
    let row = |name: &str| {
        fields
            .iter()
            .find(|f| f.last() == Some(&name))
            .unwrap()
            .clone()
    };
    assert_eq!(row("five")[4], "5");
    assert_eq!(row("big")[4], (5u64 << 20).to_string());
    assert_eq!(row("old")[4], "0");
    assert_eq!(row("old")[5], "1600000000");
    let mtime: i64 = row("five")[5].parse().unwrap();
    let start = before
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (start - 2..=start + 60).contains(&mtime),
        "mtime {mtime} vs start {start}"
    );
    assert!(row("five")[0].starts_with("-rw-"), "{:?}", row("five"));

    // Rename over an existing file: the target is replaced atomically.
    fs::write(p.join("target"), b"old contents").unwrap();
    fs::write(p.join("new"), b"new contents").unwrap();
    fs::rename(p.join("new"), p.join("target")).unwrap();
    assert_eq!(fs::read(p.join("target")).unwrap(), b"new contents");
    assert!(!p.join("new").exists());
    let names = sh("ls -a", p);
    assert_eq!(names.lines().filter(|l| *l == "target").count(), 1);
    // Renaming a directory over an empty one works; over a non-empty one fails.
    sh("mkdir d1 d2 d3 && touch d3/x && mv -T d1 d2", p);
    assert!(p.join("d2").is_dir() && !p.join("d1").exists());
    let e = fs::rename(p.join("d2"), p.join("d3")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
}

#[test]
fn an_unlinked_open_file_stays_readable_until_closed() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount("mnt");
    let data = pseudo_random(6 << 20, 5);
    let path = m.path.join("doomed");
    fs::write(&path, &data).unwrap();
    let mut f = File::open(&path).unwrap();
    let mut head = vec![0u8; 4096];
    f.read_exact(&mut head).unwrap();
    fs::remove_file(&path).unwrap();
    assert!(!path.exists(), "the name is gone");
    assert_eq!(f.metadata().unwrap().len(), data.len() as u64);
    let mut rest = Vec::new();
    f.read_to_end(&mut rest).unwrap();
    head.extend_from_slice(&rest);
    assert_eq!(sha256_hex(&head), sha256_hex(&data));
    // A writer keeps writing to its unlinked file, and reads its bytes back.
    let wpath = m.path.join("doomed-rw");
    let mut w = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&wpath)
        .unwrap();
    fs::remove_file(&wpath).unwrap();
    w.write_all(b"still here").unwrap();
    w.sync_all().unwrap();
    let mut back = String::new();
    std::io::Seek::seek(&mut w, std::io::SeekFrom::Start(0)).unwrap();
    w.read_to_string(&mut back).unwrap();
    assert_eq!(back, "still here");
}

#[test]
fn cp_a_a_tree_in_and_out_is_identical() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount("mnt");
    let src = cluster.dir().join("tree");
    fs::create_dir_all(src.join("sub/deeper")).unwrap();
    fs::write(src.join("a.txt"), b"alpha\n").unwrap();
    fs::write(src.join("sub/b.bin"), pseudo_random(3 << 20, 1)).unwrap();
    fs::write(src.join("sub/deeper/empty"), b"").unwrap();
    sh(
        "ln -s ../a.txt sub/link && chmod 600 sub/b.bin && touch -d @1500000000 a.txt",
        &src,
    );
    sh(&format!("cp -a '{}' tree", src.display()), &m.path);
    let out = cluster.dir().join("back");
    sh(&format!("cp -a tree '{}'", out.display()), &m.path);
    sh(
        &format!("diff -r '{}' '{}'", src.display(), out.display()),
        Path::new("/"),
    );
    sh(&format!("diff -r '{}' tree", src.display()), &m.path);
    let meta = fs::metadata(out.join("a.txt")).unwrap();
    assert_eq!(
        meta.mtime(),
        1_500_000_000,
        "cp -a kept the mtime through the mount"
    );
    assert_eq!(
        fs::metadata(out.join("sub/b.bin")).unwrap().mode() & 0o777,
        0o600
    );
    assert_eq!(
        fs::read_link(m.path.join("tree/sub/link")).unwrap(),
        Path::new("../a.txt")
    );
}

#[test]
fn python_checkpoint_write_fsync_rename_and_read_back() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount("mnt");
    let script = r#"
import hashlib, os, sys
d = sys.argv[1]
data = os.urandom(1 << 20) * 256
tmp = os.path.join(d, "ckpt.pt.tmp")
with open(tmp, "wb") as f:
    for i in range(0, len(data), 8 << 20):
        f.write(data[i:i + (8 << 20)])
    f.flush()
    os.fsync(f.fileno())
os.rename(tmp, os.path.join(d, "ckpt.pt"))
dfd = os.open(d, os.O_RDONLY)
os.fsync(dfd)
os.close(dfd)
with open(os.path.join(d, "ckpt.pt"), "rb") as f:
    back = f.read()
assert not os.path.exists(tmp)
assert len(back) == len(data), (len(back), len(data))
assert hashlib.sha256(back).digest() == hashlib.sha256(data).digest()
print(hashlib.sha256(data).hexdigest())
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&m.path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let digest = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // The bytes are there for a fresh mount too.
    drop(m);
    let m = cluster.mount("again");
    assert_eq!(sha256_file(&m.path.join("ckpt.pt")), digest);
}

#[test]
fn two_mounts_see_each_others_files_after_close() {
    let cluster = ProcessCluster::start(3);
    let a = cluster.mount("a");
    let b = cluster.mount("b");
    fs::write(a.path.join("from-a"), b"written by a").unwrap();
    assert_eq!(fs::read(b.path.join("from-a")).unwrap(), b"written by a");
    // b reads it first, then a rewrites it longer: b's next open sees the new bytes.
    fs::write(a.path.join("shared"), b"v1").unwrap();
    assert_eq!(fs::read(b.path.join("shared")).unwrap(), b"v1");
    fs::write(a.path.join("shared"), b"version two").unwrap();
    assert_eq!(fs::read(b.path.join("shared")).unwrap(), b"version two");
    fs::create_dir(b.path.join("dir-from-b")).unwrap();
    fs::write(b.path.join("dir-from-b/f"), pseudo_random(5 << 20, 2)).unwrap();
    assert_eq!(
        sha256_file(&a.path.join("dir-from-b/f")),
        sha256_hex(&pseudo_random(5 << 20, 2))
    );
}

/// Close-to-open keeps what a mount's own writes put in its page cache: a file written
/// and closed (and one rewritten in part through another descriptor, then fsynced) is
/// read back by the next open from the kernel's cache, and not fetched again from the
/// data servers (the open once took the new length and mtime of its own commit for
/// another client's change and dropped every page). A change made through another
/// mount still drops them, and the bytes read are the new ones.
#[test]
fn a_mounts_own_writes_stay_cached_for_its_next_open_and_another_mounts_do_not() {
    use std::os::unix::fs::FileExt;
    use tessera_tests::posix::resident_pages;
    const LEN: usize = 1 << 20;
    const PAGES: usize = LEN / 4096;
    let cluster = ProcessCluster::start(3);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    let path = a.path.join("f");
    let mut data = pseudo_random(LEN, 7);
    fs::write(&path, &data).unwrap();
    let f = File::open(&path).unwrap();
    assert_eq!(
        resident_pages(&f, LEN),
        PAGES,
        "pages written, then reopened"
    );
    drop(f);

    // A part rewritten through another descriptor, fsynced, closed.
    let w = fs::OpenOptions::new().write(true).open(&path).unwrap();
    w.write_all_at(b"rewritten", 5000).unwrap();
    w.sync_all().unwrap();
    drop(w);
    data[5000..5009].copy_from_slice(b"rewritten");
    let f = File::open(&path).unwrap();
    assert_eq!(
        resident_pages(&f, LEN),
        PAGES,
        "pages after a partial rewrite"
    );
    let mut back = vec![0u8; LEN];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back == data, "the cached bytes are the file's");
    drop(f);

    // Another mount changes it: a's next open drops its pages and reads the new bytes.
    let other = fs::OpenOptions::new()
        .write(true)
        .open(b.path.join("f"))
        .unwrap();
    other.write_all_at(b"from b", 100_000).unwrap();
    drop(other);
    data[100_000..100_006].copy_from_slice(b"from b");
    let f = File::open(&path).unwrap();
    assert_eq!(
        resident_pages(&f, LEN),
        0,
        "pages after another mount's change"
    );
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back == data, "a reads b's change");
}

/// Guards against write-behind losing or misplacing bytes of writer processes sharing
/// one file (ranges that do not end on segment boundaries), and against another mount
/// missing them, or serving its cached old bytes, after the writers closed.
#[test]
fn four_dd_writers_of_disjoint_ranges_then_another_mount_reads_and_sees_a_rewrite() {
    let cluster = ProcessCluster::start(3);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    let part = (16 << 20) + 12_345;
    let (v1, v2) = (pseudo_random(4 * part, 11), pseudo_random(4 * part, 12));
    let (src1, src2) = (cluster.dir().join("v1.bin"), cluster.dir().join("v2.bin"));
    fs::write(&src1, &v1).unwrap();
    fs::write(&src2, &v2).unwrap();
    let dd = |src: &Path, i: usize| {
        format!(
            "dd if='{}' of=f bs=1M iflag=skip_bytes,count_bytes oflag=seek_bytes \
             skip={at} seek={at} count={part} conv=notrunc status=none & p{i}=$!; ",
            src.display(),
            at = i * part
        )
    };
    let all: String = (0..4).map(|i| dd(&src1, i)).collect();
    sh(
        &format!("{all} wait $p0 && wait $p1 && wait $p2 && wait $p3"),
        &a.path,
    );
    assert_eq!(
        sha256_file(&a.path.join("f")),
        sha256_hex(&v1),
        "on the writers' mount"
    );
    assert_eq!(
        sha256_file(&b.path.join("f")),
        sha256_hex(&v1),
        "on another mount"
    );
    // Rewritten in place by one writer: b, which has the old bytes cached, sees the new.
    sh(
        &format!(
            "dd if='{}' of=f bs=1M conv=notrunc,fsync status=none",
            src2.display()
        ),
        &a.path,
    );
    assert_eq!(
        sha256_file(&b.path.join("f")),
        sha256_hex(&v2),
        "after the rewrite"
    );
    assert_eq!(
        fs::metadata(b.path.join("f")).unwrap().len(),
        v2.len() as u64
    );
}
