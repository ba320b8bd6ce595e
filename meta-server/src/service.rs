//! The request side of the metadata server: decoding, the capability gate, and the
//! table that hands each request to its type's handler (`namespace::handlers`).

use crate::gate::{self, Gate};
use crate::keys::{self, Keys};
use crate::metrics::MetaMetrics;
use crate::namespace::scope::Scope;
use crate::namespace::{ConnId, Handle, Knock, Namespace, Origin};
use bytes::Bytes;
use proto::meta::{AdminRequest as A, Caller, ClusterRequest as C, FsCall, MetaRequest};
use proto::{codec, rpc, ErrorCode, WireError};
use std::sync::Arc;
use tracing::warn;
use transport::{Closed, Connection, Handler, HandlerFuture};

/// Answers [`MetaRequest`]s from the namespace.
pub(crate) struct MetaService {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) max_msg_bytes: usize,
    /// `None` on a server without keys.
    pub(crate) keys: Option<Arc<Keys>>,
    /// The capabilities of client keys, applied before a call is served.
    pub(crate) gate: Arc<Gate>,
    pub(crate) metrics: Arc<MetaMetrics>,
}

impl Handler for MetaService {
    fn handle(&self, conn: Connection, request: Bytes) -> HandlerFuture {
        let (ns, limit) = (self.ns.clone(), self.max_msg_bytes);
        let (keys, gate, metrics) = (self.keys.clone(), self.gate.clone(), self.metrics.clone());
        Box::pin(async move {
            let req = match codec::decode::<MetaRequest>(&request) {
                Ok(req) => req,
                Err(e) => {
                    warn!(peer = conn.peer(), error = %e, "undecodable request");
                    return refuse(WireError::from(e), limit);
                }
            };
            let (name, started) = (req.name(), std::time::Instant::now());
            let answer = dispatch(ns, keys, gate, conn, req, limit).await;
            let failed = rpc::is_error(&answer);
            metrics.requests.record(name, started.elapsed(), failed);
            answer
        })
    }

    fn disconnected(&self, conn: transport::ConnId, how: Closed) {
        let ns = self.ns.clone();
        let id = ConnId(conn.0);
        // A connection that broke may belong to a client that lives on and comes back
        // (see `namespace::resume`); one its peer closed, or this server, ends now. Its
        // store reads are bounded as a request's are (see `kv::deadline`).
        let arrived = std::time::Instant::now();
        let end = move || {
            crate::kv::deadline::for_request(arrived, || match how {
                Closed::Broken => ns.connection_broken(id),
                Closed::ByPeer | Closed::Locally => ns.connection_closed(id),
            })
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(end)),
            Err(_) => end(),
        }
    }
}

/// Applies the gate, then serves `req`: the answer's bytes.
async fn dispatch(
    ns: Arc<Namespace>,
    keys: Option<Arc<Keys>>,
    gate: Arc<Gate>,
    conn: Connection,
    req: MetaRequest,
    limit: usize,
) -> Bytes {
    let who = conn.peer_identity();
    let allowed = match &req {
        MetaRequest::Admin(r) => gate::admin_call(who.as_deref(), r),
        MetaRequest::Cluster(r) => gate::cluster_call(who.as_deref(), r),
        MetaRequest::Fs(_) => Ok(()),
    };
    if let Err(e) = allowed {
        return refuse(e, limit);
    }
    // After a start, changes answered early before it land again first (`early`).
    ns.admit_early(knock(&req)).await;
    match req {
        MetaRequest::Admin(A::KeyCreate(r)) => key_call(ns, keys, &conn, limit, r).await,
        MetaRequest::Admin(A::KeyList(r)) => key_call(ns, keys, &conn, limit, r).await,
        MetaRequest::Admin(A::KeyRevoke(r)) => key_call(ns, keys, &conn, limit, r).await,
        MetaRequest::Cluster(C::Revocations(r)) => {
            let answer = match &keys {
                Some(k) if keys::is_server(who.as_deref()) => {
                    let (ns, k) = (ns.clone(), k.clone());
                    on_pool(move || k.revocations(&ns, &r))
                        .await
                        .and_then(|r| r)
                }
                _ => Err(keys::not_permitted("the revocation list")),
            };
            Bytes::from(rpc::answer(&answer, limit))
        }
        MetaRequest::Fs(call) => match admit(&ns, &gate, who.clone(), call).await {
            Ok((call, scope)) => {
                let (req, conn_id) = (MetaRequest::Fs(call), ConnId(conn.id().0));
                Bytes::from(route(ns, req, conn_id, who, limit, scope).await)
            }
            Err(e) => refuse(e, limit),
        },
        req => Bytes::from(route(ns, req, ConnId(conn.id().0), who, limit, None).await),
    }
}

/// Whom `req` comes from, for the gate of changes sent again after a start.
fn knock(req: &MetaRequest) -> Knock {
    use proto::meta::FsRequest as F;
    match req {
        MetaRequest::Fs(FsCall {
            req: F::Settle(s), ..
        }) => Knock::Replay(s.client),
        MetaRequest::Fs(FsCall { op: Some(op), .. }) if op.retry => Knock::Replay(op.client),
        MetaRequest::Fs(_) => Knock::Other,
        MetaRequest::Cluster(C::RegisterData(_) | C::Heartbeat(_) | C::GetMap(_))
        | MetaRequest::Admin(A::Status(_)) => Knock::Free,
        MetaRequest::Cluster(_) | MetaRequest::Admin(_) => Knock::Other,
    }
}

/// The answer to a request refused before it is served.
fn refuse(e: WireError, limit: usize) -> Bytes {
    let err: Result<(), WireError> = Err(e);
    Bytes::from(rpc::answer(&err, limit))
}

/// Applies the peer's capabilities to a file-system call ([`Gate::admit`]); a scoped
/// key's check reads the store, so it runs as store work does ([`blocking`]).
async fn admit(
    ns: &Arc<Namespace>,
    gate: &Arc<Gate>,
    who: Option<Arc<transport::PeerIdentity>>,
    call: FsCall,
) -> Result<gate::Admitted, WireError> {
    if !gate::is_scoped(who.as_deref()) {
        return gate.admit(ns, who.as_deref(), call);
    }
    let local = ns.reads_are_local();
    let (ns, gate) = (ns.clone(), gate.clone());
    store_work("admit", local, move || {
        gate.admit(&ns, who.as_deref(), call)
    })
    .await?
}

/// A key management request: admin capability checked here, store writes on the
/// blocking pool.
async fn key_call<R>(
    ns: Arc<Namespace>,
    keys: Option<Arc<Keys>>,
    conn: &Connection,
    limit: usize,
    req: R,
) -> Bytes
where
    R: KeyRequest,
{
    let who = conn.peer_identity();
    let result = match keys {
        None => Err(WireError::new(
            ErrorCode::NotSupported,
            "this metadata server runs without keys (no key_file)".to_string(),
        )),
        Some(_) if !keys::may_administer(who.as_deref()) => Err(keys::not_permitted(R::WHAT)),
        Some(keys) => on_pool(move || req.run(&keys, &ns)).await.and_then(|r| r),
    };
    Bytes::from(rpc::answer(&result, limit))
}

/// The three key management requests, run against [`Keys`].
trait KeyRequest: rpc::Rpc + Send + 'static {
    /// For the refusal.
    const WHAT: &'static str;
    fn run(self, keys: &Keys, ns: &Namespace) -> Result<Self::Reply, WireError>;
}

impl KeyRequest for proto::meta::admin::KeyCreate {
    const WHAT: &'static str = "key create";
    fn run(self, keys: &Keys, ns: &Namespace) -> Result<(), WireError> {
        keys.create(ns, self)
    }
}

impl KeyRequest for proto::meta::admin::KeyList {
    const WHAT: &'static str = "key list";
    fn run(
        self,
        keys: &Keys,
        ns: &Namespace,
    ) -> Result<Vec<proto::meta::admin::KeyInfo>, WireError> {
        keys.list(ns)
    }
}

impl KeyRequest for proto::meta::admin::KeyRevoke {
    const WHAT: &'static str = "key revoke";
    fn run(self, keys: &Keys, ns: &Namespace) -> Result<(), WireError> {
        keys.revoke(ns, self)
    }
}

/// Hands each request to its type's handler (`namespace::handlers`). A flat table
/// reads best on one screen, so rustfmt is told not to spread it.
#[rustfmt::skip]
async fn route(
    ns: Arc<Namespace>,
    req: MetaRequest,
    conn: ConnId,
    who: Option<Arc<transport::PeerIdentity>>,
    limit: usize,
    scope: Option<Arc<Scope>>,
) -> Vec<u8> {
    use proto::meta::FsRequest as F;
    // Cluster and admin calls are not made for a user: their handlers check no
    // permission, and nobody is what they are taken for if one ever did.
    let server = Origin { conn, caller: Caller::NOBODY, who: who.clone(), op: None };
    match req {
        // Every file-system call is judged for the user it names (`namespace::perm`);
        // a client capability that squashes root maps it here (`Caller::squashed`).
        MetaRequest::Fs(FsCall { caller, req, op }) => {
            let at = Origin { conn, caller, who, op };
            match req {
                F::Hello(r) => serve(ns, r, at, limit).await,
                F::Lookup(r) => serve_noting(ns, r, at, limit, scope).await,
                F::GetAttr(r) => serve(ns, r, at, limit).await,
                F::SetAttr(r) => serve(ns, r, at, limit).await,
                F::Create(r) => serve_noting(ns, r, at, limit, scope).await,
                F::TmpFile(r) => serve_noting(ns, r, at, limit, scope).await,
                F::Open(r) => serve(ns, r, at, limit).await,
                F::OpenAt(r) => serve_noting(ns, r, at, limit, scope).await,
                F::Regrant(r) => serve(ns, r, at, limit).await,
                F::MkNod(r) => serve_noting(ns, r, at, limit, scope).await,
                F::Mkdir(r) => serve_noting(ns, r, at, limit, scope).await,
                F::Symlink(r) => serve_noting(ns, r, at, limit, scope).await,
                F::Readlink(r) => serve(ns, r, at, limit).await,
                F::Link(r) => serve_noting(ns, r, at, limit, scope).await,
                F::Unlink(r) => serve(ns, r, at, limit).await,
                F::Rmdir(r) => serve(ns, r, at, limit).await,
                F::Rename(r) => serve(ns, r, at, limit).await,
                F::ReadDir(r) => serve_noting(ns, r, at, limit, scope).await,
                F::StatFs(r) => serve(ns, r, at, limit).await,
                F::Commit(r) => serve(ns, r, at, limit).await,
                F::Release(r) => serve(ns, r, at, limit).await,
                F::TailCut(r) => serve(ns, r, at, limit).await,
                F::ReleaseMany(r) => serve(ns, r, at, limit).await,
                F::GetXattr(r) => serve(ns, r, at, limit).await,
                F::SetXattr(r) => serve(ns, r, at, limit).await,
                F::ListXattr(r) => serve(ns, r, at, limit).await,
                F::RemoveXattr(r) => serve(ns, r, at, limit).await,
                F::GetFlags(r) => serve(ns, r, at, limit).await,
                F::SetFlags(r) => serve(ns, r, at, limit).await,
                F::Append(r) => serve(ns, r, at, limit).await,
                F::Accessed(r) => serve(ns, r, at, limit).await,
                F::SetLock(r) => serve(ns, r, at, limit).await,
                F::GetLock(r) => serve(ns, r, at, limit).await,
                F::ReleaseLocks(r) => serve(ns, r, at, limit).await,
                F::Resume(r) => serve(ns, r, at, limit).await,
                F::MyCaps(r) => serve(ns, r, at, limit).await,
                F::LookupParent(r) => lookup_parent(ns, r, at, limit, scope).await,
                F::Settle(r) => serve(ns, r, at, limit).await,
            }
        }
        MetaRequest::Cluster(req) => match req {
            C::RegisterData(r) => serve(ns, r, server, limit).await,
            C::Heartbeat(r) => serve(ns, r, server, limit).await,
            C::GetMap(r) => serve(ns, r, server, limit).await,
            C::ListFiles(r) => serve(ns, r, server, limit).await,
            C::InodesExist(r) => serve(ns, r, server, limit).await,
            C::InodeCopies(r) => serve(ns, r, server, limit).await,
            // Answered by `MetaService::handle`, which knows who asks.
            C::Revocations(_) => not_here(limit),
        },
        MetaRequest::Admin(req) => match req {
            A::Status(r) => serve(ns, r, server, limit).await,
            A::CheckNamespace(r) => serve(ns, r, server, limit).await,
            A::KeyCreate(_) | A::KeyList(_) | A::KeyRevoke(_) => not_here(limit),
        },
    }
}

/// The answer of a request `route` is never given (`MetaService::handle` answers it).
fn not_here(limit: usize) -> Vec<u8> {
    let err: Result<(), WireError> = Err(WireError::new(
        ErrorCode::NotSupported,
        "request routed to the namespace by mistake".to_string(),
    ));
    rpc::answer(&err, limit)
}

/// Runs a request whose reply names inodes reached through names, and notes them in
/// the caller's scope (see `namespace::scope`).
async fn serve_noting<R: Handle + Reveals>(
    ns: Arc<Namespace>,
    req: R,
    at: Origin,
    limit: usize,
    scope: Option<Arc<Scope>>,
) -> Vec<u8> {
    let Some(scope) = scope else {
        return serve(ns, req, at, limit).await;
    };
    let (result, tail) = run(ns, req, at).await;
    if let Ok(reply) = &result {
        R::reveals(reply, &mut |attr_ino, kind| {
            if kind != proto::FileKind::Directory {
                scope.note(attr_ino);
            }
        });
    }
    with_tail(rpc::answer(&result, limit), tail)
}

/// The inodes a reply names, each with its kind.
trait Reveals: rpc::Rpc {
    fn reveals(reply: &Self::Reply, note: &mut dyn FnMut(proto::InodeId, proto::FileKind));
}

macro_rules! reveals_attr {
    ($($req:ty => |$r:ident| $attr:expr;)*) => {$(
        impl Reveals for $req {
            fn reveals($r: &Self::Reply, note: &mut dyn FnMut(proto::InodeId, proto::FileKind)) {
                let a = $attr;
                note(a.ino, a.kind);
            }
        }
    )*};
}

reveals_attr! {
    proto::meta::fs::Lookup => |r| r;
    proto::meta::fs::Create => |r| &r.attr;
    proto::meta::fs::TmpFile => |r| &r.attr;
    proto::meta::fs::MkNod => |r| &r.attr;
    proto::meta::fs::Mkdir => |r| &r.attr;
    proto::meta::fs::Symlink => |r| &r.attr;
    proto::meta::fs::Link => |r| &r.attr;
}

impl Reveals for proto::meta::fs::OpenAt {
    fn reveals(
        reply: &proto::meta::fs::OpenedAt,
        note: &mut dyn FnMut(proto::InodeId, proto::FileKind),
    ) {
        let a = reply.attr();
        note(a.ino, a.kind);
    }
}

impl Reveals for proto::meta::fs::ReadDir {
    fn reveals(
        page: &proto::meta::fs::DirPage,
        note: &mut dyn FnMut(proto::InodeId, proto::FileKind),
    ) {
        for e in &page.entries {
            note(e.ino, e.kind);
        }
    }
}

/// Answers a directory's parent. A scoped key's root (which it names as the root) is
/// its own parent and is answered as the root, so ".." never leads out of the scope.
async fn lookup_parent(
    ns: Arc<Namespace>,
    req: proto::meta::fs::LookupParent,
    at: Origin,
    limit: usize,
    scope: Option<Arc<Scope>>,
) -> Vec<u8> {
    let Some(root) = scope.map(|s| s.root) else {
        return serve(ns, req, at, limit).await;
    };
    let own = req.dir == root;
    // The scope's root too has its search permission checked, as any directory.
    let mut result = run(ns.clone(), req, at).await.0;
    if own && result.is_ok() {
        // A store read: off the async workers unless it is local (as in `run`).
        result = if ns.reads_are_local() {
            ns.getattr(root).map_err(WireError::from)
        } else {
            let ns = ns.clone();
            on_pool(move || ns.getattr(root).map_err(WireError::from))
                .await
                .and_then(|r| r)
        };
    }
    if let Ok(a) = &mut result {
        if a.ino == root {
            a.ino = proto::InodeId::ROOT;
        }
    }
    rpc::answer(&result, limit)
}

/// Runs one request and encodes its answer (with its tail, to a change of a client
/// that takes early replies).
async fn serve<R: Handle>(ns: Arc<Namespace>, req: R, at: Origin, limit: usize) -> Vec<u8> {
    let (result, tail) = run(ns, req, at).await;
    with_tail(rpc::answer(&result, limit), tail)
}

/// Whether the answer to a request from `at` carries a [`proto::meta::ReplyTail`]:
/// only a change of a client that takes early replies reads one.
fn takes_tail(at: &Origin) -> bool {
    at.op.is_some_and(|op| op.early)
}

fn with_tail(answer: Vec<u8>, tail: Option<proto::meta::ReplyTail>) -> Vec<u8> {
    match tail {
        Some(tail) => tail.append_to(answer),
        None => answer,
    }
}

/// Runs one request; with the tail its answer may carry.
async fn run<R: Handle>(
    ns: Arc<Namespace>,
    req: R,
    at: Origin,
) -> (Result<R::Reply, WireError>, Option<proto::meta::ReplyTail>) {
    let (local, tailed) = (ns.reads_are_local(), takes_tail(&at));
    let ns_answers_early = ns.answers_early();
    let serve = move || {
        let (r, answered) = ns.handle_answered(req, at, true);
        (r, tailed.then(|| ns.reply_tail(answered)))
    };
    if R::POINT_READ && local {
        // A few cached reads under the namespace lock: handing them to the blocking
        // pool would cost more than they take (not so over the network, with etcd).
        serve()
    } else if R::EARLY && tailed && local && ns_answers_early && transport::multi_thread_runtime() {
        // Answered before the log's sync: a change that takes locks and stages, run
        // by the task's worker; a wait in it leaves the worker's other tasks to
        // another thread (`early::blocking`). Not in the transport's first poll of the
        // handler, which runs in the connection's reader: a wait there would hold up
        // every later request of the connection.
        tokio::task::yield_now().await;
        crate::namespace::on_worker(serve)
    } else {
        // Store commits fsync and scans may be long: not on a worker that others wait
        // behind (`store_work`).
        let r = store_work(R::NAME, local, serve).await;
        r.unwrap_or_else(|e| (Err(e), None))
    }
}

/// Runs `f`, `what`'s work, which may block (store reads, a commit's wait for the log):
/// with `local` reads where the request is ([`transport::blocking::in_place`]: an
/// open, a close or an access time then answers without two thread wakes), after a
/// yield out of the transport's first poll of the handler (the connection's reader,
/// which would wait with it); over etcd (many such calls wait at once on the network)
/// on the blocking pool. A panic in `f` is an error, logged with `what`.
async fn store_work<T: Send + 'static>(
    what: &'static str,
    local: bool,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, WireError> {
    if !local {
        return on_pool(f).await;
    }
    tokio::task::yield_now().await;
    transport::blocking::in_place(f).await.map_err(|e| {
        warn!(
            op = what,
            "a request's work {e}: answered with an I/O error"
        );
        WireError::new(ErrorCode::Io, format!("request {e}"))
    })
}

/// Runs `f` on the blocking pool.
async fn on_pool<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, WireError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| WireError::new(ErrorCode::Io, format!("request failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards store work on a current-thread runtime, where running it in place would
    /// panic (`block_in_place`): it runs on a pool thread and answers.
    #[tokio::test]
    async fn store_work_on_a_current_thread_runtime_runs_on_the_pool() {
        let here = std::thread::current().id();
        let there = store_work("t", true, || std::thread::current().id()).await;
        assert_ne!(there.unwrap(), here, "on a thread of the blocking pool");
    }

    /// Guards store work on a multi-threaded runtime: it runs on the thread of the
    /// task that asked (after its yield), and a panic in it is an I/O error, not an
    /// unwind through the request's task.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn store_work_runs_in_place_and_a_panic_is_an_error() {
        let (here, there) = tokio::spawn(async {
            let there = store_work("t", true, || std::thread::current().id()).await;
            (std::thread::current().id(), there.unwrap())
        })
        .await
        .unwrap();
        assert_eq!(here, there, "on the worker that holds the request");
        let failed = store_work("t", true, || -> () { panic!("a test's panic") }).await;
        assert_eq!(failed.unwrap_err().code, ErrorCode::Io);
    }
}
