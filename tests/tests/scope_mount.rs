//! Client capabilities through `tessera mount` and the `tessera` command (issue 23 item
//! 3): a mount with a key scoped to `/teamA` shows that directory as its root and
//! nothing above it, squashes root, a read-only key's mount fails every change with
//! EROFS, and a key without the admin capability cannot run the administration
//! commands. Needs root and /dev/fuse (as every mount test).

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tessera_tests::agent::Agent;
use tessera_tests::posix::{mknod, wait_until, User};
use tessera_tests::ProcessCluster;

/// Makes client key `name` with the `tessera key create` flags `flags`; returns the
/// client configuration that uses it.
fn client_key(cluster: &ProcessCluster, name: &str, flags: &[&str]) -> (PathBuf, String) {
    let out = cluster.dir().join(format!("{name}.key"));
    let out_arg = out.to_string_lossy().to_string();
    let mut args = vec!["key", "create", name];
    args.extend(flags);
    args.extend(["--out", &out_arg]);
    let (code, text) = cluster.tessera(&args);
    assert_eq!(code, 0, "{text}");
    (
        out,
        format!("key_file = {out_arg:?}\nclient_name = \"{name}\"\n"),
    )
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("an entry").file_name().to_string_lossy().into())
        .collect();
    v.sort();
    v
}

/// The options of the mount at `path`, as the kernel lists them.
fn mount_options(path: &Path) -> Vec<String> {
    let mounts = fs::read_to_string("/proc/self/mounts").expect("/proc/self/mounts");
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(&*path.to_string_lossy()));
    let options = line.and_then(|l| l.split(' ').nth(3)).unwrap_or_default();
    options.split(',').map(String::from).collect()
}

fn errno(r: std::io::Result<impl Sized>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// `/teamA` (open to all: `a`, `sub/`, root's 0600 `secret`) and `/teamB` (`b`).
fn tree(admin: &Path) {
    fs::create_dir_all(admin.join("teamA/sub")).expect("the tree");
    fs::write(admin.join("teamA/a"), b"A").expect("the tree");
    fs::set_permissions(admin.join("teamA"), fs::Permissions::from_mode(0o777)).expect("the tree");
    fs::write(admin.join("teamA/secret"), b"S").expect("the tree");
    fs::set_permissions(
        admin.join("teamA/secret"),
        fs::Permissions::from_mode(0o600),
    )
    .expect("the tree");
    fs::create_dir(admin.join("teamB")).expect("the tree");
    fs::write(admin.join("teamB/b"), b"B").expect("the tree");
}

/// Guards against a scoped mount showing, or letting root change, anything outside its
/// directory (issue 23).
#[test]
fn a_scoped_mount_shows_its_directory_as_root_and_squashes_root() {
    let cluster = ProcessCluster::start(1);
    let admin = cluster.mount("admin");
    tree(&admin.path);
    let (_, conf) = client_key(&cluster, "team-a", &["--path", "/teamA"]);
    let m = cluster.mount_with_config("team-a", &conf);

    let team_a = fs::metadata(admin.path.join("teamA")).unwrap().ino();
    assert_eq!(
        fs::metadata(&m.path).unwrap().ino(),
        team_a,
        "the root is /teamA"
    );
    assert_eq!(names(&m.path), ["a", "secret", "sub"]);
    assert_eq!(fs::read(m.path.join("a")).unwrap(), b"A");
    // `..` inside stays inside; the paths of /teamB and /teamA resolve inside: absent.
    assert_eq!(fs::metadata(m.path.join("sub/..")).unwrap().ino(), team_a);
    for outside in ["teamB", "teamB/b", "teamA", "../teamB"] {
        let p = m.path.join(outside);
        let e = fs::metadata(&p).map(drop).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{}: {e}", p.display());
    }

    // Root squash: root (this test) makes nobody's files and cannot read root's 0600.
    fs::write(m.path.join("mine"), b"m").unwrap();
    let mine = fs::metadata(admin.path.join("teamA/mine")).unwrap();
    assert_eq!(
        (mine.uid(), mine.gid()),
        (65534, 65534),
        "root's file is nobody's"
    );
    assert_eq!(errno(fs::read(m.path.join("secret"))), Some(libc::EACCES));
    assert_eq!(fs::read(admin.path.join("teamA/secret")).unwrap(), b"S");
}

/// Guards against a read-only key's mount changing anything (issue 23): each change an
/// application can make fails with EROFS, reads work.
#[test]
fn a_read_only_mount_fails_every_change_with_erofs() {
    let cluster = ProcessCluster::start(1);
    let admin = cluster.mount("admin");
    tree(&admin.path);
    let (_, conf) = client_key(&cluster, "reader", &["--read-only", "--no-root-squash"]);
    let m = cluster.mount_with_config("reader", &conf);
    let p = |s: &str| m.path.join(s);

    assert_eq!(fs::read(p("teamA/a")).unwrap(), b"A");
    let options = mount_options(&m.path);
    assert!(options.contains(&"ro".to_string()), "mounted {options:?}");
    assert_eq!(names(&p("teamB")), ["b"]);
    let append = fs::OpenOptions::new().append(true).open(p("teamA/a"));
    let changes = [
        ("create", errno(fs::write(p("teamA/new"), b"x"))),
        ("overwrite", errno(fs::write(p("teamA/a"), b"x"))),
        ("append", errno(append)),
        ("mkdir", errno(fs::create_dir(p("teamA/d")))),
        ("unlink", errno(fs::remove_file(p("teamA/a")))),
        ("rmdir", errno(fs::remove_dir(p("teamA/sub")))),
        ("rename", errno(fs::rename(p("teamA/a"), p("teamA/z")))),
        ("link", errno(fs::hard_link(p("teamA/a"), p("teamA/l")))),
        (
            "symlink",
            errno(std::os::unix::fs::symlink("a", p("teamA/s"))),
        ),
        (
            "chmod",
            errno(fs::set_permissions(
                p("teamA/a"),
                fs::Permissions::from_mode(0o666),
            )),
        ),
        (
            "truncate",
            errno(fs::OpenOptions::new().write(true).open(p("teamA/a"))),
        ),
    ];
    for (what, got) in changes {
        assert_eq!(got, Some(libc::EROFS), "{what}");
    }
    assert_eq!(names(&admin.path.join("teamA")), ["a", "secret", "sub"]);
    assert_eq!(fs::read(admin.path.join("teamA/a")).unwrap(), b"A");
}

/// Guards against a client key running the administration commands (issue 23).
#[test]
fn a_non_admin_key_cannot_run_status_fsck_or_key_list() {
    let cluster = ProcessCluster::start(1);
    let (key, conf) = client_key(&cluster, "plain", &[]);
    let conf_file = cluster.dir().join("plain.toml");
    fs::write(&conf_file, conf).unwrap();
    let bin = tessera_tests::process::bin_dir().join("tessera");
    for cmd in [&["status"][..], &["fsck"], &["key", "list"]] {
        let out = Command::new(&bin)
            .args(cmd)
            .args(["--meta", cluster.meta_addr()])
            .args(["--config", &conf_file.to_string_lossy()])
            .args(["--key-file", &key.to_string_lossy()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd:?} ran: {err}");
        assert!(err.contains("not permitted to this key"), "{cmd:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    let (code, text) = cluster.tessera(&["status"]);
    assert_eq!(code, 0, "the administrator's status: {text}");
}

/// Guards against a read-only key's mount failing to open a file whose writer was killed
/// with it open: the open must first cut what the writer left past the committed
/// length, and that cut was refused as a change (EROFS).
#[test]
fn a_read_only_mount_opens_a_file_a_killed_writer_left() {
    let cluster = ProcessCluster::start(1);
    let mut w = cluster.mount("writer");
    let path = w.path.join("left");
    fs::write(&path, b"committed").unwrap();
    let mut writer = Agent::start(&User::root(), "writer");
    writer.expect(&format!("open f {} rw", path.display()), "ok");
    writer.expect("pwrite f 9 tail", "ok 4");
    writer.expect("fsync f", "ok");
    writer.expect("pwrite f 13 more", "ok 4");
    w.kill_client();
    drop(writer);
    let (_, conf) = client_key(&cluster, "late-reader", &["--read-only"]);
    let m = cluster.mount_with_config("reader", &conf);
    let read = fs::read(m.path.join("left"));
    assert_eq!(read.unwrap(), b"committedtail", "what the writer committed");
    let meta_log = || fs::read_to_string(cluster.dir().join("meta.log")).unwrap_or_default();
    wait_until(
        "the reader's open made the cut",
        Duration::from_secs(10),
        || meta_log().contains("its opener cuts the chunks past the length"),
    );
}

/// Guards against device nodes and set-id programs taking effect through the mount: any
/// caller could make a device node (root of a root-squashed client too, whose kernel
/// lets root), and mounts were neither `nodev` nor `nosuid`.
#[test]
fn only_root_makes_device_nodes_and_mounts_are_nodev_nosuid() {
    let cluster = ProcessCluster::start(1);
    let admin = cluster.mount("admin");
    let open = admin.path.join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let (_, conf) = client_key(&cluster, "squashed", &[]);
    let m = cluster.mount_with_config("squashed", &conf);
    let null = libc::makedev(1, 3);
    let chr = mknod(&m.path.join("open/null"), libc::S_IFCHR | 0o666, null);
    assert_eq!(errno(chr), Some(libc::EPERM), "root squashed to nobody");
    let blk = mknod(&m.path.join("open/disk"), libc::S_IFBLK | 0o666, null);
    assert_eq!(errno(blk), Some(libc::EPERM));
    mknod(&m.path.join("open/fifo"), libc::S_IFIFO | 0o666, 0).expect("a FIFO is no device");
    mknod(&admin.path.join("open/null"), libc::S_IFCHR | 0o666, null).expect("root makes one");

    for (mount, what) in [(&admin.path, "admin"), (&m.path, "squashed")] {
        let options = mount_options(mount);
        for o in ["nodev", "nosuid"] {
            assert!(options.contains(&o.to_string()), "{what}: {options:?}");
        }
    }
    let honours = cluster.mount_with_config("honours", "dev = true\nsuid = true\n");
    let options = mount_options(&honours.path);
    assert!(
        !options.iter().any(|o| o == "nodev" || o == "nosuid"),
        "dev and suid asked: {options:?}"
    );
}
