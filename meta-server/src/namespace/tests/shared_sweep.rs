//! Metadata servers that die on a shared engine: their sessions stay named in the
//! files' `P` keys until a live server ends them, a grace after their live key went
//! (see `sweep`); a server whose own key went gives no session. And sessions taken back
//! from one server on another, in either order of their starts, and back again.

use super::shared_races::{grace, lose_live_key, taken_back, two, unlink};
use super::{caller, owner, touch, ROOT};
use crate::clock::SystemClock;
use crate::config::NamespaceConfig;
use crate::error::MetaError;
use crate::kv::etcd::local::LocalEtcd;
use crate::kv::{open_engine, EtcdConfig, KvError, KvStore, StoreKind};
use crate::namespace::{keys, ConnId, Namespace, SessionOwner};
use proto::meta::OpenAccess;
use proto::{ClientId, ErrorCode};
use std::sync::Arc;
use std::time::Duration;

fn reader(conn: u64) -> SessionOwner {
    SessionOwner {
        access: OpenAccess::Read,
        ..owner(conn)
    }
}

/// Server A dies with a file open for writing and one open for reading that B then
/// unlinks: nothing changes within the grace; after it, B frees the unlinked file and
/// marks the written one's tail, and leaves its own session alone.
#[test]
fn a_dead_servers_sessions_end_a_grace_after_its_live_key_went() {
    let (_h, hooked, a, b) = two();
    let written = touch(&b, ROOT, "w").ino;
    let gone = touch(&b, ROOT, "g").ino;
    let kept = touch(&b, ROOT, "k").ino;
    a.open_inode(written, false, owner(5)).unwrap();
    a.open_inode(gone, false, reader(5)).unwrap();
    let mine = b.open_inode(kept, false, reader(7)).unwrap().session;
    unlink(&b, b"g");
    lose_live_key(&hooked, &a);
    drop(a);
    let t0 = b.now();
    assert_eq!(b.sweep_dead_servers(t0).unwrap(), 0, "within the grace");
    assert!(b.getattr(gone).is_ok(), "freed within the grace");
    let later = t0 + grace();
    assert_eq!(b.sweep_dead_servers(later).unwrap(), 2);
    assert_eq!(b.getattr(gone).unwrap_err().code(), ErrorCode::NotFound);
    let engine = &hooked.inner;
    assert!(
        engine.get(&keys::tail(written)).unwrap().is_some(),
        "no tail mark"
    );
    assert!(engine.get(&keys::openers(written)).unwrap().is_none());
    assert!(engine.get(&keys::tail(kept)).unwrap().is_none());
    assert!(
        engine.get(&keys::openers(kept)).unwrap().is_some(),
        "B's own ended"
    );
    assert_eq!(b.sweep_dead_servers(later).unwrap(), 0, "ended twice");
    b.release(mine, None).unwrap();
    assert_eq!(b.check_namespace().unwrap(), Vec::<String>::new());
}

/// A client whose server died takes its session back on B within the grace: B holds it
/// from then on, its sweep leaves it, and the unlinked file lives until B's close.
#[test]
fn a_session_taken_back_from_a_dead_server_is_not_ended_with_it() {
    let (_h, hooked, a, b) = two();
    let ino = touch(&b, ROOT, "f").ino;
    let session = a.open_inode(ino, false, owner(5)).unwrap().session;
    lose_live_key(&hooked, &a);
    drop(a);
    let back = proto::meta::fs::OpenSession {
        session,
        ino,
        writes: true,
        grant: None,
    };
    let r = b
        .resume(ClientId(1), &[back], ConnId(9), &caller())
        .unwrap();
    assert!(r.lost.is_empty(), "{:?}", r.lost);
    unlink(&b, b"f");
    let t0 = b.now();
    assert_eq!(b.sweep_dead_servers(t0).unwrap(), 0);
    assert_eq!(b.sweep_dead_servers(t0 + grace()).unwrap(), 0);
    assert!(
        b.getattr(ino).is_ok(),
        "freed under the session B took back"
    );
    b.release(session, None).unwrap();
    assert_eq!(b.getattr(ino).unwrap_err().code(), ErrorCode::NotFound);
    assert!(hooked.inner.get(&keys::tail(ino)).unwrap().is_none());
    assert_eq!(b.check_namespace().unwrap(), Vec::<String>::new());
}

/// Guards against a server that stalled past its lease handing out sessions that the
/// others, having found it dead, would never end: its opens fail, with a clear reason,
/// and leave no trace in the file's key.
#[test]
fn a_server_whose_live_key_went_gives_no_session() {
    let (_h, hooked, a, b) = two();
    let ino = touch(&b, ROOT, "f").ino;
    lose_live_key(&hooked, &a);
    let r = a.retry_conflicts("open", || a.open_inode(ino, false, owner(5)));
    match r {
        Err(MetaError::Store(KvError::Unavailable { message, .. })) => {
            assert!(message.contains("live key"), "{message}")
        }
        other => panic!("expected the server's key gone, got {other:?}"),
    }
    assert!(hooked.inner.get(&keys::openers(ino)).unwrap().is_none());
    // B, alive, opens as before.
    let s = b.open_inode(ino, false, owner(7)).unwrap().session;
    b.release(s, None).unwrap();
}

/// On etcd: each server's live key is held under a lease that outlives its length
/// while the server runs, and goes when it stops; the other server then ends
/// what it held (a file unlinked while open there is freed).
#[test]
fn on_etcd_a_servers_live_key_lasts_while_it_runs_and_its_sessions_end_after() {
    if !LocalEtcd::present_for_tests() {
        return;
    }
    let (_etcd, config) = short_lease_etcd("sweep");
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = etcd_pair(&config, dir.path());
    let ino = touch(&b, ROOT, "f").ino;
    a.open_inode(ino, false, reader(5)).unwrap();
    unlink(&b, b"f");
    // 3 s: a lease of 1 s asked (etcd grants at least 2 s), renewed a few times.
    std::thread::sleep(Duration::from_millis(3000));
    assert_eq!(b.sweep_dead_servers(b.now()).unwrap(), 0);
    assert!(b.getattr(ino).is_ok(), "ended while its server ran");
    assert!(!a.live_key_lost());
    drop(a);
    assert_eq!(b.sweep_dead_servers(b.now()).unwrap(), 1);
    assert_eq!(b.getattr(ino).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(b.check_namespace().unwrap(), Vec::<String>::new());
}

/// Guards against a take-back working only from an older server to a younger one:
/// B started after A, so B's session ids are above A's first one, which made A answer
/// them lost as "its own, ended".
#[test]
fn a_session_is_taken_back_on_a_server_that_started_earlier() {
    let (_h, _hooked, a, b) = two();
    let ino = touch(&b, ROOT, "f").ino;
    let session = b.open_inode(ino, false, reader(5)).unwrap().session;
    b.connection_broken(ConnId(5));
    let r = a
        .resume(
            ClientId(1),
            &[taken_back(session, ino)],
            ConnId(9),
            &caller(),
        )
        .unwrap();
    assert!(r.lost.is_empty(), "{:?}", r.lost);
    assert_eq!(b.expire_detached(b.now() + Duration::from_secs(3600)), 1);
    unlink(&b, b"f");
    assert!(
        a.getattr(ino).is_ok(),
        "freed under the session A took back"
    );
    a.release(session, None).unwrap();
    assert_eq!(a.getattr(ino).unwrap_err().code(), ErrorCode::NotFound);
}

/// Guards against a session that went A -> B -> A being freed under A: A still had it
/// in memory (its connection's grace running) and took it back without naming itself
/// in the key, which named B; B's grace then took it out of the key.
#[test]
fn a_session_taken_back_and_back_again_stays_named() {
    let (_h, _hooked, a, b) = two();
    let ino = touch(&a, ROOT, "f").ino;
    let session = a.open_inode(ino, false, reader(5)).unwrap().session;
    a.connection_broken(ConnId(5));
    let r = b
        .resume(
            ClientId(1),
            &[taken_back(session, ino)],
            ConnId(9),
            &caller(),
        )
        .unwrap();
    assert!(r.lost.is_empty(), "{:?}", r.lost);
    b.connection_broken(ConnId(9));
    let r = a
        .resume(
            ClientId(1),
            &[taken_back(session, ino)],
            ConnId(6),
            &caller(),
        )
        .unwrap();
    assert!(r.lost.is_empty(), "{:?}", r.lost);
    assert_eq!(b.expire_detached(b.now() + Duration::from_secs(3600)), 1);
    unlink(&b, b"f");
    assert!(a.getattr(ino).is_ok(), "freed under the session back on A");
    a.release(session, None).unwrap();
    assert_eq!(a.getattr(ino).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(a.check_namespace().unwrap(), Vec::<String>::new());
}

/// The same, but B's grace ran out before the client came back to A: the session
/// ended there, so A answers it lost (and forgets it), and the unlinked file is freed.
#[test]
fn a_session_ended_where_it_was_taken_is_lost_on_the_way_back() {
    let (_h, _hooked, a, b) = two();
    let ino = touch(&a, ROOT, "f").ino;
    let session = a.open_inode(ino, false, reader(5)).unwrap().session;
    a.connection_broken(ConnId(5));
    b.resume(
        ClientId(1),
        &[taken_back(session, ino)],
        ConnId(9),
        &caller(),
    )
    .unwrap();
    b.connection_broken(ConnId(9));
    assert_eq!(b.expire_detached(b.now() + Duration::from_secs(3600)), 1);
    let r = a
        .resume(
            ClientId(1),
            &[taken_back(session, ino)],
            ConnId(6),
            &caller(),
        )
        .unwrap();
    assert_eq!(r.lost, vec![session]);
    unlink(&a, b"f");
    assert_eq!(a.getattr(ino).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(a.check_namespace().unwrap(), Vec::<String>::new());
}

/// Guards against a server that started during a sweep being taken for a dead one
/// from that moment: C registers and opens a file between A's list of the live keys
/// and its read of the `P` keys, then dies a second later. Its grace counts from when
/// A first found its key gone, not from the sweep that saw it start.
#[test]
fn a_server_that_starts_during_a_sweep_gets_its_whole_grace() {
    let (h, hooked, a, b) = two();
    let ino = touch(&b, ROOT, "f").ino;
    let c_slot: Arc<parking_lot::Mutex<Option<Namespace>>> = Default::default();
    let (slot, engine) = (c_slot.clone(), hooked.inner.clone());
    *hooked.hook.lock() = Some((
        keys::server_prefix(),
        0,
        Box::new(move || {
            let c =
                Namespace::open_shared(engine, NamespaceConfig::default(), Arc::new(SystemClock))
                    .unwrap();
            c.open_inode(ino, false, reader(3)).unwrap();
            *slot.lock() = Some(c);
        }),
    ));
    let t0 = a.now();
    assert_eq!(a.sweep_dead_servers(t0).unwrap(), 0);
    let c = c_slot.lock().take().expect("the hook ran");
    lose_live_key(&hooked, &c);
    drop(c);
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(a.sweep_dead_servers(t1).unwrap(), 0);
    assert_eq!(
        a.sweep_dead_servers(t0 + grace()).unwrap(),
        0,
        "C's grace cut short"
    );
    assert_eq!(a.sweep_dead_servers(t1 + grace()).unwrap(), 1);
    drop((h, b));
}

/// On etcd, a server killed (its lease not revoked, not renewed) keeps its live key
/// until the lease runs out; the other server then ends its sessions.
#[test]
fn on_etcd_a_killed_servers_sessions_end_once_its_lease_ran_out() {
    if !LocalEtcd::present_for_tests() {
        return;
    }
    let (_etcd, config) = short_lease_etcd("sweep-kill");
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = etcd_pair(&config, dir.path());
    let ino = touch(&b, ROOT, "f").ino;
    a.open_inode(ino, false, reader(5)).unwrap();
    unlink(&b, b"f");
    let t = std::time::Instant::now();
    a.crash();
    assert_eq!(
        b.sweep_dead_servers(b.now()).unwrap(),
        0,
        "ended before its lease ran out"
    );
    let mut ended = 0;
    while ended == 0 && t.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(250));
        ended = b.sweep_dead_servers(b.now()).unwrap();
    }
    assert_eq!(ended, 1, "not ended within 15 s");
    assert_eq!(b.getattr(ino).unwrap_err().code(), ErrorCode::NotFound);
    eprintln!("ended {:?} after the kill", t.elapsed());
}

/// Two servers on a new shared namespace under `config` (three data servers registered
/// first by one server alone: a new shared namespace forms no chains yet), with no
/// session grace.
fn etcd_pair(config: &EtcdConfig, dir: &std::path::Path) -> (Namespace, Namespace) {
    {
        let store: Arc<dyn KvStore> = open_engine(StoreKind::Etcd, dir, config).unwrap();
        let ns = Namespace::open(store, NamespaceConfig::default()).unwrap();
        for i in 0..3 {
            ns.register_data(None, &format!("10.0.0.{i}:7000"), 1000, 10)
                .unwrap();
        }
        ns.sync().unwrap();
    }
    let open = || {
        let engine = open_engine(StoreKind::Etcd, dir, config).unwrap();
        let ns = NamespaceConfig {
            session_grace_ms: 0,
            ..NamespaceConfig::default()
        };
        Namespace::open_shared(engine, ns, Arc::new(SystemClock)).unwrap()
    };
    (open(), open())
}

/// Guards against a server whose live key went answering a take-back "lost": the
/// session still stands in its file's key, and the client must try elsewhere, so the
/// resume fails instead.
#[test]
fn a_take_back_on_a_server_whose_live_key_went_fails_rather_than_lose_the_session() {
    let (_h, hooked, a, b) = two();
    let ino = touch(&b, ROOT, "f").ino;
    let session = b.open_inode(ino, false, reader(5)).unwrap().session;
    b.connection_broken(ConnId(5));
    lose_live_key(&hooked, &a);
    let r = a.resume(
        ClientId(1),
        &[taken_back(session, ino)],
        ConnId(9),
        &caller(),
    );
    match r {
        Err(MetaError::Store(KvError::Unavailable { message, .. })) => {
            assert!(message.contains("live key"), "{message}")
        }
        other => panic!("expected the server's key gone, got {other:?}"),
    }
    let r = b
        .resume(
            ClientId(1),
            &[taken_back(session, ino)],
            ConnId(6),
            &caller(),
        )
        .unwrap();
    assert!(r.lost.is_empty(), "{:?}", r.lost);
}

/// The test etcd (kept by the caller) and a prefix `name-PID/` on it with a lease of
/// 1 s asked (etcd grants at least 2 s).
fn short_lease_etcd(name: &str) -> (Arc<LocalEtcd>, EtcdConfig) {
    let etcd = LocalEtcd::shared().expect("starting etcd");
    let config = EtcdConfig {
        prefix: format!("{name}-{}/", std::process::id()),
        owner_lease_ms: 1000,
        ..etcd.config()
    };
    (etcd, config)
}
