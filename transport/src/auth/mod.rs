//! Authentication of every connection: keys, the handshake, and the gate that keeps
//! requests from an application until their connection has authenticated.
//!
//! The handshake ([`proto::auth`]) is two ordinary calls on a fresh connection, so tcp,
//! rdma and mem carry it alike without backend code. An [`Endpoint`](crate::Endpoint)
//! given [`Credentials`] runs the client side in `connect`; one given a [`Verifier`]
//! wraps the handler of every listener in a gate that answers the handshake, marks the
//! connection with its [`PeerIdentity`], and only then hands requests to the application.
//! Traffic is authenticated, not encrypted.

mod gate;
mod handshake;
mod keys;

pub(crate) use gate::Gate;
pub(crate) use handshake::client_handshake;
pub use keys::{new_key_id, ClientKeyFile, Key, KEY_FILE_MODE};

use proto::auth::{Caps, Claim, KeyId};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// How long a new connection to a listener with a [`Verifier`] may take to authenticate
/// before it is closed, unless the endpoint sets another.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 5000;

/// Who the connecting side of an endpoint is: its name, its key, and for a client what
/// it claims (the key's id and capabilities, which its key was derived for).
#[derive(Clone)]
pub struct Credentials {
    /// A client's key name, or a server's `server/...` name.
    pub name: String,
    /// The client's key, or the cluster key for a server.
    pub key: Key,
    /// A client's key id and capabilities; `None` for a server.
    pub claim: Option<Claim>,
}

impl Credentials {
    /// A server's credentials: `server/<what>` with the cluster key.
    pub fn server(what: &str, cluster_key: Key) -> Credentials {
        Credentials {
            name: format!("{}{what}", proto::auth::SERVER_NAME_PREFIX),
            key: cluster_key,
            claim: None,
        }
    }

    /// A client's credentials, from its key file.
    pub fn client(file: ClientKeyFile) -> Credentials {
        Credentials {
            name: file.name,
            key: file.key,
            claim: Some(file.claim),
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({})", self.name)
    }
}

/// What an authenticated peer is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// A server of the cluster: it holds the cluster key.
    Server,
    /// A client with these capabilities.
    Client(Caps),
}

/// Who is at the other end of an authenticated connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The name it authenticated with.
    pub name: String,
    /// A client's key id (`None` for a server).
    pub key_id: Option<KeyId>,
    /// What it is.
    pub role: Role,
}

impl PeerIdentity {
    /// The key this peer holds, as one string: its name, and for a client its key id
    /// (`name#id`). A key made again under a name is another key: whatever is kept per
    /// key (a scope, the client ids it was given) is not inherited by the next one.
    pub fn key_label(&self) -> String {
        match &self.key_id {
            Some(id) => format!("{}#{id}", self.name),
            None => self.name.clone(),
        }
    }
}

/// What a [`Verifier`] knows of a `Hello`.
#[derive(Clone, Debug)]
pub enum Lookup {
    /// A valid claim: the key its proof must be made with and what it becomes.
    Known {
        /// The key its proof must be made with.
        key: Key,
        /// What it becomes once authenticated.
        role: Role,
    },
    /// Refused whatever the proof (an unknown name, a revoked or superseded key, other
    /// capabilities than the name's): `why` goes to the server's log. `key` is derived
    /// all the same and the proof checked against it, so that a refusal of a name costs
    /// what a wrong key costs (the time of an answer tells nothing of which names exist).
    Refused {
        /// The key derived for the claim.
        key: Key,
        /// The precise reason, for the log.
        why: &'static str,
    },
    /// Cannot tell now. The connection is closed as a server that is away would close
    /// it, so the peer tries again later instead of taking it as a refusal of its key.
    Unavailable,
}

/// The future a [`Verifier`] returns.
pub type LookupFuture = Pin<Box<dyn Future<Output = Lookup> + Send + 'static>>;

/// The listening side's knowledge of keys.
pub trait Verifier: Send + Sync + 'static {
    /// What a `Hello` of `name` claiming `claim` (a client's; `None` for a server)
    /// must prove.
    fn lookup(&self, name: &str, claim: Option<&Claim>) -> LookupFuture;

    /// Whether a peer that just proved its key is revoked now. The gate asks once the
    /// connection carries the peer's identity, so that a revocation, which records
    /// itself first and then closes the connections of that identity, is either seen
    /// here or closes this connection: a handshake racing it cannot stay authenticated.
    fn revoked(&self, who: &PeerIdentity) -> bool;
}

/// A client's record as a [`KeyTable`] keeps it (never its key: derived).
#[derive(Clone, Debug)]
pub struct KeyRecord {
    /// The id of the name's current key.
    pub key_id: KeyId,
    /// What it may do.
    pub caps: Caps,
    /// Refused from now on.
    pub revoked: bool,
}

/// A [`Verifier`] that derives every client's key from the cluster key and checks the
/// claim against its records: the name's current key id, not revoked, the same
/// capabilities. `server/...` names prove the cluster key; `admin` is known without a
/// record ([`ClientKeyFile::admin`]). The metadata server fills it from its store.
pub struct KeyTable {
    cluster: Key,
    clients: parking_lot::RwLock<HashMap<String, KeyRecord>>,
}

impl KeyTable {
    /// A table that knows the cluster key and no client yet.
    pub fn new(cluster: Key) -> KeyTable {
        KeyTable {
            cluster,
            clients: parking_lot::RwLock::new(HashMap::new()),
        }
    }

    /// The cluster key every `server/...` name proves.
    pub fn cluster_key(&self) -> &Key {
        &self.cluster
    }

    /// Adds or replaces a client's record; returns the one it replaced.
    pub fn insert(&self, name: &str, record: KeyRecord) -> Option<KeyRecord> {
        self.clients.write().insert(name.to_string(), record)
    }

    /// Marks a client revoked; false if it is unknown.
    pub fn revoke(&self, name: &str) -> bool {
        match self.clients.write().get_mut(name) {
            Some(r) => {
                r.revoked = true;
                true
            }
            None => false,
        }
    }

    /// Whether the client `name` holding key `key_id` is valid now.
    pub fn is_valid(&self, name: &str, key_id: &KeyId) -> bool {
        if name == proto::auth::ADMIN_NAME {
            return *key_id == KeyId::ADMIN;
        }
        self.clients
            .read()
            .get(name)
            .is_some_and(|r| !r.revoked && r.key_id == *key_id)
    }

    /// What the table says of a `Hello`, at once.
    pub fn lookup_now(&self, name: &str, claim: Option<&Claim>) -> Lookup {
        let Some(claim) = claim else {
            let key = self.cluster.clone();
            return match name.starts_with(proto::auth::SERVER_NAME_PREFIX) {
                true => Lookup::Known {
                    key,
                    role: Role::Server,
                },
                false => Lookup::Refused {
                    key,
                    why: "a client without a key id",
                },
            };
        };
        let key = self.cluster.derive_client(name, claim);
        let why = if name == proto::auth::ADMIN_NAME {
            let admin = claim.key_id == KeyId::ADMIN && claim.caps == Caps::admin();
            (!admin).then_some("not the administrator's key id and capabilities")
        } else {
            match self.clients.read().get(name) {
                None => Some("unknown client"),
                Some(r) if r.revoked => Some("revoked"),
                Some(r) if r.key_id != claim.key_id => Some("superseded key (made again)"),
                Some(r) if r.caps != claim.caps => Some("claims other capabilities"),
                Some(_) => None,
            }
        };
        match why {
            Some(why) => Lookup::Refused { key, why },
            None => Lookup::Known {
                key,
                role: Role::Client(claim.caps.clone()),
            },
        }
    }
}

impl Verifier for KeyTable {
    fn lookup(&self, name: &str, claim: Option<&Claim>) -> LookupFuture {
        let found = self.lookup_now(name, claim);
        Box::pin(async move { found })
    }

    fn revoked(&self, who: &PeerIdentity) -> bool {
        match (&who.role, &who.key_id) {
            (Role::Server, _) => false,
            (Role::Client(_), Some(id)) => !self.is_valid(&who.name, id),
            (Role::Client(_), None) => true,
        }
    }
}

/// An endpoint's authentication settings.
#[derive(Clone, Default)]
pub(crate) struct AuthSetup {
    /// Used by `connect`; `None`: connect without authenticating (insecure).
    pub(crate) credentials: Option<Credentials>,
    /// Used by `listen`; `None`: serve without authentication (insecure).
    pub(crate) verifier: Option<Arc<dyn Verifier>>,
    /// See [`HANDSHAKE_TIMEOUT_MS`].
    pub(crate) handshake_timeout_ms: u64,
}

/// The safe default of every server: a listen address beyond loopback needs keys, or an
/// explicit `insecure`. Returns the one-line refusal, naming `--insecure`.
pub fn check_listen(listen: &str, has_key: bool, insecure: bool) -> Result<(), String> {
    if has_key || insecure || is_loopback(listen) {
        return Ok(());
    }
    Err(format!(
        "refusing to listen on {listen} without a key: anyone who reaches it could read and \
         change every file; give the server its key_file (tessera up makes one), or pass \
         --insecure (config insecure = true) to run unauthenticated"
    ))
}

/// Whether `listen` (`host:port`) is on the loopback interface only.
pub fn is_loopback(listen: &str) -> bool {
    let host = listen.rsplit_once(':').map_or(listen, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_listens_without_a_key() {
        for ok in ["127.0.0.1:7600", "127.0.0.9:0", "[::1]:7600", "localhost:1"] {
            assert!(check_listen(ok, false, false).is_ok(), "{ok}");
        }
        for bad in [
            "0.0.0.0:7600",
            "10.0.0.1:7600",
            "[::]:7600",
            "example.org:1",
        ] {
            let err = check_listen(bad, false, false).unwrap_err();
            assert!(err.contains("--insecure") && !err.contains('\n'), "{err}");
            assert!(check_listen(bad, true, false).is_ok());
            assert!(check_listen(bad, false, true).is_ok());
        }
    }
}
