//! Files a client had open when its connection closed: the next opener that finds them
//! closed everywhere is asked to cut what a vanished writer may have left past the end.

use super::{caller, code, engine_tests, mkdir, owner, touch, H, ROOT};
use crate::kv::StoreKind;
use crate::namespace::{keys, ConnId, SessionOwner};
use proto::meta::OpenAccess;
use proto::ErrorCode;

/// Marks, duty, waiting and the end of the duty with a `TailCut`.
fn the_next_opener_cuts_and_others_wait(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let f = touch(ns, ROOT, "f");
    let d = mkdir(ns, ROOT, "d");
    ns.open_inode(f.ino, false, owner(7)).unwrap();
    ns.open_inode(d.ino, false, owner(7)).unwrap();
    let quiet = touch(ns, ROOT, "quiet");
    ns.connection_closed(ConnId(7));
    assert!(h.has_key(&keys::tail(f.ino)), "a file it had open");
    assert!(!h.has_key(&keys::tail(d.ino)), "directories hold no bytes");
    assert!(
        !h.has_key(&keys::tail(quiet.ino)),
        "a file it had closed cleanly"
    );

    let cutter = ns.open_inode(f.ino, false, owner(1)).unwrap();
    assert!(cutter.cut_tail);
    assert_eq!(
        code(ns.open_inode(f.ino, false, owner(2))),
        ErrorCode::Busy,
        "an open while the cut runs"
    );
    assert_eq!(
        code(ns.create(ROOT, b"f", 0o644, caller(), false, owner(2))),
        ErrorCode::Busy,
        "a create that would open it"
    );
    let other = ns.open_inode(quiet.ino, false, owner(2)).unwrap();
    assert_eq!(
        code(ns.tail_cut(f.ino, other.session)),
        ErrorCode::Stale,
        "a session not given the cut"
    );
    ns.tail_cut(f.ino, cutter.session).unwrap();
    assert!(!h.has_key(&keys::tail(f.ino)));
    let after = ns.open_inode(f.ino, false, owner(2)).unwrap();
    assert!(!after.cut_tail, "cut once");
    assert!(
        !ns.open_inode(quiet.ino, false, owner(3)).unwrap().cut_tail,
        "never marked"
    );
}

/// A file still open elsewhere keeps its mark without a duty (that session may be
/// writing past the end itself); a cutter that vanishes leaves the duty to the next.
fn the_duty_waits_for_other_sessions_and_outlives_its_cutter(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let f = touch(ns, ROOT, "f");
    ns.open_inode(f.ino, false, owner(7)).unwrap();
    let live = ns.open_inode(f.ino, false, owner(8)).unwrap();
    ns.connection_closed(ConnId(7));
    let while_open = ns.open_inode(f.ino, false, owner(1)).unwrap();
    assert!(!while_open.cut_tail, "connection 8 still has it open");
    ns.release(while_open.session, None).unwrap();
    ns.release(live.session, None).unwrap();
    assert!(h.has_key(&keys::tail(f.ino)), "kept for a later open");

    let first = ns.open_inode(f.ino, false, owner(3)).unwrap();
    assert!(first.cut_tail);
    ns.connection_closed(ConnId(3));
    let second = ns.open_inode(f.ino, false, owner(4)).unwrap();
    assert!(
        second.cut_tail,
        "the first cutter vanished before reporting"
    );
    assert_eq!(code(ns.tail_cut(f.ino, first.session)), ErrorCode::Stale);
    ns.tail_cut(f.ino, second.session).unwrap();
    assert!(!h.has_key(&keys::tail(f.ino)));
}

/// The mark survives a restart of the metadata server and goes with the file; a
/// stopping server marks nothing.
fn the_mark_survives_a_restart_and_goes_with_the_file_and_a_stop_marks_nothing(kind: StoreKind) {
    let mut h = H::with_nodes(kind, 1);
    let f = touch(h.ns(), ROOT, "f");
    let g = touch(h.ns(), ROOT, "g");
    h.ns().open_inode(f.ino, false, owner(7)).unwrap();
    h.ns().open_inode(g.ino, false, owner(7)).unwrap();
    h.ns().connection_closed(ConnId(7));
    h.restart();
    let ns = h.ns();
    assert!(ns.open_inode(f.ino, false, owner(1)).unwrap().cut_tail);
    ns.unlink(ROOT, b"g").unwrap();
    assert!(!h.has_key(&keys::tail(g.ino)), "deleted with its inode");
    let (gc, _) = ns
        .heartbeat(proto::NodeId(1), 1000, 0, &[], 0, Default::default())
        .unwrap();
    assert_eq!(
        gc,
        vec![proto::meta::GcTask::DeleteFile(g.ino)],
        "empty, but a vanished client may have written past its end"
    );

    // Connections the server closes as it stops are no vanished clients: they live
    // on, and may still commit what they wrote after the restart.
    let live = touch(ns, ROOT, "live");
    ns.open_inode(live.ino, false, owner(9)).unwrap();
    ns.stop();
    ns.connection_closed(ConnId(9));
    assert!(!h.has_key(&keys::tail(live.ino)));
}

/// Guards against a reader handing itself a cut grant: its vanished session marked the
/// file, so its next open was given the cut (a truncation at the data servers).
fn a_readers_vanished_session_leaves_no_tail(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let f = touch(ns, ROOT, "f");
    let reader = SessionOwner {
        access: OpenAccess::Read,
        ..owner(7)
    };
    ns.open_inode(f.ino, false, reader).unwrap();
    ns.connection_closed(ConnId(7));
    assert!(!h.has_key(&keys::tail(f.ino)), "a reader leaves no bytes");
    assert!(
        !ns.open_inode(f.ino, false, reader_again())
            .unwrap()
            .cut_tail
    );
}

fn reader_again() -> SessionOwner {
    SessionOwner {
        access: OpenAccess::Read,
        ..owner(1)
    }
}

engine_tests!(
    a_readers_vanished_session_leaves_no_tail,
    the_next_opener_cuts_and_others_wait,
    the_duty_waits_for_other_sessions_and_outlives_its_cutter,
    the_mark_survives_a_restart_and_goes_with_the_file_and_a_stop_marks_nothing,
);
