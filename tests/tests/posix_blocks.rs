//! `st_blocks` on real mounts (issue 28, item 11): it reports the blocks the chunks
//! hold, so `du` shows a sparse file (a checkpoint, a disk image) as small as it is; a
//! dense file counts its whole length, a small one its bytes rounded up to a block;
//! truncation and punched whole chunks lower it, and it survives a remount and dropped
//! caches. The default chunk is 4 MiB. They need root (writing
//! `/proc/sys/vm/drop_caches`) and /dev/fuse, as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::Command;
use tessera_tests::posix::{check_output, fallocate};
use tessera_tests::{pseudo_random, ProcessCluster};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The default chunk size.
const CHUNK: u64 = 4 * MIB;

/// Drops the kernel's page cache, dentries and inodes, so stats reach the servers.
fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", "3").expect("dropping the kernel's caches");
}

fn blocks(p: &Path) -> u64 {
    fs::metadata(p).unwrap().blocks()
}

/// What `du` says the file takes, in bytes.
fn du_bytes(p: &Path) -> u64 {
    let out = Command::new("du").arg("-B1").arg(p).output().unwrap();
    let text = check_output("du", &out);
    text.split_whitespace().next().unwrap().parse().unwrap()
}

/// Writes 1 MiB at 0 and 1 MiB at 1 GiB (a 1 GiB + 1 MiB file with a hole between).
fn write_sparse(p: &Path) -> File {
    let f = File::create(p).unwrap();
    let data = pseudo_random(MIB as usize, 1);
    f.write_all_at(&data, 0).unwrap();
    f.write_all_at(&data, GIB).unwrap();
    f
}

/// Guards against `st_blocks` following the length (`du` counted the holes of a sparse
/// file: a 1 GiB hole showed as 1 GiB used), also after a remount and dropped caches.
#[test]
fn a_sparse_file_reports_the_blocks_its_chunks_hold() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let p = m.path.join("sparse");
    let f = write_sparse(&p);
    let size = GIB + MIB;
    // Its first chunk whole (the file goes on past it) and 1 MiB of its last.
    let want = (CHUNK + MIB) / 512;
    // Before the close commits them, the writes already count (not as a hole).
    let open = f.metadata().unwrap();
    assert_eq!(open.len(), size);
    assert!(
        open.blocks() >= 2 * MIB / 512,
        "open: {} blocks",
        open.blocks()
    );
    drop(f);
    let st = fs::metadata(&p).unwrap();
    assert_eq!((st.len(), st.blocks()), (size, want), "after the close");
    assert!(st.blocks() < size / 512 / 100, "far below size/512");
    assert_eq!(du_bytes(&p), want * 512, "du");
    m.unmount();
    drop_caches();
    let m = cluster.mount("again");
    let p = m.path.join("sparse");
    assert_eq!(blocks(&p), want, "after a remount and dropped caches");
    assert_eq!(du_bytes(&p), want * 512, "du after a remount");
    let (code, out) = cluster.tessera(&["fsck"]);
    assert_eq!(code, 0, "tessera fsck:\n{out}");
}

/// Guards against a dense or small file reporting fewer blocks than its bytes, and
/// against truncation and punched holes leaving freed chunks counted.
#[test]
fn dense_small_cut_and_punched_files_count_what_they_hold() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let dense = m.path.join("dense");
    fs::write(&dense, pseudo_random((5 * CHUNK + 12345) as usize, 2)).unwrap();
    let size = 5 * CHUNK + 12345;
    assert!(blocks(&dense) >= size / 512, "dense: {}", blocks(&dense));
    let small = m.path.join("small");
    fs::write(&small, vec![7u8; 1000]).unwrap();
    assert_eq!(blocks(&small), 2, "1000 bytes: two blocks");

    // Cut down to 1.5 chunks: what is left.
    let f = OpenOptions::new().write(true).open(&dense).unwrap();
    f.set_len(CHUNK + CHUNK / 2).unwrap();
    assert_eq!(blocks(&dense), (CHUNK + CHUNK / 2) / 512, "after the cut");
    // Grown again, the new part is a hole.
    f.set_len(4 * CHUNK).unwrap();
    assert_eq!(
        blocks(&dense),
        2 * CHUNK / 512,
        "grown: the cut chunk counts whole"
    );
    drop(f);

    // A hole punched over chunk 1 and a half frees chunk 1 only.
    let punched = m.path.join("punched");
    fs::write(&punched, pseudo_random((4 * CHUNK) as usize, 3)).unwrap();
    let f = OpenOptions::new().write(true).open(&punched).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fallocate(&f, punch, CHUNK, CHUNK + CHUNK / 2).unwrap();
    assert_eq!(blocks(&punched), 3 * CHUNK / 512, "a whole chunk punched");
    fallocate(&f, punch, 3 * CHUNK + 4096, 8192).unwrap();
    assert_eq!(
        blocks(&punched),
        3 * CHUNK / 512,
        "part of a chunk: still held"
    );
    drop(f);
    drop_caches();
    assert_eq!(blocks(&punched), 3 * CHUNK / 512, "after dropped caches");

    // `truncate -s` makes a hole; `fallocate` reserves blocks, as on a local disk.
    let hole = m.path.join("hole");
    File::create(&hole).unwrap().set_len(GIB).unwrap();
    assert_eq!(blocks(&hole), 0, "truncate -s: all hole");
    let reserved = m.path.join("reserved");
    let f = File::create(&reserved).unwrap();
    fallocate(&f, 0, 0, 2 * CHUNK).unwrap();
    assert_eq!(f.metadata().unwrap().blocks(), 2 * CHUNK / 512, "fallocate");
    let (code, out) = cluster.tessera(&["fsck"]);
    assert_eq!(code, 0, "tessera fsck:\n{out}");
}

/// Guards against `cp --sparse=always` onto the mount filling the holes it skips.
/// cp finds the source's holes with `SEEK_HOLE`/`SEEK_DATA` and also skips runs of
/// zeros it reads, so a copy from the mount stays sparse too.
#[test]
fn cp_sparse_always_onto_the_mount_stays_sparse() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let local = cluster.dir().join("local-sparse");
    drop(write_sparse(&local));
    let onto = m.path.join("copy");
    let out = Command::new("cp")
        .arg("--sparse=always")
        .arg(&local)
        .arg(&onto)
        .output()
        .unwrap();
    check_output("cp", &out);
    let want = (CHUNK + MIB) / 512;
    assert_eq!(fs::metadata(&onto).unwrap().len(), GIB + MIB);
    assert_eq!(blocks(&onto), want, "local -> mount");
    let again = m.path.join("copy2");
    let out = Command::new("cp")
        .arg("--sparse=always")
        .arg(&onto)
        .arg(&again)
        .output()
        .unwrap();
    check_output("cp", &out);
    assert_eq!(blocks(&again), want, "mount -> mount");
    let data = pseudo_random(MIB as usize, 1);
    let copy = File::open(&again).unwrap();
    for (at, want) in [
        (0, &data[..]),
        (GIB, &data[..]),
        (GIB / 2, &[0u8; 4096][..]),
    ] {
        let mut got = vec![1u8; want.len()];
        copy.read_exact_at(&mut got, at).unwrap();
        assert!(got == want, "the copy's bytes at {at}");
    }
}
