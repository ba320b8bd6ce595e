//! The metadata server's keys: the verifier its listener checks every handshake with
//! (the cluster key for servers; for clients, the key derived from it for their claim,
//! checked against the stored record of their name), the requests that manage client
//! keys (admin), and the revocation list the data servers pull (cluster).

use crate::namespace::{ClientRecord, Namespace, StoredClient};
use crate::MetaError;
use proto::auth::{check_caps_path, check_peer_name, KeyId, ADMIN_NAME};
use proto::meta::admin::{KeyCreate, KeyInfo, KeyRevoke};
use proto::meta::cluster::{RevocationPage, Revocations, MAX_REVOCATIONS_PER_PAGE};
use proto::{ErrorCode, WireError};
use std::sync::{Arc, OnceLock, Weak};
use tracing::{info, warn};
use transport::auth::KeyRecord;
use transport::{Key, KeyTable, Listener, PeerIdentity, Role};

/// Keys and the listener whose connections a revocation closes.
pub struct Keys {
    table: Arc<KeyTable>,
    listener: OnceLock<Weak<Listener>>,
    /// Held across a key change's store write and its table update, so that two
    /// changes of one name (two creates, a create and a revoke) reach the store and
    /// the table in the same order.
    changes: parking_lot::Mutex<()>,
    /// This start's epoch of the revocation list (see `RevocationPage::epoch`).
    epoch: u64,
}

impl Keys {
    /// The verifier's table: the cluster key and every stored client record. A record
    /// of the previous format (a stored key, not a derived one) is left out, so its
    /// client is refused, with one line telling the operator to make it again.
    pub fn load(ns: &Namespace, cluster: Key) -> Result<Keys, MetaError> {
        let mark = proto::mac::tag(cluster.bytes(), &[CLUSTER_MARK_DOMAIN]);
        if let Some(marked) = ns.adopt_cluster_key(&mark)? {
            warn!(
                revoked = marked,
                "the cluster key changed: every client key made under the previous one is \
                 revoked and the revocation list emptied; make each again with \
                 `tessera key create NAME --replace ...`"
            );
        }
        // Random per start (the standard library seeds RandomState from the OS); it
        // need not be secret, only differ from the previous start's.
        let epoch = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            std::time::SystemTime::now(),
        );
        let table = Arc::new(KeyTable::new(cluster));
        for (name, rec) in ns.client_keys()? {
            match rec {
                StoredClient::Derived(r) => {
                    let (key_id, caps, revoked) = (r.key_id, r.caps, r.revoked);
                    table.insert(
                        &name,
                        KeyRecord {
                            key_id,
                            caps,
                            revoked,
                        },
                    );
                }
                StoredClient::Stored { revoked: true, .. } => {}
                StoredClient::Stored { .. } => warn!(
                    "client key '{name}' was made by an older Tessera, which stored the key \
                     itself; keys are derived now, so it is refused: make it again with \
                     `tessera key create {name} ...` and hand out the new key file"
                ),
            }
        }
        Ok(Keys {
            table,
            listener: OnceLock::new(),
            changes: parking_lot::Mutex::new(()),
            epoch,
        })
    }

    /// The verifier for the listener.
    pub fn table(&self) -> Arc<KeyTable> {
        self.table.clone()
    }

    /// Tells the keys the listener, so a revocation can close connections.
    pub fn set_listener(&self, listener: &Arc<Listener>) {
        let _ = self.listener.set(Arc::downgrade(listener));
    }

    fn listener(&self) -> Option<Arc<Listener>> {
        self.listener.get().and_then(Weak::upgrade)
    }

    /// Records a client key its administrator derived: name, id and capabilities. A
    /// name that holds a valid key is refused unless the request says `replace` (so
    /// that a mistyped name revokes no one's key); replaced, the previous key is
    /// revoked, on the list the data servers pull, and its connections here are closed
    /// at once.
    pub fn create(&self, ns: &Namespace, req: KeyCreate) -> Result<(), WireError> {
        check_peer_name(&req.name).map_err(|e| invalid(&e))?;
        check_caps_path(&req.caps.path).map_err(|e| invalid(&e))?;
        if req.name == ADMIN_NAME || req.key_id == KeyId::ADMIN {
            return Err(invalid(
                "the name 'admin' and the key id of zeros are the administrator's",
            ));
        }
        if req.name.starts_with(proto::auth::SERVER_NAME_PREFIX) {
            return Err(invalid("names starting with 'server/' are the servers'"));
        }
        let rec = ClientRecord::new(req.key_id, req.caps.clone());
        let _order = self.changes.lock();
        ns.put_client_key(&req.name, &rec, req.replace)?;
        let record = KeyRecord {
            key_id: req.key_id,
            caps: req.caps,
            revoked: false,
        };
        // Recorded first, closed second (see `transport::auth::Verifier::revoked`).
        let old = self.table.insert(&req.name, record);
        let closed = match (old, self.listener()) {
            (Some(old), Some(l)) if old.key_id != req.key_id => l.close_key(&req.name, &old.key_id),
            _ => 0,
        };
        info!(name = %req.name, key_id = %req.key_id, closed, "client key created");
        Ok(())
    }

    /// Every stored client key, without the keys.
    pub fn list(&self, ns: &Namespace) -> Result<Vec<KeyInfo>, WireError> {
        Ok(ns
            .client_keys()?
            .into_iter()
            .map(|(name, r)| match r {
                StoredClient::Derived(r) => KeyInfo {
                    name,
                    caps: r.caps,
                    key_id: Some(r.key_id),
                    revoked: r.revoked,
                },
                // Refused since keys are derived: listed as revoked, to be made again.
                StoredClient::Stored { caps, .. } => KeyInfo {
                    name,
                    caps,
                    key_id: None,
                    revoked: true,
                },
            })
            .collect())
    }

    /// Revokes a client key and closes its connections at once.
    pub fn revoke(&self, ns: &Namespace, req: KeyRevoke) -> Result<(), WireError> {
        let _order = self.changes.lock();
        ns.revoke_client_key(&req.name)?;
        // Recorded first, closed second (see `transport::auth::Verifier::revoked`).
        self.table.revoke(&req.name);
        let closed = self.listener().map_or(0, |l| l.close_peer(&req.name));
        info!(name = %req.name, closed, "client key revoked, its connections closed");
        Ok(())
    }
}

impl Keys {
    /// The revocations a data server has not seen, from the store, with this start's
    /// epoch.
    pub fn revocations(
        &self,
        ns: &Namespace,
        req: &Revocations,
    ) -> Result<RevocationPage, WireError> {
        let (page, done) = ns.revocations(req.since, MAX_REVOCATIONS_PER_PAGE)?;
        let version = page.last().map_or(req.since, |(v, _)| *v);
        Ok(RevocationPage {
            revoked: page.into_iter().map(|(_, r)| r).collect(),
            version,
            done,
            epoch: self.epoch,
        })
    }
}

/// What the cluster key's mark in the store is a MAC of.
const CLUSTER_MARK_DOMAIN: &[u8] = b"tessera cluster key mark 1";

fn invalid(why: &str) -> WireError {
    WireError::new(ErrorCode::InvalidArgument, why.to_string())
}

/// Whether the peer may call admin requests: a client with the admin capability (or no
/// authentication at all: a server without keys trusts everyone, as it always did).
pub fn may_administer(who: Option<&PeerIdentity>) -> bool {
    match who.map(|w| &w.role) {
        None => true,
        Some(Role::Client(caps)) => caps.admin,
        Some(Role::Server) => false,
    }
}

/// Whether the peer is a server of the cluster (may pull the revocation list).
pub fn is_server(who: Option<&PeerIdentity>) -> bool {
    matches!(who.map(|w| &w.role), Some(Role::Server))
}

/// The refusal of a request the peer may not make.
pub fn not_permitted(what: &str) -> WireError {
    WireError::new(
        ErrorCode::NotPermitted,
        format!("{what} is not permitted to this key"),
    )
}
