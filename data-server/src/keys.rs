//! How a data server checks a handshake: servers by the cluster key, clients by the key
//! it derives itself from the cluster key for their claim (name, key id, capabilities),
//! and the revocation list it pulls from the metadata server every
//! [`REVOCATION_POLL`]. No key is asked for or sent: a client is checked with the
//! metadata server away as with it up; the list kept is the last one pulled.

use parking_lot::Mutex;
use proto::auth::{Claim, KeyId};
use proto::meta::cluster::{RevocationPage, Revocations, MAX_REVOCATIONS};
use proto::Request;
use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tracing::{info, warn};
use transport::auth::{Lookup, LookupFuture};
use transport::{Endpoint, Key, Link, Listener, PeerIdentity, Role, Verifier};

/// How often the revocation list is pulled: a revoked key is refused by every data
/// server, and its connections there closed, within this time (once the metadata
/// server is reachable).
pub const REVOCATION_POLL: Duration = Duration::from_secs(10);

/// The verifier of a data server's listener.
#[derive(Clone)]
pub struct DataVerifier(Arc<Inner>);

struct Inner {
    cluster: Key,
    /// Connects out with the server's credentials (no verifier of its own).
    ep: Endpoint,
    meta: Link,
    list: Mutex<RevocationList>,
}

/// The revoked keys known here, and the metadata server's version of the last one.
#[derive(Default)]
struct RevocationList {
    version: u64,
    revoked: HashSet<(String, KeyId)>,
}

impl DataVerifier {
    /// A verifier that pulls revocations from the metadata server at `meta_addr`
    /// through `ep`.
    pub fn new(cluster: Key, ep: Endpoint, meta_addr: String) -> DataVerifier {
        DataVerifier(Arc::new(Inner {
            cluster,
            ep,
            meta: Link::new(meta_addr),
            list: Mutex::new(RevocationList::default()),
        }))
    }

    /// Pulls the revocations not seen yet, adds each to the list and then closes the
    /// connections of its key (in that order: see `Verifier::revoked`). Returns how
    /// many were new; an error leaves the list as it was (kept across outages).
    pub async fn pull(&self, listener: &Weak<Listener>) -> Result<usize, crate::DataError> {
        let mut new = 0;
        // Bounded: every page but the last is full, and the list holds at most
        // MAX_REVOCATIONS.
        let max_pages = MAX_REVOCATIONS / proto::meta::cluster::MAX_REVOCATIONS_PER_PAGE + 2;
        for _ in 0..max_pages {
            let since = self.0.list.lock().version;
            let page = self.0.ask_meta(since).await?;
            for r in &page.revoked {
                let fresh = {
                    let mut list = self.0.list.lock();
                    if list.revoked.len() >= MAX_REVOCATIONS {
                        warn!("more than {MAX_REVOCATIONS} revocations: the rest not kept");
                        break;
                    }
                    list.revoked.insert((r.name.clone(), r.key_id))
                };
                if !fresh {
                    continue;
                }
                new += 1;
                let closed = listener
                    .upgrade()
                    .map_or(0, |l| l.close_key(&r.name, &r.key_id));
                info!(name = %r.name, key_id = %r.key_id, closed, "client key revoked");
            }
            let mut list = self.0.list.lock();
            list.version = list.version.max(page.version);
            if page.done {
                break;
            }
        }
        Ok(new)
    }

    /// Pulls the revocation list now and every [`REVOCATION_POLL`]; ends with the
    /// listener.
    pub fn watch(&self, listener: Weak<Listener>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REVOCATION_POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if listener.strong_count() == 0 {
                    return;
                }
                if let Err(e) = me.pull(&listener).await {
                    // The metadata server is away: the last list stands until it is back.
                    warn!(error = %e, "cannot pull the revocation list; keeping the last one");
                }
            }
        })
    }
}

impl Inner {
    async fn ask_meta(&self, since: u64) -> Result<RevocationPage, crate::DataError> {
        let conn = self.meta.get(&self.ep).await?;
        let limit = self.ep.config().max_msg_bytes;
        let req = Request::new(Revocations { since });
        transport::rpc::call::<_, crate::DataError>(&conn, &req, limit).await
    }

    fn is_revoked(&self, name: &str, key_id: &KeyId) -> bool {
        // A lookup by borrowed parts would need another key type; names are short.
        self.list
            .lock()
            .revoked
            .contains(&(name.to_string(), *key_id))
    }
}

impl Verifier for DataVerifier {
    fn lookup(&self, name: &str, claim: Option<&Claim>) -> LookupFuture {
        let found = match claim {
            None if name.starts_with(proto::auth::SERVER_NAME_PREFIX) => Lookup::Known {
                key: self.0.cluster.clone(),
                role: Role::Server,
            },
            None => Lookup::Refused {
                key: self.0.cluster.clone(),
                why: "a client without a key id",
            },
            // Every claim costs one derivation, whatever the name: no name oracle.
            Some(claim) => {
                let key = self.0.cluster.derive_client(name, claim);
                match self.0.is_revoked(name, &claim.key_id) {
                    true => Lookup::Refused {
                        key,
                        why: "revoked",
                    },
                    false => Lookup::Known {
                        key,
                        role: Role::Client(claim.caps.clone()),
                    },
                }
            }
        };
        Box::pin(async move { found })
    }

    fn revoked(&self, who: &PeerIdentity) -> bool {
        match (&who.role, &who.key_id) {
            (Role::Server, _) => false,
            (Role::Client(_), Some(id)) => self.0.is_revoked(&who.name, id),
            (Role::Client(_), None) => true,
        }
    }
}
