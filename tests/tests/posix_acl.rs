//! POSIX ACLs on real mounts, beside the local file system (ext4 here): `setfacl` and
//! `getfacl`, what users named in an ACL may do, default ACLs given to what is made in
//! a directory, `chmod` and the mask, `cp -a`. The same script runs in a directory of
//! the local disk and in one on the mount, and every line it prints must match.
//! They need root, /dev/fuse and the `acl` package, as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::process::Command;
use tessera_tests::posix::{
    assert_same_lines, check_output, on_disk_and_mount, ALICE_UID, BOB_UID, SHARED_GID,
};
use tessera_tests::ProcessCluster;

/// A user in [`SHARED_GID`] only through its supplementary groups.
const CAROL_UID: u32 = 4545;

/// The script: `$1` is the directory to work in. `r LABEL CMD...` prints the label, `ok`
/// or `fail`, and the command's output (paths are relative, so both sides print the
/// same). `A`, `B` and `C` run a command as Alice, Bob and Carol (in the shared group),
/// each with umask 077, so that only a default ACL can give others access.
fn script() -> String {
    let who = |name: &str, uid: u32, groups: &str| {
        format!(
            "{name}() {{ setpriv --reuid={uid} --regid={uid} {groups} -- \
             sh -c 'umask 077; exec \"$@\"' sh \"$@\"; }}"
        )
    };
    format!(
        r#"
set -u
cd "$1"
{alice}
{bob}
{carol}
r() {{ label=$1; shift; if out=$("$@" 2>&1); then echo "$label ok $out"; else echo "$label fail $out"; fi; }}
acl() {{ getfacl -n -p "$@" 2>/dev/null | grep -v '^#' | tr '\n' ' '; }}
st() {{ stat -c '%A %u:%g' "$@"; }}
umask 022
mkdir proj && chmod 0750 proj
r set-access setfacl -m u:{a}:rwx,g:{s}:r-x proj
r set-default setfacl -d -m u:{a}:rwx,g:{s}:rwx,o::- proj
r proj-acl acl proj
r proj-mode st proj
r alice-creates A touch proj/a.txt
r alice-mkdir A mkdir proj/sub
r alice-mkdir-deeper A mkdir proj/sub/deeper
r a-acl acl proj/a.txt
r a-mode st proj/a.txt
r sub-acl acl proj/sub
r deeper-acl acl proj/sub/deeper
r deeper-mode st proj/sub/deeper
r bob-lists B ls proj
r bob-reads B cat proj/a.txt
r carol-lists C ls proj
r carol-appends C sh -c 'echo carol >> proj/a.txt'
r mask-to-r setfacl -m m::r proj/a.txt
r a-mode-masked st proj/a.txt
r carol-appends-masked C sh -c 'echo carol >> proj/a.txt'
r alice-reads A cat proj/a.txt
r bob-search setfacl -m u:{b}:x proj
r bob-sets B setfacl -m u:{b}:rw proj/a.txt
r alice-sets A setfacl -m u:{b}:rw proj/a.txt
r bob-appends-masked B sh -c 'echo bob >> proj/a.txt'
r chmod-770 chmod 0770 proj/a.txt
r a-acl-chmod acl proj/a.txt
r bob-appends B sh -c 'echo bob >> proj/a.txt'
r copy cp -a proj/a.txt proj/a.copy
r copy-acl acl proj/a.copy
r copy-mode st proj/a.copy
r remove-acl setfacl -b proj/a.txt
r a-acl-removed acl proj/a.txt
r a-mode-removed st proj/a.txt
r bob-after-removal B cat proj/a.txt
r equivalent setfacl --set u::rwx,g::r,o::- proj/a.copy
r equivalent-acl acl proj/a.copy
r equivalent-mode st proj/a.copy
r remove-default setfacl -k proj
r root-creates touch proj/plain
r plain-acl acl proj/plain
r plain-mode st proj/plain
r file-default setfacl -d -m u:{a}:r proj/plain
r fifo A mkfifo proj/sub/fifo
r fifo-acl acl proj/sub/fifo
r fifo-mode st proj/sub/fifo
r list-after A ls proj/sub
r sub-chmod chmod 0705 proj/sub
r sub-acl-chmod acl proj/sub
r o-make touch proj/o
r o-acl setfacl -m u:{b}:rwx proj/o
r o-chmod chmod 0704 proj/o
r o-mode st proj/o
r bob-reads-o B cat proj/o
r bob-writes-o B sh -c 'echo x >> proj/o'
r sg-make touch proj/sg
r sg-own chown {a}:{s} proj/sg
r sg-mode chmod 2770 proj/sg
r sg-acl A setfacl -m u:{b}:r proj/sg
r sg-after st proj/sg
r link ln -s a.txt proj/ln
r link-acl setfattr -h -n system.posix_acl_access -v 0sAgAAAAEABgD/////BAAEAP////8gAAAA/////w== proj/ln
r link-get getfattr -h -n system.posix_acl_access proj/ln
"#,
        alice = who("A", ALICE_UID, "--clear-groups"),
        bob = who("B", BOB_UID, "--clear-groups"),
        carol = who("C", CAROL_UID, &format!("--groups={SHARED_GID}")),
        a = ALICE_UID,
        b = BOB_UID,
        s = SHARED_GID,
    )
}

/// Guards against ACLs that a mount stores but does not apply, applies otherwise than
/// Linux, or loses: every step's outcome and every listing equal the local disk's.
#[test]
fn acls_behave_as_on_the_local_disk() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("m");
    let script = ("the ACL script", script());
    let (want, got) = on_disk_and_mount(&cluster, &m, (script.0, &script.1), "acl");
    // The local file system must be one that keeps ACLs, or the comparison says nothing.
    assert!(
        want.iter()
            .any(|l| l.starts_with("a-acl ok user::rw- user:4242:rwx")),
        "the local side has no ACLs: {want:#?}"
    );
    assert_same_lines(&want, &got);
}

/// Guards against another mount's kernel judging by an ACL it read before a change
/// through this mount for longer than the attribute TTL: a user named later reads the
/// file there (its kernel had refused her by the old ACL).
#[test]
fn an_acl_set_through_one_mount_reaches_another() {
    use tessera_tests::posix::User;
    let cluster = ProcessCluster::start(1);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    for p in [cluster.dir(), a.path.as_path(), b.path.as_path()] {
        tessera_tests::posix::open_to_all(p);
    }
    fs::write(a.path.join("f"), b"data").unwrap();
    let f = a.path.join("f");
    check_output(
        "chmod",
        &Command::new("chmod").arg("0600").arg(&f).output().unwrap(),
    );
    let alice = User::plain(ALICE_UID);
    let on_b = b.path.join("f");
    let reads = || {
        alice
            .command("cat")
            .arg(&on_b)
            .output()
            .unwrap()
            .status
            .success()
    };
    let modify = |entry: String| {
        let out = Command::new("setfacl")
            .args(["-m", &entry])
            .arg(&f)
            .output()
            .unwrap();
        check_output("setfacl", &out);
    };
    // Bob named: the group bits are set, so b's kernel reads the ACL at Alice's try.
    modify(format!("u:{BOB_UID}:r"));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(!reads(), "0640 of root's, Alice not named");
    modify(format!("u:{ALICE_UID}:r"));
    // Within the attribute TTL (1 s) and a margin for a loaded machine; here it was
    // at the first try.
    tessera_tests::posix::wait_until(
        "the other mount lets Alice read",
        std::time::Duration::from_secs(5),
        reads,
    );
}
