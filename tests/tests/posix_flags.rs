//! Attribute flags on real mounts (`chattr +i`, `+a`, `lsattr`), beside the local file
//! system: the same script runs in a directory of the local disk and in one on the
//! mount, and every line it prints must match. What an immutable or append-only file or
//! directory refuses, to root as to its owner; who may set the flags; bytes a refused
//! truncation leaves. They need root, /dev/fuse and `chattr` (e2fsprogs), as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::Path;
use std::process::Command;
use tessera_tests::posix::{
    assert_same_lines, check_output, errno_of, on_disk_and_mount, ALICE_UID,
};
use tessera_tests::ProcessCluster;

/// The script: `$1` is the directory to work in. `r LABEL CMD...` prints the label, `ok`
/// or `fail`, and the command's output (paths are relative, so both sides print the
/// same). `A` runs a command as Alice, without root's capabilities. `fl` prints which of
/// `i` and `a` a file has (a local file system shows others too, as ext4's extents).
/// It clears every flag at the end, so that the directories can be removed.
fn script() -> String {
    format!(
        r#"
set -u
cd "$1"
A() {{ setpriv --reuid={a} --regid={a} --clear-groups -- "$@"; }}
r() {{ label=$1; shift; if out=$("$@" 2>&1); then echo "$label ok $out"; else echo "$label fail $out"; fi; }}
fl() {{ lsattr -d "$1" | cut -d' ' -f1 | tr -cd 'ia'; }}
ftrunc() {{ python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND); os.ftruncate(fd, 0)' "$1"; }}
early() {{ python3 -c '
import os, subprocess, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
subprocess.run(["chattr", "+i", sys.argv[1]], check=True)
try:
    os.write(fd, b"late")
except OSError as e:
    sys.exit(e.strerror)
finally:
    subprocess.run(["chattr", "-i", sys.argv[1]], check=True)
' "$1"; }}
punch() {{ python3 -c '
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
# FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE over the first byte.
if libc.fallocate(fd, 3, ctypes.c_long(0), ctypes.c_long(1)) != 0:
    sys.exit(os.strerror(ctypes.get_errno()))
' "$1"; }}
umask 022
echo data > f
r set-i chattr +i f
r flags-i fl f
r append sh -c 'echo more >> f'
r overwrite sh -c 'echo new > f'
r truncate truncate -s 0 f
r rm rm f
r mv mv f g
r ln ln f h
r chmod chmod 600 f
r chown chown 1:1 f
r touch touch f
r touch-at touch -d @0 f
r setfattr setfattr -n user.a -v 1 f
r getfattr getfattr -d -m - f
r set-a-too chattr +a f
r read cat f
r clear-i chattr -i f
r flags-none fl f
r write-after sh -c 'echo after >> f'
r read-after cat f
r write-open-before early f
r read-open-before cat f
echo a > ap
r set-a chattr +a ap
r flags-a fl ap
r append-a sh -c 'echo b >> ap'
r overwrite-a sh -c 'echo c > ap'
r truncate-a truncate -s 0 ap
r ftruncate-a ftrunc ap
r punch-a punch ap
r rm-a rm ap
r mv-a mv ap aq
r ln-a ln ap aq
r chmod-a chmod 600 ap
r touch-now-a touch ap
r touch-at-a touch -d @0 ap
r setfattr-a setfattr -n user.a -v 1 ap
r read-a cat ap
mkdir d && echo x > d/x
r dir-i chattr +i d
r dir-flags fl d
r dir-create touch d/new
r dir-mkdir mkdir d/sub
r dir-rm rm d/x
r dir-mv mv d/x d/y
r dir-write sh -c 'echo more >> d/x'
r dir-chmod chmod 700 d
r dir-rmdir rmdir d
r dir-list ls d
r dir-clear chattr -i d
r dir-a chattr +a d
r dir-a-create touch d/new
r dir-a-rm rm d/x
r dir-a-mv mv d/new d/newer
r dir-a-list ls d
r dir-a-clear chattr -a d
touch own && chown {a} own
r alice-lsattr A sh -c "lsattr -d own | cut -c1-5"
r alice-set-i A chattr +i own
r alice-set-a A chattr +a own
r root-sets-i chattr +i own
r alice-clears A chattr -i own
r alice-chmod A chmod 600 own
r alice-rm A rm -f own
r root-clears chattr -i own
r alice-rm-after A rm -f own
r left ls
chattr -R -ia . 2>/dev/null
"#,
        a = ALICE_UID,
    )
}

/// Guards against flags that a mount keeps but does not apply, applies otherwise than
/// Linux (the refusals, their order, who may set them), or loses; and against a refused
/// truncation that cut bytes first: every line equals the local disk's.
#[test]
fn flags_behave_as_on_the_local_disk() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("m");
    let script = ("the flags script", script());
    let (want, got) = on_disk_and_mount(&cluster, &m, (script.0, &script.1), "flags");
    // The local file system must keep the flags, or the comparison says nothing.
    assert!(
        want.iter().any(|l| l == "flags-i ok i")
            && want
                .iter()
                .any(|l| l == "rm fail rm: cannot remove 'f': Operation not permitted"),
        "the local side keeps no flags: {want:#?}"
    );
    assert_same_lines(&want, &got);
}

/// Guards against flags kept by the mount that set them rather than by the metadata
/// server: another mount of the cluster sees them and is refused as the first is, and
/// an attribute the flags are kept in never shows in a listing.
#[test]
fn flags_set_through_one_mount_hold_on_another() {
    let cluster = ProcessCluster::start(1);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    fs::write(a.path.join("f"), b"kept").unwrap();
    let chattr = |flag: &str, p: &Path| {
        let out = Command::new("chattr").arg(flag).arg(p).output().unwrap();
        check_output("chattr", &out);
    };
    chattr("+i", &a.path.join("f"));
    let on_b = b.path.join("f");
    let lsattr = Command::new("lsattr").arg(&on_b).output().unwrap();
    assert!(
        check_output("lsattr", &lsattr).starts_with("----i"),
        "the other mount lists the flag"
    );
    let e = fs::OpenOptions::new().append(true).open(&on_b);
    assert_eq!(errno_of("append on the other mount", e), libc::EPERM);
    let e = fs::remove_file(&on_b);
    assert_eq!(errno_of("remove on the other mount", e), libc::EPERM);
    assert_eq!(fs::read(&on_b).unwrap(), b"kept");
    assert!(
        tessera_tests::posix::listxattr(&on_b).unwrap().is_empty(),
        "the flags' own attribute is not listed"
    );
    chattr("-i", &on_b);
    fs::remove_file(a.path.join("f")).unwrap();
}
