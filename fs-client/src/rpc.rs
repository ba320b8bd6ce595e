//! Calls to the metadata server and the data servers: encoding, decoding, reconnecting.

use crate::error::{ClientError, Result};
use bytes::Bytes;
use parking_lot::Mutex;
use proto::codec;
use proto::data::{DataReply, DataRequest, DataResult};
use proto::meta::{MetaReply, MetaRequest, MetaResult, NodeInfo};
use proto::NodeId;
use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use transport::{Connection, Endpoint, Link, TransportError};

/// Round trips sent by one client so far, by server kind: what the regression guard in
/// `tests/tests/round_trips.rs` bounds. A retry on a new connection counts again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RpcCounts {
    /// Calls to the metadata server.
    pub meta_calls: u64,
    /// Calls to data servers (each moves its bytes with one-sided operations, which are
    /// part of the call and not counted apart).
    pub data_calls: u64,
    /// Requests tried again after a failure: a stale map, a busy or unreachable server,
    /// another member of the chain, a direct read after a failed prefetch, a metadata
    /// call repeated on a new connection. The calls a retry sends are in the counts
    /// above (one that fails to connect sends none): counts taken with no retry are
    /// those of the path alone.
    pub retries: u64,
}

impl std::ops::Sub for RpcCounts {
    type Output = RpcCounts;

    /// The calls made between two readings.
    fn sub(self, earlier: RpcCounts) -> RpcCounts {
        RpcCounts {
            meta_calls: self.meta_calls - earlier.meta_calls,
            data_calls: self.data_calls - earlier.data_calls,
            retries: self.retries - earlier.retries,
        }
    }
}

/// A client's endpoint with counters of the calls sent through it. Relaxed atomic
/// increments: one uncontended add per round trip, cheap beside the round trip itself.
pub struct RpcEndpoint {
    ep: Endpoint,
    meta_calls: AtomicU64,
    data_calls: AtomicU64,
    retries: AtomicU64,
}

impl RpcEndpoint {
    /// Wraps `ep` with counters at zero.
    pub fn new(ep: Endpoint) -> RpcEndpoint {
        RpcEndpoint {
            ep,
            meta_calls: AtomicU64::new(0),
            data_calls: AtomicU64::new(0),
            retries: AtomicU64::new(0),
        }
    }

    /// The calls sent so far.
    pub fn counts(&self) -> RpcCounts {
        RpcCounts {
            meta_calls: self.meta_calls.load(Ordering::Relaxed),
            data_calls: self.data_calls.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
        }
    }

    /// Records that a failed request is about to be tried again.
    pub(crate) fn count_retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }
}

impl Deref for RpcEndpoint {
    type Target = Endpoint;

    fn deref(&self) -> &Endpoint {
        &self.ep
    }
}

/// Sends a metadata request once. A caller that may wait for a server that is away
/// (see [`server_away`]) tries again itself, after resuming its open files on the new
/// connection: a reconnect hidden in here would skip that.
pub async fn meta_call(ep: &RpcEndpoint, link: &Link, req: &MetaRequest) -> Result<MetaReply> {
    let bytes = Bytes::from(codec::encode(req, ep.config().max_msg_bytes)?);
    let conn = link.get(ep).await?;
    ep.meta_calls.fetch_add(1, Ordering::Relaxed);
    let reply = conn.call(bytes).await?;
    let result: MetaResult = codec::decode(&reply)?;
    Ok(result?)
}

/// Whether `e`, the failure of `req`, says the metadata server is away (not running,
/// restarting, or cut off) in a way that makes sending `req` again safe: nothing reached
/// a server (no connection), or the connection broke under a request that may be
/// applied twice. A caller may wait for the server and try again.
pub(crate) fn server_away(e: &ClientError, req: &MetaRequest) -> bool {
    match e {
        ClientError::Transport(TransportError::Connect { .. }) => true,
        ClientError::Transport(TransportError::Disconnected { .. }) => idempotent(req),
        _ => false,
    }
}

/// Whether `e` says the metadata server could not be reached or its connection broke.
pub(crate) fn unreachable(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Transport(
            TransportError::Connect { .. } | TransportError::Disconnected { .. }
        )
    )
}

/// Whether applying the request twice has the effect of applying it once.
fn idempotent(req: &MetaRequest) -> bool {
    use MetaRequest as R;
    match req {
        R::Hello { .. }
        | R::Lookup { .. }
        | R::GetAttr { .. }
        | R::SetAttr { .. }
        | R::Readlink { .. }
        | R::ReadDir { .. }
        | R::StatFs
        | R::Open { .. }
        | R::Commit { .. }
        | R::GetXattr { .. }
        | R::ListXattr { .. }
        | R::SetXattr { .. }
        | R::RegisterData { .. }
        | R::Heartbeat { .. }
        | R::ClusterMap
        | R::Status
        | R::ListFiles { .. }
        | R::CheckNamespace
        | R::InodesExist { .. }
        | R::Accessed { .. }
        | R::SetLock { .. }
        | R::GetLock { .. }
        | R::ReleaseLocks { .. }
        // Sessions of a lost connection ended with it; a retry finds them gone.
        | R::ReleaseMany { .. }
        // Moving sessions to the connection it arrives on, again, changes nothing.
        | R::Resume { .. }
        | R::TailCut { .. } => true,
        R::Create { .. }
        | R::MkNod { .. }
        | R::Mkdir { .. }
        | R::Symlink { .. }
        | R::Link { .. }
        | R::Unlink { .. }
        | R::Rmdir { .. }
        | R::Rename { .. }
        | R::Release { .. }
        | R::RemoveXattr { .. }
        | R::Append { .. } => false,
    }
}

/// Sends a data-server request (all are idempotent: safe to retry once on a new
/// connection when the old one broke).
pub async fn data_call(
    ep: &RpcEndpoint,
    conn: &Connection,
    req: &DataRequest,
) -> Result<DataReply> {
    let bytes = Bytes::from(codec::encode(req, ep.config().max_msg_bytes)?);
    ep.data_calls.fetch_add(1, Ordering::Relaxed);
    let reply = conn.call(bytes).await?;
    let result: DataResult = codec::decode(&reply)?;
    Ok(result?)
}

/// Links to every data server, by node id, refreshed from the cluster map.
#[derive(Default)]
pub struct DataLinks {
    links: Mutex<HashMap<NodeId, std::sync::Arc<Link>>>,
}

impl DataLinks {
    /// Installs the addresses of a cluster map.
    pub fn update(&self, nodes: &[NodeInfo]) {
        let mut links = self.links.lock();
        for n in nodes {
            match links.get(&n.node) {
                Some(l) => l.set_addr(&n.addr),
                None => {
                    links.insert(n.node, std::sync::Arc::new(Link::new(n.addr.clone())));
                }
            }
        }
    }

    /// The link to `node`, if the map names it.
    pub fn get(&self, node: NodeId) -> Option<std::sync::Arc<Link>> {
        self.links.lock().get(&node).cloned()
    }
}

/// Unwraps an expected reply variant or reports a protocol error.
macro_rules! expect_reply {
    ($reply:expr, $pat:pat => $out:expr) => {
        match $reply {
            $pat => Ok($out),
            other => Err($crate::error::ClientError::Protocol(format!(
                "unexpected reply {other:?}"
            ))),
        }
    };
}
pub(crate) use expect_reply;
