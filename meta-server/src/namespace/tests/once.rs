//! Changes with an id are applied once however often they arrive (`namespace::once`):
//! sent again on a new connection, after a restart (a standby taking over), or first
//! after their own retry; a record too old, or an answer lost, is a clear error.

use super::{code, engine_tests, H, ROOT};
use crate::kv::StoreKind;
use crate::namespace::{keys, ConnId, Origin, OP_SLOTS};
use proto::meta::fs::{Append, Create, Mkdir, Rename, Unlink};
use proto::meta::{Caller, OpId, OpenAccess, RenameMode};
use proto::{ClientId, ErrorCode, WireError};

const CLIENT: ClientId = ClientId(1);

/// Change `seq` of the test's client, sent on `conn` (a retry if `retry`).
pub(super) fn at(conn: u64, seq: u64, retry: bool) -> Origin {
    Origin {
        conn: ConnId(conn),
        caller: Caller::ROOT,
        who: None,
        op: Some(OpId {
            retry,
            ..OpId::new(CLIENT, seq)
        }),
    }
}

pub(super) fn create(name: &str) -> Create {
    Create {
        parent: ROOT,
        name: name.into(),
        perm: 0o644,
        exclusive: true,
        access: OpenAccess::ReadWrite,
        append: false,
        client: CLIENT,
    }
}

fn mkdir(name: &str) -> Mkdir {
    Mkdir {
        parent: ROOT,
        name: name.into(),
        perm: 0o755,
    }
}

fn wire<T>(r: Result<T, WireError>) -> ErrorCode {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.code,
    }
}

/// An exclusive create, a mkdir, a rename, an unlink and an append, each sent again
/// after its connection broke: each answers as the first time, and none is applied
/// twice (which would fail with `EEXIST` or `ENOENT`, or append twice).
fn a_change_sent_again_is_answered_from_its_record(kind: StoreKind) {
    let h = H::with_nodes(kind, 3);
    let ns = h.ns();
    let first = ns.handle(create("f"), at(1, 1, false)).unwrap();
    let made = ns.handle(mkdir("d"), at(1, 2, false)).unwrap();
    let rename = Rename {
        parent: ROOT,
        name: b"d".to_vec(),
        new_parent: ROOT,
        new_name: b"e".to_vec(),
        mode: RenameMode::Replace,
    };
    ns.handle(rename.clone(), at(1, 3, false)).unwrap();
    let append = Append {
        ino: first.attr.ino,
        len: 100,
    };
    let offset = ns.handle(append.clone(), at(1, 4, false)).unwrap();
    let unlink = Unlink {
        parent: ROOT,
        name: b"e".to_vec(),
    };
    // Not an empty directory's unlink: a file's. Made for it.
    ns.handle(create("g"), at(1, 5, false)).unwrap();
    let gone = ns
        .handle(
            Unlink {
                parent: ROOT,
                name: b"g".to_vec(),
            },
            at(1, 6, false),
        )
        .unwrap();
    ns.connection_broken(ConnId(1));

    let again = ns.handle(create("f"), at(2, 1, true)).unwrap();
    assert_eq!(again.attr.ino, first.attr.ino);
    assert_eq!(again.session, first.session);
    let again = ns.handle(mkdir("d"), at(2, 2, true)).unwrap();
    assert_eq!(again.attr.ino, made.attr.ino);
    ns.handle(rename, at(2, 3, true)).unwrap();
    assert_eq!(ns.handle(append, at(2, 4, true)).unwrap(), offset);
    let again = ns
        .handle(
            Unlink {
                parent: ROOT,
                name: b"g".to_vec(),
            },
            at(2, 6, true),
        )
        .unwrap();
    assert_eq!(again, gone);
    // Applied once: one append's bytes, the directory under its new name only.
    assert_eq!(ns.getattr(first.attr.ino).unwrap().size, 100);
    assert_eq!(ns.lookup(ROOT, b"e").unwrap().ino, made.attr.ino);
    assert_eq!(code(ns.lookup(ROOT, b"d")), ErrorCode::NotFound);
    // The create's session moved to the new connection: it ends with it.
    ns.connection_closed(ConnId(2));
    assert_eq!(code(ns.release(first.session, None)), ErrorCode::Stale);
    // A change with no id is not looked up: the same unlink is an error now.
    assert_eq!(wire(ns.handle(unlink, ConnId(3))), ErrorCode::IsADirectory);
}

/// The server restarts (as a standby takes over) between a create and its retry: the
/// retry gets the create's answer, and its session is opened again for writing.
fn a_create_sent_again_to_a_restarted_server_keeps_its_open(kind: StoreKind) {
    let mut h = H::with_nodes(kind, 3);
    let first = h.ns().handle(create("f"), at(1, 1, false)).unwrap();
    h.restart();
    let again = h.ns().handle(create("f"), at(2, 1, true)).unwrap();
    assert_eq!(again.attr.ino, first.attr.ino);
    assert_eq!(again.session, first.session);
    // The session is this server's now: a length commit through it is allowed.
    h.ns().release(again.session, None).unwrap();
}

/// A change's first try may reach the server after its retry (a slow server's queue):
/// whichever comes second is answered from the record, not applied again.
fn a_first_try_after_its_retry_is_not_applied_again(kind: StoreKind) {
    let h = H::new(kind);
    let ns = h.ns();
    let made = ns.handle(mkdir("d"), at(1, 1, true)).unwrap();
    let late = ns.handle(mkdir("d"), at(1, 1, false)).unwrap();
    assert_eq!(late.attr.ino, made.attr.ino);
    // Another change under a new count is applied: `EEXIST`.
    assert_eq!(
        wire(ns.handle(mkdir("d"), at(1, 2, false))),
        ErrorCode::AlreadyExists
    );
}

/// A create's first try arriving after its retry is answered from the record, and
/// leaves the open where the retry put it: on the retry's connection, not on the
/// connection the client gave up (whose close would end it).
fn a_late_first_try_leaves_the_open_with_its_retry(kind: StoreKind) {
    let h = H::with_nodes(kind, 3);
    let ns = h.ns();
    let retried = ns.handle(create("f"), at(2, 1, true)).unwrap();
    let late = ns.handle(create("f"), at(1, 1, false)).unwrap();
    assert_eq!(late.session, retried.session);
    ns.connection_closed(ConnId(1));
    ns.release(retried.session, None).unwrap();
}

/// A change whose slot a later change took cannot tell whether it was applied: it is
/// refused (`Stale`), not applied again. A count of 0 is no change's.
fn a_change_too_old_to_tell_is_refused(kind: StoreKind) {
    let h = H::new(kind);
    let ns = h.ns();
    ns.handle(mkdir("a"), at(1, 1, false)).unwrap();
    ns.handle(mkdir("b"), at(1, 1 + OP_SLOTS, false)).unwrap();
    assert_eq!(
        wire(ns.handle(mkdir("a"), at(2, 1, true))),
        ErrorCode::Stale
    );
    // A first try that far behind its client's latest change (one the client gave up
    // on, late from a slow queue) would share a slot with a later one: refused.
    assert_eq!(
        wire(ns.handle(mkdir("c"), at(1, 1, false))),
        ErrorCode::Stale
    );
    assert_eq!(code(ns.lookup(ROOT, b"c")), ErrorCode::NotFound);
    assert_eq!(
        wire(ns.handle(mkdir("c"), at(2, 0, false))),
        ErrorCode::InvalidArgument
    );
    assert_eq!(code(ns.lookup(ROOT, b"c")), ErrorCode::NotFound);
}

/// The change landed with its mark but the server stopped before it recorded the
/// answer: the retry fails with EIO, naming what happened, and applies nothing.
fn an_applied_change_without_its_answer_fails_clearly(kind: StoreKind) {
    let h = H::new(kind);
    let ns = h.ns();
    ns.handle(mkdir("d"), at(1, 1, false)).unwrap();
    crate::namespace::once::forget_answer(ns, CLIENT, 1);
    match ns.handle(mkdir("d"), at(2, 1, true)) {
        Err(e) => {
            assert_eq!(e.code, ErrorCode::Io);
            assert!(e.message.contains("was applied"), "{}", e.message);
        }
        Ok(m) => panic!("answered {m:?}"),
    }
}

/// Records older than two hours are deleted by the purge; newer ones stay.
fn old_change_records_are_purged(kind: StoreKind) {
    let h = H::new(kind);
    let ns = h.ns();
    for seq in 1..=3 {
        ns.handle(mkdir(&format!("d{seq}")), at(1, seq, false))
            .unwrap();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let ttl = crate::namespace::once::OP_RECORD_TTL.as_secs();
    crate::namespace::once::age_record(ns, CLIENT, 1, now - ttl - 60);
    crate::namespace::once::age_record(ns, CLIENT, 2, now - ttl + 60);
    assert_eq!(ns.purge_op_records().unwrap(), 1);
    assert!(!h.has_key(&keys::op_record(CLIENT, 1)));
    assert!(h.has_key(&keys::op_record(CLIENT, 2)));
    assert!(h.has_key(&keys::op_record(CLIENT, 3)));
    assert_eq!(ns.purge_op_records().unwrap(), 0);
}

/// A create sent again while its first try's connection still stands (a call that
/// timed out on a slow server, whose connection the server has not yet found broken):
/// the session moves to the asking connection, since the asker sent the create's own
/// id, instead of the replay failing `Busy` (which the client would take for a file
/// being cut, and send as a new create).
fn a_create_sent_again_takes_its_session_from_a_standing_connection(kind: StoreKind) {
    let h = H::with_nodes(kind, 3);
    let ns = h.ns();
    let first = ns.handle(create("f"), at(1, 1, false)).unwrap();
    let again = ns.handle(create("f"), at(2, 1, true)).unwrap();
    assert_eq!(again.session, first.session);
    ns.connection_closed(ConnId(1));
    // Still open: it is connection 2's now.
    ns.release(first.session, None).unwrap();
}

engine_tests!(
    a_change_sent_again_is_answered_from_its_record,
    a_create_sent_again_to_a_restarted_server_keeps_its_open,
    a_first_try_after_its_retry_is_not_applied_again,
    a_late_first_try_leaves_the_open_with_its_retry,
    a_change_too_old_to_tell_is_refused,
    an_applied_change_without_its_answer_fails_clearly,
    old_change_records_are_purged,
    a_create_sent_again_takes_its_session_from_a_standing_connection,
);
