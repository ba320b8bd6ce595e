//! Open-file sessions: open, release, orphans, closed connections, restarts.

use super::{caller, code, engine_tests, mkdir, owner, touch, written, H, ROOT};
use crate::kv::StoreKind;
use crate::namespace::{keys, ConnId};
use proto::meta::{Commit, GcTask};
use proto::{ErrorCode, FileKind, InodeId, NodeId, SessionId, Timestamp};

fn gc_tasks(h: &H, node: u32) -> Vec<GcTask> {
    h.ns()
        .heartbeat(NodeId(node), 1000, 0, &[], 0, Default::default())
        .unwrap()
        .0
}

fn open_and_release(kind: StoreKind) {
    let h = H::with_nodes(kind, 2);
    let ns = h.ns();
    let f = touch(ns, ROOT, "f");
    ns.commit(f.ino, Commit::length(10, Timestamp::now()))
        .unwrap();
    let a = ns.open_inode(f.ino, false, owner(1)).unwrap();
    let b = ns.open_inode(f.ino, false, owner(2)).unwrap();
    assert_ne!(a.session, b.session);
    assert_eq!((a.attr.size, a.layout.chains.len()), (10, 2));
    let t = Timestamp {
        secs: 1_800_000_000,
        nanos: 1,
    };
    ns.release(a.session, Some(Commit::length(4096, t)))
        .unwrap();
    let attr = ns.getattr(f.ino).unwrap();
    assert_eq!((attr.size, attr.mtime), (4096, t));
    assert_eq!(code(ns.release(a.session, None)), ErrorCode::Stale);
    assert_eq!(
        code(ns.release(SessionId(u64::MAX), None)),
        ErrorCode::Stale
    );
    ns.release(b.session, None).unwrap();
    assert_eq!(
        code(ns.open_inode(InodeId(1234), false, owner(1))),
        ErrorCode::NotFound
    );
}

fn open_truncate_and_directories(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let f = touch(ns, ROOT, "f");
    ns.commit(f.ino, Commit::length(99, Timestamp { secs: 5, nanos: 0 }))
        .unwrap();
    let o = ns.open_inode(f.ino, true, owner(1)).unwrap();
    assert_eq!(o.attr.size, 0);
    assert!(o.attr.mtime.secs > 5 && o.attr.ctime >= o.attr.mtime);
    assert_eq!(ns.getattr(f.ino).unwrap().size, 0);
    let d = mkdir(ns, ROOT, "d");
    let od = ns.open_inode(d.ino, false, owner(1)).unwrap();
    assert_eq!(
        (od.attr.kind, od.layout.chains.len()),
        (FileKind::Directory, 0)
    );
    assert_eq!(
        code(ns.open_inode(d.ino, true, owner(1))),
        ErrorCode::IsADirectory
    );
    ns.release(od.session, None).unwrap();
    // A directory removed while open: release still ends the session cleanly.
    let od = ns.open_inode(d.ino, false, owner(1)).unwrap();
    ns.rmdir(ROOT, b"d").unwrap();
    ns.release(od.session, Some(Commit::length(1, Timestamp::now())))
        .unwrap();
}

fn unlink_while_open_keeps_inode_until_release(kind: StoreKind) {
    let h = H::with_nodes(kind, 2);
    let ns = h.ns();
    let o = ns
        .create(ROOT, b"f", 0o644, caller(), true, owner(1))
        .unwrap();
    let second = ns.open_inode(o.attr.ino, false, owner(2)).unwrap();
    ns.setxattr(o.attr.ino, b"user.k", b"v", proto::meta::XattrMode::Upsert)
        .unwrap();
    let files = ns.statfs().unwrap().files;
    ns.unlink(ROOT, b"f").unwrap();
    assert_eq!(code(ns.lookup(ROOT, b"f")), ErrorCode::NotFound);
    let attr = ns.getattr(o.attr.ino).unwrap();
    assert_eq!(attr.nlink, 0, "fstat of an open, unlinked file still works");
    assert!(h.has_key(&keys::orphan(o.attr.ino)));
    assert!(
        gc_tasks(&h, 1).is_empty(),
        "chunks stay while the file is open"
    );
    // Writes and length commits still land on the orphan.
    ns.commit(o.attr.ino, Commit::length(77, Timestamp::now()))
        .unwrap();
    assert_eq!(
        code(ns.link(o.attr.ino, ROOT, b"back")),
        ErrorCode::NotFound
    );
    ns.release(o.session, None).unwrap();
    assert_eq!(ns.getattr(o.attr.ino).unwrap().size, 77, "one session left");
    ns.release(second.session, None).unwrap();
    assert_eq!(code(ns.getattr(o.attr.ino)), ErrorCode::NotFound);
    assert!(!h.has_key(&keys::orphan(o.attr.ino)));
    assert!(!h.has_key(&keys::xattr(o.attr.ino, b"user.k")));
    assert_eq!(ns.statfs().unwrap().files, files - 1);
    for node in [1, 2] {
        assert_eq!(gc_tasks(&h, node), vec![GcTask::DeleteFile(o.attr.ino)]);
    }
}

fn connection_close_ends_its_sessions_only(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let a = ns
        .create(ROOT, b"a", 0o644, caller(), true, owner(7))
        .unwrap();
    let a2 = ns.open_inode(a.attr.ino, false, owner(7)).unwrap();
    let b = ns
        .create(ROOT, b"b", 0o644, caller(), true, owner(7))
        .unwrap();
    let b_other = ns.open_inode(b.attr.ino, false, owner(8)).unwrap();
    written(ns, a.attr.ino, 10);
    written(ns, b.attr.ino, 10);
    ns.unlink(ROOT, b"a").unwrap();
    ns.unlink(ROOT, b"b").unwrap();
    ns.connection_closed(ConnId(7));
    ns.connection_closed(ConnId(7));
    ns.connection_closed(ConnId(12345));
    assert_eq!(
        code(ns.getattr(a.attr.ino)),
        ErrorCode::NotFound,
        "last sessions closed"
    );
    assert_eq!(code(ns.release(a2.session, None)), ErrorCode::Stale);
    assert_eq!(code(ns.release(b.session, None)), ErrorCode::Stale);
    assert_eq!(
        ns.getattr(b.attr.ino).unwrap().nlink,
        0,
        "connection 8 still has b open"
    );
    ns.release(b_other.session, None).unwrap();
    assert_eq!(code(ns.getattr(b.attr.ino)), ErrorCode::NotFound);
    let tasks = gc_tasks(&h, 1);
    assert_eq!(
        tasks,
        vec![
            GcTask::DeleteFile(a.attr.ino),
            GcTask::DeleteFile(b.attr.ino)
        ]
    );
}

fn restart_purges_orphans_and_old_sessions(kind: StoreKind) {
    // Guards against files unlinked while open leaking forever when the server dies
    // before their release.
    let mut h = H::with_nodes(kind, 1);
    let o = h
        .ns()
        .create(ROOT, b"f", 0o644, caller(), true, owner(1))
        .unwrap();
    let keep = h
        .ns()
        .create(ROOT, b"keep", 0o644, caller(), true, owner(1))
        .unwrap();
    written(h.ns(), o.attr.ino, 10);
    h.ns().unlink(ROOT, b"f").unwrap();
    let files = h.ns().statfs().unwrap().files;
    h.restart();
    let ns = h.ns();
    assert_eq!(code(ns.getattr(o.attr.ino)), ErrorCode::NotFound);
    assert!(!h.has_key(&keys::orphan(o.attr.ino)));
    assert_eq!(ns.statfs().unwrap().files, files - 1);
    assert_eq!(ns.getattr(keep.attr.ino).unwrap().nlink, 1);
    assert_eq!(gc_tasks(&h, 1), vec![GcTask::DeleteFile(o.attr.ino)]);
    // Sessions from before the restart are stale, and new ids never collide with them.
    assert_eq!(code(ns.release(keep.session, None)), ErrorCode::Stale);
    let fresh = ns.open_inode(keep.attr.ino, false, owner(1)).unwrap();
    assert!(fresh.session > keep.session);
}

fn restart_purges_many_orphans(kind: StoreKind) {
    // On etcd: guards against the start's purge of orphans in pages over 128 writes.
    let mut h = H::with_nodes(kind, 1);
    let mut inos = Vec::new();
    for i in 0..100 {
        let name = format!("f{i}");
        let o = h
            .ns()
            .create(ROOT, name.as_bytes(), 0o644, caller(), true, owner(1))
            .unwrap();
        written(h.ns(), o.attr.ino, 10);
        h.ns().unlink(ROOT, name.as_bytes()).unwrap();
        inos.push(o.attr.ino);
    }
    h.restart();
    for ino in inos {
        assert_eq!(code(h.ns().getattr(ino)), ErrorCode::NotFound);
        assert!(!h.has_key(&keys::orphan(ino)));
    }
}

fn heartbeat_done_tasks_are_forgotten(kind: StoreKind) {
    // On etcd: guards against a heartbeat's done tasks in one transaction over its 128.
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let mut inos = Vec::new();
    for i in 0..300 {
        let name = format!("f{i}");
        let f = touch(ns, ROOT, &name);
        written(ns, f.ino, 1);
        inos.push(f.ino);
        ns.unlink(ROOT, name.as_bytes()).unwrap();
    }
    let first = gc_tasks(&h, 1);
    assert_eq!(first.len(), crate::namespace::MAX_GC_TASKS_PER_HEARTBEAT);
    assert_eq!(gc_tasks(&h, 1), first, "tasks repeat until done");
    let rest = ns
        .heartbeat(NodeId(1), 1000, 0, &first, 0, Default::default())
        .unwrap()
        .0;
    assert_eq!(rest.len(), 300 - first.len());
    let none = ns
        .heartbeat(NodeId(1), 1000, 0, &rest, 0, Default::default())
        .unwrap()
        .0;
    assert!(none.is_empty());
    let all: Vec<_> = first.iter().chain(&rest).copied().collect();
    let want: Vec<_> = inos.into_iter().map(GcTask::DeleteFile).collect();
    assert_eq!(all, want);
}

/// Batched closes: every session ends, one already gone is skipped, the last session
/// of an unlinked file frees it, and a batch over the limit is refused whole.
fn release_many_ends_sessions_and_skips_gone_ones(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let f = touch(ns, ROOT, "f");
    let a = ns.open_inode(f.ino, false, owner(1)).unwrap();
    let b = ns.open_inode(f.ino, false, owner(1)).unwrap();
    ns.unlink(ROOT, b"f").unwrap();
    ns.release(a.session, None).unwrap();
    assert!(h.has_key(&keys::orphan(f.ino)), "b still holds it");
    ns.release_many(&[a.session, b.session, SessionId(u64::MAX)])
        .unwrap();
    assert!(
        !h.has_key(&keys::orphan(f.ino)),
        "freed by its last session"
    );
    assert_eq!(code(ns.getattr(f.ino)), ErrorCode::NotFound);
    assert_eq!(code(ns.release(b.session, None)), ErrorCode::Stale);

    let g = touch(ns, ROOT, "g");
    let c = ns.open_inode(g.ino, false, owner(1)).unwrap();
    let too_many = vec![c.session; proto::meta::MAX_RELEASES + 1];
    assert_eq!(code(ns.release_many(&too_many)), ErrorCode::InvalidArgument);
    ns.release(c.session, None).unwrap();
}

engine_tests!(
    release_many_ends_sessions_and_skips_gone_ones,
    open_and_release,
    open_truncate_and_directories,
    unlink_while_open_keeps_inode_until_release,
    connection_close_ends_its_sessions_only,
    restart_purges_orphans_and_old_sessions,
    restart_purges_many_orphans,
    heartbeat_done_tasks_are_forgotten,
);
