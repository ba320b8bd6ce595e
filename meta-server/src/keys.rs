//! The metadata server's keys: the verifier its listener checks every handshake with
//! (the cluster key for servers, the stored client keys for clients), and the requests
//! that manage client keys (admin) or hand one to a data server (cluster).

use crate::namespace::{ClientRecord, Namespace};
use crate::MetaError;
use proto::auth::{check_peer_name, Caps};
use proto::meta::admin::{KeyCreate, KeyInfo, KeyRevoke};
use proto::meta::cluster::{ClientKey as ClientKeyReq, ClientKeyAnswer};
use proto::{ErrorCode, WireError};
use std::sync::{Arc, OnceLock, Weak};
use tracing::info;
use transport::auth::ClientKey;
use transport::{Key, KeyTable, Listener, PeerIdentity, Role};

/// The name of the administrator's key given in the configuration (`admin_key_file`).
pub const ADMIN_NAME: &str = "admin";

/// Keys and the listener whose connections a revocation closes.
pub struct Keys {
    table: Arc<KeyTable>,
    listener: OnceLock<Weak<Listener>>,
}

impl Keys {
    /// The verifier's table: the cluster key, every stored client key, and the
    /// administrator's key from the configuration (all capabilities, not stored).
    pub fn load(ns: &Namespace, cluster: Key, admin: Option<Key>) -> Result<Keys, MetaError> {
        let table = Arc::new(KeyTable::new(cluster));
        for (name, rec) in ns.client_keys()? {
            let Some(key) = Key::from_hex(&rec.key_hex) else {
                return Err(MetaError::Corrupt(format!(
                    "client key {name}: not 64 hex digits"
                )));
            };
            let (caps, revoked) = (rec.caps, rec.revoked);
            table.insert(&name, ClientKey { key, caps, revoked });
        }
        if let Some(key) = admin {
            let caps = Caps {
                root_squash: false,
                admin: true,
                ..Caps::default()
            };
            let revoked = false;
            table.insert(ADMIN_NAME, ClientKey { key, caps, revoked });
        }
        Ok(Keys {
            table,
            listener: OnceLock::new(),
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

    /// Makes and stores a client key; answers it in hex.
    pub fn create(&self, ns: &Namespace, req: KeyCreate) -> Result<String, WireError> {
        check_peer_name(&req.name).map_err(|e| invalid(&e))?;
        if req.name == ADMIN_NAME || !req.caps.path.starts_with(b"/") {
            return Err(invalid(
                "the name 'admin' is the configured key's; paths start at /",
            ));
        }
        let key = Key::generate().map_err(|e| WireError::new(ErrorCode::Io, e.to_string()))?;
        let rec = ClientRecord {
            key_hex: key.to_hex(),
            caps: req.caps.clone(),
            revoked: false,
        };
        ns.add_client_key(&req.name, &rec)?;
        let (caps, revoked) = (req.caps, false);
        self.table
            .insert(&req.name, ClientKey { key, caps, revoked });
        info!(name = %req.name, "client key created");
        Ok(rec.key_hex)
    }

    /// Every stored client key, without the keys.
    pub fn list(&self, ns: &Namespace) -> Result<Vec<KeyInfo>, WireError> {
        Ok(ns
            .client_keys()?
            .into_iter()
            .map(|(name, r)| KeyInfo {
                name,
                caps: r.caps,
                revoked: r.revoked,
            })
            .collect())
    }

    /// Revokes a client key and closes its connections at once.
    pub fn revoke(&self, ns: &Namespace, req: KeyRevoke) -> Result<(), WireError> {
        ns.revoke_client_key(&req.name)?;
        self.table.revoke(&req.name);
        let closed = self
            .listener
            .get()
            .and_then(Weak::upgrade)
            .map_or(0, |l| l.close_peer(&req.name));
        info!(name = %req.name, closed, "client key revoked, its connections closed");
        Ok(())
    }

    /// A client's key for a data server checking its handshake.
    pub fn for_data_server(&self, req: &ClientKeyReq) -> ClientKeyAnswer {
        match self.table.lookup_now(&req.name) {
            transport::auth::Lookup::Known {
                key,
                role: Role::Client(caps),
            } => ClientKeyAnswer::Known {
                key_hex: key.to_hex(),
                caps,
            },
            transport::auth::Lookup::Revoked => ClientKeyAnswer::Revoked,
            _ => ClientKeyAnswer::Unknown,
        }
    }
}

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

/// Whether the peer is a server of the cluster (may ask for client keys).
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
