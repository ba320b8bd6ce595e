//! Locks on a shared engine (`shared_locks`): one table for every server, kept when a
//! server dies, dropped by the others a grace after it did unless its client took
//! them back.

use super::shared_races::{grace, lose_live_key, two};
use super::{owner, touch, ROOT};
use crate::namespace::{keys, ConnId, Namespace, SessionOwner};
use proto::meta::{fs, LockKind, LockSpec};
use proto::{ClientId, ErrorCode, InodeId};
use std::time::Duration;

/// Asks `ns` for a write lock on all of `ino` for `client` (its lock owner 1) over
/// `conn`.
fn lock(
    ns: &Namespace,
    conn: u64,
    client: u64,
    ino: InodeId,
    kind: LockKind,
) -> Result<(), ErrorCode> {
    lock_as(ns, conn, client, ino, kind, false)
}

fn lock_as(
    ns: &Namespace,
    conn: u64,
    client: u64,
    ino: InodeId,
    kind: LockKind,
    reclaim: bool,
) -> Result<(), ErrorCode> {
    let req = fs::SetLock {
        ino,
        client: ClientId(client),
        lock: spec(kind),
        reclaim,
        waits: false,
    };
    ns.handle(req, ConnId(conn)).map_err(|e| e.code)
}

fn spec(kind: LockKind) -> LockSpec {
    LockSpec {
        owner: 1,
        pid: 1,
        start: 0,
        end: u64::MAX,
        kind,
    }
}

/// Opens `ino` on `ns` for `client` over `conn` (a lock needs the file open there).
fn open(ns: &Namespace, conn: u64, client: u64, ino: InodeId) -> proto::SessionId {
    let who = SessionOwner {
        client: ClientId(client),
        ..owner(conn)
    };
    ns.open_inode(ino, false, who).unwrap().session
}

/// A lock taken through A holds against a client of B, which sees it with `GetLock`,
/// and is B's to take once A's client unlocks.
#[test]
fn a_lock_taken_through_one_server_holds_against_the_others_clients() {
    let (_h, _hooked, a, b) = two();
    let ino = touch(&a, ROOT, "f").ino;
    open(&a, 5, 1, ino);
    open(&b, 7, 2, ino);
    lock(&a, 5, 1, ino, LockKind::Write).unwrap();
    assert_eq!(
        lock(&b, 7, 2, ino, LockKind::Read),
        Err(ErrorCode::WouldBlock)
    );
    let probe = fs::GetLock {
        ino,
        client: ClientId(2),
        lock: spec(LockKind::Write),
    };
    let seen = b.handle(probe, ConnId(7)).unwrap();
    assert_eq!(seen.map(|l| l.kind), Some(LockKind::Write));
    lock(&a, 5, 1, ino, LockKind::Unlock).unwrap();
    lock(&b, 7, 2, ino, LockKind::Write).unwrap();
    assert_eq!(
        lock(&a, 5, 1, ino, LockKind::Write),
        Err(ErrorCode::WouldBlock)
    );
    assert_eq!(b.check_namespace().unwrap(), Vec::<String>::new());
}

/// A connection that closes on A drops the locks taken over it, and only those.
#[test]
fn a_closed_connection_drops_its_locks_on_a_shared_engine() {
    let (_h, _hooked, a, b) = two();
    let (f, g) = (touch(&a, ROOT, "f").ino, touch(&a, ROOT, "g").ino);
    open(&a, 5, 1, f);
    open(&a, 6, 3, g);
    lock(&a, 5, 1, f, LockKind::Write).unwrap();
    lock(&a, 6, 3, g, LockKind::Write).unwrap();
    open(&b, 7, 2, f);
    open(&b, 7, 2, g);
    a.connection_closed(ConnId(5));
    lock(&b, 7, 2, f, LockKind::Write).unwrap();
    assert_eq!(
        lock(&b, 7, 2, g, LockKind::Write),
        Err(ErrorCode::WouldBlock)
    );
}

/// A server dies holding a client's lock. Within the grace nobody else gets it; after
/// it, B drops it and another client takes it.
#[test]
fn a_dead_servers_locks_are_dropped_a_grace_after_it_went() {
    let (_h, hooked, a, b) = two();
    let ino = touch(&a, ROOT, "f").ino;
    open(&a, 5, 1, ino);
    lock(&a, 5, 1, ino, LockKind::Write).unwrap();
    open(&b, 7, 2, ino);
    lose_live_key(&hooked, &a);
    drop(a);
    let t0 = b.now();
    b.sweep_dead_servers(t0).unwrap();
    assert_eq!(
        lock(&b, 7, 2, ino, LockKind::Write),
        Err(ErrorCode::WouldBlock)
    );
    // The dead server's session and its lock.
    assert_eq!(b.sweep_dead_servers(t0 + grace()).unwrap(), 2);
    lock(&b, 7, 2, ino, LockKind::Write).unwrap();
}

/// The client of a server that died comes back on B within the grace and takes its
/// lock back: it stays the client's, through B, past the grace; and when the first
/// server, alive but cut off from the client, ends the client's old connection, the
/// lock stays too.
#[test]
fn a_lock_taken_back_on_another_server_outlives_the_first() {
    let (_h, hooked, a, b) = two();
    let ino = touch(&a, ROOT, "f").ino;
    let session = open(&a, 5, 1, ino);
    lock(&a, 5, 1, ino, LockKind::Write).unwrap();
    a.connection_broken(ConnId(5));
    let back = proto::meta::fs::OpenSession {
        session,
        ino,
        writes: true,
        grant: None,
    };
    let r = b
        .resume(ClientId(1), &[back], ConnId(5), &super::caller())
        .unwrap();
    assert!(r.lost.is_empty(), "{:?}", r.lost);
    // Connection numbers are each server's own: B's may be the one A's was.
    lock_as(&b, 5, 1, ino, LockKind::Write, true).unwrap();
    // A's grace for the broken connection runs out: it drops only what it holds.
    assert_eq!(a.expire_detached(a.now() + Duration::from_secs(3600)), 1);
    open(&b, 7, 2, ino);
    assert_eq!(
        lock(&b, 7, 2, ino, LockKind::Read),
        Err(ErrorCode::WouldBlock)
    );
    // Then A dies; B's sweep past the grace leaves the lock it holds.
    lose_live_key(&hooked, &a);
    drop(a);
    let t0 = b.now();
    b.sweep_dead_servers(t0).unwrap();
    assert_eq!(b.sweep_dead_servers(t0 + grace()).unwrap(), 0);
    assert_eq!(
        lock(&b, 7, 2, ino, LockKind::Read),
        Err(ErrorCode::WouldBlock)
    );
    // The client's close of its connection on B ends it.
    b.connection_closed(ConnId(5));
    lock(&b, 7, 2, ino, LockKind::Read).unwrap();
}

/// A server whose live key went takes no lock (the others may be dropping its locks).
#[test]
fn a_server_whose_live_key_went_takes_no_lock() {
    let (_h, hooked, a, _b) = two();
    let ino = touch(&a, ROOT, "f").ino;
    open(&a, 5, 1, ino);
    lose_live_key(&hooked, &a);
    assert_eq!(
        lock(&a, 5, 1, ino, LockKind::Write),
        Err(ErrorCode::Unavailable)
    );
    assert!(hooked.inner.get(&keys::locks(ino)).unwrap().is_none());
}

/// Guards against a lock key outliving its file: an unlinked file freed at its last
/// close takes its locks with it, and the namespace check finds nothing left.
#[test]
fn a_freed_file_takes_its_locks_with_it() {
    let (_h, hooked, a, b) = two();
    let ino = touch(&a, ROOT, "f").ino;
    let s = open(&a, 5, 1, ino);
    lock(&a, 5, 1, ino, LockKind::Write).unwrap();
    super::shared_races::unlink(&b, b"f");
    a.release(s, None).unwrap();
    assert!(hooked.inner.get(&keys::locks(ino)).unwrap().is_none());
    assert_eq!(a.check_namespace().unwrap(), Vec::<String>::new());
}
