//! A directory's ctime names one state of its entries: clients that know every name in
//! a directory check a create's or unlink's `DirChange` against it.

use super::{caller, engine_tests, mkdir, owner, H, ROOT};
use proto::meta::{DirChange, XattrMode};
use proto::{FileKind, SetAttr};

fn create(h: &H, dir: proto::InodeId, name: &str) -> DirChange {
    let ns = h.ns();
    let o = ns
        .create(dir, name.as_bytes(), 0o644, caller(), false, owner(1))
        .unwrap();
    ns.release(o.session, None).unwrap();
    o.parent.expect("a create reports its directory's change")
}

fn each_change_moves_ctime_forward(kind: crate::kv::StoreKind) {
    let h = H::with_nodes(kind, 2);
    let ns = h.ns();
    let d = mkdir(ns, ROOT, "d");
    let mut known = d.ctime;
    // Far more changes than the clock's resolution separates on a fast machine.
    for i in 0..200 {
        let c = create(&h, d.ino, &format!("f{i}"));
        assert_eq!(c.before, known, "change {i} starts where the last ended");
        assert!(c.after.ctime > c.before, "change {i} moves the ctime");
        assert_eq!(c.after.ino, d.ino);
        known = c.after.ctime;
    }
    for i in 0..100 {
        let u = ns.unlink(d.ino, format!("f{i}").as_bytes()).unwrap();
        assert_eq!(u.nlink, 0, "its only name");
        let c = u.parent;
        assert_eq!(c.before, known, "unlink {i} starts where the last ended");
        assert!(c.after.ctime > c.before);
        known = c.after.ctime;
    }
    // A create that opens an existing file changes nothing.
    let again = create(&h, d.ino, "f150");
    assert_eq!((again.before, again.after.ctime), (known, known));
    // The other calls that make or remove a name report their change the same way.
    let f = ns.lookup(d.ino, b"f150").unwrap();
    let made = [
        ns.mkdir(d.ino, b"sub", 0o755, caller()).unwrap().parent,
        ns.symlink(d.ino, b"l", b"f150", caller()).unwrap().parent,
        ns.mknod(d.ino, b"p", FileKind::Fifo, 0o644, 0, caller())
            .unwrap()
            .parent,
        ns.link(f.ino, d.ino, b"h").unwrap().parent,
        ns.rmdir(d.ino, b"sub").unwrap(),
    ];
    for (i, c) in made.iter().enumerate() {
        assert_eq!(c.before, known, "name call {i} starts where the last ended");
        assert!(c.after.ctime > c.before && c.after.ino == d.ino);
        known = c.after.ctime;
    }
    assert_eq!(made[0].after.nlink, 3, "the new subdirectory's link");
    assert_eq!(made[4].after.nlink, 2);
    // Every other kind of change of the directory moves it too, so a client's list of
    // names taken at `known` is seen to be old.
    type Change = Box<dyn Fn(&crate::Namespace)>;
    let ino = d.ino;
    let changes: Vec<(&str, Change)> = vec![
        (
            "chmod",
            Box::new(move |ns| {
                let set = SetAttr {
                    perm: Some(0o700),
                    ..SetAttr::default()
                };
                ns.setattr(ino, &set).unwrap();
            }),
        ),
        (
            "setxattr",
            Box::new(move |ns| {
                ns.setxattr(ino, b"user.a", b"1", XattrMode::Upsert)
                    .unwrap();
            }),
        ),
        (
            "rename",
            Box::new(move |ns| {
                ns.rename(ino, b"f150", ino, b"g", proto::meta::RenameMode::Replace)
                    .unwrap();
            }),
        ),
    ];
    for (what, change) in changes {
        change(ns);
        let now = ns.getattr(d.ino).unwrap().ctime;
        assert!(now > known, "{what} moves the directory's ctime");
        known = now;
    }
    let c = create(&h, d.ino, "last");
    assert_eq!(c.before, known);
}

/// A listing that is the whole directory says at which ctime; a part of one does not.
fn a_whole_listing_says_at_which_ctime(kind: crate::kv::StoreKind) {
    let h = H::with_nodes(kind, 2);
    let ns = h.ns();
    let d = mkdir(ns, ROOT, "d");
    let empty = ns.readdir(d.ino, None, 100, false).unwrap();
    assert_eq!(empty.complete_at, Some(d.ctime));
    let mut known = d.ctime;
    for i in 0..5 {
        known = create(&h, d.ino, &format!("f{i}")).after.ctime;
    }
    let all = ns.readdir(d.ino, None, 100, true).unwrap();
    assert_eq!(
        (all.entries.len(), all.done, all.complete_at),
        (5, true, Some(known))
    );
    let first = ns.readdir(d.ino, None, 2, false).unwrap();
    assert_eq!(
        (first.done, first.complete_at),
        (false, None),
        "one page of several"
    );
    let rest = ns.readdir(d.ino, Some(b"f1"), 100, false).unwrap();
    assert_eq!(
        (rest.done, rest.complete_at),
        (true, None),
        "not from the top"
    );
}

engine_tests!(
    each_change_moves_ctime_forward,
    a_whole_listing_says_at_which_ctime
);
