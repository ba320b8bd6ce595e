//! Sessions and locks of a connection that broke wait for their client to resume them
//! on a new connection; the grace over, they end as a vanished client's.

use super::{code, engine_tests, touch, H, ROOT};
use crate::kv::StoreKind;
use crate::namespace::SessionOwner;
use crate::namespace::{keys, ConnId};
use crate::ManualClock;
use proto::meta::fs::{GetLock, OpenSession, SetLock};
use proto::meta::{Caller, LockKind, LockSpec};
use proto::{ClientId, ErrorCode, InodeId, SessionId};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn of(client: u64, conn: u64) -> SessionOwner {
    SessionOwner {
        client: ClientId(client),
        conn: ConnId(conn),
        access: proto::meta::OpenAccess::ReadWrite,
        append: false,
    }
}

fn exclusive(owner: u64) -> LockSpec {
    LockSpec {
        owner,
        pid: 1,
        start: 0,
        end: u64::MAX,
        kind: LockKind::Write,
    }
}

/// Whether another client (5) is refused the whole-file lock of `ino`.
fn locked(h: &H, ino: InodeId) -> bool {
    // A lock is probed on an open descriptor: the file is open on its connection.
    let probe = h.ns().open_inode(ino, false, of(5, 50)).unwrap();
    let req = GetLock {
        ino,
        client: ClientId(5),
        lock: exclusive(1),
    };
    let locked = match h.ns().handle(req, ConnId(50)) {
        Ok(l) => l.is_some(),
        other => panic!("getlock: {other:?}"),
    };
    h.ns().release(probe.session, None).unwrap();
    locked
}

/// Sessions a client resumes, named opened for reading.
fn opens(list: &[(SessionId, InodeId)]) -> Vec<OpenSession> {
    let open = |&(session, ino)| OpenSession {
        session,
        ino,
        writes: false,
        grant: None,
    };
    list.iter().map(open).collect()
}

fn later() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// A broken connection keeps its client's opens and locks; `Resume` on a new one moves
/// them there, so neither the end of the grace nor the old connection's end touches
/// them; they end with the new connection.
fn a_resumed_client_keeps_its_opens_and_locks(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let f = touch(ns, ROOT, "f");
    let gone = touch(ns, ROOT, "gone");
    let o = ns.open_inode(f.ino, false, of(3, 7)).unwrap();
    let u = ns.open_inode(gone.ino, false, of(3, 7)).unwrap();
    let lock = SetLock {
        ino: f.ino,
        client: ClientId(3),
        lock: exclusive(9),
        reclaim: false,
        waits: false,
    };
    ns.handle(lock, ConnId(7)).unwrap();
    ns.unlink(ROOT, b"gone").unwrap();

    ns.connection_broken(ConnId(7));
    assert!(locked(&h, f.ino), "held through the grace");
    let other = ns.open_inode(f.ino, false, of(4, 8)).unwrap();
    assert!(!other.cut_tail, "still open by the cut-off client");
    assert!(!h.has_key(&keys::tail(f.ino)), "nothing marked yet");

    let lost = ns
        .resume(
            ClientId(3),
            &opens(&[(o.session, f.ino), (u.session, gone.ino)]),
            ConnId(9),
            &Caller::ROOT,
        )
        .unwrap()
        .lost;
    assert!(lost.is_empty(), "{lost:?}");
    assert_eq!(ns.expire_detached(later()), 0, "nothing left to expire");
    ns.connection_closed(ConnId(7));
    assert!(locked(&h, f.ino), "moved to the new connection");
    assert!(
        h.has_key(&keys::inode(gone.ino)),
        "an unlinked open file lives on"
    );
    ns.release(other.session, None).unwrap();
    assert!(!ns.open_inode(f.ino, false, of(4, 8)).unwrap().cut_tail);

    ns.connection_closed(ConnId(9));
    assert!(!locked(&h, f.ino), "ended with the new connection");
    assert!(
        !h.has_key(&keys::inode(gone.ino)),
        "freed with its last session"
    );
    assert!(
        h.has_key(&keys::tail(f.ino)),
        "a vanished client's file now"
    );
}

/// The grace over, a broken connection's opens and locks end as a vanished client's;
/// a resume after that reports its sessions lost. A client cannot resume another's.
fn after_the_grace_the_sessions_end_and_are_lost(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let f = touch(ns, ROOT, "f");
    let o = ns.open_inode(f.ino, false, of(3, 7)).unwrap();
    let theirs = ns.open_inode(f.ino, false, of(4, 8)).unwrap();
    let lock = SetLock {
        ino: f.ino,
        client: ClientId(3),
        lock: exclusive(9),
        reclaim: false,
        waits: false,
    };
    ns.handle(lock, ConnId(7)).unwrap();
    ns.connection_broken(ConnId(7));
    assert_eq!(ns.expire_detached(Instant::now()), 0, "the grace runs");
    assert_eq!(ns.expire_detached(later()), 1);
    assert!(!locked(&h, f.ino), "dropped with the grace");
    assert!(
        h.has_key(&keys::tail(f.ino)),
        "marked as a vanished client's"
    );

    let lost = ns
        .resume(
            ClientId(3),
            &opens(&[(o.session, f.ino), (theirs.session, f.ino)]),
            ConnId(9),
            &Caller::ROOT,
        )
        .unwrap()
        .lost;
    assert_eq!(
        lost,
        vec![o.session, theirs.session],
        "ended, and not its own"
    );
    ns.release(theirs.session, None).expect("still client 4's");
}

/// A connection closed by its peer (the client's process ended) ends at once, as does
/// a broken one with no grace configured, and one with nothing open is not kept.
fn an_orderly_close_or_no_grace_ends_at_once(kind: StoreKind) {
    let h = H::with_config(
        kind,
        crate::config::NamespaceConfig {
            session_grace_ms: 0,
            ..Default::default()
        },
    );
    h.ns()
        .register_data(None, "10.0.0.1:7000", 1000, 10)
        .unwrap();
    let ns = h.ns();
    let f = touch(ns, ROOT, "f");
    ns.open_inode(f.ino, false, of(3, 7)).unwrap();
    ns.connection_broken(ConnId(7));
    assert!(h.has_key(&keys::tail(f.ino)), "no grace: ended at once");

    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let f = touch(ns, ROOT, "f");
    ns.open_inode(f.ino, false, of(3, 7)).unwrap();
    ns.connection_closed(ConnId(7));
    assert!(
        h.has_key(&keys::tail(f.ino)),
        "closed by the peer: ended at once"
    );
    ns.connection_broken(ConnId(8));
    assert_eq!(ns.expire_detached(later()), 0, "nothing was open on it");
}

/// Sessions from before a restart (the server ended none on purpose) are opened again
/// by a resume while their files exist; a file gone since is lost. Too many sessions in
/// one resume are refused.
fn a_resume_after_a_restart_opens_again(kind: StoreKind) {
    let mut h = H::with_nodes(kind, 1);
    let f = touch(h.ns(), ROOT, "f");
    let g = touch(h.ns(), ROOT, "g");
    let of_f = h.ns().open_inode(f.ino, false, of(3, 7)).unwrap();
    let of_g = h.ns().open_inode(g.ino, false, of(3, 7)).unwrap();
    h.ns().stop();
    h.restart();
    let ns = h.ns();
    ns.unlink(ROOT, b"g").unwrap();
    assert!(
        !h.has_key(&keys::inode(g.ino)),
        "nobody had it open after the restart"
    );
    let lost = ns
        .resume(
            ClientId(3),
            &opens(&[(of_f.session, f.ino), (of_g.session, g.ino)]),
            ConnId(9),
            &Caller::ROOT,
        )
        .unwrap()
        .lost;
    assert_eq!(lost, vec![of_g.session]);
    ns.unlink(ROOT, b"f").unwrap();
    assert!(
        h.has_key(&keys::inode(f.ino)),
        "open again: kept after its unlink"
    );
    ns.release(of_f.session, None).unwrap();
    assert!(!h.has_key(&keys::inode(f.ino)), "freed at its close");

    let many = opens(&vec![(of_f.session, f.ino); proto::meta::MAX_RESUMES + 1]);
    assert_eq!(
        code(ns.resume(ClientId(3), &many, ConnId(9), &Caller::ROOT)),
        ErrorCode::InvalidArgument
    );
}

/// The grace measured on a manual clock: it holds to its last millisecond and ends one
/// after, with no wait in real time.
fn a_manual_clock_runs_out_the_grace(kind: StoreKind) {
    let config = crate::config::NamespaceConfig {
        session_grace_ms: 30_000,
        ..Default::default()
    };
    let clock = Arc::new(ManualClock::new());
    let h = H::with_clock(kind, config, clock.clone());
    h.ns()
        .register_data(None, "10.0.0.1:7000", 1000, 10)
        .unwrap();
    let ns = h.ns();
    let f = touch(ns, ROOT, "f");
    ns.open_inode(f.ino, false, of(3, 7)).unwrap();
    ns.connection_broken(ConnId(7));
    clock.advance(Duration::from_millis(29_999));
    assert_eq!(ns.expire_detached(ns.now()), 0, "within the grace");
    assert_eq!(ns.waiting_resume(), 1);
    clock.advance(Duration::from_millis(1));
    assert_eq!(ns.expire_detached(ns.now()), 1, "the grace is over");
    assert!(
        h.has_key(&keys::tail(f.ino)),
        "ended as a vanished client's"
    );
}

/// After a restart (a namespace that existed), new locks are refused for
/// `lock_grace_ms` while clients take back theirs (`reclaim`); an unlock and a reclaim
/// go through; the grace over, locks are taken as before. A new namespace has none.
fn a_restarted_server_keeps_new_locks_out_while_old_ones_are_taken_back(kind: StoreKind) {
    let config = crate::config::NamespaceConfig {
        lock_grace_ms: 5_000,
        ..Default::default()
    };
    let clock = Arc::new(ManualClock::new());
    let mut h = H::with_clock(kind, config, clock.clone());
    h.ns()
        .register_data(None, "10.0.0.1:7000", 1000, 10)
        .unwrap();
    let f = touch(h.ns(), ROOT, "f");
    let set = |client: u64, owner: u64, kind: LockKind, reclaim: bool| SetLock {
        ino: f.ino,
        client: ClientId(client),
        lock: LockSpec {
            kind,
            ..exclusive(owner)
        },
        reclaim,
        waits: false,
    };
    // A new namespace: no grace.
    let held = h.ns().open_inode(f.ino, false, of(3, 7)).unwrap();
    h.ns()
        .handle(set(3, 9, LockKind::Write, false), ConnId(7))
        .unwrap();
    h.ns().stop();
    h.restart();
    let ns = h.ns();
    // The holder resumes its open and takes its lock back; another client is refused
    // meanwhile, even with no lock held yet.
    let other = ns.open_inode(f.ino, false, of(4, 8)).unwrap();
    assert_eq!(
        ns.handle(set(4, 1, LockKind::Read, false), ConnId(8))
            .map_err(|e| e.code),
        Err(ErrorCode::WouldBlock)
    );
    ns.resume(
        ClientId(3),
        &opens(&[(held.session, f.ino)]),
        ConnId(9),
        &Caller::ROOT,
    )
    .unwrap();
    ns.handle(set(3, 9, LockKind::Write, true), ConnId(9))
        .unwrap();
    assert!(locked(&h, f.ino));
    // An unlock goes through in the grace.
    ns.handle(set(3, 9, LockKind::Unlock, false), ConnId(9))
        .unwrap();
    assert!(!locked(&h, f.ino));
    assert_eq!(
        ns.handle(set(4, 1, LockKind::Write, false), ConnId(8))
            .map_err(|e| e.code),
        Err(ErrorCode::WouldBlock),
        "still in the grace"
    );
    clock.advance(Duration::from_millis(5_000));
    ns.handle(set(4, 1, LockKind::Write, false), ConnId(8))
        .unwrap();
    assert!(locked(&h, f.ino));
    ns.release(other.session, None).unwrap();
}

engine_tests!(
    a_restarted_server_keeps_new_locks_out_while_old_ones_are_taken_back,
    a_manual_clock_runs_out_the_grace,
    a_resumed_client_keeps_its_opens_and_locks,
    after_the_grace_the_sessions_end_and_are_lost,
    an_orderly_close_or_no_grace_ends_at_once,
    a_resume_after_a_restart_opens_again,
);
