//! Attribute flags (`chattr +i`, `+a`) through `Namespace::handle`: what each refuses,
//! to root as to the owner, who may set them, and how they are kept (an attribute no
//! listing shows, counted as the others are, gone with its inode).

use super::{engine_tests, H, ROOT};
use crate::kv::StoreKind;
use crate::namespace::{ConnId, Namespace, Origin};
use proto::meta::{fs, Caller, OpenAccess, RenameMode, XattrMode};
use proto::{ClientId, ErrorCode, InodeFlags, InodeId, SetAttr, TimeSet};

const ALICE: u32 = 1000;
const EPERM: Option<ErrorCode> = Some(ErrorCode::NotPermitted);
const IMMUTABLE: InodeFlags = InodeFlags {
    immutable: true,
    append: false,
};
const APPEND: InodeFlags = InodeFlags {
    immutable: false,
    append: true,
};

fn at(uid: u32) -> Origin {
    Origin {
        conn: ConnId(1),
        caller: Caller::new(uid, uid),
        who: None,
        op: None,
    }
}

/// The code `req` fails with as `uid`, or `None` if it succeeds.
fn as_user<R: crate::namespace::Handle>(ns: &Namespace, uid: u32, req: R) -> Option<ErrorCode> {
    ns.handle(req, at(uid)).err().map(|e| e.code)
}

/// A file of `uid` in `parent`, created and closed.
fn file(ns: &Namespace, uid: u32, parent: InodeId, name: &str) -> InodeId {
    let req = fs::Create {
        parent,
        name: name.into(),
        perm: 0o644,
        exclusive: true,
        access: OpenAccess::ReadWrite,
        append: false,
        client: ClientId(1),
    };
    let o = ns.handle(req, at(uid)).unwrap();
    ns.release(o.session, None).unwrap();
    o.attr.ino
}

/// A directory everyone may write in, made by root (the root directory is 0755).
fn mkdir(ns: &Namespace, parent: InodeId, name: &str) -> InodeId {
    let req = fs::Mkdir {
        parent,
        name: name.into(),
        perm: 0o777,
    };
    ns.handle(req, at(0)).unwrap().attr.ino
}

fn set(ino: InodeId, flags: InodeFlags) -> fs::SetFlags {
    fs::SetFlags { ino, flags }
}

fn open(ino: InodeId, access: OpenAccess, append: bool) -> fs::Open {
    fs::Open {
        ino,
        client: ClientId(1),
        truncate: false,
        access,
        append,
    }
}

fn unlink(parent: InodeId, name: &str) -> fs::Unlink {
    fs::Unlink {
        parent,
        name: name.into(),
    }
}

fn setattr(ino: InodeId, set: SetAttr) -> fs::SetAttr {
    fs::SetAttr {
        ino,
        set,
        commit: None,
    }
}

fn xattr(ino: InodeId) -> fs::SetXattr {
    fs::SetXattr {
        ino,
        name: b"user.a".to_vec(),
        value: b"1".to_vec(),
        mode: XattrMode::Upsert,
    }
}

/// Guards against an immutable inode changed through any request, by root as by its
/// owner (the kernel does not know the flags: the server is the only check).
fn an_immutable_file_takes_no_change_from_anyone(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let top = mkdir(ns, ROOT, "top");
    let f = file(ns, ALICE, top, "f");
    assert_eq!(as_user(ns, 0, set(f, IMMUTABLE)), None);
    assert_eq!(
        ns.handle(fs::GetFlags { ino: f }, at(ALICE)).unwrap(),
        IMMUTABLE
    );
    for uid in [0, ALICE] {
        assert_eq!(as_user(ns, uid, open(f, OpenAccess::Write, false)), EPERM);
        assert_eq!(
            as_user(ns, uid, open(f, OpenAccess::ReadWrite, true)),
            EPERM
        );
        assert_eq!(as_user(ns, uid, open(f, OpenAccess::Read, false)), None);
        assert_eq!(as_user(ns, uid, unlink(top, "f")), EPERM);
        let chmod = SetAttr {
            perm: Some(0o600),
            ..SetAttr::default()
        };
        assert_eq!(as_user(ns, uid, setattr(f, chmod)), EPERM);
        let now = SetAttr {
            mtime: Some(TimeSet::Now),
            ..SetAttr::default()
        };
        assert_eq!(as_user(ns, uid, setattr(f, now)), EPERM);
        assert_eq!(as_user(ns, uid, xattr(f)), EPERM);
        let link = fs::Link {
            ino: f,
            new_parent: top,
            new_name: b"l".to_vec(),
            // The kernel's own rule does not cover the flags: checked anyway.
            kernel_checked: true,
        };
        assert_eq!(as_user(ns, uid, link), EPERM);
        let rename = fs::Rename {
            parent: top,
            name: b"f".to_vec(),
            new_parent: top,
            new_name: b"g".to_vec(),
            mode: RenameMode::Replace,
        };
        assert_eq!(as_user(ns, uid, rename), EPERM);
    }
    // Nor is it replaced by a rename onto its name.
    file(ns, 0, top, "other");
    let onto = fs::Rename {
        parent: top,
        name: b"other".to_vec(),
        new_parent: top,
        new_name: b"f".to_vec(),
        mode: RenameMode::Replace,
    };
    assert_eq!(as_user(ns, 0, onto), EPERM);
    // An immutable directory takes no new or removed name.
    let d = mkdir(ns, top, "d");
    file(ns, ALICE, d, "in");
    assert_eq!(as_user(ns, 0, set(d, IMMUTABLE)), None);
    let create = fs::Create {
        parent: d,
        name: b"new".to_vec(),
        perm: 0o644,
        exclusive: true,
        access: OpenAccess::ReadWrite,
        append: false,
        client: ClientId(1),
    };
    assert_eq!(as_user(ns, 0, create), EPERM);
    assert_eq!(as_user(ns, 0, unlink(d, "in")), EPERM);
    // Cleared by root, everything goes again.
    assert_eq!(as_user(ns, 0, set(f, InodeFlags::default())), None);
    assert_eq!(as_user(ns, 0, set(d, InodeFlags::default())), None);
    assert_eq!(as_user(ns, ALICE, unlink(top, "f")), None);
    assert_eq!(as_user(ns, ALICE, unlink(d, "in")), None);
}

/// Guards against an append-only file or directory losing what it holds: writes only
/// with `O_APPEND`, no truncation, chmod, explicit times or removal; new names only.
fn an_append_only_file_grows_only_at_its_end(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let top = mkdir(ns, ROOT, "top");
    let f = file(ns, ALICE, top, "log");
    assert_eq!(as_user(ns, 0, set(f, APPEND)), None);
    assert_eq!(as_user(ns, ALICE, open(f, OpenAccess::Write, false)), EPERM);
    let o = ns
        .handle(open(f, OpenAccess::Write, true), at(ALICE))
        .unwrap();
    ns.release(o.session, None).unwrap();
    let trunc = fs::Open {
        truncate: true,
        ..open(f, OpenAccess::Write, true)
    };
    assert_eq!(as_user(ns, ALICE, trunc), EPERM);
    let size = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    assert_eq!(as_user(ns, 0, setattr(f, size)), EPERM);
    let explicit = SetAttr {
        mtime: Some(TimeSet::At(proto::Timestamp { secs: 1, nanos: 0 })),
        ..SetAttr::default()
    };
    assert_eq!(as_user(ns, 0, setattr(f, explicit)), EPERM);
    let now = SetAttr {
        mtime: Some(TimeSet::Now),
        ..SetAttr::default()
    };
    assert_eq!(as_user(ns, ALICE, setattr(f, now)), None, "touch");
    assert_eq!(as_user(ns, 0, unlink(top, "log")), EPERM);
    assert_eq!(as_user(ns, 0, xattr(f)), EPERM);
    // In an append-only directory names are added, never removed.
    let d = mkdir(ns, top, "d");
    assert_eq!(as_user(ns, 0, set(d, APPEND)), None);
    file(ns, ALICE, d, "added");
    assert_eq!(as_user(ns, 0, unlink(d, "added")), EPERM);
}

/// Guards against a user setting or clearing a flag (`CAP_LINUX_IMMUTABLE` is root's)
/// and against flags on what the kernel never asks about.
fn only_root_sets_and_clears_them(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let top = mkdir(ns, ROOT, "top");
    let f = file(ns, ALICE, top, "f");
    let bob = ALICE + 1;
    // The owner may ask for what is there already; another user nothing.
    assert_eq!(as_user(ns, ALICE, set(f, InodeFlags::default())), None);
    assert_eq!(as_user(ns, bob, set(f, InodeFlags::default())), EPERM);
    assert_eq!(as_user(ns, ALICE, set(f, IMMUTABLE)), EPERM);
    assert_eq!(as_user(ns, ALICE, set(f, APPEND)), EPERM);
    assert_eq!(as_user(ns, 0, set(f, IMMUTABLE)), None);
    assert_eq!(as_user(ns, ALICE, set(f, InodeFlags::default())), EPERM);
    // While it stays immutable nothing else changes (ext4's rule).
    let both = InodeFlags {
        immutable: true,
        append: true,
    };
    assert_eq!(as_user(ns, 0, set(f, both)), EPERM);
    assert_eq!(
        as_user(ns, 0, set(f, APPEND)),
        None,
        "root clears i, sets a"
    );
    let symlink = fs::Symlink {
        parent: top,
        name: b"s".to_vec(),
        target: b"f".to_vec(),
    };
    let s = ns.handle(symlink, at(0)).unwrap().attr.ino;
    assert_eq!(
        as_user(ns, 0, set(s, IMMUTABLE)),
        Some(ErrorCode::NotSupported)
    );
}

/// Guards against the flags' attribute showing in listings, upsetting the count `fsck`
/// checks, or staying behind its inode.
fn flags_are_a_hidden_attribute_that_goes_with_its_inode(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let top = mkdir(ns, ROOT, "top");
    let f = file(ns, ALICE, top, "f");
    let before = ns.getattr(f).unwrap();
    ns.handle(set(f, APPEND), at(0)).unwrap();
    let after = ns.getattr(f).unwrap();
    assert!(after.ctime > before.ctime, "chattr moves the change time");
    assert_eq!(after.xattr_count, 1, "counted, so a client asks the server");
    assert!(ns.listxattr(f).unwrap().is_empty(), "but never listed");
    assert!(ns.check_namespace().unwrap().is_empty(), "and fsck agrees");
    // A user attribute beside it is listed alone; clearing the flags keeps it.
    ns.handle(set(f, InodeFlags::default()), at(0)).unwrap();
    ns.handle(xattr(f), at(ALICE)).unwrap();
    ns.handle(set(f, APPEND), at(0)).unwrap();
    assert_eq!(ns.listxattr(f).unwrap(), vec![b"user.a".to_vec()]);
    ns.handle(set(f, InodeFlags::default()), at(0)).unwrap();
    assert_eq!(ns.getattr(f).unwrap().xattr_count, 1);
    assert_eq!(ns.getflags(f).unwrap(), InodeFlags::default());
    // An unnamed file (`O_TMPFILE`) flagged while open goes at its last close with the
    // flags' attribute: nothing stays behind.
    let tmp = fs::TmpFile {
        parent: top,
        perm: 0o600,
        linkable: false,
        access: OpenAccess::ReadWrite,
        client: ClientId(1),
    };
    let o = ns.handle(tmp, at(0)).unwrap();
    ns.handle(set(o.attr.ino, IMMUTABLE), at(0)).unwrap();
    ns.release(o.session, None).unwrap();
    assert_eq!(
        ns.getattr(o.attr.ino).err().map(|e| e.code()),
        Some(ErrorCode::NotFound)
    );
    assert!(ns.check_namespace().unwrap().is_empty());
}

/// Guards against a flagged file's length or times moved around the setattr rules: a
/// commit needs a session opened for writing (made before the flag), which a read
/// session's release on the same connection may carry; and against a setuid the
/// kernel clears before a write refused.
fn commits_need_an_earlier_write_session(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let top = mkdir(ns, ROOT, "top");
    let f = file(ns, ALICE, top, "f");
    let writer = ns
        .handle(open(f, OpenAccess::Write, true), at(ALICE))
        .unwrap();
    assert_eq!(as_user(ns, 0, set(f, APPEND)), None);
    let commit = |len| fs::Commit {
        ino: f,
        commit: proto::meta::Commit::length(len, proto::Timestamp { secs: 1, nanos: 0 }),
    };
    // Through the session opened before the flag (connection 1): still committed.
    assert_eq!(as_user(ns, ALICE, commit(10)), None);
    // A read session's release carries the file's commit too (the client sends it with
    // whichever handle closes), beside the connection's write session.
    let reader = ns
        .handle(open(f, OpenAccess::Read, false), at(ALICE))
        .unwrap();
    let release = fs::Release {
        session: reader.session,
        commit: Some(proto::meta::Commit::length(
            10,
            proto::Timestamp { secs: 1, nanos: 0 },
        )),
    };
    assert_eq!(as_user(ns, ALICE, release), None);
    // Without one, as a writer with permission: refused.
    let other = Origin {
        conn: ConnId(2),
        ..at(ALICE)
    };
    let refused = ns.handle(commit(20), other).err().map(|e| e.code);
    assert_eq!(refused, EPERM);
    ns.release(writer.session, None).unwrap();
    assert_eq!(ns.getattr(f).unwrap().size, 10);
    // A writer clearing setuid before its write (the kernel's `file_remove_privs`).
    ns.handle(set(f, InodeFlags::default()), at(0)).unwrap();
    let suid = SetAttr {
        perm: Some(0o4755),
        ..SetAttr::default()
    };
    ns.handle(setattr(f, suid), at(ALICE)).unwrap();
    ns.handle(set(f, APPEND), at(0)).unwrap();
    let kill = SetAttr {
        perm: Some(0o755),
        ..SetAttr::default()
    };
    assert_eq!(as_user(ns, ALICE, setattr(f, kill)), None);
    // A chmod that changes nothing is a chmod, not the kernel's clearing.
    let same = SetAttr {
        perm: Some(0o755),
        ..SetAttr::default()
    };
    assert_eq!(as_user(ns, ALICE, setattr(f, same)), EPERM);
    let more = SetAttr {
        perm: Some(0o777),
        ..SetAttr::default()
    };
    assert_eq!(as_user(ns, ALICE, setattr(f, more)), EPERM);
    // Two links made before the flag.
    ns.handle(set(f, InodeFlags::default()), at(0)).unwrap();
    let link = fs::Link {
        ino: f,
        new_parent: top,
        new_name: b"g".to_vec(),
        kernel_checked: false,
    };
    ns.handle(link, at(ALICE)).unwrap();
    ns.handle(set(f, IMMUTABLE), at(0)).unwrap();
    let rename = fs::Rename {
        parent: top,
        name: b"f".to_vec(),
        new_parent: top,
        new_name: b"g".to_vec(),
        mode: RenameMode::Replace,
    };
    // Linux answers 0 (`vfs_rename`, before any rule): through a mount the kernel
    // does, and never asks; the server asked directly applies the rules.
    assert_eq!(as_user(ns, ALICE, rename), EPERM);
    assert_eq!(ns.getattr(f).unwrap().nlink, 2, "nothing happened");
}

engine_tests!(
    an_immutable_file_takes_no_change_from_anyone,
    an_append_only_file_grows_only_at_its_end,
    only_root_sets_and_clears_them,
    flags_are_a_hidden_attribute_that_goes_with_its_inode,
    commits_need_an_earlier_write_session,
);
