//! The metadata server's network side: its configuration, the request handler that runs
//! namespace operations (`service.rs`: where each kind runs), and [`MetaServer`], which
//! ties them to a listener.

use crate::config::NamespaceConfig;
use crate::error::StartError;
use crate::gate::Gate;
use crate::grants::{self, Granter};
use crate::keys::Keys;
use crate::kv::etcd::owner::Owner;
use crate::kv::{open_engine_fenced, EtcdConfig, StoreKind};
use crate::metrics::{self, MetaMetrics};
use crate::namespace::Namespace;
use crate::service::MetaService;
use crate::MetaError;
use proto::PROTOCOL_VERSION;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use telemetry::{MetricsConfig, MetricsServer};
use tracing::{info, warn};
use transport::{Backend, Endpoint, Listener, TransportConfig};

/// Everything the metadata server can be told; see `tessera-meta.example.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetaConfig {
    /// Address the transport listens on (port 0: any free port).
    pub listen: String,
    /// Directory of the embedded store (with etcd: of nothing yet, but still made).
    pub data_dir: PathBuf,
    /// Store engine: an embedded one, or etcd (then `etcd` says where).
    pub store: StoreKind,
    /// The etcd cluster, read when `store` is etcd.
    pub etcd: EtcdConfig,
    /// Where to write the bound address once serving (for scripts); empty: nowhere.
    pub addr_file: PathBuf,
    /// Transport backend.
    pub transport: Backend,
    /// Transport limits and timeouts.
    pub transport_limits: TransportConfig,
    /// Namespace settings.
    pub namespace: NamespaceConfig,
    /// The cluster key's file (64 hex digits, mode 0600); empty: no authentication,
    /// which needs a loopback `listen` or `insecure`.
    pub key_file: PathBuf,
    /// The administrator's key file, only checked: the key `admin` is derived from the
    /// cluster key, so every server knows it without this file; given, a file whose key
    /// is not that derived key refuses the start. Empty: not checked.
    pub admin_key_file: PathBuf,
    /// Serve without authentication on any address (warned about at every start).
    pub insecure: bool,
    /// How long a grant handed out with a file's layout lasts (clients renew it at half
    /// its lifetime).
    pub grant_lifetime_ms: u64,
    /// The Prometheus endpoint (off unless `metrics.listen` is set).
    pub metrics: MetricsConfig,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            listen: "127.0.0.1:7600".into(),
            data_dir: PathBuf::from("/var/lib/tessera/meta"),
            store: StoreKind::default(),
            etcd: EtcdConfig::default(),
            addr_file: PathBuf::new(),
            transport: Backend::Tcp,
            transport_limits: TransportConfig::default(),
            namespace: NamespaceConfig::default(),
            key_file: PathBuf::new(),
            admin_key_file: PathBuf::new(),
            insecure: false,
            grant_lifetime_ms: grants::DEFAULT_GRANT_LIFETIME_MS,
            metrics: MetricsConfig::default(),
        }
    }
}

impl MetaConfig {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        self.transport_limits.validate()?;
        self.metrics.validate()?;
        self.namespace.validate().map_err(|e| e.to_string())?;
        if self.listen.is_empty() {
            return Err("listen must be an address (host:port)".into());
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err("data_dir must be set".into());
        }
        if self.store == StoreKind::Etcd {
            self.etcd.validate()?;
        } else if self.etcd.shared {
            return Err("etcd.shared (--etcd-shared) needs store = \"etcd\"".into());
        }
        if self.key_file.as_os_str().is_empty() && !self.admin_key_file.as_os_str().is_empty() {
            return Err("admin_key_file needs key_file (the cluster key)".into());
        }
        if !grants::GRANT_LIFETIME_RANGE_MS.contains(&self.grant_lifetime_ms) {
            let r = grants::GRANT_LIFETIME_RANGE_MS;
            return Err(format!(
                "grant_lifetime_ms must be between {} and {}",
                r.start(),
                r.end()
            ));
        }
        let has_key = !self.key_file.as_os_str().is_empty();
        transport::auth::check_listen(&self.listen, has_key, self.insecure)
    }
}

/// How often the sessions of broken connections are checked for an expired grace.
const DETACHED_CHECK: std::time::Duration = std::time::Duration::from_secs(1);
/// How often old change records are looked for (they are kept two hours).
const OP_PURGE_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

/// A metadata server running inside this process.
pub struct MetaServer {
    listener: Arc<Listener>,
    ns: Arc<Namespace>,
    gate: Arc<Gate>,
    /// Ends the sessions of broken connections nobody resumed; stopped on drop.
    expiry: tokio::task::JoinHandle<()>,
    /// The Prometheus endpoint, when configured.
    metrics: Option<MetricsServer>,
    /// On etcd, the namespace's owner key: revoked in `drop`, after serving stopped and
    /// what was staged is committed.
    owner: Option<Owner>,
}

impl Drop for MetaServer {
    fn drop(&mut self) {
        self.expiry.abort();
        if self.ns.is_shared() {
            // The connections closed now are not clients that ended: their sessions
            // and locks stay for the clients to take back on another server.
            self.shutdown();
        }
        if let Some(owner) = self.owner.take() {
            // Serving stops first, so nothing is staged after the sync; and changes
            // staged lazily (closes, purges) must land while the key is still ours:
            // once it is revoked the fence refuses them, and they would be lost.
            self.shutdown();
            if let Err(e) = self.ns.sync() {
                warn!(error = %e, "changes staged before the stop were not committed");
            }
            drop(owner);
        }
    }
}

/// What a server on a shared engine does every tick: looks at the leader key (and
/// takes it if its holder died), reads the stored map again if it follows, and ends
/// what dead servers left (`namespace::sweep`).
fn shared_tick(ns: &Namespace, now: std::time::Instant) {
    match ns.campaign() {
        Ok(true) => {}
        Ok(false) => {
            if let Err(e) = ns.cluster_map() {
                warn!(error = %e, "reading the cluster map the leader stored failed");
            }
        }
        Err(e) => warn!(error = %e, "looking at the leader key failed"),
    }
    if let Err(e) = ns.sweep_dead_servers(now) {
        warn!(error = %e, "ending the sessions of dead metadata servers failed");
    }
}

/// Ends, every [`DETACHED_CHECK`], the sessions whose client did not come back in time
/// (on a shared engine, those of metadata servers that died too, and the leader
/// looked at: `shared_tick`), and every [`OP_PURGE_EVERY`] deletes old change records (`namespace::once`).
fn spawn_expiry(ns: &Arc<Namespace>) -> tokio::task::JoinHandle<()> {
    let ns = Arc::downgrade(ns);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(DETACHED_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_purge = std::time::Instant::now();
        let mut purge: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            tick.tick().await;
            let Some(ns) = ns.upgrade() else { return };
            let idle = purge.as_ref().is_none_or(|p| p.is_finished());
            if idle && last_purge.elapsed() >= OP_PURGE_EVERY {
                last_purge = std::time::Instant::now();
                // On a thread of its own: the grace checks go on meanwhile.
                let (ns, arrived) = (ns.clone(), std::time::Instant::now());
                purge = Some(tokio::task::spawn_blocking(move || {
                    let purged =
                        crate::kv::deadline::for_request(arrived, || ns.purge_op_records());
                    if let Err(e) = purged {
                        warn!(error = %e, "deleting old change records failed");
                    }
                }));
            }
            if ns.is_shared() {
                let (now, arrived) = (ns.now(), std::time::Instant::now());
                let ns = ns.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    crate::kv::deadline::for_request(arrived, || shared_tick(&ns, now))
                })
                .await;
            }
            if ns.waiting_resume() == 0 {
                continue;
            }
            let (now, arrived) = (ns.now(), std::time::Instant::now());
            let _ = tokio::task::spawn_blocking(move || {
                crate::kv::deadline::for_request(arrived, || ns.expire_detached(now))
            })
            .await;
        }
    })
}

/// The cluster key and the stored client records: `None` without a `key_file`.
fn load_keys(config: &MetaConfig, ns: &Namespace) -> Result<Option<Arc<Keys>>, StartError> {
    if config.key_file.as_os_str().is_empty() {
        return Ok(None);
    }
    let cluster = transport::Key::load(&config.key_file).map_err(StartError::Key)?;
    if !config.admin_key_file.as_os_str().is_empty() {
        check_admin_key(config, &cluster)?;
    }
    let keys = Keys::load(ns, cluster).map_err(|source| StartError::Open {
        dir: config.data_dir.clone(),
        source,
    })?;
    Ok(Some(Arc::new(keys)))
}

/// Refuses a configured administrator's key file whose key is not the one derived from
/// the cluster key (a file of another cluster, or of a Tessera that made it at random).
fn check_admin_key(config: &MetaConfig, cluster: &transport::Key) -> Result<(), StartError> {
    let path = &config.admin_key_file;
    let key = match transport::ClientKeyFile::load(path) {
        Ok(file) => file.key,
        Err(_) => transport::Key::load(path).map_err(StartError::Key)?,
    };
    if key != transport::ClientKeyFile::admin(cluster).key {
        return Err(StartError::Config(format!(
            "the admin key file {} is not the administrator's key derived from the cluster \
             key file {}: write it again from that cluster key (tessera up does), or leave \
             admin_key_file out",
            path.display(),
            config.key_file.display()
        )));
    }
    Ok(())
}

impl MetaServer {
    /// Opens the store and the namespace and starts serving.
    pub async fn start(config: MetaConfig) -> Result<MetaServer, StartError> {
        config.validate().map_err(StartError::Config)?;
        // Every client and data server holds a connection: more than 1024 of them need
        // more than the usual soft limit.
        transport::raise_open_file_limit();
        let (dir, kind, ns_config, etcd) = (
            config.data_dir.clone(),
            config.store,
            config.namespace.clone(),
            config.etcd.clone(),
        );
        let who = format!("{} (pid {})", config.listen, std::process::id());
        let (ns, owner) = tokio::task::spawn_blocking(move || -> Result<_, StartError> {
            std::fs::create_dir_all(&dir).map_err(|source| StartError::DataDir {
                dir: dir.clone(),
                source,
            })?;
            // Before the namespace is opened: opening writes (the purge of orphans).
            // Shared: no owner; each server holds its live key instead (`open_shared`).
            let owner = match kind {
                StoreKind::Etcd if !etcd.shared => {
                    Some(Owner::acquire(&etcd, &who).map_err(StartError::Owner)?)
                }
                _ => None,
            };
            let fence = owner.as_ref().map(Owner::fence);
            let open = || -> Result<Namespace, MetaError> {
                let engine = open_engine_fenced(kind, &dir, &etcd, fence)?;
                if kind == StoreKind::Etcd && etcd.shared {
                    let clock = Arc::new(crate::clock::SystemClock);
                    return Namespace::open_shared(engine, ns_config, clock);
                }
                Namespace::open(engine, ns_config)
            };
            match open() {
                // The disk guard keeps room on the store's disk, which etcd's is not.
                Ok(ns) if kind == StoreKind::Etcd => Ok((ns, owner)),
                Ok(ns) => Ok((ns.with_disk_guard(dir), owner)),
                Err(source) => Err(StartError::Open { dir, source }),
            }
        })
        .await??;
        let ns = Arc::new(ns);
        let limits = config.transport_limits.clone();
        let mut ep = Endpoint::new(config.transport, limits.clone(), PROTOCOL_VERSION)
            .map_err(StartError::Transport)?;
        let keys = load_keys(&config, &ns)?;
        if let Some(k) = &keys {
            ep = ep.with_verifier(k.table());
        } else {
            warn!(listen = %config.listen, "serving WITHOUT authentication: anyone who \
                  reaches this address can read and change every file");
        }
        let gate = Arc::new(Gate::default());
        let meta_metrics = Arc::new(MetaMetrics::new(&ns)?);
        if let Some(k) = &keys {
            ns.set_granter(Arc::new(Granter::new(config.grant_lifetime_ms, k.table())));
        }
        let service = MetaService {
            ns: ns.clone(),
            max_msg_bytes: limits.max_msg_bytes,
            keys: keys.clone(),
            gate: gate.clone(),
            metrics: meta_metrics.clone(),
        };
        let listener = ep
            .listen(&config.listen, Arc::new(service))
            .await
            .map_err(|source| StartError::Listen {
                addr: config.listen.clone(),
                source,
            })?;
        let listener = Arc::new(listener);
        if let Some(k) = &keys {
            k.set_listener(&listener);
        }
        info!(addr = %listener.local_addr(), store = kind.name(), "metadata server started");
        let expiry = spawn_expiry(&ns);
        let transport = ep.backend().name();
        let metrics = metrics::serve(&config.metrics, &meta_metrics, &ns, &listener, transport);
        Ok(MetaServer {
            metrics: metrics.await?,
            listener,
            ns,
            gate,
            expiry,
            owner,
        })
    }

    /// Returns once this server lost the namespace's owner key on etcd (its lease
    /// expired): another server may serve the namespace now, so this one must stop.
    /// Shared, once it lost its live key: others may be ending its sessions and locks.
    /// Never returns on an embedded store.
    pub async fn owner_lost(&self) {
        match &self.owner {
            Some(o) => o.lost().await,
            None if self.ns.is_shared() => {
                while !self.ns.live_key_lost() {
                    tokio::time::sleep(crate::kv::etcd::owner::OWNER_POLL).await;
                }
            }
            None => std::future::pending().await,
        }
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// The address of the metrics endpoint, when one serves.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::local_addr)
    }

    /// The namespace (for tests and tools).
    pub fn namespace(&self) -> &Arc<Namespace> {
        &self.ns
    }

    /// How many requests naming an inode outside their key's scope were refused.
    pub fn scope_refusals(&self) -> u64 {
        self.gate.refused()
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

    /// Guards against a metadata server starting with an administrator's key file that
    /// is not the key derived from its cluster key (of another cluster, or made at
    /// random before keys were derived): one line naming both files.
    #[test]
    fn an_admin_key_file_that_is_not_the_derived_key_refuses_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = transport::Key::generate().unwrap();
        let key_file = dir.path().join("cluster.key");
        cluster.save(&key_file).unwrap();
        let good = dir.path().join("admin.key");
        transport::ClientKeyFile::admin(&cluster)
            .save(&good)
            .unwrap();
        let config = |admin_key_file| MetaConfig {
            key_file: key_file.clone(),
            admin_key_file,
            ..MetaConfig::default()
        };
        assert!(check_admin_key(&config(good), &cluster).is_ok());
        let other = transport::Key::generate().unwrap();
        let (derived, random) = (dir.path().join("other.key"), dir.path().join("old.key"));
        transport::ClientKeyFile::admin(&other)
            .save(&derived)
            .unwrap();
        other.save(&random).unwrap();
        for bad in [derived, random] {
            let err = check_admin_key(&config(bad.clone()), &cluster)
                .unwrap_err()
                .to_string();
            assert!(err.contains(&*bad.to_string_lossy()), "{err}");
            assert!(err.contains(&*key_file.to_string_lossy()), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    /// Guards against the example file drifting from the defaults it documents.
    #[test]
    fn example_file_equals_the_defaults() {
        let text = include_str!("../tessera-meta.example.toml");
        let parsed: MetaConfig = toml::from_str(text).expect("example parses");
        assert_eq!(parsed, MetaConfig::default());
        parsed.validate().expect("defaults are valid");
    }

    /// Guards against `--etcd-shared` on an embedded store passing unnoticed (it would
    /// serve one server's store as if others shared it).
    #[test]
    fn a_shared_prefix_needs_etcd() {
        let mut c = MetaConfig::default();
        c.etcd.shared = true;
        let e = c.validate().unwrap_err();
        assert!(e.contains("etcd.shared"), "{e}");
        c.store = StoreKind::Etcd;
        c.validate().unwrap();
    }

    /// Guards against an etcd configuration that cannot work being found at a call.
    #[test]
    fn an_etcd_store_needs_endpoints_and_a_prefix() {
        let mut c = MetaConfig {
            store: StoreKind::Etcd,
            ..MetaConfig::default()
        };
        c.validate().unwrap();
        c.etcd.endpoints.clear();
        assert!(c.validate().unwrap_err().contains("etcd.endpoints"));
        c.etcd = EtcdConfig {
            prefix: String::new(),
            ..EtcdConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("etcd.prefix"));
        // Not read unless the store is etcd.
        c.store = StoreKind::Redb;
        c.validate().unwrap();
    }

    /// A server on etcd serves its namespace, and a new one on the same prefix finds it.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_server_on_etcd_finds_its_namespace_after_a_restart() {
        use crate::kv::etcd::local::LocalEtcd;
        if !LocalEtcd::present_for_tests() {
            return;
        }
        let etcd = tokio::task::spawn_blocking(LocalEtcd::shared)
            .await
            .unwrap()
            .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let config = MetaConfig {
            listen: "127.0.0.1:0".into(),
            data_dir: tmp.path().join("meta"),
            store: StoreKind::Etcd,
            etcd: etcd.config(),
            ..MetaConfig::default()
        };
        let server = MetaServer::start(config.clone()).await.unwrap();
        let ns = server.namespace().clone();
        let root = proto::InodeId::ROOT;
        let (caller, mode) = (proto::meta::Caller::new(0, 0), 0o755);
        let made = tokio::task::spawn_blocking(move || ns.mkdir(root, b"d", mode, caller))
            .await
            .unwrap()
            .unwrap();
        server.shutdown();
        drop(server);
        let again = MetaServer::start(config).await.unwrap();
        let ns = again.namespace().clone();
        let found = tokio::task::spawn_blocking(move || ns.lookup(root, b"d"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(found.ino, made.attr.ino);
        again.shutdown();
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
