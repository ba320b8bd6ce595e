//! The metadata server's network side: its configuration, the request handler that runs
//! namespace operations on the blocking pool, and [`MetaServer`], which ties them to a
//! listener.

use crate::config::NamespaceConfig;
use crate::error::StartError;
use crate::kv::{open_store, StoreKind};
use crate::namespace::{ConnId, Handle, Namespace, Origin};
use crate::MetaError;
use bytes::Bytes;
use proto::meta::{Caller, FsCall, MetaRequest};
use proto::{codec, rpc, ErrorCode, WireError, PROTOCOL_VERSION};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tracing::{info, warn};
use transport::{
    Backend, Closed, Connection, Endpoint, Handler, HandlerFuture, Listener, TransportConfig,
};

/// Everything the metadata server can be told; see `tessera-meta.example.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetaConfig {
    /// Address the transport listens on (port 0: any free port).
    pub listen: String,
    /// Directory of the embedded store.
    pub data_dir: PathBuf,
    /// Embedded store engine.
    pub store: StoreKind,
    /// Where to write the bound address once serving (for scripts); empty: nowhere.
    pub addr_file: PathBuf,
    /// Transport backend.
    pub transport: Backend,
    /// Transport limits and timeouts.
    pub transport_limits: TransportConfig,
    /// Namespace settings.
    pub namespace: NamespaceConfig,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            listen: "127.0.0.1:7600".into(),
            data_dir: PathBuf::from("/var/lib/tessera/meta"),
            store: StoreKind::default(),
            addr_file: PathBuf::new(),
            transport: Backend::Tcp,
            transport_limits: TransportConfig::default(),
            namespace: NamespaceConfig::default(),
        }
    }
}

impl MetaConfig {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        self.transport_limits.validate()?;
        self.namespace.validate().map_err(|e| e.to_string())?;
        if self.listen.is_empty() {
            return Err("listen must be an address (host:port)".into());
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err("data_dir must be set".into());
        }
        Ok(())
    }
}

/// Answers [`MetaRequest`]s from the namespace.
struct MetaService {
    ns: Arc<Namespace>,
    max_msg_bytes: usize,
}

impl Handler for MetaService {
    fn handle(&self, conn: Connection, request: Bytes) -> HandlerFuture {
        let (ns, limit) = (self.ns.clone(), self.max_msg_bytes);
        Box::pin(async move {
            match codec::decode::<MetaRequest>(&request) {
                Ok(req) => Bytes::from(route(ns, req, ConnId(conn.id().0), limit).await),
                Err(e) => {
                    warn!(peer = conn.peer(), error = %e, "undecodable request");
                    let err: Result<(), WireError> = Err(WireError::from(e));
                    Bytes::from(rpc::answer(&err, limit))
                }
            }
        })
    }

    fn disconnected(&self, conn: transport::ConnId, how: Closed) {
        let ns = self.ns.clone();
        let id = ConnId(conn.0);
        // A connection that broke may belong to a client that lives on and comes back
        // (see `namespace::resume`); one its peer closed, or this server, ends now.
        let end = move || match how {
            Closed::Broken => ns.connection_broken(id),
            Closed::ByPeer | Closed::Locally => ns.connection_closed(id),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(end)),
            Err(_) => end(),
        }
    }
}

/// Hands each request to its type's handler (`namespace::handlers`). A flat table
/// reads best on one screen, so rustfmt is told not to spread it.
#[rustfmt::skip]
async fn route(ns: Arc<Namespace>, req: MetaRequest, conn: ConnId, limit: usize) -> Vec<u8> {
    use proto::meta::{AdminRequest as A, ClusterRequest as C, FsRequest as F};
    // Cluster and admin calls are not made for a user: their handlers check no
    // permission, and nobody is what they are taken for if one ever did.
    let server = Origin { conn, caller: Caller::NOBODY };
    match req {
        // Every file-system call is judged for the user it names (`namespace::perm`);
        // a client capability that squashes root maps it here (`Caller::squashed`).
        MetaRequest::Fs(FsCall { caller, req }) => {
            let at = Origin { conn, caller };
            match req {
                F::Hello(r) => serve(ns, r, at, limit).await,
                F::Lookup(r) => serve(ns, r, at, limit).await,
                F::GetAttr(r) => serve(ns, r, at, limit).await,
                F::SetAttr(r) => serve(ns, r, at, limit).await,
                F::Create(r) => serve(ns, r, at, limit).await,
                F::MkNod(r) => serve(ns, r, at, limit).await,
                F::Mkdir(r) => serve(ns, r, at, limit).await,
                F::Symlink(r) => serve(ns, r, at, limit).await,
                F::Readlink(r) => serve(ns, r, at, limit).await,
                F::Link(r) => serve(ns, r, at, limit).await,
                F::Unlink(r) => serve(ns, r, at, limit).await,
                F::Rmdir(r) => serve(ns, r, at, limit).await,
                F::Rename(r) => serve(ns, r, at, limit).await,
                F::ReadDir(r) => serve(ns, r, at, limit).await,
                F::StatFs(r) => serve(ns, r, at, limit).await,
                F::Open(r) => serve(ns, r, at, limit).await,
                F::Commit(r) => serve(ns, r, at, limit).await,
                F::Release(r) => serve(ns, r, at, limit).await,
                F::TailCut(r) => serve(ns, r, at, limit).await,
                F::ReleaseMany(r) => serve(ns, r, at, limit).await,
                F::GetXattr(r) => serve(ns, r, at, limit).await,
                F::SetXattr(r) => serve(ns, r, at, limit).await,
                F::ListXattr(r) => serve(ns, r, at, limit).await,
                F::RemoveXattr(r) => serve(ns, r, at, limit).await,
                F::Append(r) => serve(ns, r, at, limit).await,
                F::Accessed(r) => serve(ns, r, at, limit).await,
                F::SetLock(r) => serve(ns, r, at, limit).await,
                F::GetLock(r) => serve(ns, r, at, limit).await,
                F::ReleaseLocks(r) => serve(ns, r, at, limit).await,
                F::Resume(r) => serve(ns, r, at, limit).await,
            }
        }
        MetaRequest::Cluster(req) => match req {
            C::RegisterData(r) => serve(ns, r, server, limit).await,
            C::Heartbeat(r) => serve(ns, r, server, limit).await,
            C::GetMap(r) => serve(ns, r, server, limit).await,
            C::ListFiles(r) => serve(ns, r, server, limit).await,
            C::InodesExist(r) => serve(ns, r, server, limit).await,
        },
        MetaRequest::Admin(req) => match req {
            A::Status(r) => serve(ns, r, server, limit).await,
            A::CheckNamespace(r) => serve(ns, r, server, limit).await,
        },
    }
}

/// Runs one request and encodes its answer.
async fn serve<R: Handle>(ns: Arc<Namespace>, req: R, at: Origin, limit: usize) -> Vec<u8> {
    let result = if R::POINT_READ {
        // A few cached reads under the namespace lock: handing them to the blocking
        // pool would cost more than they take.
        ns.handle(req, at)
    } else {
        // Store commits fsync and scans may be long: keep them off the async workers.
        // The namespace opens the request's span (operation and ids).
        match tokio::task::spawn_blocking(move || ns.handle(req, at)).await {
            Ok(r) => r,
            Err(e) => Err(WireError::new(
                ErrorCode::Io,
                format!("request failed: {e}"),
            )),
        }
    };
    rpc::answer(&result, limit)
}

/// How often the sessions of broken connections are checked for an expired grace.
const DETACHED_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// A metadata server running inside this process.
pub struct MetaServer {
    listener: Listener,
    ns: Arc<Namespace>,
    /// Ends the sessions of broken connections nobody resumed; stopped on drop.
    expiry: tokio::task::JoinHandle<()>,
}

impl Drop for MetaServer {
    fn drop(&mut self) {
        self.expiry.abort();
    }
}

/// Ends, every [`DETACHED_CHECK`], the sessions whose client did not come back in time.
fn spawn_expiry(ns: &Arc<Namespace>) -> tokio::task::JoinHandle<()> {
    let ns = Arc::downgrade(ns);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(DETACHED_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(ns) = ns.upgrade() else { return };
            if ns.waiting_resume() == 0 {
                continue;
            }
            let now = ns.now();
            let _ = tokio::task::spawn_blocking(move || ns.expire_detached(now)).await;
        }
    })
}

impl MetaServer {
    /// Opens the store and the namespace and starts serving.
    pub async fn start(config: MetaConfig) -> Result<MetaServer, StartError> {
        config.validate().map_err(StartError::Config)?;
        // Every client and data server holds a connection: more than 1024 of them need
        // more than the usual soft limit.
        transport::raise_open_file_limit();
        let (dir, kind, ns_config) = (
            config.data_dir.clone(),
            config.store,
            config.namespace.clone(),
        );
        let ns = tokio::task::spawn_blocking(move || -> Result<Namespace, StartError> {
            std::fs::create_dir_all(&dir).map_err(|source| StartError::DataDir {
                dir: dir.clone(),
                source,
            })?;
            let open = || -> Result<Namespace, MetaError> {
                Namespace::open(open_store(kind, &dir)?, ns_config)
            };
            match open() {
                Ok(ns) => Ok(ns.with_disk_guard(dir)),
                Err(source) => Err(StartError::Open { dir, source }),
            }
        })
        .await??;
        let ns = Arc::new(ns);
        let limits = config.transport_limits.clone();
        let ep = Endpoint::new(config.transport, limits.clone(), PROTOCOL_VERSION)
            .map_err(StartError::Transport)?;
        let service = MetaService {
            ns: ns.clone(),
            max_msg_bytes: limits.max_msg_bytes,
        };
        let listener = ep
            .listen(&config.listen, Arc::new(service))
            .await
            .map_err(|source| StartError::Listen {
                addr: config.listen.clone(),
                source,
            })?;
        info!(addr = %listener.local_addr(), store = kind.name(), "metadata server started");
        let expiry = spawn_expiry(&ns);
        Ok(MetaServer {
            listener,
            ns,
            expiry,
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// The namespace (for tests and tools).
    pub fn namespace(&self) -> &Arc<Namespace> {
        &self.ns
    }

    /// Stops serving and closes every connection.
    pub fn shutdown(&self) {
        self.ns.stop();
        self.listener.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against the example file drifting from the defaults it documents.
    #[test]
    fn example_file_equals_the_defaults() {
        let text = include_str!("../tessera-meta.example.toml");
        let parsed: MetaConfig = toml::from_str(text).expect("example parses");
        assert_eq!(parsed, MetaConfig::default());
        parsed.validate().expect("defaults are valid");
    }

    /// Guards against a bad data directory being reported as a request's InvalidArgument.
    #[tokio::test]
    async fn a_data_dir_that_cannot_be_made_is_a_start_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let config = MetaConfig {
            listen: "127.0.0.1:0".into(),
            data_dir: file.join("meta"),
            ..MetaConfig::default()
        };
        let Err(e) = MetaServer::start(config).await else {
            panic!("started on a data directory below a regular file");
        };
        assert!(matches!(&e, StartError::DataDir { dir, .. } if *dir == file.join("meta")));
        assert!(e.to_string().contains("file/meta"), "{e}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = toml::from_str::<MetaConfig>("[namespace]\nchunk_size = 1").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }
}
