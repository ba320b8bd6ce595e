//! `O_TMPFILE` on real mounts (issue 28, item 10): an unnamed file written through its
//! descriptor, then named with `linkat` (`AT_EMPTY_PATH`, and `/proc/self/fd/N` with
//! `AT_SYMLINK_FOLLOW`) and read back after the kernel's caches were dropped; one never
//! named is freed at its close (chunks gone, `tessera fsck` clean); `O_EXCL` makes one
//! that no link can name; Python's `tempfile.TemporaryFile` takes the `O_TMPFILE` path.
//! They need root (`linkat` with `AT_EMPTY_PATH`, writing `/proc/sys/vm/drop_caches`)
//! and /dev/fuse, as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use tessera_tests::posix::{chunk_files, cpath, wait_chunks, User};
use tessera_tests::{pseudo_random, ProcessCluster};

const MIB: usize = 1 << 20;

/// `open(dir, O_TMPFILE | O_RDWR | extra, 0600)`.
fn tmpfile(dir: &Path, extra: i32) -> io::Result<File> {
    // SAFETY: a valid C string; the mode argument is read for O_TMPFILE.
    let fd = unsafe {
        libc::open(
            cpath(dir).as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | extra,
            0o600,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened and owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `linkat(fd, "", AT_FDCWD, to, AT_EMPTY_PATH)`.
fn link_fd(f: &File, to: &Path) -> io::Result<()> {
    // SAFETY: a valid descriptor and C strings.
    let r = unsafe {
        libc::linkat(
            f.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            cpath(to).as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, to, AT_SYMLINK_FOLLOW)`.
fn link_proc(f: &File, to: &Path) -> io::Result<()> {
    let from = format!("/proc/self/fd/{}", f.as_raw_fd());
    // SAFETY: valid C strings.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            cpath(Path::new(&from)).as_ptr(),
            libc::AT_FDCWD,
            cpath(to).as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Drops the kernel's page cache, dentries and inodes, so reads reach the servers.
fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", "3").expect("dropping the kernel's caches");
}

/// Guards against `O_TMPFILE` failing with EOPNOTSUPP (fuser answered the kernel's
/// FUSE_TMPFILE with ENOSYS), and against an unnamed file that a link cannot name, or
/// that loses its bytes when named.
#[test]
fn tmpfile_written_then_linked_reads_back_by_name() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let dir = m.path.join("d");
    fs::create_dir(&dir).unwrap();
    let (a, b) = (pseudo_random(3 * MIB / 2, 10), pseudo_random(300_000, 11));

    let mut f = tmpfile(&dir, 0).expect("O_TMPFILE");
    f.write_all(&a).unwrap();
    let st = f.metadata().unwrap();
    assert_eq!(
        (st.nlink(), st.len(), st.mode() & 0o7777),
        (0, a.len() as u64, 0o600)
    );
    assert_eq!(
        fs::read_dir(&dir).unwrap().count(),
        0,
        "an unnamed file has no entry"
    );
    link_fd(&f, &dir.join("by-fd")).expect("linkat AT_EMPTY_PATH");
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    let mut g = tmpfile(&dir, 0).unwrap();
    g.write_all(&b).unwrap();
    link_proc(&g, &m.path.join("by-proc")).expect("linkat /proc/self/fd AT_SYMLINK_FOLLOW");
    // Written after the link: the named file is the open one.
    g.write_all(b"tail").unwrap();
    drop((f, g));

    drop_caches();
    assert_eq!(fs::read(dir.join("by-fd")).unwrap(), a, "by-fd's bytes");
    let mut want = b.clone();
    want.extend_from_slice(b"tail");
    assert_eq!(
        fs::read(m.path.join("by-proc")).unwrap(),
        want,
        "by-proc's bytes"
    );
    assert_eq!(fs::metadata(dir.join("by-fd")).unwrap().nlink(), 1);

    // O_EXCL: never linkable (the kernel refuses with ENOENT, as for an unlinked file).
    let h = tmpfile(&dir, libc::O_EXCL).expect("O_TMPFILE | O_EXCL");
    let e = link_fd(&h, &dir.join("never")).unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::ENOENT),
        "linking an O_EXCL tmpfile: {e}"
    );
    assert!(!dir.join("never").exists());
    let (code, out) = cluster.tessera(&["fsck"]);
    assert_eq!(code, 0, "tessera fsck with a tmpfile open:\n{out}");
}

/// Guards against an unnamed file that outlives its close: its inode and chunks must
/// go as an unlinked file's do, and `tessera fsck` must find nothing left.
#[test]
fn an_unnamed_tmpfile_is_freed_at_its_close() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let inodes_before = fs_inodes(&m.path);
    let mut f = tmpfile(&m.path, 0).unwrap();
    f.write_all(&pseudo_random(2 * MIB + 5, 12)).unwrap();
    f.sync_all().unwrap();
    let ino = f.metadata().unwrap().ino();
    assert!(
        chunk_files(cluster.dir(), Some(ino)) > 0,
        "its chunks were written"
    );
    assert_eq!(
        fs_inodes(&m.path),
        inodes_before + 1,
        "the open tmpfile is counted"
    );
    drop(f);
    wait_chunks(cluster.dir(), Some(ino), 0);
    assert_eq!(fs_inodes(&m.path), inodes_before, "its inode is freed");
    assert_eq!(fs::read_dir(&m.path).unwrap().count(), 0);
    let (code, out) = cluster.tessera(&["fsck"]);
    assert_eq!(code, 0, "tessera fsck after the tmpfile's close:\n{out}");
}

/// Inodes in use on the mount, as `df -i` counts them.
fn fs_inodes(p: &Path) -> u64 {
    let s = tessera_tests::posix::statvfs(p);
    s.f_files - s.f_ffree
}

/// Guards against Python's `tempfile.TemporaryFile` falling back to a named file (made
/// and unlinked at once, which moves the directory's mtime) because `O_TMPFILE` fails.
#[test]
fn python_temporary_file_takes_the_o_tmpfile_path() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let out = User::root().py(
        r#"
import tempfile
d = sys.argv[1]
os.utime(d, (1000, 1000))
with tempfile.TemporaryFile(dir=d) as f:
    f.write(b"x" * 100000)
    f.seek(0)
    t("read", lambda: len(f.read()))
    t("nlink", lambda: os.fstat(f.fileno()).st_nlink)
t("dir_mtime", lambda: int(os.stat(d).st_mtime))
t("names", lambda: len(os.listdir(d)))
"#,
        &[&m.path],
    );
    out.expect(&[
        ("read", "OK 100000"),
        ("nlink", "OK 0"),
        ("dir_mtime", "OK 1000"),
        ("names", "OK 0"),
    ]);
}
