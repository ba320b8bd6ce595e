//! Client key records: the revocation list data servers pull (every revoked or
//! superseded key, once, in order, across restarts) and records of the format that
//! stored the key itself, refused with one line.

use super::{engine_tests, H};
use crate::kv::{StoreKind, WriteBatch};
use crate::namespace::{keys, ClientRecord, StoredClient};
use proto::auth::{Caps, KeyId};
use proto::meta::cluster::Revoked;
use serde::Serialize;

fn id(n: u8) -> KeyId {
    KeyId([n; 16])
}

fn revoked(name: &str, n: u8) -> Revoked {
    Revoked {
        name: name.into(),
        key_id: id(n),
    }
}

/// Guards against a revoked key, or the previous key of a name made again, missing from
/// the list the data servers pull (it would stay valid there), or one listed twice.
fn revocations_list_each_revoked_or_superseded_key_once_in_order(kind: StoreKind) {
    let mut h = H::new(kind);
    let ns = h.ns();
    ns.put_client_key("alice", &ClientRecord::new(id(1), Caps::default()), true)
        .unwrap();
    ns.put_client_key("bob", &ClientRecord::new(id(2), Caps::default()), true)
        .unwrap();
    assert_eq!(ns.revocations(0, 10).unwrap(), (vec![], true));
    ns.revoke_client_key("bob").unwrap();
    ns.put_client_key("alice", &ClientRecord::new(id(3), Caps::default()), true)
        .unwrap();
    ns.revoke_client_key("alice").unwrap();
    ns.revoke_client_key("alice").unwrap();
    ns.put_client_key("bob", &ClientRecord::new(id(4), Caps::default()), true)
        .unwrap();
    let want = vec![
        (1, revoked("bob", 2)),
        (2, revoked("alice", 1)),
        (3, revoked("alice", 3)),
    ];
    let (first, done) = ns.revocations(0, 2).unwrap();
    assert_eq!((first.as_slice(), done), (&want[..2], false));
    assert_eq!(ns.revocations(2, 2).unwrap(), (want[2..].to_vec(), true));
    h.restart();
    assert_eq!(h.ns().revocations(0, 10).unwrap(), (want.clone(), true));
    h.ns().revoke_client_key("bob").unwrap();
    let (after, _) = h.ns().revocations(3, 10).unwrap();
    assert_eq!(
        after,
        vec![(4, revoked("bob", 4))],
        "versions go on after a restart"
    );
}

/// The record of a client key as the previous format stored it.
#[derive(Serialize)]
struct StoredKey {
    key_hex: String,
    caps: Caps,
    revoked: bool,
}

/// Guards against a store of the previous format (keys stored, not derived) panicking
/// the server or letting its keys in: such a record reads as refused, to be made again.
fn a_record_of_a_stored_key_is_refused_to_be_made_again(kind: StoreKind) {
    let mut h = H::new(kind);
    let old = StoredKey {
        key_hex: "ab".repeat(32),
        caps: Caps::default(),
        revoked: false,
    };
    let mut batch = WriteBatch::new();
    batch.put(
        keys::client_key("old"),
        crate::namespace::records::encode(&old).unwrap(),
    );
    h.store().commit(batch).unwrap();
    h.restart();
    let stored = StoredClient::Stored {
        caps: Caps::default(),
        revoked: false,
    };
    assert_eq!(h.ns().client_key("old").unwrap(), Some(stored));
    let err = h.ns().revoke_client_key("old").unwrap_err().to_string();
    assert!(err.contains("tessera key create"), "{err}");
    let cluster = transport::Key::generate().unwrap();
    let table = crate::keys::Keys::load(h.ns(), cluster.clone())
        .unwrap()
        .table();
    let file = transport::ClientKeyFile::derive(&cluster, "old", id(5), Caps::default());
    let found = table.lookup_now("old", Some(&file.claim));
    assert!(
        matches!(
            found,
            transport::auth::Lookup::Refused {
                why: "unknown client",
                ..
            }
        ),
        "{found:?}"
    );
    h.ns()
        .put_client_key("old", &ClientRecord::new(id(5), Caps::default()), true)
        .unwrap();
    assert!(matches!(
        h.ns().client_key("old").unwrap(),
        Some(StoredClient::Derived(_))
    ));
}

/// Guards against a mistyped `key create` revoking a team's valid key, and a "new" key
/// reusing the current id (it revoked nothing and kept the old connections).
fn a_valid_key_is_replaced_only_when_asked(kind: StoreKind) {
    let h = H::new(kind);
    let ns = h.ns();
    let rec = |n| ClientRecord::new(id(n), Caps::default());
    ns.put_client_key("alice", &rec(1), false).unwrap();
    let err = ns.put_client_key("alice", &rec(2), false).unwrap_err();
    assert!(err.to_string().contains("--replace"), "{err}");
    let err = ns.put_client_key("alice", &rec(1), true).unwrap_err();
    assert!(err.to_string().contains("current one"), "{err}");
    assert_eq!(ns.revocations(0, 10).unwrap(), (vec![], true));
    ns.put_client_key("alice", &rec(2), true).unwrap();
    assert_eq!(
        ns.revocations(0, 10).unwrap().0,
        vec![(1, revoked("alice", 1))]
    );
    ns.revoke_client_key("alice").unwrap();
    ns.put_client_key("alice", &rec(3), false).unwrap();
}

/// Guards against a rotated cluster key leaving the revocation list full for good
/// (it only grew) and the previous key's records valid.
fn a_new_cluster_key_revokes_every_client_key_and_empties_the_list(kind: StoreKind) {
    let mut h = H::new(kind);
    let rec = |n| ClientRecord::new(id(n), Caps::default());
    assert_eq!(h.ns().adopt_cluster_key(b"one").unwrap(), None);
    h.ns().put_client_key("alice", &rec(1), false).unwrap();
    h.ns().put_client_key("bob", &rec(2), false).unwrap();
    h.ns().revoke_client_key("bob").unwrap();
    assert_eq!(h.ns().adopt_cluster_key(b"one").unwrap(), None);
    assert_eq!(h.ns().revocations(0, 10).unwrap().0.len(), 1);
    h.restart();
    assert_eq!(h.ns().adopt_cluster_key(b"two").unwrap(), Some(1));
    assert_eq!(h.ns().revocations(0, 10).unwrap(), (vec![], true));
    let alice = h.ns().client_key("alice").unwrap();
    assert!(matches!(alice, Some(StoredClient::Derived(r)) if r.revoked));
    h.restart();
    assert_eq!(h.ns().adopt_cluster_key(b"two").unwrap(), None);
    h.ns().put_client_key("alice", &rec(3), false).unwrap();
}

engine_tests!(
    revocations_list_each_revoked_or_superseded_key_once_in_order,
    a_record_of_a_stored_key_is_refused_to_be_made_again,
    a_valid_key_is_replaced_only_when_asked,
    a_new_cluster_key_revokes_every_client_key_and_empties_the_list,
);
