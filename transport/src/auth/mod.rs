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
pub use keys::{Key, KEY_FILE_MODE};

use proto::auth::Caps;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// How long a new connection to a listener with a [`Verifier`] may take to authenticate
/// before it is closed, unless the endpoint sets another.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 5000;

/// Who the connecting side of an endpoint is: its name and its key.
#[derive(Clone)]
pub struct Credentials {
    /// A client's key name, or a server's `server/...` name.
    pub name: String,
    /// The client's key, or the cluster key for a server.
    pub key: Key,
}

impl Credentials {
    /// A server's credentials: `server/<what>` with the cluster key.
    pub fn server(what: &str, cluster_key: Key) -> Credentials {
        Credentials {
            name: format!("{}{what}", proto::auth::SERVER_NAME_PREFIX),
            key: cluster_key,
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
    /// What it is.
    pub role: Role,
}

/// What a [`Verifier`] knows of a name.
#[derive(Clone, Debug)]
pub enum Lookup {
    /// A known, valid name: its key and what it is.
    Known {
        /// The key its proof must be made with.
        key: Key,
        /// What it becomes once authenticated.
        role: Role,
    },
    /// No such name.
    Unknown,
    /// The name was revoked.
    Revoked,
    /// Cannot tell now: the one who knows (a data server's metadata server) is away.
    /// The connection is closed as a server that is away would close it, so the peer
    /// tries again later instead of taking it as a refusal of its key.
    Unavailable,
}

/// The future a [`Verifier`] returns.
pub type LookupFuture = Pin<Box<dyn Future<Output = Lookup> + Send + 'static>>;

/// The listening side's knowledge of keys. Asynchronous, so that a data server can ask
/// the metadata server about a client it has not seen.
pub trait Verifier: Send + Sync + 'static {
    /// What `name` is.
    fn lookup(&self, name: &str) -> LookupFuture;
}

/// A client's record as a [`KeyTable`] keeps it.
#[derive(Clone, Debug)]
pub struct ClientKey {
    /// Its key.
    pub key: Key,
    /// What it may do.
    pub caps: Caps,
    /// Refused from now on.
    pub revoked: bool,
}

/// A [`Verifier`] that holds everything in memory: the cluster key, for every
/// `server/...` name, and the clients' keys. The metadata server fills it from its store.
pub struct KeyTable {
    cluster: Key,
    clients: parking_lot::RwLock<HashMap<String, ClientKey>>,
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

    /// Adds or replaces a client's record.
    pub fn insert(&self, name: &str, record: ClientKey) {
        self.clients.write().insert(name.to_string(), record);
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

    /// What the table says of `name`, at once.
    pub fn lookup_now(&self, name: &str) -> Lookup {
        if name.starts_with(proto::auth::SERVER_NAME_PREFIX) {
            return Lookup::Known {
                key: self.cluster.clone(),
                role: Role::Server,
            };
        }
        match self.clients.read().get(name) {
            None => Lookup::Unknown,
            Some(r) if r.revoked => Lookup::Revoked,
            Some(r) => Lookup::Known {
                key: r.key.clone(),
                role: Role::Client(r.caps.clone()),
            },
        }
    }
}

impl Verifier for KeyTable {
    fn lookup(&self, name: &str) -> LookupFuture {
        let found = self.lookup_now(name);
        Box::pin(async move { found })
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
