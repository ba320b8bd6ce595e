//! The handlers check permissions for the caller a request names (`perm`, `access`):
//! each request type, as another user and as the owner, through `Namespace::handle`.

use super::{engine_tests, H, ROOT};
use crate::kv::StoreKind;
use crate::namespace::perm::XattrAccess;
use crate::namespace::{ConnId, Namespace, Origin};
use proto::meta::{fs, Caller, OpenAccess, RenameMode, XattrMode};
use proto::{ClientId, ErrorCode, InodeId, SetAttr};

const ALICE: u32 = 1000;
const BOB: u32 = 1001;

fn at(uid: u32, conn: u64) -> Origin {
    Origin {
        conn: ConnId(conn),
        caller: Caller::new(uid, uid),
        who: None,
        op: None,
    }
}

/// The code `req` fails with as `uid` (on connection 1), or `None` if it succeeds.
fn as_user<R: crate::namespace::Handle>(ns: &Namespace, uid: u32, req: R) -> Option<ErrorCode> {
    ns.handle(req, at(uid, 1)).err().map(|e| e.code)
}

fn mkdir(ns: &Namespace, uid: u32, parent: InodeId, name: &str, perm: u32) -> InodeId {
    let req = fs::Mkdir {
        parent,
        name: name.into(),
        perm,
    };
    ns.handle(req, at(uid, 1)).unwrap().attr.ino
}

fn create_req(parent: InodeId, name: &str, perm: u32, access: OpenAccess) -> fs::Create {
    fs::Create {
        parent,
        name: name.into(),
        perm,
        exclusive: false,
        client: ClientId(1),
        access,
        append: false,
    }
}

/// Creates (and closes) a file of `uid` on connection 1.
fn file(ns: &Namespace, uid: u32, parent: InodeId, name: &str, perm: u32) -> InodeId {
    let req = create_req(parent, name, perm, OpenAccess::ReadWrite);
    let o = ns.handle(req, at(uid, 1)).unwrap();
    ns.release(o.session, None).unwrap();
    o.attr.ino
}

fn mkdir_req(parent: InodeId, name: &str) -> fs::Mkdir {
    fs::Mkdir {
        parent,
        name: name.into(),
        perm: 0o755,
    }
}

fn symlink_req(parent: InodeId, name: &str) -> fs::Symlink {
    fs::Symlink {
        parent,
        name: name.into(),
        target: b"t".to_vec(),
    }
}

fn link_req(ino: InodeId, new_parent: InodeId, name: &str, kernel_checked: bool) -> fs::Link {
    fs::Link {
        ino,
        new_parent,
        new_name: name.into(),
        kernel_checked,
    }
}

const EACCES: Option<ErrorCode> = Some(ErrorCode::PermissionDenied);
const EPERM: Option<ErrorCode> = Some(ErrorCode::NotPermitted);

fn names_need_search_and_write_on_the_directory(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let private = mkdir(ns, 0, ROOT, "private", 0o700);
    let open = mkdir(ns, 0, ROOT, "open", 0o755);
    let lookup = |parent, name: &str| fs::Lookup {
        parent,
        name: name.into(),
    };
    assert_eq!(as_user(ns, ALICE, lookup(private, "x")), EACCES);
    assert_eq!(
        as_user(ns, ALICE, lookup(open, "x")),
        Some(ErrorCode::NotFound)
    );
    let listing = |ino| fs::ReadDir {
        ino,
        after: None,
        max_entries: 10,
        plus: false,
    };
    assert_eq!(as_user(ns, ALICE, listing(private)), EACCES);
    assert_eq!(as_user(ns, ALICE, listing(open)), None);
    let sub = mkdir_req(open, "d");
    assert_eq!(as_user(ns, ALICE, sub.clone()), EACCES);
    let new = create_req(open, "f", 0o644, OpenAccess::Write);
    assert_eq!(as_user(ns, ALICE, new), EACCES);
    assert_eq!(as_user(ns, ALICE, symlink_req(open, "l")), EACCES);
    // A malformed name is refused before any permission check, as a path walk does.
    let bad = mkdir_req(open, "a/b");
    assert_eq!(as_user(ns, ALICE, bad), Some(ErrorCode::InvalidArgument));
    assert_eq!(as_user(ns, 0, sub.clone()), None);
    // An existing name is EEXIST before the write check (Linux's order; `mkdir -p` of
    // an existing directory relies on it), but not before the search check.
    let exists = Some(ErrorCode::AlreadyExists);
    assert_eq!(as_user(ns, ALICE, sub), exists);
    assert_eq!(as_user(ns, ALICE, symlink_req(open, "d")), exists);
    // Before the device rule (EPERM for a non-root device node) and the hard-link rule
    // too, as Linux's `filename_create` comes first.
    let device = fs::MkNod {
        parent: open,
        name: b"d".to_vec(),
        kind: proto::FileKind::CharDevice,
        perm: 0o644,
        rdev: 0,
    };
    assert_eq!(as_user(ns, ALICE, device), exists);
    let secret = file(ns, 0, ROOT, "secret", 0o600);
    assert_eq!(
        as_user(ns, ALICE, link_req(secret, open, "d", false)),
        exists
    );
    mkdir(ns, 0, private, "inner", 0o755);
    assert_eq!(as_user(ns, ALICE, mkdir_req(private, "inner")), EACCES);
}

fn opens_are_checked_against_the_mode(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let dir = mkdir(ns, 0, ROOT, "d", 0o777);
    let ro = file(ns, 0, dir, "ro", 0o644);
    let exec_only = file(ns, 0, dir, "prog", 0o711);
    let open = |ino, access| fs::Open {
        ino,
        client: ClientId(1),
        truncate: false,
        access,
        append: false,
    };
    assert_eq!(as_user(ns, ALICE, open(ro, OpenAccess::Read)), None);
    assert_eq!(as_user(ns, ALICE, open(ro, OpenAccess::Write)), EACCES);
    assert_eq!(as_user(ns, ALICE, open(ro, OpenAccess::ReadWrite)), EACCES);
    assert_eq!(as_user(ns, ALICE, open(exec_only, OpenAccess::Exec)), None);
    // A directory opens for reading only, even by root in a 0777 one: a writable open
    // got a writable grant for chunks of no file.
    let eisdir = Some(ErrorCode::IsADirectory);
    assert_eq!(as_user(ns, 0, open(dir, OpenAccess::Write)), eisdir);
    assert_eq!(as_user(ns, 0, open(dir, OpenAccess::ReadWrite)), eisdir);
    assert_eq!(as_user(ns, 0, open(dir, OpenAccess::Read)), None);
    assert_eq!(
        as_user(ns, ALICE, open(exec_only, OpenAccess::Read)),
        EACCES
    );
    let trunc = fs::Open {
        truncate: true,
        ..open(ro, OpenAccess::Read)
    };
    assert_eq!(as_user(ns, ALICE, trunc), EACCES);
    // A create that finds the file opens it: checked as an open.
    let again = create_req(dir, "ro", 0o666, OpenAccess::Write);
    assert_eq!(as_user(ns, ALICE, again), EACCES);
    let again = create_req(dir, "ro", 0o666, OpenAccess::Read);
    assert_eq!(as_user(ns, ALICE, again), None);
    // A new file is opened whatever its mode, as open(O_CREAT) does.
    let fresh = create_req(dir, "mine", 0o444, OpenAccess::ReadWrite);
    assert_eq!(as_user(ns, ALICE, fresh), None);
}

fn truncation_and_commits_go_through_a_write_session(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let d = mkdir(ns, 0, ROOT, "d", 0o777);
    let f = file(ns, ALICE, d, "f", 0o644);
    let cut = || fs::SetAttr {
        ino: f,
        set: SetAttr {
            size: Some(0),
            ..SetAttr::default()
        },
        commit: None,
    };
    let commit = || fs::Commit {
        ino: f,
        commit: proto::meta::Commit::length(9, proto::Timestamp::now()),
    };
    assert_eq!(as_user(ns, BOB, cut()), EACCES);
    assert_eq!(as_user(ns, BOB, commit()), EACCES);
    // Alice opens it for writing on connection 2, then makes it read-only: her
    // descriptor still truncates and commits (ftruncate, close), Bob's connection not.
    let req = fs::Open {
        ino: f,
        client: ClientId(1),
        truncate: false,
        access: OpenAccess::Write,
        append: false,
    };
    ns.handle(req, at(ALICE, 2)).unwrap();
    let chmod = fs::SetAttr {
        ino: f,
        set: SetAttr {
            perm: Some(0o444),
            ..SetAttr::default()
        },
        commit: None,
    };
    ns.handle(chmod, at(ALICE, 2)).unwrap();
    assert!(ns.handle(cut(), at(ALICE, 2)).is_ok());
    assert!(ns.handle(commit(), at(ALICE, 2)).is_ok());
    assert_eq!(as_user(ns, ALICE, cut()), EACCES, "another connection");
}

fn removal_and_rename_follow_the_sticky_rule(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let tmp = mkdir(ns, 0, ROOT, "tmp", 0o1777);
    file(ns, ALICE, tmp, "a", 0o644);
    let unlink = |name: &str| fs::Unlink {
        parent: tmp,
        name: name.into(),
    };
    let rename = |name: &str, to: &str| fs::Rename {
        parent: tmp,
        name: name.into(),
        new_parent: tmp,
        new_name: to.into(),
        mode: RenameMode::Replace,
    };
    assert_eq!(as_user(ns, BOB, unlink("a")), EPERM);
    assert_eq!(as_user(ns, BOB, rename("a", "b")), EPERM);
    // Replacing another user's name is removing it.
    file(ns, BOB, tmp, "mine", 0o644);
    assert_eq!(as_user(ns, BOB, rename("mine", "a")), EPERM);
    assert_eq!(
        as_user(ns, BOB, unlink("missing")),
        Some(ErrorCode::NotFound)
    );
    // A directory moved to another parent needs write on itself (its `..`).
    let theirs = mkdir(ns, ALICE, tmp, "theirs", 0o755);
    let other = mkdir(ns, 0, ROOT, "other", 0o777);
    let away = fs::Rename {
        parent: other,
        name: b"x".to_vec(),
        new_parent: other,
        new_name: b"y".to_vec(),
        mode: RenameMode::Replace,
    };
    mkdir(ns, BOB, other, "x", 0o555);
    assert_eq!(
        as_user(ns, BOB, away),
        None,
        "same parent: no write on itself"
    );
    let moved = fs::Rename {
        parent: other,
        name: b"y".to_vec(),
        new_parent: theirs,
        new_name: b"y".to_vec(),
        mode: RenameMode::Replace,
    };
    assert_eq!(as_user(ns, ALICE, moved), EACCES);
    assert_eq!(as_user(ns, ALICE, unlink("a")), None);
}

/// Guards against a hard link to another user's unreadable file being refused where the
/// caller's kernel allowed it (`fs.protected_hardlinks = 0`, xfstests generic/597), and
/// against the library's links (no kernel in between) losing the rule: the server
/// applies it only when the kernel did not.
fn hard_links_to_others_files_follow_the_kernels_rule_or_the_servers(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let tmp = mkdir(ns, 0, ROOT, "tmp", 0o1777);
    let theirs = file(ns, ALICE, tmp, "theirs", 0o600);
    let link = |name: &str, kernel_checked| fs::Link {
        ino: theirs,
        new_parent: tmp,
        new_name: name.into(),
        kernel_checked,
    };
    assert_eq!(as_user(ns, BOB, link("by-library", false)), EPERM);
    assert_eq!(as_user(ns, BOB, link("by-mount", true)), None);
    // The directory's own permissions hold either way.
    let closed = mkdir(ns, 0, ROOT, "closed", 0o755);
    assert_eq!(
        as_user(ns, BOB, link_req(theirs, closed, "x", true)),
        EACCES
    );
}

fn attributes_and_xattrs_follow_their_owners(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let d = mkdir(ns, 0, ROOT, "d", 0o777);
    let f = file(ns, ALICE, d, "f", 0o600);
    let set = |set| fs::SetAttr {
        ino: f,
        set,
        commit: None,
    };
    let chown = SetAttr {
        uid: Some(BOB),
        ..SetAttr::default()
    };
    assert_eq!(as_user(ns, ALICE, set(chown.clone())), EPERM);
    assert_eq!(as_user(ns, 0, set(chown)), None);
    // A chmod by the owner outside the file's group drops setgid.
    let chmod = SetAttr {
        perm: Some(0o2755),
        ..SetAttr::default()
    };
    let a = ns.handle(set(chmod), at(BOB, 1)).unwrap();
    assert_eq!(a.perm, 0o755);
    let xattr = |name: &str| fs::SetXattr {
        ino: f,
        name: name.into(),
        value: b"v".to_vec(),
        mode: XattrMode::Upsert,
    };
    assert_eq!(as_user(ns, BOB, xattr("trusted.t")), EPERM);
    assert_eq!(as_user(ns, BOB, xattr("security.s")), EPERM);
    assert_eq!(as_user(ns, BOB, xattr("user.u")), None);
    assert_eq!(as_user(ns, ALICE, xattr("user.u")), EACCES);
    assert_eq!(as_user(ns, 0, xattr("trusted.t")), None);
    let get = |name: &str| fs::GetXattr {
        ino: f,
        name: name.into(),
    };
    assert_eq!(
        as_user(ns, ALICE, get("user.u")),
        None,
        "others may read (0o755)"
    );
    let private = SetAttr {
        perm: Some(0o600),
        ..SetAttr::default()
    };
    ns.handle(set(private), at(BOB, 1)).unwrap();
    assert_eq!(as_user(ns, ALICE, get("user.u")), EACCES);
    assert_eq!(
        as_user(ns, ALICE, get("trusted.t")),
        Some(ErrorCode::NoData)
    );
    let list = |uid| ns.handle(fs::ListXattr { ino: f }, at(uid, 1)).unwrap();
    assert_eq!(list(ALICE), vec![b"user.u".to_vec()], "trusted.* hidden");
    assert_eq!(list(0).len(), 2);
}

/// A setattr (and an xattr change, and a hard link's rule) is checked on the record it
/// changes, under the lock: a chown landing while the request waits (here: ALICE's
/// chmod, asked while the file was hers, comes after it was given to BOB) is not
/// missed, and a chown's mode drops are decided on that record too; a truncation
/// through a writable session still goes on after a chmod 000 landed in between.
fn setattr_and_xattr_changes_are_checked_on_the_record_they_change(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let d = mkdir(ns, 0, ROOT, "d", 0o777);
    let f = file(ns, ALICE, d, "f", 0o6755);
    let alice = Caller::new(ALICE, ALICE);
    let chmod = SetAttr {
        perm: Some(0o777),
        ..SetAttr::default()
    };
    let to_bob = SetAttr {
        uid: Some(BOB),
        ..SetAttr::default()
    };
    ns.handle(
        fs::SetAttr {
            ino: f,
            set: to_bob,
            commit: None,
        },
        at(0, 1),
    )
    .unwrap();
    let late = ns.commit_and_setattr_as(f, None, &chmod, Some((&alice, ConnId(1))));
    assert_eq!(late.unwrap_err().code(), ErrorCode::NotPermitted);
    let a = ns.getattr(f).unwrap();
    // The chown (root's, with no mode) dropped setuid and the group-exec setgid.
    assert_eq!((a.uid, a.perm), (BOB, 0o755));
    // The same for extended attributes: ALICE could write the file's user.* when she
    // asked; the file is BOB's and 0o755 when her change comes.
    let g = file(ns, ALICE, d, "g", 0o666);
    let bob = Caller::new(BOB, BOB);
    ns.may_xattr(&bob, g, b"user.x", XattrAccess::Write)
        .unwrap();
    let private = SetAttr {
        perm: Some(0o644),
        ..SetAttr::default()
    };
    ns.commit_and_setattr(g, None, &private).unwrap();
    let late = ns.setxattr_as(g, (b"user.x", b"v"), XattrMode::Upsert, Some(&bob));
    assert_eq!(late.unwrap_err().code(), ErrorCode::PermissionDenied);
    ns.setxattr(g, b"user.y", b"v", XattrMode::Upsert).unwrap();
    let late = ns.removexattr_as(g, b"user.y", Some(&bob));
    assert_eq!(late.unwrap_err().code(), ErrorCode::PermissionDenied);
    // A hard link to another's file (the server's rule: read and write needed) after
    // the file became private.
    let l = file(ns, ALICE, d, "l", 0o666);
    ns.may_link(&bob, l, (d, b"l2"), false).unwrap();
    ns.commit_and_setattr(l, None, &private).unwrap();
    let late = ns.link_as(l, (d, b"l2"), Some(&bob));
    assert_eq!(late.unwrap_err().code(), ErrorCode::NotPermitted);
    // ftruncate on a descriptor opened for writing needs no write bit, then or later.
    let open = ns
        .handle(
            create_req(d, "w", 0o644, OpenAccess::ReadWrite),
            at(ALICE, 1),
        )
        .unwrap();
    let w = open.attr.ino;
    let cut = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    let none = SetAttr {
        perm: Some(0),
        ..SetAttr::default()
    };
    ns.commit_and_setattr(w, None, &none).unwrap();
    ns.commit_and_setattr_as(w, None, &cut, Some((&alice, ConnId(1))))
        .unwrap();
    // Another connection of the same user holds no session: refused.
    let other = ns.commit_and_setattr_as(w, None, &cut, Some((&alice, ConnId(2))));
    assert_eq!(other.unwrap_err().code(), ErrorCode::PermissionDenied);
    ns.release(open.session, None).unwrap();
}

fn a_new_file_in_a_setgid_directory_of_a_foreign_group_loses_setgid(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let shared = mkdir(ns, 0, ROOT, "shared", 0o2777);
    let req = create_req(shared, "prog", 0o2755, OpenAccess::ReadWrite);
    let o = ns.handle(req, at(ALICE, 1)).unwrap();
    assert_eq!((o.attr.gid, o.attr.perm), (0, 0o755));
    let req = create_req(shared, "rootprog", 0o2755, OpenAccess::ReadWrite);
    let o = ns.handle(req, at(0, 1)).unwrap();
    assert_eq!(o.attr.perm, 0o2755, "root keeps it");
}

/// Guards against a wire client ending (and committing a length through) another
/// connection's session by guessing its id, or locking a file it has not open.
fn sessions_and_locks_belong_to_their_connection(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let f = file(ns, 0, ROOT, "f", 0o666);
    let open = fs::Open {
        ino: f,
        client: ClientId(1),
        truncate: false,
        access: OpenAccess::Read,
        append: false,
    };
    let s = ns.handle(open, at(ALICE, 2)).unwrap().session;
    let release = fs::Release {
        session: s,
        commit: Some(proto::meta::Commit::length(
            1 << 40,
            proto::Timestamp::now(),
        )),
    };
    assert_eq!(as_user(ns, 0, release.clone()), Some(ErrorCode::Stale));
    let many = fs::ReleaseMany { sessions: vec![s] };
    assert_eq!(as_user(ns, 0, many), None, "skipped");
    assert_eq!(ns.getattr(f).unwrap().size, 0);
    let lock = |kind| fs::SetLock {
        ino: f,
        client: ClientId(1),
        lock: proto::meta::LockSpec {
            owner: 1,
            pid: 1,
            start: 0,
            end: u64::MAX,
            kind,
        },
        reclaim: false,
        waits: false,
    };
    use proto::meta::LockKind;
    assert_eq!(
        as_user(ns, 0, lock(LockKind::Write)),
        Some(ErrorCode::Stale)
    );
    assert_eq!(as_user(ns, 0, lock(LockKind::Unlock)), None);
    assert!(ns.handle(lock(LockKind::Read), at(ALICE, 2)).is_ok());
    // Its own connection ends it, but a read session carries no length commit for
    // a caller who may not write the file.
    let ro = fs::SetAttr {
        ino: f,
        set: SetAttr {
            perm: Some(0o644),
            ..SetAttr::default()
        },
        commit: None,
    };
    ns.handle(ro, at(0, 1)).unwrap();
    let r = ns.handle(release, at(ALICE, 2)).err().map(|e| e.code);
    assert_eq!(r, EACCES);
    let own = fs::Release {
        session: s,
        commit: None,
    };
    assert!(ns.handle(own, at(ALICE, 2)).is_ok());
    assert_eq!(ns.getattr(f).unwrap().size, 0);
}

/// `OpenAt` is a lookup and an open in one: both checks apply (search on the directory,
/// the open against the file's mode); what is not a regular file is only looked up;
/// with `accessed`, the access time moves as `Accessed` moves it.
fn an_open_by_name_checks_the_lookup_and_the_open(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let private = mkdir(ns, 0, ROOT, "private", 0o700);
    let dir = mkdir(ns, 0, ROOT, "d", 0o755);
    let ro = file(ns, 0, dir, "ro", 0o644);
    file(ns, 0, private, "hidden", 0o644);
    let link = fs::Symlink {
        parent: dir,
        name: "link".into(),
        target: b"ro".to_vec(),
    };
    ns.handle(link, at(0, 1)).unwrap();
    let open_at = |parent, name: &str, access, accessed| fs::OpenAt {
        parent,
        name: name.into(),
        client: ClientId(1),
        access,
        append: false,
        accessed,
    };
    let read = OpenAccess::Read;
    assert_eq!(
        as_user(ns, ALICE, open_at(private, "hidden", read, None)),
        EACCES
    );
    assert_eq!(
        as_user(ns, ALICE, open_at(dir, "none", read, None)),
        Some(ErrorCode::NotFound)
    );
    assert_eq!(
        as_user(ns, ALICE, open_at(dir, "ro", OpenAccess::Write, None)),
        EACCES
    );
    // A directory, a symbolic link: found, not opened (no session to end).
    for (parent, name, kind) in [
        (ROOT, "d", proto::FileKind::Directory),
        (dir, "link", proto::FileKind::Symlink),
    ] {
        match ns
            .handle(open_at(parent, name, read, Some(false)), at(ALICE, 1))
            .unwrap()
        {
            fs::OpenedAt::Found(a) => assert_eq!(a.kind, kind, "{name}"),
            fs::OpenedAt::Opened(o) => panic!("{name} was opened: {o:?}"),
        }
    }
    // The file was just written (its atime is not after its mtime): relatime moves it.
    let before = ns.getattr(ro).unwrap();
    let o = match ns
        .handle(open_at(dir, "ro", read, Some(false)), at(ALICE, 1))
        .unwrap()
    {
        fs::OpenedAt::Opened(o) => o,
        fs::OpenedAt::Found(a) => panic!("a regular file was not opened: {a:?}"),
    };
    assert_eq!(o.attr.ino, ro);
    assert!(
        o.attr.atime > before.atime,
        "the reply carries the moved atime"
    );
    assert_eq!(ns.getattr(ro).unwrap().atime, o.attr.atime);
    ns.release(o.session, None).unwrap();
    // Read again at once: relatime leaves it; without `accessed` nothing moves either.
    for accessed in [Some(false), None] {
        let fs::OpenedAt::Opened(again) = ns
            .handle(open_at(dir, "ro", read, accessed), at(ALICE, 1))
            .unwrap()
        else {
            panic!("not opened");
        };
        assert_eq!(again.attr.atime, o.attr.atime, "{accessed:?}");
        ns.release(again.session, None).unwrap();
    }
}

engine_tests!(
    an_open_by_name_checks_the_lookup_and_the_open,
    sessions_and_locks_belong_to_their_connection,
    names_need_search_and_write_on_the_directory,
    opens_are_checked_against_the_mode,
    truncation_and_commits_go_through_a_write_session,
    removal_and_rename_follow_the_sticky_rule,
    hard_links_to_others_files_follow_the_kernels_rule_or_the_servers,
    attributes_and_xattrs_follow_their_owners,
    a_new_file_in_a_setgid_directory_of_a_foreign_group_loses_setgid,
    setattr_and_xattr_changes_are_checked_on_the_record_they_change,
);
