//! Client ids belong to the key that said hello for them: another key naming one is
//! refused, and a resume takes no session from a live connection nor reopens a file its
//! caller may not read.

use super::{engine_tests, touch, H, ROOT};
use crate::kv::StoreKind;
use crate::namespace::{ConnId, Origin, SessionOwner};
use proto::auth::Caps;
use proto::meta::fs::{GetLock, Hello, OpenSession, ReleaseLocks, Resume, SetLock};
use proto::meta::{Caller, LockKind, LockSpec, OpenAccess};
use proto::{ClientId, ErrorCode, InodeId, SessionId};
use std::sync::Arc;
use transport::{PeerIdentity, Role};

/// A request from key `name` on connection `conn`, as root.
fn from(name: &str, conn: u64) -> Origin {
    Origin {
        conn: ConnId(conn),
        caller: Caller::ROOT,
        who: Some(Arc::new(PeerIdentity {
            name: name.to_string(),
            key_id: Some(proto::auth::KeyId([1; 16])),
            role: Role::Client(Caps::default()),
        })),
        op: None,
    }
}

/// Session `session` of `ino`, as a resume names it.
fn open(session: SessionId, ino: InodeId, writes: bool) -> OpenSession {
    OpenSession {
        session,
        ino,
        writes,
        grant: None,
    }
}

fn hello(h: &H, name: &str, conn: u64) -> ClientId {
    let req = Hello {
        name: name.to_string(),
    };
    h.ns().handle(req, from(name, conn)).unwrap()
}

fn lock(owner: u64, kind: LockKind) -> LockSpec {
    LockSpec {
        owner,
        pid: 1,
        start: 0,
        end: u64::MAX,
        kind,
    }
}

fn set_lock(ino: InodeId, client: ClientId, kind: LockKind) -> SetLock {
    SetLock {
        ino,
        client,
        lock: lock(9, kind),
        reclaim: false,
        waits: false,
    }
}

/// Whether `client` (of key `name`) is refused a whole-file write lock of `ino`.
fn locked_for(h: &H, ino: InodeId, client: ClientId, name: &str, conn: u64) -> bool {
    // A lock is probed on an open descriptor: the file is open on its connection.
    let owner = SessionOwner {
        client,
        conn: ConnId(conn),
        access: OpenAccess::Read,
        append: false,
    };
    let probe = h.ns().open_inode(ino, false, owner).unwrap();
    let req = GetLock {
        ino,
        client,
        lock: lock(1, LockKind::Write),
    };
    let locked = h.ns().handle(req, from(name, conn)).unwrap().is_some();
    h.ns().release(probe.session, None).unwrap();
    locked
}

/// File `f`, which key alice's client (on connection 1) has open for writing and
/// locked whole: the file, her client id and her session.
fn alice_holds_f(h: &H) -> (proto::Attr, ClientId, proto::meta::fs::Opened) {
    let f = touch(h.ns(), ROOT, "f");
    let a = hello(h, "alice", 1);
    let opened = SessionOwner {
        client: a,
        conn: ConnId(1),
        access: OpenAccess::ReadWrite,
        append: false,
    };
    let o = h.ns().open_inode(f.ino, false, opened).unwrap();
    h.ns()
        .handle(set_lock(f.ino, a, LockKind::Write), from("alice", 1))
        .unwrap();
    (f, a, o)
}

/// Guards against any key unlocking, resuming or probing another key's client by
/// naming its id (ids come in order from hello).
fn another_keys_client_is_refused(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let (f, a, o) = alice_holds_f(&h);
    let b = hello(&h, "bob", 2);

    let refused = |r: Result<(), proto::WireError>| match r {
        Err(e) => assert_eq!(e.code, ErrorCode::NotPermitted, "{e}"),
        Ok(()) => panic!("bob was let act as alice's client"),
    };
    let ns = h.ns();
    refused(ns.handle(set_lock(f.ino, a, LockKind::Unlock), from("bob", 2)));
    let release = ReleaseLocks {
        ino: f.ino,
        client: a,
        owner: 9,
    };
    refused(ns.handle(release, from("bob", 2)));
    let resume = Resume {
        client: a,
        sessions: vec![open(o.session, f.ino, true)],
    };
    refused(ns.handle(resume, from("bob", 2)).map(drop));
    let probe = GetLock {
        ino: f.ino,
        client: a,
        lock: lock(1, LockKind::Write),
    };
    refused(ns.handle(probe, from("bob", 2)).map(drop));

    assert!(locked_for(&h, f.ino, b, "bob", 2), "alice's lock stays");
    ns.connection_closed(ConnId(2));
    assert!(
        locked_for(&h, f.ino, b, "bob", 3),
        "and stays on her connection"
    );
    // Her own key still may.
    ns.handle(set_lock(f.ino, a, LockKind::Unlock), from("alice", 1))
        .unwrap();
    assert!(!locked_for(&h, f.ino, b, "bob", 3), "unlocked by alice");
}

/// Guards against a resume moving a session (and its client's locks) off a connection
/// that still stands: it fails `Busy` and changes nothing.
fn a_live_session_is_not_taken_over(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let (f, a, o) = alice_holds_f(&h);
    let b = hello(&h, "bob", 5);
    // Another mount with the same key, on connection 2.
    let resume = Resume {
        client: a,
        sessions: vec![open(o.session, f.ino, true)],
    };
    let err = h.ns().handle(resume.clone(), from("alice", 2)).unwrap_err();
    assert_eq!(err.code, ErrorCode::Busy, "{err}");
    h.ns().connection_closed(ConnId(2));
    assert!(locked_for(&h, f.ino, b, "bob", 5), "the lock stayed on 1");
    h.ns().may_lock(f.ino, ConnId(1)).unwrap();

    // Once connection 1 broke, the same resume takes them.
    h.ns().connection_broken(ConnId(1));
    let lost = h.ns().handle(resume, from("alice", 3)).unwrap().lost;
    assert!(lost.is_empty(), "{lost:?}");
    h.ns().may_lock(f.ino, ConnId(3)).unwrap();
}

/// Guards against a resume after a restart opening a file its caller may not read, and
/// shows that an id of a previous start is bound to the first key naming it.
fn a_resume_after_a_restart_checks_the_caller(kind: StoreKind) {
    let mut h = H::with_nodes(kind, 1);
    let f = touch(h.ns(), ROOT, "f");
    let secret = h
        .ns()
        .create(ROOT, b"secret", 0o600, Caller::ROOT, true, super::owner(1))
        .unwrap();
    h.ns().release(secret.session, None).unwrap();
    let a = hello(&h, "alice", 1);
    h.ns().stop();
    h.restart();

    let old = |ino: InodeId| open(SessionId(1), ino, false);
    let mut at = from("alice", 4);
    at.caller = Caller::new(1000, 1000);
    let resume = Resume {
        client: a,
        sessions: vec![old(secret.attr.ino)],
    };
    let lost = h.ns().handle(resume, at.clone()).unwrap().lost;
    assert_eq!(lost, vec![SessionId(1)], "mode 0600 of root: not readable");
    let resume = Resume {
        client: a,
        sessions: vec![old(f.ino)],
    };
    assert!(h.ns().handle(resume.clone(), at).unwrap().lost.is_empty());
    let err = h.ns().handle(resume, from("bob", 5)).unwrap_err();
    assert_eq!(err.code, ErrorCode::NotPermitted, "bound to alice: {err}");
}

/// Guards against a file opened for writing coming back read-only after a metadata
/// server restart (its writes failed once the grant it held ran out): a session the
/// client names as writing is opened for writing again when its caller may write the
/// file today, for reading when it may only read it or its key is read-only.
fn a_writer_resumed_after_a_restart_writes_again(kind: StoreKind) {
    let mut h = H::with_nodes(kind, 1);
    // `touch` makes files of user 1000.
    let mine = touch(h.ns(), ROOT, "mine");
    let roots = h
        .ns()
        .create(ROOT, b"roots", 0o644, Caller::ROOT, true, super::owner(1))
        .unwrap();
    h.ns().release(roots.session, None).unwrap();
    let f = roots.attr;
    let a = hello(&h, "alice", 1);
    h.ns().stop();
    h.restart();

    let mut at = from("alice", 4);
    at.caller = Caller::new(1000, 1000);
    let resume = Resume {
        client: a,
        sessions: vec![
            open(SessionId(1), mine.ino, true),
            open(SessionId(2), f.ino, true),
            open(SessionId(3), mine.ino, false),
        ],
    };
    let r = h.ns().handle(resume, at.clone()).unwrap();
    assert!(r.lost.is_empty(), "{:?}", r.lost);
    let write_of = |s| h.ns().session_file(SessionId(s), ConnId(4)).unwrap().1;
    assert!(write_of(1), "hers, opened for writing: writing again");
    assert!(!write_of(2), "root's 0644: she may only read it");
    assert!(!write_of(3), "opened for reading: reading");

    // A read-only key's writer comes back reading.
    let ro = Caps {
        read_only: true,
        ..Caps::default()
    };
    at.who = Some(Arc::new(PeerIdentity {
        name: "alice".into(),
        key_id: Some(proto::auth::KeyId([1; 16])),
        role: Role::Client(ro),
    }));
    at.conn = ConnId(6);
    let resume = Resume {
        client: a,
        sessions: vec![open(SessionId(4), mine.ino, true)],
    };
    assert!(h.ns().handle(resume, at).unwrap().lost.is_empty());
    assert!(!h.ns().session_file(SessionId(4), ConnId(6)).unwrap().1);
}

engine_tests!(
    another_keys_client_is_refused,
    a_live_session_is_not_taken_over,
    a_resume_after_a_restart_checks_the_caller,
    a_writer_resumed_after_a_restart_writes_again,
);
