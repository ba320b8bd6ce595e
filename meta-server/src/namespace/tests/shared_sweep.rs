//! Metadata servers that die on a shared engine: their sessions stay named in the
//! files' `P` keys until a live server ends them, a grace after their live key went
//! (see `sweep`); a server whose own key went gives no session.

use super::shared_races::{two, unlink, Hooked};
use super::{caller, owner, touch, ROOT};
use crate::clock::SystemClock;
use crate::config::NamespaceConfig;
use crate::error::MetaError;
use crate::kv::etcd::local::LocalEtcd;
use crate::kv::{open_engine, EtcdConfig, KvError, KvStore, StoreKind, WriteBatch};
use crate::namespace::{keys, ConnId, Namespace, SessionOwner};
use proto::meta::OpenAccess;
use proto::{ClientId, ErrorCode};
use std::sync::Arc;
use std::time::Duration;

/// Takes `ns`'s live key out of the engine, as its lease running out does on etcd.
fn lose_live_key(hooked: &Hooked, ns: &Namespace) {
    let mut b = WriteBatch::new();
    b.delete(keys::server(ns.server_id().unwrap()));
    hooked.inner.commit(b).unwrap();
}

fn reader(conn: u64) -> SessionOwner {
    SessionOwner {
        access: OpenAccess::Read,
        ..owner(conn)
    }
}

fn grace() -> Duration {
    Duration::from_millis(NamespaceConfig::default().session_grace_ms)
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

/// On etcd: each server's live key is held under a lease that outlives several lease
/// periods while the server runs, and goes when it stops; the other server then ends
/// what it held (a file unlinked while open there is freed).
#[test]
fn on_etcd_a_servers_live_key_lasts_while_it_runs_and_its_sessions_end_after() {
    if !LocalEtcd::present_for_tests() {
        return;
    }
    let etcd = LocalEtcd::shared().expect("starting etcd");
    let config = EtcdConfig {
        prefix: format!("sweep-{}/", std::process::id()),
        owner_lease_ms: 1000,
        ..etcd.config()
    };
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        let engine = open_engine(StoreKind::Etcd, dir.path(), &config).unwrap();
        let ns = NamespaceConfig {
            session_grace_ms: 0,
            ..NamespaceConfig::default()
        };
        Namespace::open_shared(engine, ns, Arc::new(SystemClock)).unwrap()
    };
    {
        // Data servers first, registered by one server alone (a new shared namespace
        // forms no chains yet).
        let store: Arc<dyn KvStore> = open_engine(StoreKind::Etcd, dir.path(), &config).unwrap();
        let ns = Namespace::open(store, NamespaceConfig::default()).unwrap();
        for i in 0..3 {
            ns.register_data(None, &format!("10.0.0.{i}:7000"), 1000, 10)
                .unwrap();
        }
        ns.sync().unwrap();
    }
    let (a, b) = (open(), open());
    let ino = touch(&b, ROOT, "f").ino;
    a.open_inode(ino, false, reader(5)).unwrap();
    unlink(&b, b"f");
    // Three lease periods: renewed, not expired.
    std::thread::sleep(Duration::from_millis(3000));
    assert_eq!(b.sweep_dead_servers(b.now()).unwrap(), 0);
    assert!(b.getattr(ino).is_ok(), "ended while its server ran");
    assert!(!a.live_key_lost());
    drop(a);
    assert_eq!(b.sweep_dead_servers(b.now()).unwrap(), 1);
    assert_eq!(b.getattr(ino).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(b.check_namespace().unwrap(), Vec::<String>::new());
}
