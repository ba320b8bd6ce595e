//! What a data server knows of the cluster: its own id, the cluster map (from heartbeat
//! replies, or fetched when a request names a newer one), and connections to its peers.

use crate::DataError;
use parking_lot::{Mutex, RwLock};
use proto::grant::{unix_ms, MetaReach};
use proto::meta::cluster::GetMap;
use proto::meta::{ClusterMap, MemberState, MetaRequest, WATCH_AFTER, WATCH_EVERY};
use proto::{ChainId, NodeId, Request, Rpc};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use transport::{Connection, Endpoint, Link};

/// Peer links kept at most; past it the table is cleared (links reconnect on use).
const MAX_PEER_LINKS: usize = 1024;

/// Whether this data server reaches its metadata server, from the outcome of its calls
/// there (a heartbeat every `heartbeat_ms`): grants that ran out during an outage are
/// taken until it answers again (see [`MetaReach`]).
pub struct MetaContact {
    /// Unix milliseconds of the last answer (or of the server's start).
    last_ms: AtomicU64,
    /// The last call got no answer.
    lost: AtomicBool,
}

impl MetaContact {
    /// Contact as of now: nothing lost yet, so a grant that ran out before this server
    /// started is never excused.
    pub fn new() -> MetaContact {
        MetaContact {
            last_ms: AtomicU64::new(unix_ms()),
            lost: AtomicBool::new(false),
        }
    }

    /// The metadata server answered at `now_ms`.
    pub fn answered(&self, now_ms: u64) {
        self.last_ms.fetch_max(now_ms, Ordering::AcqRel);
        self.lost.store(false, Ordering::Release);
    }

    /// A call to it got no answer (it is down, or cut off).
    pub fn unanswered(&self) {
        self.lost.store(true, Ordering::Release);
    }

    /// What a grant check is to know.
    pub fn reach(&self) -> MetaReach {
        match self.lost.load(Ordering::Acquire) {
            false => MetaReach::Reached,
            true => MetaReach::LostSince(self.last_ms.load(Ordering::Acquire)),
        }
    }
}

impl Default for MetaContact {
    fn default() -> Self {
        MetaContact::new()
    }
}

/// The cluster as one data server sees it.
pub struct ClusterView {
    ep: Endpoint,
    meta: Link,
    contact: Arc<MetaContact>,
    me: OnceLock<NodeId>,
    map: RwLock<Arc<ClusterMap>>,
    /// One fetch of the map at a time; the others wait and use its result.
    refreshing: tokio::sync::Mutex<()>,
    peers: Mutex<HashMap<String, Arc<Link>>>,
}

impl ClusterView {
    /// A view that knows nothing yet.
    pub fn new(ep: Endpoint, meta_addr: String) -> ClusterView {
        ClusterView::with_contact(ep, meta_addr, Arc::default())
    }

    /// A view that records whether the metadata server answers in `contact`.
    pub fn with_contact(ep: Endpoint, meta_addr: String, contact: Arc<MetaContact>) -> ClusterView {
        ClusterView {
            ep,
            meta: Link::new(meta_addr),
            contact,
            me: OnceLock::new(),
            map: RwLock::new(Arc::new(ClusterMap::default())),
            refreshing: tokio::sync::Mutex::new(()),
            peers: Mutex::new(HashMap::new()),
        }
    }

    /// The metadata server's address (of several, the one last answering).
    pub fn meta_addr(&self) -> String {
        self.meta.addr()
    }

    /// The endpoint connections go out from.
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// This server's id, once registered.
    pub fn me(&self) -> Option<NodeId> {
        self.me.get().copied()
    }

    pub(crate) fn set_me(&self, node: NodeId) {
        let _ = self.me.set(node);
    }

    /// The map as known now.
    pub fn current(&self) -> Arc<ClusterMap> {
        self.map.read().clone()
    }

    /// Takes `map` if it is newer than the one known.
    pub fn offer(&self, map: ClusterMap) {
        let mut m = self.map.write();
        if map.version > m.version {
            tracing::info!(version = map.version, "cluster map updated");
            *m = Arc::new(map);
        }
    }

    /// Returns once the known map says `node` is down, looking every [`WATCH_EVERY`]
    /// after [`WATCH_AFTER`] (the map comes with heartbeats). A successor that hangs
    /// keeps its connection open: a forward to it is given up then, instead of waiting
    /// out the transport's whole timeout while the client's own budget runs out.
    pub async fn until_down(&self, node: NodeId) {
        tokio::time::sleep(WATCH_AFTER).await;
        while self.current().is_up(node) {
            tokio::time::sleep(WATCH_EVERY).await;
        }
    }

    /// Calls the metadata server (heartbeats, registration, map fetches: one link).
    pub async fn meta_call<R: Rpc<Envelope = MetaRequest>>(
        &self,
        req: R,
    ) -> Result<R::Reply, DataError> {
        let r = self.meta_try(req).await;
        match &r {
            // A refusal is an answer too.
            Ok(_) | Err(DataError::Remote(_)) => self.contact.answered(unix_ms()),
            Err(DataError::Transport(_)) => self.contact.unanswered(),
            Err(_) => {}
        }
        r
    }

    async fn meta_try<R: Rpc<Envelope = MetaRequest>>(
        &self,
        req: R,
    ) -> Result<R::Reply, DataError> {
        let conn = self.meta.get(&self.ep).await?;
        let limit = self.ep.config().max_msg_bytes;
        let r = transport::rpc::call(&conn, &Request::new(req), limit).await;
        match &r {
            // A metadata server that stopped answering: the next call tries its standby.
            Err(DataError::Transport(e)) => self.meta.call_failed(&conn, e),
            // One that cannot take the call now (on a shared engine, one that does not
            // lead; or one cut off from its store): the next call asks another.
            Err(DataError::Remote(w)) if w.code == proto::ErrorCode::Unavailable => {
                tracing::info!(error = %w, "the metadata server sent this data server elsewhere");
                self.meta.ask_elsewhere(&conn);
            }
            _ => {}
        }
        r
    }

    /// A map at least as new as `version`: the known one, or a fresh one from the
    /// metadata server. A request made with an older map gets `Stale`, so that its
    /// sender refreshes and retries.
    pub async fn at(&self, version: u64) -> Result<Arc<ClusterMap>, DataError> {
        let known = self.current();
        if version < known.version {
            return Err(DataError::Stale(format!(
                "cluster map {version} is older than {}",
                known.version
            )));
        }
        if version == known.version {
            return Ok(known);
        }
        let _one = self.refreshing.lock().await;
        if self.current().version < version {
            let map = self.meta_call(GetMap).await?;
            self.offer(map);
        }
        let map = self.current();
        if map.version < version {
            return Err(DataError::Stale(format!(
                "cluster map {version} is unknown to the metadata server"
            )));
        }
        Ok(map)
    }

    /// A connection to data server `node`.
    pub async fn peer(&self, map: &ClusterMap, node: NodeId) -> Result<Connection, DataError> {
        let addr = map
            .addr(node)
            .ok_or_else(|| DataError::Stale(format!("{node} is not in the cluster map")))?;
        self.peer_at(addr).await
    }

    /// A connection to the data server listening at `addr`.
    pub async fn peer_at(&self, addr: &str) -> Result<Connection, DataError> {
        let link = {
            let mut peers = self.peers.lock();
            if peers.len() >= MAX_PEER_LINKS && !peers.contains_key(addr) {
                peers.clear();
            }
            peers
                .entry(addr.to_string())
                .or_insert_with(|| Arc::new(Link::new(addr.to_string())))
                .clone()
        };
        link.get(&self.ep)
            .await
            .map_err(|e| DataError::Unavailable(format!("data server {addr} unreachable: {e}")))
    }

    /// This server's state in `chain`, per `map`.
    pub fn my_state(&self, map: &ClusterMap, chain: ChainId) -> Option<MemberState> {
        let me = self.me()?;
        map.chain(chain)?
            .members
            .iter()
            .find(|m| m.node == me)
            .map(|m| m.state)
    }
}
