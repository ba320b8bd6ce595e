//! How a data server checks a handshake: servers by the cluster key, clients by the key
//! the metadata server holds for their name, asked on this server's own authenticated
//! link and kept for [`CLIENT_KEY_TTL`].

use parking_lot::Mutex;
use proto::meta::cluster::{ClientKey, ClientKeyAnswer};
use proto::Request;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tracing::{info, warn};
use transport::auth::{Lookup, LookupFuture};
use transport::{Endpoint, Key, Link, Listener, Role, Verifier};

/// How long an answer of the metadata server about a client is used: a revoked key is
/// refused by every data server within this time (or once the metadata server is back,
/// when it is away: meanwhile the last answer stands).
pub const CLIENT_KEY_TTL: Duration = Duration::from_secs(10);

/// Client answers kept at most; the table is cleared when full.
const MAX_CACHED_CLIENTS: usize = 4096;

/// The verifier of a data server's listener.
#[derive(Clone)]
pub struct DataVerifier(Arc<Inner>);

struct Inner {
    cluster: Key,
    /// Connects out with the server's credentials (no verifier of its own).
    ep: Endpoint,
    meta: Link,
    cache: Mutex<HashMap<String, (Lookup, Instant)>>,
}

impl DataVerifier {
    /// A verifier that asks the metadata server at `meta_addr` through `ep`.
    pub fn new(cluster: Key, ep: Endpoint, meta_addr: String) -> DataVerifier {
        DataVerifier(Arc::new(Inner {
            cluster,
            ep,
            meta: Link::new(meta_addr),
            cache: Mutex::new(HashMap::new()),
        }))
    }
}

impl DataVerifier {
    /// Asks again about every client known valid; returns those that no longer are.
    pub async fn recheck(&self) -> Vec<String> {
        let known: Vec<String> = self
            .0
            .cache
            .lock()
            .iter()
            .filter(|(_, (l, _))| matches!(l, Lookup::Known { .. }))
            .map(|(name, _)| name.clone())
            .collect();
        let mut gone = Vec::new();
        for name in known {
            let Ok(found) = self.0.ask_meta(&name).await else {
                continue; // the metadata server is away: ask again next round
            };
            if !matches!(found, Lookup::Known { .. }) {
                gone.push(name.clone());
            }
            self.0.cache.lock().insert(name, (found, Instant::now()));
        }
        gone
    }

    /// Every [`CLIENT_KEY_TTL`], closes the connections of clients whose key was
    /// revoked since they authenticated; ends with the listener.
    pub fn watch(&self, listener: Weak<Listener>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(CLIENT_KEY_TTL).await;
                let gone = me.recheck().await;
                let Some(l) = listener.upgrade() else { return };
                for name in gone {
                    let closed = l.close_peer(&name);
                    info!(%name, closed, "client key revoked: its connections closed");
                }
            }
        })
    }
}

impl Inner {
    async fn ask(self: Arc<Self>, name: String) -> Lookup {
        let cached = self.cache.lock().get(&name).cloned();
        if let Some((found, at)) = &cached {
            if at.elapsed() < CLIENT_KEY_TTL {
                return found.clone();
            }
        }
        let found = match self.ask_meta(&name).await {
            Ok(f) => f,
            Err(e) => {
                // While the metadata server is away, clients it vouched for go on
                // reconnecting (open files keep reading and writing meanwhile).
                warn!(%name, error = %e, "cannot ask the metadata server for a client's key");
                return cached.map_or(Lookup::Unavailable, |(found, _)| found);
            }
        };
        let mut cache = self.cache.lock();
        if cache.len() >= MAX_CACHED_CLIENTS {
            cache.clear();
        }
        cache.insert(name, (found.clone(), Instant::now()));
        found
    }

    async fn ask_meta(&self, name: &str) -> Result<Lookup, crate::DataError> {
        let conn = self.meta.get(&self.ep).await?;
        let limit = self.ep.config().max_msg_bytes;
        let req = Request::new(ClientKey {
            name: name.to_string(),
        });
        let answer = transport::rpc::call::<_, crate::DataError>(&conn, &req, limit).await?;
        Ok(match answer {
            ClientKeyAnswer::Known { key_hex, caps } => match Key::from_hex(&key_hex) {
                Some(key) => Lookup::Known {
                    key,
                    role: Role::Client(caps),
                },
                None => Lookup::Unknown,
            },
            ClientKeyAnswer::Unknown => Lookup::Unknown,
            ClientKeyAnswer::Revoked => Lookup::Revoked,
        })
    }
}

impl Verifier for DataVerifier {
    fn lookup(&self, name: &str) -> LookupFuture {
        if name.starts_with(proto::auth::SERVER_NAME_PREFIX) {
            let key = self.0.cluster.clone();
            return Box::pin(async move {
                Lookup::Known {
                    key,
                    role: Role::Server,
                }
            });
        }
        Box::pin(self.0.clone().ask(name.to_string()))
    }
}
