//! The permission rules, case by case, with the errno Linux gives for each.

use super::*;
use proto::{ErrorCode, Timestamp};

const ALICE: u32 = 1000;
const BOB: u32 = 1001;
const STAFF: u32 = 50;

fn user(uid: u32) -> Caller {
    Caller::new(uid, uid)
}

fn file(perm: u32, uid: u32, gid: u32) -> Mode {
    Mode {
        kind: FileKind::Regular,
        perm,
        uid,
        gid,
        acl: None,
        flags: InodeFlags::default(),
    }
}

fn dir(perm: u32, uid: u32) -> Mode {
    Mode {
        kind: FileKind::Directory,
        perm,
        uid,
        gid: uid,
        acl: None,
        flags: InodeFlags::default(),
    }
}

fn code(r: Result<(), MetaError>) -> Option<ErrorCode> {
    r.err().map(|e| e.code())
}

const EACCES: Option<ErrorCode> = Some(ErrorCode::PermissionDenied);
const EPERM: Option<ErrorCode> = Some(ErrorCode::NotPermitted);
const ENODATA: Option<ErrorCode> = Some(ErrorCode::NoData);

#[test]
fn mode_bits_pick_owner_then_group_then_others() {
    let staff_member = Caller::with_groups(BOB, BOB, [STAFF]);
    let cases = [
        // (caller, mode, want, allowed)
        (user(ALICE), file(0o600, ALICE, ALICE), R | W, true),
        (user(BOB), file(0o600, ALICE, ALICE), R, false),
        (user(BOB), file(0o644, ALICE, ALICE), R, true),
        (user(BOB), file(0o644, ALICE, ALICE), W, false),
        // The owner's bits decide for the owner even when others have more.
        (user(ALICE), file(0o066, ALICE, ALICE), R, false),
        // A supplementary group counts as the group.
        (staff_member.clone(), file(0o640, ALICE, STAFF), R, true),
        (staff_member, file(0o604, ALICE, STAFF), R, false),
        (Caller::new(BOB, STAFF), file(0o660, ALICE, STAFF), W, true),
        (user(BOB), dir(0o711, ALICE), X, true),
        (user(BOB), dir(0o700, ALICE), X, false),
        // Root: everything but executing a file nobody may execute.
        (Caller::ROOT, file(0o000, ALICE, ALICE), R | W, true),
        (Caller::ROOT, file(0o644, ALICE, ALICE), X, false),
        (Caller::ROOT, file(0o100, ALICE, ALICE), X, true),
        (Caller::ROOT, dir(0o000, ALICE), R | W | X, true),
    ];
    for (i, (c, m, want, ok)) in cases.into_iter().enumerate() {
        assert_eq!(may(&c, &m, want), ok, "case {i}: {c:?} {m:?} {want}");
    }
}

#[test]
fn removing_a_name_needs_write_and_search_and_the_sticky_rule() {
    let victim = file(0o644, ALICE, ALICE);
    let cases = [
        // A 755 directory of someone else: EACCES.
        (user(BOB), dir(0o755, ALICE), victim.clone(), EACCES),
        (user(ALICE), dir(0o755, ALICE), victim.clone(), None),
        // Writable but not searchable: EACCES.
        (user(BOB), dir(0o776, ALICE), victim.clone(), EACCES),
        // Sticky /tmp-like: only the victim's or the directory's owner, or root: EPERM.
        (user(BOB), dir(0o1777, 0), victim.clone(), EPERM),
        (user(ALICE), dir(0o1777, 0), victim.clone(), None),
        (user(BOB), dir(0o1777, BOB), victim.clone(), None),
        (Caller::ROOT, dir(0o1777, BOB), victim.clone(), None),
        // Not sticky: anyone with write and search.
        (user(BOB), dir(0o777, 0), victim.clone(), None),
    ];
    for (i, (c, d, v, want)) in cases.into_iter().enumerate() {
        assert_eq!(code(may_delete(&c, &d, &v)), want, "case {i}");
    }
    assert_eq!(code(may_create(&user(BOB), &dir(0o755, ALICE))), EACCES);
    assert_eq!(code(may_create(&user(BOB), &dir(0o1777, 0))), None);
}

#[test]
fn setattr_rules_follow_linux() {
    let mine = file(0o644, ALICE, ALICE);
    let set = |f: &dyn Fn(&mut SetAttr)| {
        let mut s = SetAttr::default();
        f(&mut s);
        s
    };
    let t = Timestamp { secs: 5, nanos: 0 };
    let none = Held::default();
    let writing = Held {
        write_session: true,
    };
    let staff_alice = Caller::with_groups(ALICE, ALICE, [STAFF]);
    let cases = [
        (user(BOB), set(&|s| s.perm = Some(0o777)), none, EPERM),
        (user(ALICE), set(&|s| s.perm = Some(0o600)), none, None),
        (user(BOB), set(&|s| s.uid = Some(BOB)), none, EPERM),
        // The owner may not give the file away, only root may.
        (user(ALICE), set(&|s| s.uid = Some(BOB)), none, EPERM),
        (user(ALICE), set(&|s| s.uid = Some(ALICE)), none, None),
        (Caller::ROOT, set(&|s| s.uid = Some(BOB)), none, None),
        (user(ALICE), set(&|s| s.gid = Some(STAFF)), none, EPERM),
        (staff_alice, set(&|s| s.gid = Some(STAFF)), none, None),
        (user(BOB), set(&|s| s.gid = Some(BOB)), none, EPERM),
        (user(BOB), set(&|s| s.size = Some(0)), none, EACCES),
        (user(BOB), set(&|s| s.size = Some(0)), writing, None),
        (
            user(BOB),
            set(&|s| s.mtime = Some(TimeSet::At(t))),
            none,
            EPERM,
        ),
        (
            user(BOB),
            set(&|s| s.mtime = Some(TimeSet::Now)),
            none,
            EACCES,
        ),
        (
            user(ALICE),
            set(&|s| s.mtime = Some(TimeSet::At(t))),
            none,
            None,
        ),
    ];
    for (i, (c, s, held, want)) in cases.into_iter().enumerate() {
        assert_eq!(code(check_setattr(&c, &mine, &s, held)), want, "case {i}");
    }
    // Anyone may set the times of a file they may write to now, not to a given time.
    let shared = file(0o666, ALICE, ALICE);
    let now = set(&|s| s.atime = Some(TimeSet::Now));
    assert_eq!(code(check_setattr(&user(BOB), &shared, &now, none)), None);
}

#[test]
fn a_writer_may_only_clear_setuid_and_setgid_of_a_file_it_does_not_own() {
    let suid = file(0o6775, ALICE, STAFF);
    let writer = Caller::new(BOB, STAFF);
    let kill = SetAttr {
        perm: Some(0o775),
        ..SetAttr::default()
    };
    assert_eq!(
        code(check_setattr(&writer, &suid, &kill, Held::default())),
        None
    );
    let more = SetAttr {
        perm: Some(0o777),
        ..SetAttr::default()
    };
    assert_eq!(
        code(check_setattr(&writer, &suid, &more, Held::default())),
        EPERM
    );
    // The kernel clears setuid alone first (`file_remove_privs`), then setgid.
    let kill_suid = SetAttr {
        perm: Some(0o2775),
        ..SetAttr::default()
    };
    let r = check_setattr(&writer, &suid, &kill_suid, Held::default());
    assert_eq!(code(r), None);
    let reader = user(BOB);
    assert_eq!(
        code(check_setattr(&reader, &suid, &kill, Held::default())),
        EPERM
    );
}

#[test]
fn chmod_by_an_owner_outside_the_group_drops_setgid() {
    assert_eq!(chmod_mode(&user(ALICE), STAFF, 0o2755), 0o755);
    assert_eq!(
        chmod_mode(&Caller::new(ALICE, STAFF), STAFF, 0o2755),
        0o2755
    );
    assert_eq!(chmod_mode(&Caller::ROOT, STAFF, 0o2755), 0o2755);
}

#[test]
fn hard_links_of_files_of_others_need_read_and_write() {
    assert_eq!(
        code(may_link(&user(BOB), &file(0o644, ALICE, ALICE))),
        EPERM
    );
    assert_eq!(code(may_link(&user(BOB), &file(0o666, ALICE, ALICE))), None);
    assert_eq!(
        code(may_link(&user(BOB), &file(0o4666, ALICE, ALICE))),
        EPERM
    );
    assert_eq!(
        code(may_link(&user(ALICE), &file(0o000, ALICE, ALICE))),
        None
    );
}

#[test]
fn xattr_namespaces_follow_linux() {
    use XattrAccess::{Read, Remove, Write};
    const CAPS: &[u8] = b"security.capability";
    let cap_file = |perm| file(perm, ALICE, ALICE);
    let f = file(0o644, ALICE, ALICE);
    let fifo = Mode {
        kind: FileKind::Fifo,
        ..f.clone()
    };
    let cases = [
        (user(ALICE), f.clone(), &b"trusted.x"[..], Write, EPERM),
        (user(ALICE), f.clone(), b"trusted.x", Read, ENODATA),
        (Caller::ROOT, f.clone(), b"trusted.x", Write, None),
        (user(ALICE), f.clone(), b"security.x", Write, EPERM),
        (user(BOB), f.clone(), b"security.x", Read, None),
        (user(ALICE), f.clone(), b"user.x", Write, None),
        (user(BOB), f.clone(), b"user.x", Write, EACCES),
        (user(BOB), f.clone(), b"user.x", Read, None),
        (
            user(BOB),
            file(0o600, ALICE, ALICE),
            b"user.x",
            Read,
            EACCES,
        ),
        (user(ALICE), fifo.clone(), b"user.x", Write, EPERM),
        (user(ALICE), fifo.clone(), b"user.x", Read, ENODATA),
        // A sticky directory's user attributes are its owner's to write.
        (user(BOB), dir(0o1777, ALICE), b"user.x", Write, EPERM),
        (user(ALICE), dir(0o1777, ALICE), b"user.x", Write, None),
        // Whoever may write a file may remove its capabilities (the kernel's
        // `file_remove_privs` before a write); nothing else of `security.*`.
        (user(BOB), cap_file(0o666), CAPS, Remove, None),
        (user(BOB), cap_file(0o644), CAPS, Remove, EPERM),
        (user(ALICE), cap_file(0o444), CAPS, Remove, None),
        (user(BOB), cap_file(0o666), CAPS, Write, EPERM),
        (user(BOB), cap_file(0o666), b"security.x", Remove, EPERM),
        (user(BOB), dir(0o777, ALICE), CAPS, Remove, EPERM),
    ];
    for (i, (c, m, name, access, want)) in cases.into_iter().enumerate() {
        assert_eq!(code(check_xattr(&c, &m, name, access)), want, "case {i}");
    }
    assert!(!lists_xattr(&user(ALICE), b"trusted.x"));
    assert!(lists_xattr(&user(ALICE), b"user.x"));
    assert!(lists_xattr(&Caller::ROOT, b"trusted.x"));
}

/// Guards against any user making device nodes (a block device of a disk it may then
/// read and write on a mount that honours devices): only root may, as without
/// `CAP_MKNOD` on Linux; FIFOs and sockets need no privilege.
#[test]
fn only_root_makes_device_nodes() {
    for kind in [FileKind::BlockDevice, FileKind::CharDevice] {
        let e = may_mknod(&user(ALICE), kind).unwrap_err();
        assert_eq!(e.code(), ErrorCode::NotPermitted, "{kind:?}");
        may_mknod(&Caller::ROOT, kind).unwrap();
    }
    for kind in [FileKind::Fifo, FileKind::Socket] {
        may_mknod(&user(ALICE), kind).unwrap();
    }
}

#[test]
fn a_chown_drops_setuid_and_setgid_as_linux_does() {
    let chown = |uid, gid| SetAttr {
        uid,
        gid,
        ..SetAttr::default()
    };
    let staff_owner = Caller::with_groups(ALICE, ALICE, [STAFF]);
    let cases = [
        // (caller, mode, change, mode left)
        // Setuid goes with any change of owner or group, even by root.
        (
            Caller::ROOT,
            file(0o4755, ALICE, STAFF),
            chown(Some(BOB), None),
            Some(0o755),
        ),
        // Setgid too when group-executable.
        (
            Caller::ROOT,
            file(0o6755, ALICE, STAFF),
            chown(None, Some(0)),
            Some(0o755),
        ),
        // Not group-executable (mandatory locking's mark): kept by root or a member of
        // the file's group, dropped for anyone else.
        (
            Caller::ROOT,
            file(0o2644, ALICE, STAFF),
            chown(Some(BOB), None),
            None,
        ),
        (
            staff_owner.clone(),
            file(0o2644, ALICE, STAFF),
            chown(None, Some(STAFF)),
            None,
        ),
        (
            user(ALICE),
            file(0o2644, ALICE, STAFF),
            chown(Some(ALICE), None),
            Some(0o644),
        ),
        // Nothing to drop, a directory, a change that sets the mode itself (a
        // mount's kernel sends the mode it computed), no owner or group change.
        (
            Caller::ROOT,
            file(0o755, ALICE, STAFF),
            chown(Some(BOB), None),
            None,
        ),
        (
            Caller::ROOT,
            dir(0o6755, ALICE),
            chown(Some(BOB), None),
            None,
        ),
        (
            Caller::ROOT,
            file(0o4755, ALICE, STAFF),
            SetAttr {
                perm: Some(0o755),
                ..chown(Some(BOB), None)
            },
            None,
        ),
        (
            Caller::ROOT,
            file(0o4755, ALICE, STAFF),
            SetAttr::default(),
            None,
        ),
    ];
    for (c, m, set, want) in cases {
        assert_eq!(chown_mode(&c, &m, &set), want, "{c:?} {m:?} {set:?}");
    }
}
