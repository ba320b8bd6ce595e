//! POSIX point 2 on real mounts: special files (FIFOs, sockets, device nodes), symlinks
//! up to PATH_MAX, hard links across directories, the 255-byte name limit, renameat2
//! flags, directory renames and their errors, and no EXDEV inside one mount.
//! They need root and /dev/fuse, as CI has.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use tessera_tests::posix::{errno_of, mknod, open_to_all, renameat2, User, ALICE_UID};
use tessera_tests::ProcessCluster;

const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
const EXCHANGE: u32 = libc::RENAME_EXCHANGE;

/// Guards against special files stored with the wrong type or device number, or not
/// working as what they are: a FIFO passes bytes between processes, a socket file made
/// by `bind` accepts connections, device nodes keep major and minor; only root may
/// make device nodes.
#[test]
fn fifos_sockets_and_device_nodes_keep_their_types() {
    let cluster = ProcessCluster::start(1);
    open_to_all(cluster.dir());
    let m = cluster.mount("mnt");
    let p = m.path.as_path();
    mknod(&p.join("fifo"), libc::S_IFIFO | 0o640, 0).unwrap();
    mknod(&p.join("sock"), libc::S_IFSOCK | 0o600, 0).unwrap();
    mknod(&p.join("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3)).unwrap();
    mknod(
        &p.join("loop"),
        libc::S_IFBLK | 0o660,
        libc::makedev(7, 200),
    )
    .unwrap();
    mknod(&p.join("plain"), libc::S_IFREG | 0o644, 0).unwrap();
    let meta = |n: &str| fs::symlink_metadata(p.join(n)).unwrap();
    assert!(meta("fifo").file_type().is_fifo());
    assert_eq!(meta("fifo").mode() & 0o7777, 0o640);
    assert!(meta("sock").file_type().is_socket());
    assert!(meta("null").file_type().is_char_device());
    assert_eq!(meta("null").rdev(), libc::makedev(1, 3));
    assert!(meta("loop").file_type().is_block_device());
    assert_eq!(meta("loop").rdev(), libc::makedev(7, 200));
    assert!(meta("plain").is_file() && meta("plain").len() == 0);
    // The FIFO carries bytes from a writer thread to this reader.
    let fifo = p.join("fifo");
    let writer = std::thread::spawn(move || {
        let mut w = fs::OpenOptions::new().write(true).open(fifo).unwrap();
        w.write_all(b"through the pipe").unwrap();
    });
    let mut got = String::new();
    fs::File::open(p.join("fifo"))
        .unwrap()
        .read_to_string(&mut got)
        .unwrap();
    writer.join().unwrap();
    assert_eq!(got, "through the pipe");
    // A socket bound on the mount is reachable by its path.
    let listener = UnixListener::bind(p.join("bound.sock")).unwrap();
    assert!(meta("bound.sock").file_type().is_socket());
    let mut client = UnixStream::connect(p.join("bound.sock")).unwrap();
    client.write_all(b"hi").unwrap();
    let (mut server, _) = listener.accept().unwrap();
    let mut buf = [0u8; 2];
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hi");
    // Users make FIFOs, not devices.
    fs::create_dir(p.join("pub")).unwrap();
    tessera_tests::posix::chown(&p.join("pub"), ALICE_UID, ALICE_UID).unwrap();
    let script = r#"
d = sys.argv[1]
t("fifo", os.mkfifo, d + "/ufifo")
t("chr", os.mknod, d + "/uchr", stat.S_IFCHR | 0o600, os.makedev(1, 3))
"#;
    let user = User::plain(ALICE_UID);
    let out = user.py(script, &[p.join("pub").as_path()]);
    out.expect(&[("fifo", "OK"), ("chr", "EPERM")]);
    assert_eq!(meta("pub/ufifo").uid(), ALICE_UID);
}

/// Guards against symlink targets cut short or refused below PATH_MAX (4095 bytes plus
/// the NUL), and against links that do not resolve through the mount.
#[test]
fn symlinks_hold_targets_up_to_path_max() {
    let cluster = ProcessCluster::start(1);
    let a = cluster.mount("a");
    let p = a.path.as_path();
    let long: String = (0..4095)
        .map(|i| if i % 100 == 99 { '/' } else { 'x' })
        .collect();
    std::os::unix::fs::symlink(&long, p.join("long")).unwrap();
    assert_eq!(
        fs::read_link(p.join("long")).unwrap().as_os_str().len(),
        4095
    );
    assert_eq!(fs::read_link(p.join("long")).unwrap(), Path::new(&long));
    let meta = fs::symlink_metadata(p.join("long")).unwrap();
    assert!(meta.file_type().is_symlink());
    assert_eq!(meta.len(), 4095, "a symlink's size is its target's length");
    let too_long = "y".repeat(4096);
    let e = std::os::unix::fs::symlink(&too_long, p.join("too-long"));
    assert_eq!(errno_of("4096-byte target", e), libc::ENAMETOOLONG);
    // Relative and absolute targets resolve through the mount.
    fs::create_dir_all(p.join("dir/sub")).unwrap();
    fs::write(p.join("dir/sub/file"), b"target bytes").unwrap();
    std::os::unix::fs::symlink("dir/sub/file", p.join("rel")).unwrap();
    std::os::unix::fs::symlink(p.join("dir/sub"), p.join("abs")).unwrap();
    assert_eq!(fs::read(p.join("rel")).unwrap(), b"target bytes");
    assert_eq!(fs::read(p.join("abs/file")).unwrap(), b"target bytes");
    // A second mount reads the same long target.
    let b = cluster.mount("b");
    assert_eq!(
        fs::read_link(b.path.join("long")).unwrap(),
        Path::new(&long)
    );
}

/// Guards against hard links that copy instead of share, or that only work inside one
/// directory: both names reach one inode, writes through one show through the other,
/// and the data outlives the first name. Directories cannot be hard-linked.
#[test]
fn hard_links_across_directories_share_one_inode() {
    let cluster = ProcessCluster::start(2);
    let a = cluster.mount("a");
    let p = a.path.as_path();
    fs::create_dir_all(p.join("x/y")).unwrap();
    fs::create_dir(p.join("z")).unwrap();
    fs::write(p.join("x/y/orig"), b"version 1").unwrap();
    fs::hard_link(p.join("x/y/orig"), p.join("z/link")).unwrap();
    let (m1, m2) = (
        fs::metadata(p.join("x/y/orig")).unwrap(),
        fs::metadata(p.join("z/link")).unwrap(),
    );
    assert_eq!((m1.ino(), m1.nlink()), (m2.ino(), 2));
    fs::write(p.join("z/link"), b"version 2, longer").unwrap();
    assert_eq!(fs::read(p.join("x/y/orig")).unwrap(), b"version 2, longer");
    fs::remove_file(p.join("x/y/orig")).unwrap();
    assert_eq!(fs::read(p.join("z/link")).unwrap(), b"version 2, longer");
    assert_eq!(fs::metadata(p.join("z/link")).unwrap().nlink(), 1);
    let e = fs::hard_link(p.join("x"), p.join("z/dirlink"));
    assert_eq!(errno_of("link of a directory", e), libc::EPERM);
    let e = fs::hard_link(p.join("z/link"), p.join("x/y"));
    assert_eq!(errno_of("link over an existing name", e), libc::EEXIST);
    let b = cluster.mount("b");
    assert_eq!(
        fs::read(b.path.join("z/link")).unwrap(),
        b"version 2, longer"
    );
}

/// Guards against names past 255 bytes being stored (other tools and file systems could
/// not copy them) or names of exactly 255 bytes being refused; bytes count, not
/// characters.
#[test]
fn names_past_255_bytes_are_enametoolong() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let p = m.path.as_path();
    let ok = "n".repeat(255);
    let euro_ok = "\u{20ac}".repeat(85);
    assert_eq!(euro_ok.len(), 255);
    let long = "n".repeat(256);
    let euro_long = "\u{20ac}".repeat(86);
    fs::write(p.join(&ok), b"255").unwrap();
    fs::create_dir(p.join(&euro_ok)).unwrap();
    let names: Vec<String> = fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.contains(&ok) && names.contains(&euro_ok), "{names:?}");
    fs::write(p.join("short"), b"s").unwrap();
    let errs = [
        ("create", fs::write(p.join(&long), b"x").err()),
        ("create utf-8", fs::write(p.join(&euro_long), b"x").err()),
        ("mkdir", fs::create_dir(p.join(&long)).err()),
        ("stat", fs::metadata(p.join(&long)).err()),
        (
            "symlink",
            std::os::unix::fs::symlink("short", p.join(&long)).err(),
        ),
        ("link", fs::hard_link(p.join("short"), p.join(&long)).err()),
        ("rename", fs::rename(p.join("short"), p.join(&long)).err()),
        (
            "mknod",
            mknod(&p.join(&long), libc::S_IFIFO | 0o600, 0).err(),
        ),
    ];
    for (what, e) in errs {
        let e = e.unwrap_or_else(|| panic!("{what} of a 256-byte name succeeded"));
        assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG), "{what}: {e}");
    }
    assert_eq!(
        fs::read(p.join("short")).unwrap(),
        b"s",
        "the failed rename left it"
    );
}

/// Guards against RENAME_NOREPLACE replacing (lock-file and "create once" patterns rely
/// on it) and RENAME_EXCHANGE losing, mixing up or half-swapping entries, including a
/// file with a directory across directories (the parents' link counts follow).
#[test]
fn renameat2_noreplace_and_exchange() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let p = m.path.as_path();
    fs::write(p.join("a"), b"A").unwrap();
    fs::write(p.join("b"), b"B").unwrap();
    let e = renameat2(&p.join("a"), &p.join("b"), NOREPLACE);
    assert_eq!(errno_of("noreplace over b", e), libc::EEXIST);
    assert_eq!(
        (
            fs::read(p.join("a")).unwrap(),
            fs::read(p.join("b")).unwrap()
        ),
        (b"A".to_vec(), b"B".to_vec())
    );
    renameat2(&p.join("a"), &p.join("c"), NOREPLACE).unwrap();
    assert!(!p.join("a").exists());
    assert_eq!(fs::read(p.join("c")).unwrap(), b"A");
    // Exchange two files in one directory.
    renameat2(&p.join("b"), &p.join("c"), EXCHANGE).unwrap();
    assert_eq!(fs::read(p.join("b")).unwrap(), b"A");
    assert_eq!(fs::read(p.join("c")).unwrap(), b"B");
    // Exchange a directory with a file across directories.
    fs::create_dir_all(p.join("d1/dir/inner")).unwrap();
    fs::write(p.join("d1/dir/inner/f"), b"deep").unwrap();
    fs::create_dir(p.join("d2")).unwrap();
    fs::write(p.join("d2/file"), b"flat").unwrap();
    let nl = |q: &str| fs::metadata(p.join(q)).unwrap().nlink();
    assert_eq!((nl("d1"), nl("d2")), (3, 2));
    renameat2(&p.join("d1/dir"), &p.join("d2/file"), EXCHANGE).unwrap();
    assert_eq!(fs::read(p.join("d1/dir")).unwrap(), b"flat");
    assert_eq!(fs::read(p.join("d2/file/inner/f")).unwrap(), b"deep");
    assert_eq!(
        (nl("d1"), nl("d2")),
        (2, 3),
        "the directory took its `..` along"
    );
    let dotdot = fs::metadata(p.join("d2/file/..")).unwrap().ino();
    assert_eq!(dotdot, fs::metadata(p.join("d2")).unwrap().ino());
    let e = renameat2(&p.join("b"), &p.join("absent"), EXCHANGE);
    assert_eq!(errno_of("exchange with nothing", e), libc::ENOENT);
    let e = renameat2(&p.join("b"), &p.join("c"), EXCHANGE | NOREPLACE);
    assert_eq!(errno_of("both flags", e), libc::EINVAL);
    // Exchanging a directory into its own subtree is refused.
    let e = renameat2(&p.join("d2/file"), &p.join("d2/file/inner/f"), EXCHANGE);
    assert_eq!(errno_of("exchange into own subtree", e), libc::EINVAL);
}

/// Guards against directory renames that corrupt the tree: over an empty directory it
/// replaces it; over a non-empty one, into itself or its subtree, or across kinds it
/// fails with the errno ext4 gives, and the failed attempts change nothing.
#[test]
fn directory_renames_and_their_errors() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let p = m.path.as_path();
    for d in ["src/sub", "empty", "full", "deep/er/est"] {
        fs::create_dir_all(p.join(d)).unwrap();
    }
    fs::write(p.join("src/sub/f"), b"kept").unwrap();
    fs::write(p.join("full/x"), b"x").unwrap();
    fs::write(p.join("file"), b"file").unwrap();
    fs::rename(p.join("src"), p.join("empty")).unwrap();
    assert!(!p.join("src").exists());
    assert_eq!(fs::read(p.join("empty/sub/f")).unwrap(), b"kept");
    let mv = |a: &str, b: &str| fs::rename(p.join(a), p.join(b));
    let errs = [
        ("over non-empty", mv("empty", "full"), libc::ENOTEMPTY),
        ("into itself", mv("deep", "deep/er/new"), libc::EINVAL),
        ("into own child", mv("deep", "deep/er"), libc::EINVAL),
        ("dir over file", mv("empty", "file"), libc::ENOTDIR),
        ("file over dir", mv("file", "full"), libc::EISDIR),
        (
            "rmdir non-empty",
            fs::remove_dir(p.join("full")),
            libc::ENOTEMPTY,
        ),
        (
            "rmdir of a file",
            fs::remove_dir(p.join("file")),
            libc::ENOTDIR,
        ),
        (
            "unlink of a dir",
            fs::remove_file(p.join("full")),
            libc::EISDIR,
        ),
    ];
    for (what, r, want) in errs {
        assert_eq!(errno_of(what, r), want, "{what}");
    }
    assert_eq!(fs::read(p.join("full/x")).unwrap(), b"x");
    assert_eq!(fs::read(p.join("file")).unwrap(), b"file");
    assert!(p.join("deep/er/est").is_dir() && p.join("empty/sub").is_dir());
}

/// Guards against renames and links across directories of one mount failing with
/// EXDEV (`mv` would then copy and delete, slowly and not atomically), and against an
/// unprivileged user moving entries in or out of directories it may not write.
#[test]
fn moves_across_directories_never_need_exdev() {
    let cluster = ProcessCluster::start(1);
    open_to_all(cluster.dir());
    let m = cluster.mount("mnt");
    let p = m.path.as_path();
    for d in ["a/b/c", "x/y", "full"] {
        fs::create_dir_all(p.join(d)).unwrap();
    }
    fs::write(p.join("a/file"), b"file").unwrap();
    fs::write(p.join("a/b/c/deep"), b"deep").unwrap();
    fs::write(p.join("full/x"), b"x").unwrap();
    fs::rename(p.join("a/file"), p.join("x/y/file")).unwrap();
    fs::rename(p.join("a/b"), p.join("x/y/b")).unwrap();
    fs::hard_link(p.join("x/y/file"), p.join("full/file")).unwrap();
    assert_eq!(fs::read(p.join("full/file")).unwrap(), b"file");
    assert_eq!(fs::read(p.join("x/y/b/c/deep")).unwrap(), b"deep");
    let out = std::process::Command::new("mv")
        .arg(p.join("x"))
        .arg(p.join("full/x2"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(fs::read(p.join("full/x2/y/b/c/deep")).unwrap(), b"deep");
    tessera_tests::posix::mkdir_owned(&p.join("mine"), 0o755, ALICE_UID, ALICE_UID);
    let script = r#"
p = sys.argv[1]
t("out_of_roots", os.rename, p + "/full/x", p + "/mine/x")
t("into_roots", os.rename, p + "/mine", p + "/full/mine")
t("own_dir", os.mkdir, p + "/mine/a")
t("within_own", os.rename, p + "/mine/a", p + "/mine/b")
"#;
    User::plain(ALICE_UID).py(script, &[p]).expect(&[
        ("out_of_roots", "EACCES"),
        ("into_roots", "EACCES"),
        ("own_dir", "OK"),
        ("within_own", "OK"),
    ]);
}
