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
    ns.put_client_key("alice", &ClientRecord::new(id(1), Caps::default()))
        .unwrap();
    ns.put_client_key("bob", &ClientRecord::new(id(2), Caps::default()))
        .unwrap();
    assert_eq!(ns.revocations(0, 10).unwrap(), (vec![], true));
    ns.revoke_client_key("bob").unwrap();
    ns.put_client_key("alice", &ClientRecord::new(id(3), Caps::default()))
        .unwrap();
    ns.revoke_client_key("alice").unwrap();
    ns.revoke_client_key("alice").unwrap();
    ns.put_client_key("bob", &ClientRecord::new(id(4), Caps::default()))
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
        .put_client_key("old", &ClientRecord::new(id(5), Caps::default()))
        .unwrap();
    assert!(matches!(
        h.ns().client_key("old").unwrap(),
        Some(StoredClient::Derived(_))
    ));
}

engine_tests!(
    revocations_list_each_revoked_or_superseded_key_once_in_order,
    a_record_of_a_stored_key_is_refused_to_be_made_again,
);
