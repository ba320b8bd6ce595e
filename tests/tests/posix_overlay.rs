//! `renameat2(RENAME_WHITEOUT)` on a real mount, and an overlay file system whose upper
//! layer and work directory are on Tessera (issue 28, item 12). They need root (a
//! whiteout is a device node; mounting an overlay) and /dev/fuse, as CI has; the
//! overlay test is counted as skipped where the kernel has no overlay file system.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use tessera_tests::posix::{cpath, errno_of, renameat2};
use tessera_tests::ProcessCluster;

const WHITEOUT: u32 = libc::RENAME_WHITEOUT;
const NOREPLACE: u32 = libc::RENAME_NOREPLACE;

/// Whether `p` is a whiteout: a character device 0/0 (the kernel's `WHITEOUT_DEV`).
fn is_whiteout(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == 0)
}

/// Guards against `RENAME_WHITEOUT` refused with EINVAL (an overlay could not use
/// Tessera as its upper layer), or a rename that moves the file without leaving the
/// whiteout, or leaves it over a target `RENAME_NOREPLACE` kept.
#[test]
fn rename_whiteout_leaves_a_whiteout_at_the_source() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let p = m.path.as_path();
    fs::create_dir(p.join("d")).unwrap();
    fs::write(p.join("a"), b"A").unwrap();
    renameat2(&p.join("a"), &p.join("d/b"), WHITEOUT).expect("RENAME_WHITEOUT");
    assert_eq!(fs::read(p.join("d/b")).unwrap(), b"A");
    let w = fs::symlink_metadata(p.join("a")).unwrap();
    assert!(w.file_type().is_char_device(), "the whiteout's type: {w:?}");
    assert_eq!((w.rdev(), w.mode() & 0o7777, w.nlink()), (0, 0, 1));

    // Over an existing target: replaced, and the whiteout left.
    fs::write(p.join("c"), b"C").unwrap();
    renameat2(&p.join("c"), &p.join("d/b"), WHITEOUT).unwrap();
    assert_eq!(fs::read(p.join("d/b")).unwrap(), b"C");
    assert!(is_whiteout(&p.join("c")));

    // With NOREPLACE over an existing target: nothing changes.
    fs::write(p.join("e"), b"E").unwrap();
    let r = renameat2(&p.join("e"), &p.join("d/b"), WHITEOUT | NOREPLACE);
    assert_eq!(errno_of("whiteout, noreplace over d/b", r), libc::EEXIST);
    assert_eq!(fs::read(p.join("e")).unwrap(), b"E");
    assert_eq!(fs::read(p.join("d/b")).unwrap(), b"C");
    renameat2(&p.join("e"), &p.join("d/f"), WHITEOUT | NOREPLACE).unwrap();
    assert!(is_whiteout(&p.join("e")));

    // A directory moves too, and its old parent's link count loses its `..`.
    fs::create_dir(p.join("sub")).unwrap();
    renameat2(&p.join("sub"), &p.join("d/sub"), WHITEOUT).unwrap();
    assert!(is_whiteout(&p.join("sub")));
    assert_eq!(fs::metadata(p).unwrap().nlink(), 3, "root: ., .., d");

    let mut names: Vec<_> = fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["a", "c", "d", "e", "sub"]);
}

/// An overlay mount, unmounted when dropped (before the Tessera mount under it).
struct Overlay(PathBuf);

impl Overlay {
    fn mount(lower: &Path, upper: &Path, work: &Path, at: &Path) -> io::Result<Overlay> {
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        let (src, kind, opts) = (cpath(Path::new("overlay")), c"overlay", CString::new(opts));
        // SAFETY: valid C strings; the data argument is a C string as overlay expects.
        let r = unsafe {
            libc::mount(
                src.as_ptr(),
                cpath(at).as_ptr(),
                kind.as_ptr(),
                0,
                opts.unwrap().as_ptr().cast(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Overlay(at.to_path_buf()))
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        // SAFETY: a valid C string path.
        let r = unsafe { libc::umount2(cpath(&self.0).as_ptr(), libc::MNT_DETACH) };
        if r != 0 {
            eprintln!("umount {:?}: {}", self.0, io::Error::last_os_error());
        }
    }
}

/// Guards against Tessera refused as an overlay's upper layer ("upper fs missing
/// required features": no `RENAME_WHITEOUT`), and against the upper layer not
/// holding what the overlay shows: new files, whiteouts of deleted and renamed
/// lower files.
#[test]
fn an_overlay_with_its_upper_layer_on_tessera() {
    let filesystems = fs::read_to_string("/proc/filesystems").unwrap();
    if !filesystems.lines().any(|l| l.ends_with("\toverlay")) {
        eprintln!("SKIPPED: this kernel has no overlay file system");
        return;
    }
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let local = tempfile::tempdir().unwrap();
    let (lower, merged) = (local.path().join("lower"), local.path().join("merged"));
    fs::create_dir_all(lower.join("dir")).unwrap();
    fs::create_dir(&merged).unwrap();
    for name in ["gone", "moved", "dir/kept"] {
        fs::write(lower.join(name), name).unwrap();
    }
    let (upper, work) = (m.path.join("upper"), m.path.join("work"));
    fs::create_dir(&upper).unwrap();
    fs::create_dir(&work).unwrap();
    let ov = Overlay::mount(&lower, &upper, &work, &merged).expect("mounting the overlay");

    fs::write(merged.join("new"), b"made through the overlay").unwrap();
    fs::remove_file(merged.join("gone")).unwrap();
    fs::rename(merged.join("moved"), merged.join("dir/there")).unwrap();
    fs::write(merged.join("dir/kept"), b"changed").unwrap();
    let mut seen: Vec<_> = fs::read_dir(&merged)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    seen.sort();
    assert_eq!(seen, ["dir", "new"], "the overlay's root");
    assert_eq!(fs::read(merged.join("dir/there")).unwrap(), b"moved");
    drop(ov);

    assert_eq!(
        fs::read(upper.join("new")).unwrap(),
        b"made through the overlay"
    );
    assert!(
        is_whiteout(&upper.join("gone")),
        "whiteout of a deleted file"
    );
    assert!(
        is_whiteout(&upper.join("moved")),
        "whiteout of a moved file"
    );
    assert_eq!(fs::read(upper.join("dir/there")).unwrap(), b"moved");
    assert_eq!(fs::read(upper.join("dir/kept")).unwrap(), b"changed");
    assert_eq!(
        fs::read(lower.join("gone")).unwrap(),
        b"gone",
        "lower untouched"
    );
}
