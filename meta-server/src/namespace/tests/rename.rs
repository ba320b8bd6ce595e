//! Rename in every mode, over every kind of target.

use super::{caller, code, engine_tests, list, mkdir, owner, touch, walk, written, H, ROOT};
use crate::kv::StoreKind;
use crate::namespace::keys;
use proto::meta::{GcTask, RenameMode};
use proto::{ErrorCode, FileKind, InodeId, NodeId};

const R: RenameMode = RenameMode::Replace;

fn rename_moves_between_directories(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let a = mkdir(ns, ROOT, "a");
    let b = mkdir(ns, ROOT, "b");
    let f = touch(ns, a.ino, "f");
    let before = ns.getattr(a.ino).unwrap();
    ns.rename(a.ino, b"f", b.ino, b"g", R).unwrap();
    assert_eq!(code(ns.lookup(a.ino, b"f")), ErrorCode::NotFound);
    let g = ns.lookup(b.ino, b"g").unwrap();
    assert_eq!((g.ino, g.nlink), (f.ino, 1));
    assert!(g.ctime >= f.ctime);
    assert!(ns.getattr(a.ino).unwrap().mtime >= before.mtime);
    // A directory takes its `..` link along and gets a new parent pointer.
    let d = mkdir(ns, a.ino, "d");
    assert_eq!(ns.getattr(a.ino).unwrap().nlink, 3);
    ns.rename(a.ino, b"d", b.ino, b"d", RenameMode::NoReplace)
        .unwrap();
    assert_eq!(ns.getattr(a.ino).unwrap().nlink, 2);
    assert_eq!(ns.getattr(b.ino).unwrap().nlink, 3);
    assert_eq!(ns.getattr(d.ino).unwrap().nlink, 2);
    // The parent pointer moved: moving b into d (its child now) is refused.
    assert_eq!(
        code(ns.rename(ROOT, b"b", d.ino, b"b", R)),
        ErrorCode::InvalidArgument
    );
    ns.rename(ROOT, b"a", d.ino, b"a", R).unwrap();
    assert_eq!(ns.getattr(ROOT).unwrap().nlink, 3);
}

fn rename_over_existing_file(kind: StoreKind) {
    let h = H::with_nodes(kind, 2);
    let ns = h.ns();
    let old = touch(ns, ROOT, "ckpt");
    written(ns, old.ino, 4096);
    let new = touch(ns, ROOT, "ckpt.tmp");
    let files = ns.statfs().unwrap().files;
    ns.rename(ROOT, b"ckpt.tmp", ROOT, b"ckpt", R).unwrap();
    assert_eq!(list(ns, ROOT), vec![b"ckpt".to_vec()]);
    assert_eq!(ns.lookup(ROOT, b"ckpt").unwrap().ino, new.ino);
    assert_eq!(code(ns.getattr(old.ino)), ErrorCode::NotFound);
    assert_eq!(ns.statfs().unwrap().files, files - 1);
    for node in [1, 2] {
        let tasks = ns
            .heartbeat(NodeId(node), 1, 0, &[], 0, Default::default())
            .unwrap()
            .0;
        assert_eq!(tasks, vec![GcTask::DeleteFile(old.ino)]);
    }
    // A replaced file that is still open lives on as an orphan until release.
    let open = ns
        .create(ROOT, b"other", 0o644, caller(), true, owner(1))
        .unwrap();
    let src = touch(ns, ROOT, "src");
    ns.rename(ROOT, b"src", ROOT, b"other", R).unwrap();
    assert_eq!(ns.getattr(open.attr.ino).unwrap().nlink, 0);
    assert!(h.has_key(&keys::orphan(open.attr.ino)));
    ns.release(open.session, None).unwrap();
    assert_eq!(code(ns.getattr(open.attr.ino)), ErrorCode::NotFound);
    assert_eq!(ns.lookup(ROOT, b"other").unwrap().ino, src.ino);
    // A replaced name with another hard link only loses a link.
    let keep = touch(ns, ROOT, "keep");
    ns.link(keep.ino, ROOT, b"keep2").unwrap();
    touch(ns, ROOT, "x");
    ns.rename(ROOT, b"x", ROOT, b"keep", R).unwrap();
    assert_eq!(ns.getattr(keep.ino).unwrap().nlink, 1);
}

fn rename_checks_kinds_and_emptiness(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let d = mkdir(ns, ROOT, "d");
    let e = mkdir(ns, ROOT, "e");
    touch(ns, ROOT, "f");
    assert_eq!(
        code(ns.rename(ROOT, b"d", ROOT, b"f", R)),
        ErrorCode::NotADirectory
    );
    assert_eq!(
        code(ns.rename(ROOT, b"f", ROOT, b"d", R)),
        ErrorCode::IsADirectory
    );
    touch(ns, e.ino, "inside");
    assert_eq!(
        code(ns.rename(ROOT, b"d", ROOT, b"e", R)),
        ErrorCode::NotEmpty
    );
    assert_eq!(
        code(ns.rename(ROOT, b"f", ROOT, b"d", RenameMode::NoReplace)),
        ErrorCode::AlreadyExists
    );
    assert_eq!(
        code(ns.rename(ROOT, b"nope", ROOT, b"x", R)),
        ErrorCode::NotFound
    );
    let f = ns.lookup(ROOT, b"f").unwrap();
    assert_eq!(
        code(ns.rename(f.ino, b"a", ROOT, b"x", R)),
        ErrorCode::NotADirectory
    );
    assert_eq!(
        code(ns.rename(ROOT, b"f", InodeId(999), b"x", R)),
        ErrorCode::NotFound
    );
    // Directory over an empty directory: the target goes, link counts stay right.
    let tree = walk(ns);
    ns.rename(e.ino, b"inside", ROOT, b"inside", R).unwrap();
    ns.rename(ROOT, b"d", ROOT, b"e", R).unwrap();
    assert_eq!(code(ns.getattr(e.ino)), ErrorCode::NotFound);
    assert_eq!(ns.lookup(ROOT, b"e").unwrap().ino, d.ino);
    assert_eq!(ns.getattr(ROOT).unwrap().nlink, 3);
    assert_ne!(walk(ns), tree);
}

fn rename_dir_into_itself_is_refused(kind: StoreKind) {
    let h = H::new(kind);
    let ns = h.ns();
    let a = mkdir(ns, ROOT, "a");
    let b = mkdir(ns, a.ino, "b");
    let c = mkdir(ns, b.ino, "c");
    let tree = walk(ns);
    for target in [a.ino, b.ino, c.ino] {
        let r = ns.rename(ROOT, b"a", target, b"x", R);
        assert_eq!(code(r), ErrorCode::InvalidArgument, "into {target}");
    }
    assert_eq!(
        code(ns.rename(a.ino, b"b", c.ino, b"b", R)),
        ErrorCode::InvalidArgument
    );
    let ex = ns.rename(ROOT, b"a", b.ino, b"c", RenameMode::Exchange);
    assert_eq!(code(ex), ErrorCode::InvalidArgument);
    let ex = ns.rename(b.ino, b"c", ROOT, b"a", RenameMode::Exchange);
    assert_eq!(code(ex), ErrorCode::InvalidArgument);
    assert_eq!(walk(ns), tree, "refused renames change nothing");
    // Sideways and upwards moves are fine.
    ns.rename(b.ino, b"c", ROOT, b"c", R).unwrap();
    ns.rename(ROOT, b"c", a.ino, b"c", R).unwrap();
}

fn rename_same_name_and_same_inode_do_nothing(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let f = touch(ns, ROOT, "f");
    mkdir(ns, ROOT, "d");
    ns.link(f.ino, ROOT, b"g").unwrap();
    let tree = walk(ns);
    for mode in [R, RenameMode::NoReplace, RenameMode::Exchange] {
        ns.rename(ROOT, b"f", ROOT, b"f", mode).unwrap();
        ns.rename(ROOT, b"d", ROOT, b"d", mode).unwrap();
    }
    ns.rename(ROOT, b"f", ROOT, b"g", R).unwrap();
    assert_eq!(walk(ns), tree);
    assert_eq!(ns.getattr(f.ino).unwrap().nlink, 2);
}

fn rename_exchange_swaps(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let a = mkdir(ns, ROOT, "a");
    let b = mkdir(ns, ROOT, "b");
    let f = touch(ns, a.ino, "x");
    let d = mkdir(ns, b.ino, "y");
    mkdir(ns, d.ino, "deep");
    ns.rename(a.ino, b"x", b.ino, b"y", RenameMode::Exchange)
        .unwrap();
    assert_eq!(ns.lookup(a.ino, b"x").unwrap().ino, d.ino);
    assert_eq!(ns.lookup(b.ino, b"y").unwrap().ino, f.ino);
    assert_eq!(ns.lookup(a.ino, b"x").unwrap().kind, FileKind::Directory);
    // The directory moved from b to a: the `..` link moved with it.
    assert_eq!(ns.getattr(a.ino).unwrap().nlink, 3);
    assert_eq!(ns.getattr(b.ino).unwrap().nlink, 2);
    assert_eq!(ns.getattr(d.ino).unwrap().nlink, 3);
    // Its parent pointer too: a cannot move below it any more.
    assert_eq!(
        code(ns.rename(ROOT, b"a", d.ino, b"a", R)),
        ErrorCode::InvalidArgument
    );
    let missing = ns.rename(a.ino, b"x", b.ino, b"none", RenameMode::Exchange);
    assert_eq!(code(missing), ErrorCode::NotFound);
    // Two directories in one parent: counts stay.
    ns.rename(ROOT, b"a", ROOT, b"b", RenameMode::Exchange)
        .unwrap();
    assert_eq!(ns.lookup(ROOT, b"a").unwrap().ino, b.ino);
    assert_eq!(ns.getattr(ROOT).unwrap().nlink, 4);
}

fn rename_survives_restart(kind: StoreKind) {
    let mut h = H::with_nodes(kind, 1);
    let a = mkdir(h.ns(), ROOT, "a");
    let b = mkdir(h.ns(), a.ino, "b");
    h.ns().rename(a.ino, b"b", ROOT, b"b", R).unwrap();
    let tree = walk(h.ns());
    h.restart();
    assert_eq!(walk(h.ns()), tree);
    assert_eq!(
        code(h.ns().rename(ROOT, b"b", b.ino, b"x", R)),
        ErrorCode::InvalidArgument
    );
    h.ns().rename(ROOT, b"a", b.ino, b"a", R).unwrap();
}

engine_tests!(
    rename_moves_between_directories,
    rename_over_existing_file,
    rename_checks_kinds_and_emptiness,
    rename_dir_into_itself_is_refused,
    rename_same_name_and_same_inode_do_nothing,
    rename_exchange_swaps,
    rename_survives_restart,
);
