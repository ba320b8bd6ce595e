//! POSIX point 1 on real mounts, as root and as unprivileged users: permission bits for
//! owner, primary group, supplementary groups and others; setuid and setgid cleared on
//! write, truncate and chown; setgid directories; sticky directories. Times, link counts
//! and `statfs` are in `posix_times.rs`.
//! They need root and /dev/fuse, as CI has.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use tessera_tests::posix::{
    chown, fallocate, file_owned, mkdir_owned, mode_of, open_to_all, User, ALICE_UID, BOB_UID,
    SHARED_GID,
};
use tessera_tests::ProcessCluster;

fn alice() -> User {
    User::plain(ALICE_UID)
}

fn bob() -> User {
    User::plain(BOB_UID)
}

/// Files and directories with every kind of permission for the access checks.
fn access_fixture(m: &Path) {
    file_owned(&m.join("secret"), b"s", 0o600, 0, 0);
    file_owned(&m.join("grp"), b"g", 0o640, 0, ALICE_UID);
    file_owned(&m.join("supp"), b"g", 0o640, 0, SHARED_GID);
    file_owned(&m.join("world"), b"w", 0o604, 0, 0);
    file_owned(&m.join("writable"), b"w", 0o666, 0, 0);
    file_owned(&m.join("nogrp"), b"n", 0o640, 0, 0);
    file_owned(&m.join("own"), b"o", 0o066, ALICE_UID, ALICE_UID);
    file_owned(
        &m.join("exe"),
        b"#!/bin/sh\necho ran\n",
        0o750,
        0,
        SHARED_GID,
    );
    mkdir_owned(&m.join("closed"), 0o700, 0, 0);
    file_owned(&m.join("closed/inner"), b"i", 0o644, 0, 0);
    mkdir_owned(&m.join("ro"), 0o755, 0, 0);
    mkdir_owned(&m.join("box"), 0o770, 0, SHARED_GID);
}

const ACCESS_SCRIPT: &str = r#"
import subprocess
p = sys.argv[1]
def run(path):
    return subprocess.run([path], capture_output=True).stdout.decode().strip()
t("secret_r", rd, p + "/secret")
t("secret_w", wr, p + "/secret")
t("grp_r", rd, p + "/grp")
t("grp_w", wr, p + "/grp")
t("supp_r", rd, p + "/supp")
t("world_r", rd, p + "/world")
t("nogrp_r", rd, p + "/nogrp")
t("own_r", rd, p + "/own")
t("closed_stat", lambda: os.stat(p + "/closed/inner") and None)
t("ro_create", wr, p + "/ro/new", b"x", os.O_WRONLY | os.O_CREAT)
t("box_create", wr, p + "/box/new-%d" % os.getuid(), b"x", os.O_WRONLY | os.O_CREAT)
t("exec", run, p + "/exe")
t("chmod_other", os.chmod, p + "/world", 0o666)
t("chown_own", os.chown, p + "/own", 0, 0)
t("chmod_own", os.chmod, p + "/own", 0o066)
t("touch_now", os.utime, p + "/writable")
t("touch_at", os.utime, p + "/writable", (1, 1))
"#;

/// Guards against a mount that lets users past the permission bits (or denies them what
/// the bits allow): owner, primary group, supplementary group and other classes, the
/// owner class winning over more generous group bits, directory search and write
/// permission, exec, chmod/chown by non-owners, and utimes (write permission allows
/// "now", only the owner sets explicit times).
#[test]
fn permission_bits_hold_for_owner_groups_and_others() {
    let cluster = ProcessCluster::start(1);
    open_to_all(cluster.dir());
    let m = cluster.mount("mnt");
    access_fixture(&m.path);
    let args = [m.path.as_path()];
    alice().py(ACCESS_SCRIPT, &args).expect(&[
        ("secret_r", "EACCES"),
        ("secret_w", "EACCES"),
        ("grp_r", "OK 1"),
        ("grp_w", "EACCES"),
        ("supp_r", "EACCES"),
        ("world_r", "OK 1"),
        ("nogrp_r", "EACCES"),
        ("own_r", "EACCES"),
        ("closed_stat", "EACCES"),
        ("ro_create", "EACCES"),
        ("box_create", "EACCES"),
        ("exec", "EACCES"),
        ("chmod_other", "EPERM"),
        ("chown_own", "EPERM"),
        ("chmod_own", "OK"),
        ("touch_now", "OK"),
        ("touch_at", "EPERM"),
    ]);
    // The same user with the shared group as a supplementary group.
    let member = alice().with_groups(&[SHARED_GID]);
    let out = member.py(ACCESS_SCRIPT, &args);
    out.expect(&[
        ("supp_r", "OK 1"),
        ("box_create", "OK"),
        ("exec", "OK ran"),
        ("secret_r", "EACCES"),
        ("grp_r", "OK 1"),
    ]);
    assert_eq!(
        fs::metadata(m.path.join(format!("box/new-{ALICE_UID}")))
            .unwrap()
            .uid(),
        ALICE_UID
    );
    // Another user is in none of the groups; the bits for others let him read `own`.
    bob().py(ACCESS_SCRIPT, &args).expect(&[
        ("grp_r", "EACCES"),
        ("own_r", "OK 1"),
        ("world_r", "OK 1"),
    ]);
    // Root passes the read and write bits, and runs what has an x bit.
    User::root().py(ACCESS_SCRIPT, &args).expect(&[
        ("secret_r", "OK 1"),
        ("own_r", "OK 1"),
        ("closed_stat", "OK"),
        ("ro_create", "OK"),
        ("exec", "OK ran"),
        ("touch_at", "OK"),
    ]);
}

const PRIVS_SCRIPT: &str = r#"
import mmap
p = sys.argv[1]
def direct(path):
    buf = mmap.mmap(-1, 4096)
    buf.write(b"d" * 4096)
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    try:
        os.write(fd, buf)
    finally:
        os.close(fd)
t("cached", wr, p + "/w_cached", b"data")
t("append", wr, p + "/w_append", b"data", os.O_WRONLY | os.O_APPEND)
t("direct", direct, p + "/w_direct")
t("trunc", os.truncate, p + "/w_trunc", 1)
t("chgrp_member", os.chown, p + "/mine", -1, 4444)
t("chgrp_other", os.chown, p + "/mine", -1, 0)
"#;

/// Guards against an unprivileged writer keeping setuid/setgid on a file it changed
/// (a privilege escalation), on every write path: page cache, O_APPEND, O_DIRECT and
/// truncate; and against chown leaving them, while root's writes keep them as on ext4.
#[test]
fn setuid_and_setgid_are_cleared_by_unprivileged_writes_and_by_chown() {
    let cluster = ProcessCluster::start(1);
    open_to_all(cluster.dir());
    let m = cluster.mount("mnt");
    let p = &m.path;
    for name in ["w_cached", "w_append", "w_direct", "w_trunc", "w_root"] {
        file_owned(&p.join(name), b"0123456789", 0o6777, 0, 0);
    }
    file_owned(&p.join("mine"), b"m", 0o2755, ALICE_UID, ALICE_UID);
    let out = alice()
        .with_groups(&[SHARED_GID])
        .py(PRIVS_SCRIPT, &[p.as_path()]);
    out.expect(&[
        ("cached", "OK"),
        ("append", "OK"),
        ("direct", "OK"),
        ("trunc", "OK"),
        ("chgrp_member", "OK"),
        ("chgrp_other", "EPERM"),
    ]);
    for name in ["w_cached", "w_append", "w_direct", "w_trunc"] {
        assert_eq!(
            mode_of(&p.join(name)),
            0o777,
            "{name} after an unprivileged write"
        );
    }
    assert_eq!(mode_of(&p.join("mine")), 0o755, "chgrp drops setgid");
    assert_eq!(fs::metadata(p.join("mine")).unwrap().gid(), SHARED_GID);
    // Root has CAP_FSETID: its writes leave the bits alone.
    fs::OpenOptions::new()
        .append(true)
        .open(p.join("w_root"))
        .unwrap()
        .write_all(b"root")
        .unwrap();
    assert_eq!(mode_of(&p.join("w_root")), 0o6777);
    // chown clears setuid, and setgid when group-exec is set; not on directories.
    file_owned(&p.join("c_suid"), b"c", 0o6755, 0, 0);
    file_owned(&p.join("c_sgid_noexec"), b"c", 0o2745, 0, 0);
    mkdir_owned(&p.join("c_dir"), 0o2775, 0, 0);
    for name in ["c_suid", "c_sgid_noexec", "c_dir"] {
        chown(&p.join(name), ALICE_UID, ALICE_UID).unwrap();
    }
    assert_eq!(mode_of(&p.join("c_suid")), 0o755);
    assert_eq!(mode_of(&p.join("c_sgid_noexec")), 0o2745);
    assert_eq!(mode_of(&p.join("c_dir")), 0o2775);
    assert_eq!(fs::metadata(p.join("c_suid")).unwrap().uid(), ALICE_UID);
}

const SGID_DIR_SCRIPT: &str = r#"
p = sys.argv[1]
os.umask(0o022)
t("file", wr, p + "/team/f", b"x", os.O_WRONLY | os.O_CREAT)
t("dir", os.mkdir, p + "/team/d", 0o755)
t("nested", wr, p + "/team/d/g", b"x", os.O_WRONLY | os.O_CREAT)
t("fifo", os.mkfifo, p + "/team/fifo", 0o644)
s = "open/s%d" % os.getuid()
t("sgid_file", lambda: os.close(os.open(p + "/" + s, os.O_CREAT | os.O_WRONLY, 0o2755)))
for n in ["team/f", "team/d", "team/d/g", "team/fifo", s]:
    t("owner:" + n, owner, p + "/" + n)
    t("mode:" + n, mode, p + "/" + n)
"#;

/// Guards against new entries in a setgid directory taking the creator's group instead
/// of the directory's (shared project directories break), against subdirectories not
/// inheriting the bit, and against a non-member planting a setgid file there.
#[test]
fn new_entries_in_a_setgid_directory_take_its_group() {
    let cluster = ProcessCluster::start(1);
    open_to_all(cluster.dir());
    let m = cluster.mount("mnt");
    mkdir_owned(&m.path.join("team"), 0o2775, 0, SHARED_GID);
    mkdir_owned(&m.path.join("open"), 0o2777, 0, SHARED_GID);
    let member = alice().with_groups(&[SHARED_GID]);
    member.py(SGID_DIR_SCRIPT, &[m.path.as_path()]).expect(&[
        ("file", "OK"),
        ("dir", "OK"),
        ("nested", "OK"),
        ("fifo", "OK"),
        ("owner:team/f", "OK 4242:4444"),
        ("mode:team/f", "OK 0o644"),
        ("owner:team/d", "OK 4242:4444"),
        ("mode:team/d", "OK 0o2755"),
        ("owner:team/d/g", "OK 4242:4444"),
        ("owner:team/fifo", "OK 4242:4444"),
        ("owner:open/s4242", "OK 4242:4444"),
        ("mode:open/s4242", "OK 0o2755"),
    ]);
    // Bob is not in the group: his setgid bit is dropped, the group still inherited.
    bob().py(SGID_DIR_SCRIPT, &[m.path.as_path()]).expect(&[
        ("sgid_file", "OK"),
        ("owner:open/s4343", "OK 4343:4444"),
        ("mode:open/s4343", "OK 0o755"),
    ]);
}

const STICKY_SCRIPT: &str = r#"
p, me = sys.argv[1], sys.argv[2]
if me == "alice":
    t("create_a", wr, p + "/tmp/a", b"a", os.O_WRONLY | os.O_CREAT)
    t("create_a2", wr, p + "/tmp/a2", b"a", os.O_WRONLY | os.O_CREAT)
    t("mkdir_ad", os.mkdir, p + "/tmp/ad")
    t("create_open", wr, p + "/open/a", b"a", os.O_WRONLY | os.O_CREAT)
    t("create_in_bobs", wr, p + "/bobs/a", b"a", os.O_WRONLY | os.O_CREAT)
else:
    t("unlink", os.unlink, p + "/tmp/a")
    t("rename_away", os.rename, p + "/tmp/a", p + "/tmp/b")
    t("create_b", wr, p + "/tmp/b", b"b", os.O_WRONLY | os.O_CREAT)
    t("rename_over", os.rename, p + "/tmp/b", p + "/tmp/a")
    t("rmdir", os.rmdir, p + "/tmp/ad")
    t("unlink_own", os.unlink, p + "/tmp/b")
    t("unlink_not_sticky", os.unlink, p + "/open/a")
    t("unlink_as_dir_owner", os.unlink, p + "/bobs/a")
"#;

/// Guards against a sticky directory (/tmp-like) letting one user delete or replace
/// another user's files; the owner of the file, of the directory, and root still can.
#[test]
fn a_sticky_directory_protects_other_users_entries() {
    let cluster = ProcessCluster::start(1);
    open_to_all(cluster.dir());
    let m = cluster.mount("mnt");
    let p = m.path.as_path();
    mkdir_owned(&p.join("tmp"), 0o1777, 0, 0);
    mkdir_owned(&p.join("open"), 0o777, 0, 0);
    mkdir_owned(&p.join("bobs"), 0o1777, BOB_UID, BOB_UID);
    assert_eq!(mode_of(&p.join("tmp")), 0o1777);
    let a = Path::new("alice");
    let b = Path::new("bob");
    alice().py(STICKY_SCRIPT, &[p, a]).expect(&[
        ("create_a", "OK"),
        ("create_a2", "OK"),
        ("mkdir_ad", "OK"),
        ("create_open", "OK"),
        ("create_in_bobs", "OK"),
    ]);
    bob().py(STICKY_SCRIPT, &[p, b]).expect(&[
        ("unlink", "EPERM"),
        ("rename_away", "EPERM"),
        ("create_b", "OK"),
        ("rename_over", "EPERM"),
        ("rmdir", "EPERM"),
        ("unlink_own", "OK"),
        ("unlink_not_sticky", "OK"),
        ("unlink_as_dir_owner", "OK"),
    ]);
    assert_eq!(
        fs::read(p.join("tmp/a")).unwrap(),
        b"a",
        "alice's file is intact"
    );
    let out = alice().py("t('unlink_mine', os.unlink, sys.argv[1] + '/tmp/a')", &[p]);
    out.expect(&[("unlink_mine", "OK")]);
    fs::remove_file(p.join("tmp/a2")).expect("root removes anything");
}

const FALLOCATE_PRIVS_SCRIPT: &str = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
KEEP, PUNCH, ZERO = 0x01, 0x02, 0x10
def falloc(p, mode, off, length):
    fd = os.open(p, os.O_RDWR)
    try:
        if libc.fallocate(fd, mode, off, length) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    finally:
        os.close(fd)
p = sys.argv[1]
t("grow", falloc, p + "/f_grow", 0, 0, 8192)
t("keep", falloc, p + "/f_keep", KEEP, 0, 8192)
t("punch", falloc, p + "/f_punch", PUNCH | KEEP, 0, 4)
t("zero", falloc, p + "/f_zero", ZERO, 2, 4)
t("member", falloc, p + "/f_member", 0, 0, 8192)
"#;

/// Guards against an unprivileged `fallocate` (growing, reserving, punching a hole,
/// zeroing a range) keeping setuid, or setgid on a file whose group the caller is not
/// in, where a write clears them (Linux clears setgid without group-execute too when
/// the writer is not in the group); a member of the group keeps that setgid bit.
#[test]
fn unprivileged_fallocate_clears_setuid_and_setgid_as_a_write_does() {
    let cluster = ProcessCluster::start(1);
    open_to_all(cluster.dir());
    let m = cluster.mount("mnt");
    let p = &m.path;
    file_owned(&p.join("f_grow"), b"0123456789", 0o2666, 0, 0);
    file_owned(&p.join("f_keep"), b"0123456789", 0o6666, 0, 0);
    file_owned(&p.join("f_punch"), b"0123456789", 0o2676, 0, 0);
    file_owned(&p.join("f_zero"), b"0123456789", 0o6666, 0, 0);
    file_owned(&p.join("f_member"), b"0123456789", 0o2666, 0, SHARED_GID);
    let out = alice()
        .with_groups(&[SHARED_GID])
        .py(FALLOCATE_PRIVS_SCRIPT, &[p.as_path()]);
    out.expect(&[
        ("grow", "OK"),
        ("keep", "OK"),
        ("punch", "OK"),
        ("zero", "OK"),
        ("member", "OK"),
    ]);
    let modes = |names: &[&str]| -> Vec<String> {
        let m = |n: &&str| format!("{n} {:#o}", mode_of(&p.join(n)));
        names.iter().map(m).collect()
    };
    assert_eq!(
        modes(&["f_grow", "f_keep", "f_punch", "f_zero", "f_member"]),
        [
            "f_grow 0o666",
            "f_keep 0o666",
            "f_punch 0o676",
            "f_zero 0o666",
            "f_member 0o2666", // a member of the file's group keeps setgid
        ]
    );
    assert_eq!(fs::read(p.join("f_punch")).unwrap(), b"\0\0\0\x00456789");
    assert_eq!(fs::read(p.join("f_zero")).unwrap(), b"01\0\0\0\x006789");
    // Root (CAP_FSETID) keeps both.
    file_owned(&p.join("f_root"), b"0123456789", 0o6666, 0, 0);
    let f = fs::OpenOptions::new()
        .write(true)
        .open(p.join("f_root"))
        .unwrap();
    fallocate(&f, 0, 0, 8192).unwrap();
    assert_eq!(mode_of(&p.join("f_root")), 0o6666, "root keeps them");
}
