//! The disk guard (`space.rs`), through the request path where it sits.

use super::*;
use crate::namespace::Handle;
use proto::meta::fs;

fn call<R: Handle>(ns: &Namespace, req: R) -> Result<(), ErrorCode> {
    ns.handle(req, ConnId(1)).map(drop).map_err(|e| e.code)
}

fn mkdir_req(name: &str) -> fs::Mkdir {
    fs::Mkdir {
        parent: ROOT,
        name: name.into(),
        perm: 0o755,
    }
}

fn symlink_req(name: &str) -> fs::Symlink {
    fs::Symlink {
        parent: ROOT,
        name: name.into(),
        target: b"elsewhere".to_vec(),
    }
}

#[test]
fn a_disk_short_of_room_refuses_new_records_and_takes_deletions() {
    // Guards against a full disk stopping every change: records are refused first, and
    // deletions, which make room, still go through.
    let mut h = H::new(StoreKind::Redb);
    let guarded = |h: &H| {
        let store = h.open_store();
        Namespace::open(store, h.config.clone())
            .unwrap()
            .with_disk_guard(h.dir.path().to_path_buf())
    };
    h.stop();
    h.config.disk_reserve_bytes = 0;
    let ns = guarded(&h);
    call(&ns, mkdir_req("d")).unwrap();
    call(&ns, symlink_req("l")).unwrap();
    drop(ns);

    // More than any disk has free: always short of room.
    h.config.disk_reserve_bytes = u64::MAX / 2;
    let ns = guarded(&h);
    assert_eq!(call(&ns, mkdir_req("e")), Err(ErrorCode::NoSpace));
    assert_eq!(call(&ns, symlink_req("m")), Err(ErrorCode::NoSpace));
    let unlink = fs::Unlink {
        parent: ROOT,
        name: b"l".to_vec(),
    };
    call(&ns, unlink).unwrap();
    let rmdir = fs::Rmdir {
        parent: ROOT,
        name: b"d".to_vec(),
    };
    call(&ns, rmdir).unwrap();
    let look = |name: &[u8]| ns.lookup(ROOT, name).map(drop).map_err(|e| e.code());
    for name in [&b"d"[..], b"l", b"e", b"m"] {
        assert_eq!(look(name), Err(ErrorCode::NotFound), "{name:?}");
    }
}
