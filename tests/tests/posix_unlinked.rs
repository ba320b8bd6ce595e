//! POSIX point 6 on real mounts: a file unlinked or renamed over by one mount stays
//! readable and writable through the handles another mount (and this one) hold; its
//! chunks and inode are freed after the last close, and reclaimed when the client
//! holding it crashes. Holders are separate processes ([`Agent`]s), some of them an
//! unprivileged user.
//! They need root and /dev/fuse, as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;
use tessera_tests::posix::{
    chunk_files, file_owned, open_to_all, statvfs, wait_chunks, wait_until, User, ALICE_UID,
};
use tessera_tests::{pseudo_random, sha256_hex, Agent, Mount, ProcessCluster};

const MIB: usize = 1 << 20;

fn ino(p: &Path) -> u64 {
    fs::metadata(p).unwrap().ino()
}

fn used_inodes(m: &Mount) -> u64 {
    let s = statvfs(&m.path);
    s.f_files - s.f_ffree
}

/// `len` pseudo-random bytes that start with `head`, so an agent can read them as text.
fn content(head: &[u8], len: usize, seed: u64) -> Vec<u8> {
    let mut v = pseudo_random(len, seed);
    v[..head.len()].copy_from_slice(head);
    v
}

/// Proves that the garbage collector ran after everything done so far: a throwaway
/// file, unlinked now, loses its chunks. Whatever still has chunks afterwards was kept
/// on purpose, not merely not reached yet.
fn gc_round(cluster: &ProcessCluster, m: &Mount, name: &str) {
    let p = m.path.join(name);
    fs::write(&p, pseudo_random(MIB, 99)).unwrap();
    let i = ino(&p);
    assert_eq!(chunk_files(cluster.dir(), Some(i)), 1);
    fs::remove_file(&p).unwrap();
    wait_chunks(cluster.dir(), Some(i), 0);
}

fn opened(user: User, name: &str, path: &Path, mode: &str) -> Agent {
    let mut ag = Agent::start(&user, name);
    ag.expect(&format!("open f {} {mode}", path.display()), "ok");
    ag
}

/// Guards against an unlink on one mount pulling a file from under the processes that
/// have it open on another (training jobs read files that a cleaner deletes), and
/// against the opposite, space never freed: reads and writes (a new chunk included) go
/// on through both handles, the data survive garbage collection while any handle is
/// open, and the chunks and the inode go after the last close.
#[test]
fn an_unlinked_file_lives_until_its_last_handle_on_any_mount_closes() {
    let cluster = ProcessCluster::start(3);
    open_to_all(cluster.dir());
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    let base_inodes = used_inodes(&a);
    let data = content(b"HEAD", 9 * MIB, 1);
    file_owned(&a.path.join("doomed"), &data, 0o666, 0, 0);
    let i = ino(&a.path.join("doomed"));
    let mut ha = opened(
        User::plain(ALICE_UID),
        "a-user",
        &a.path.join("doomed"),
        "rw",
    );
    let mut hb = opened(User::root(), "b-reader", &b.path.join("doomed"), "r");
    fs::remove_file(b.path.join("doomed")).unwrap();
    assert!(!b.path.join("doomed").exists());
    // Mount a may show the link count it cached for up to the attribute TTL (1 s).
    std::thread::sleep(Duration::from_millis(1200));
    ha.expect("fstat f", &format!("ok {} 0", data.len()));
    ha.expect("sha f", &format!("ok {} {}", sha256_hex(&data), data.len()));
    ha.expect(&format!("pwrite f {} beyond", 12 * MIB), "ok 6");
    ha.expect("fsync f", "ok");
    let mut want = data.clone();
    want.resize(12 * MIB, 0);
    want.extend_from_slice(b"beyond");
    ha.expect("sha f", &format!("ok {} {}", sha256_hex(&want), want.len()));
    hb.expect("pread f 0 4", "ok HEAD");
    gc_round(&cluster, &b, "control-1");
    assert_eq!(chunk_files(cluster.dir(), Some(i)), 4, "kept while open");
    ha.expect("sha f", &format!("ok {} {}", sha256_hex(&want), want.len()));
    ha.expect("close f", "ok");
    gc_round(&cluster, &b, "control-2");
    assert_eq!(
        chunk_files(cluster.dir(), Some(i)),
        4,
        "kept while b has it open"
    );
    hb.expect("pread f 0 4", "ok HEAD");
    hb.expect("close f", "ok");
    wait_chunks(cluster.dir(), Some(i), 0);
    assert_eq!(used_inodes(&a), base_inodes, "the orphan inode is gone too");
}

/// Guards against a rename over an open file (the write-temp-then-rename pattern of
/// config files and checkpoints) breaking the readers of the old file or mixing the
/// two: the old handle keeps the old bytes and may write them, the name shows the new
/// file on both mounts, and the old file's chunks go at its last close.
#[test]
fn a_renamed_over_file_stays_usable_and_goes_at_last_close() {
    let cluster = ProcessCluster::start(3);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    let old = content(b"OLD!", 5 * MIB, 2);
    let new = content(b"NEW!", 3 * MIB, 3);
    fs::write(a.path.join("config"), &old).unwrap();
    let old_ino = ino(&a.path.join("config"));
    let mut ha = opened(User::root(), "a-reader", &a.path.join("config"), "rw");
    fs::write(b.path.join("config.tmp"), &new).unwrap();
    let new_ino = ino(&b.path.join("config.tmp"));
    fs::rename(b.path.join("config.tmp"), b.path.join("config")).unwrap();
    ha.expect("sha f", &format!("ok {} {}", sha256_hex(&old), old.len()));
    ha.expect("pwrite f 0 old?", "ok 4");
    ha.expect("pread f 0 4", "ok old?");
    // As above: mount a may show the link count it cached (from its own create's reply,
    // or the kernel's) for up to the attribute TTL (1 s).
    std::thread::sleep(Duration::from_millis(1200));
    ha.expect("fstat f", &format!("ok {} 0", old.len()));
    assert_eq!(
        sha256_hex(&fs::read(b.path.join("config")).unwrap()),
        sha256_hex(&new)
    );
    wait_until(
        "mount a to show the new file",
        Duration::from_secs(10),
        || ino(&a.path.join("config")) == new_ino,
    );
    assert_eq!(
        sha256_hex(&fs::read(a.path.join("config")).unwrap()),
        sha256_hex(&new)
    );
    gc_round(&cluster, &b, "control");
    assert_eq!(
        chunk_files(cluster.dir(), Some(old_ino)),
        2,
        "kept while open"
    );
    ha.expect("close f", "ok");
    wait_chunks(cluster.dir(), Some(old_ino), 0);
    assert_eq!(
        chunk_files(cluster.dir(), Some(new_ino)),
        1,
        "the new file is untouched"
    );
    assert_eq!(
        sha256_hex(&fs::read(b.path.join("config")).unwrap()),
        sha256_hex(&new)
    );
}

/// Guards against files that a crashed client held open after they were unlinked (or
/// renamed over) leaking their chunks and inodes forever: when the `tessera mount`
/// process is killed with SIGKILL, its sessions end with its connection and both files
/// are reclaimed, chunks written after the unlink included; the survivors are intact.
#[test]
fn a_crashed_clients_unlinked_files_are_reclaimed() {
    let cluster = ProcessCluster::start(3);
    open_to_all(cluster.dir());
    let (mut a, b) = (cluster.mount("a"), cluster.mount("b"));
    let base_inodes = used_inodes(&b);
    file_owned(
        &a.path.join("unlinked"),
        &pseudo_random(9 * MIB, 4),
        0o666,
        0,
        0,
    );
    file_owned(
        &a.path.join("replaced"),
        &pseudo_random(5 * MIB, 5),
        0o666,
        0,
        0,
    );
    let (i1, i2) = (ino(&a.path.join("unlinked")), ino(&a.path.join("replaced")));
    let mut h1 = opened(
        User::plain(ALICE_UID),
        "a-user",
        &a.path.join("unlinked"),
        "rw",
    );
    let h2 = opened(User::root(), "a-root", &a.path.join("replaced"), "r");
    fs::remove_file(b.path.join("unlinked")).unwrap();
    let survivor = content(b"LIVE", 2 * MIB, 6);
    fs::write(b.path.join("new"), &survivor).unwrap();
    fs::rename(b.path.join("new"), b.path.join("replaced")).unwrap();
    h1.expect(&format!("pwrite f {} more", 13 * MIB), "ok 4");
    h1.expect("fsync f", "ok");
    gc_round(&cluster, &b, "control");
    assert_eq!(chunk_files(cluster.dir(), Some(i1)), 4, "kept while open");
    assert_eq!(chunk_files(cluster.dir(), Some(i2)), 2, "kept while open");
    a.kill_client();
    wait_chunks(cluster.dir(), Some(i1), 0);
    wait_chunks(cluster.dir(), Some(i2), 0);
    assert_eq!(
        used_inodes(&b),
        base_inodes + 1,
        "only the survivor is left"
    );
    let dead = h1.ask("sha f");
    assert!(
        dead.starts_with("err"),
        "a read through a dead mount: {dead}"
    );
    drop((h1, h2));
    let a2 = cluster.mount("a2");
    let back = fs::read(a2.path.join("replaced")).unwrap();
    assert_eq!(sha256_hex(&back), sha256_hex(&survivor));
    assert!(!a2.path.join("unlinked").exists());
}

/// Guards against attributes the mount keeps from its own replies outliving a change
/// they do not show: `fstat` on a descriptor held across an unlink shows no link even
/// right after a truncation or `chmod` of the file (whose replies the mount keeps for
/// the kernel's next `getattr`), and an `O_TRUNC` open right after them shows length 0.
/// Found by the differential namespace test (a seed that ran a truncation, then an
/// unlink, then `fstat`).
#[test]
fn a_held_descriptor_sees_the_unlink_and_a_truncating_open_after_a_setattr() {
    use std::os::unix::fs::PermissionsExt;
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("m");
    let p = m.path.join("f");
    fs::write(&p, pseudo_random(5000, 1)).unwrap();
    let held = fs::File::open(&p).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(3000)
        .unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
    fs::remove_file(&p).unwrap();
    let st = held.metadata().unwrap();
    assert_eq!((st.nlink(), st.len()), (0, 3000), "after the unlink");

    let q = m.path.join("g");
    fs::write(&q, b"some bytes").unwrap();
    fs::set_permissions(&q, fs::Permissions::from_mode(0o640)).unwrap();
    let t = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&q)
        .unwrap();
    assert_eq!(t.metadata().unwrap().len(), 0, "after an O_TRUNC open");
    assert_eq!(fs::metadata(&q).unwrap().len(), 0);
}

/// Guards against `fstat` on a directory held open failing with ENOENT once the
/// directory is removed or renamed over, by this mount or another (a local file system
/// answers with no link, as it does for an unlinked file).
#[test]
fn a_held_directory_answers_fstat_after_it_is_removed_or_renamed_over() {
    let cluster = ProcessCluster::start(1);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    for d in ["gone", "target", "over", "elsewhere"] {
        fs::create_dir(a.path.join(d)).unwrap();
    }
    let held = |name: &str| {
        let f = fs::File::open(a.path.join(name)).unwrap();
        let i = f.metadata().unwrap().ino();
        (name.to_string(), f, i)
    };
    let (gone, target, elsewhere) = (held("gone"), held("target"), held("elsewhere"));
    fs::remove_dir(a.path.join("gone")).unwrap();
    fs::rename(a.path.join("over"), a.path.join("target")).unwrap();
    fs::remove_dir(b.path.join("elsewhere")).unwrap();
    let unlinked = |(name, f, i): &(String, fs::File, u64)| {
        let st = f
            .metadata()
            .unwrap_or_else(|e| panic!("fstat of the removed {name}: {e}"));
        assert!(st.is_dir(), "{name}");
        assert_eq!(st.ino(), *i, "{name}");
        st.nlink() == 0
    };
    for _ in 0..2 {
        assert!(unlinked(&gone), "removed by this mount");
        assert!(unlinked(&target), "renamed over by this mount");
    }
    // Mount a may show what it cached for up to the attribute TTL (1 s).
    wait_until(
        "mount a to show the directory removed by b",
        Duration::from_secs(10),
        || unlinked(&elsewhere),
    );
    assert!(unlinked(&elsewhere), "and again");
}
