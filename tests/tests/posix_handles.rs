//! File handles on real mounts (issue 28, item 6): `name_to_handle_at` /
//! `open_by_handle_at` after the kernel dropped its inodes and after a remount, and
//! ESTALE for a handle of a removed file. They need root (`CAP_DAC_READ_SEARCH` for
//! `open_by_handle_at`, writing `/proc/sys/vm/drop_caches`) and /dev/fuse, as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use tessera_tests::{pseudo_random, ProcessCluster};

/// Largest handle the kernel makes (`MAX_HANDLE_SZ`).
const MAX_HANDLE_BYTES: usize = 128;

/// A file handle as `name_to_handle_at` fills it: `struct file_handle` followed by its
/// bytes, in `u32`s for the struct's alignment.
struct Handle(Vec<u32>);

impl Handle {
    fn of(p: &Path) -> Handle {
        let mut buf = vec![0u32; 2 + MAX_HANDLE_BYTES / 4];
        buf[0] = MAX_HANDLE_BYTES as u32;
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        let mut mount_id = 0;
        // SAFETY: a valid C string, a buffer of `file_handle` with `handle_bytes` bytes
        // after its header, a valid out pointer.
        let r = unsafe {
            libc::name_to_handle_at(
                libc::AT_FDCWD,
                c.as_ptr(),
                buf.as_mut_ptr().cast::<libc::file_handle>(),
                &mut mount_id,
                0,
            )
        };
        assert_eq!(
            r,
            0,
            "name_to_handle_at {p:?}: {}",
            io::Error::last_os_error()
        );
        Handle(buf)
    }

    /// Opens the handle's inode on the mount at `mount` with `flags`.
    fn open(&self, mount: &Path, flags: i32) -> io::Result<File> {
        let root = File::open(mount)?;
        let mut buf = self.0.clone();
        // SAFETY: a valid descriptor and the buffer `name_to_handle_at` filled.
        let fd = unsafe {
            libc::open_by_handle_at(
                root.as_raw_fd(),
                buf.as_mut_ptr().cast::<libc::file_handle>(),
                flags,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened and owned by nothing else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }
}

/// Drops the kernel's unused dentries and inodes, so a handle must be looked up anew.
fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", "2").expect("dropping the kernel's caches");
}

fn read_all(mut f: File) -> Vec<u8> {
    let mut out = Vec::new();
    f.read_to_end(&mut out).unwrap();
    out
}

/// Guards against file handles that die with the kernel's cache: `open_by_handle_at`
/// failed with ESTALE once the inode had left it or after a remount (no export support,
/// no lookup of "." and ".."), so an NFS export of the mount lost its files.
#[test]
fn file_handles_open_after_the_cache_is_dropped_and_after_a_remount() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let want = pseudo_random(300_000, 28);
    fs::create_dir_all(m.path.join("a/b")).unwrap();
    fs::write(m.path.join("a/b/f"), &want).unwrap();
    fs::write(m.path.join("gone"), b"soon removed").unwrap();
    let file = Handle::of(&m.path.join("a/b/f"));
    let dir = Handle::of(&m.path.join("a/b"));
    let gone = Handle::of(&m.path.join("gone"));

    drop_caches();
    let f = file
        .open(&m.path, libc::O_RDONLY)
        .expect("file handle, caches dropped");
    assert_eq!(read_all(f), want, "the file's bytes through its handle");
    // A directory is connected to the tree through ".." lookups and a listing of
    // each parent: its path must come out whole.
    let d = dir
        .open(&m.path, libc::O_RDONLY | libc::O_DIRECTORY)
        .expect("directory handle, caches dropped");
    let link = fs::read_link(format!("/proc/self/fd/{}", d.as_raw_fd())).unwrap();
    assert_eq!(link, m.path.join("a/b"), "the directory's path");
    drop(d);

    fs::remove_file(m.path.join("gone")).unwrap();
    drop_caches();
    let e = gone.open(&m.path, libc::O_RDONLY).map(drop).unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::ESTALE),
        "a removed file's handle: {e}"
    );

    let path = m.path.clone();
    m.unmount();
    let m = cluster.mount("mnt");
    assert_eq!(m.path, path);
    let f = file
        .open(&m.path, libc::O_RDONLY)
        .expect("file handle, after a remount");
    assert_eq!(read_all(f), want, "the file's bytes after a remount");
    let d = dir
        .open(&m.path, libc::O_RDONLY | libc::O_DIRECTORY)
        .expect("directory handle, after a remount");
    let names: Vec<_> = fs::read_dir(format!("/proc/self/fd/{}", d.as_raw_fd()))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["f"]);
}
