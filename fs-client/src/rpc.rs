//! Calls to the metadata server and the data servers: encoding, decoding, reconnecting.

use crate::error::{ClientError, Result};
use crate::metrics::ClientMetrics;
use parking_lot::Mutex;
use proto::data::DataRequest;
use proto::meta::cluster::FilesPage;
use proto::meta::fs::{DirPage, FsStats, Made, Opened, OpenedAt, Unlinked};
use proto::meta::{
    ClusterMap, ClusterStatus, DirChange, LockSpec, MetaRequest, NodeInfo, ReplyTail,
};
use proto::{Attr, ClientId, NodeId, Request, Rpc, SessionId};
use std::collections::HashMap;
use std::ops::Deref;
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
    /// Of `meta_calls`, the `ReleaseMany` calls: each ends the closes of a moment
    /// together (a read-only close waits a few milliseconds for others), so a path's
    /// close costs a share of one rather than a call of its own.
    pub release_batches: u64,
    /// Of `meta_calls`, the `Lookup` calls: a name the mount's caches could not answer.
    pub lookups: u64,
}

impl std::ops::Sub for RpcCounts {
    type Output = RpcCounts;

    /// The calls made between two readings.
    fn sub(self, earlier: RpcCounts) -> RpcCounts {
        RpcCounts {
            meta_calls: self.meta_calls - earlier.meta_calls,
            data_calls: self.data_calls - earlier.data_calls,
            retries: self.retries - earlier.retries,
            release_batches: self.release_batches - earlier.release_batches,
            lookups: self.lookups - earlier.lookups,
        }
    }
}

/// A client's endpoint with the metrics of the calls sent through it (atomic adds: no
/// lock, cheap beside the round trip itself).
pub struct RpcEndpoint {
    ep: Endpoint,
    metrics: ClientMetrics,
    /// The directory a mount of a subdirectory shows as its root (`subdir`), set once
    /// at connect: see [`meta_call`].
    root: std::sync::OnceLock<proto::InodeId>,
}

impl RpcEndpoint {
    /// Wraps `ep` with counters at zero.
    pub fn new(ep: Endpoint, metrics: ClientMetrics) -> RpcEndpoint {
        RpcEndpoint {
            ep,
            metrics,
            root: std::sync::OnceLock::new(),
        }
    }

    /// The directory set by [`RpcEndpoint::set_root`].
    pub(crate) fn root(&self) -> Option<proto::InodeId> {
        self.root.get().copied()
    }

    /// Makes `dir` the root every later metadata call names (a mount of a
    /// subdirectory); the first call wins.
    pub(crate) fn set_root(&self, dir: proto::InodeId) {
        let _ = self.root.set(dir);
    }

    /// The calls sent so far (each counted once answered, or once it failed).
    pub fn counts(&self) -> RpcCounts {
        RpcCounts {
            meta_calls: self.metrics.meta_calls(),
            data_calls: self.metrics.data_calls(),
            retries: self.metrics.retries.get(),
            release_batches: self
                .metrics
                .meta_calls_of(proto::meta::fs::ReleaseMany::NAME),
            lookups: self.metrics.meta_calls_of(proto::meta::fs::Lookup::NAME),
        }
    }

    /// The metrics of this client.
    pub fn metrics(&self) -> &ClientMetrics {
        &self.metrics
    }

    /// Records that a failed request is about to be tried again.
    pub(crate) fn count_retry(&self) {
        self.metrics.retries.inc();
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
pub async fn meta_call<R: Rpc<Envelope = MetaRequest>>(
    ep: &RpcEndpoint,
    link: &Link,
    req: &Request<R>,
) -> Result<R::Reply> {
    meta_call_tailed(ep, link, req).await.0
}

/// [`meta_call`], with the tail the server sent after its answer (to a change that
/// takes early replies; see `client::held`).
pub async fn meta_call_tailed<R: Rpc<Envelope = MetaRequest>>(
    ep: &RpcEndpoint,
    link: &Link,
    req: &Request<R>,
) -> (Result<R::Reply>, Option<ReplyTail>) {
    let conn = match link.get(ep).await {
        Ok(c) => c,
        Err(e) => return (Err(e.into()), None),
    };
    let limit = ep.config().max_msg_bytes;
    let call = ep.metrics.meta_call(R::NAME);
    // Mapped here, below the caches, so that they all see the root as the FUSE layer
    // names it, as for a client whose key is scoped to a directory.
    let rooted = ep.root.get().and_then(|&dir| req.rooted_at(dir));
    let (r, tail) = call_tailed(&conn, rooted.as_ref().unwrap_or(req), limit).await;
    call.finish(r.is_err());
    if let Err(ClientError::Transport(e)) = &r {
        link.call_failed(&conn, e);
    }
    (r, tail)
}

/// One call whose answer may carry a [`ReplyTail`].
async fn call_tailed<R: Rpc>(
    conn: &Connection,
    req: &Request<R>,
    limit: usize,
) -> (Result<R::Reply>, Option<ReplyTail>) {
    let bytes = match req.encode(limit) {
        Ok(b) => b,
        Err(e) => return (Err(e.into()), None),
    };
    let answer = match conn.call(bytes.into()).await {
        Ok(a) => a,
        Err(e) => return (Err(e.into()), None),
    };
    match req.decode_reply_with_tail(&answer) {
        Ok((r, tail)) => (r.map_err(Into::into), tail),
        Err(e) => (Err(e.into()), None),
    }
}

/// Whether `e`, the failure of request `R`, says the metadata server is away (not
/// running, restarting, cut off, or not answering) in a way that makes sending it again
/// safe: nothing reached a server (no connection), the connection broke under a request
/// that may be applied twice ([`Rpc::IDEMPOTENT`]), or the call timed out under one that
/// only reads. A caller may wait for the server and try
/// again.
pub(crate) fn server_away<R: Rpc>(e: &ClientError, req: &MetaRequest) -> bool {
    // A change with an id is applied once however often it is sent, also by the
    // server that takes over (which waits out the first server's lease, and fences
    // its writes, before it serves).
    let has_op = matches!(req, MetaRequest::Fs(call) if call.op.is_some());
    match e {
        ClientError::Transport(t) if t.never_connected() => true,
        ClientError::Transport(t) if has_op => {
            t.is_call_timeout() || matches!(t, TransportError::Disconnected { .. })
        }
        // A server that took the request and said nothing (stopped, hung): the link
        // has moved on (`Link::call_failed`). Only a request that reads is sent again:
        // the first one may still be under way on a slow server, and a change sent
        // again could land before it, and be undone by it, after later ones.
        ClientError::Transport(t @ TransportError::TimedOut { .. }) if t.is_call_timeout() => {
            only_reads(req)
        }
        ClientError::Transport(TransportError::Disconnected { .. }) => R::IDEMPOTENT,
        _ => false,
    }
}

/// Whether `req` only reads (no change to files, sessions or locks): the same answer
/// whenever and however often it is applied.
fn only_reads(req: &MetaRequest) -> bool {
    use proto::meta::fs::FsRequest as F;
    match req {
        MetaRequest::Fs(call) => matches!(
            call.req,
            F::Lookup(_)
                | F::GetAttr(_)
                | F::Readlink(_)
                | F::ReadDir(_)
                | F::StatFs(_)
                | F::GetXattr(_)
                | F::ListXattr(_)
                | F::GetLock(_)
                | F::MyCaps(_)
                | F::LookupParent(_)
        ),
        MetaRequest::Cluster(c) => matches!(c, proto::meta::cluster::ClusterRequest::GetMap(_)),
        MetaRequest::Admin(_) => false,
    }
}

/// Whether `e` says the metadata server could not be reached, its connection broke, or
/// it did not answer a call in time.
pub(crate) fn unreachable(e: &ClientError) -> bool {
    match e {
        ClientError::Transport(TransportError::Disconnected { .. }) => true,
        ClientError::Transport(t) => t.never_connected() || t.is_call_timeout(),
        _ => false,
    }
}

/// Sends a data-server request (all are idempotent: safe to retry once on a new
/// connection when the old one broke).
pub async fn data_call<R: Rpc<Envelope = DataRequest>>(
    ep: &RpcEndpoint,
    conn: &Connection,
    req: R,
) -> Result<R::Reply> {
    let limit = ep.config().max_msg_bytes;
    let req = Request::new(req);
    let call = ep.metrics.data_call(req.envelope());
    let r = transport::rpc::call(conn, &req, limit).await;
    call.finish(r.is_err());
    match &r {
        Ok(_) => ep.metrics.data_moved(req.envelope()),
        Err(ClientError::Remote(w)) if w.code == proto::ErrorCode::Corrupt => {
            ep.metrics.checksum_failure();
        }
        Err(_) => {}
    }
    r
}

/// A metadata request whose reply the caches can look at: every request sent through
/// `Client::meta`.
pub(crate) trait MetaCall: Rpc<Envelope = MetaRequest, Reply: Replied> {}

impl<R: Rpc<Envelope = MetaRequest, Reply: Replied>> MetaCall for R {}

/// What the client's caches learn from a metadata reply: the attributes it carries
/// and the directory change it reports, whatever request it answers.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Seen<'a> {
    /// One inode's attributes (lookup, getattr, setattr, commit, accessed).
    Attr(&'a Attr),
    /// An open (create, open).
    Opened(&'a Opened),
    /// A new name (mkdir, mknod, symlink, link).
    Made(&'a Made),
    /// A removed name (unlink, rmdir).
    Removed(&'a DirChange),
    /// A page of a listing.
    Dir(&'a DirPage),
    /// Nothing the caches keep.
    Nothing,
}

/// A reply type, as the caches see it ([`Seen`]).
pub(crate) trait Replied {
    /// The view of this reply.
    fn seen(&self) -> Seen<'_> {
        Seen::Nothing
    }
}

impl Replied for Attr {
    fn seen(&self) -> Seen<'_> {
        Seen::Attr(self)
    }
}

impl Replied for Opened {
    fn seen(&self) -> Seen<'_> {
        Seen::Opened(self)
    }
}

impl Replied for OpenedAt {
    fn seen(&self) -> Seen<'_> {
        match self {
            OpenedAt::Opened(o) => Seen::Opened(o),
            OpenedAt::Found(a) => Seen::Attr(a),
        }
    }
}

impl Replied for Made {
    fn seen(&self) -> Seen<'_> {
        Seen::Made(self)
    }
}

impl Replied for DirChange {
    fn seen(&self) -> Seen<'_> {
        Seen::Removed(self)
    }
}

impl Replied for Unlinked {
    fn seen(&self) -> Seen<'_> {
        Seen::Removed(&self.parent)
    }
}

impl Replied for DirPage {
    fn seen(&self) -> Seen<'_> {
        Seen::Dir(self)
    }
}

/// Replies that carry no attributes.
macro_rules! replied_with_nothing {
    ($($t:ty),* $(,)?) => {
        $(impl Replied for $t {})*
    };
}

replied_with_nothing!(
    (),
    u64,
    proto::InodeFlags,
    String,
    Vec<proto::meta::admin::KeyInfo>,
    Vec<u8>,
    Vec<Vec<u8>>,
    Vec<bool>,
    Vec<String>,
    Vec<SessionId>,
    Option<LockSpec>,
    Option<proto::grant::Grant>,
    ClientId,
    FsStats,
    ClusterMap,
    ClusterStatus,
    FilesPage,
);

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

    /// Connections to data servers open now.
    pub fn open_count(&self) -> usize {
        self.links.lock().values().filter(|l| l.is_open()).count()
    }

    /// The link to `node`, if the map names it.
    pub fn get(&self, node: NodeId) -> Option<std::sync::Arc<Link>> {
        self.links.lock().get(&node).cloned()
    }
}
