//! A metadata server and data servers running inside the test process, on `tcp`
//! (127.0.0.1) or on the in-process `mem` transport, whose fault filters
//! (`transport::mem`) then partition servers or drop their messages.

use bytes::Bytes;
use data_server::{DataConfig, DataServer};
use fs_client::{Client, ClientConfig};
use meta_server::server::{MetaConfig, MetaServer};
use proto::data::{Placement, ReadChunk};
use proto::grant::{seal, Grant, GrantMode};
use proto::{ChainId, ChunkId, ErrorCode, InodeId, MrKey, RemoteBuf, Request, PROTOCOL_VERSION};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;
use transport::{Backend, ClientKeyFile, Credentials, Endpoint, Key, TransportConfig};

/// The cluster key's file name in the cluster's `keys` directory.
pub const CLUSTER_KEY: &str = "cluster.key";
/// The administrator's key's file name (client name `admin`).
pub const ADMIN_KEY: &str = "admin.key";

/// Makes `dir` with a new random [`CLUSTER_KEY`] and the [`ADMIN_KEY`] derived from it,
/// as `tessera up` does.
pub fn make_keys(dir: &std::path::Path) {
    std::fs::create_dir(dir).expect("keys dir");
    let cluster = Key::generate().expect("random key");
    cluster.save(&dir.join(CLUSTER_KEY)).expect("key saved");
    ClientKeyFile::admin(&cluster)
        .save(&dir.join(ADMIN_KEY))
        .expect("key saved");
}

/// How long servers may take to start and register.
const READY: Duration = Duration::from_secs(30);

/// What a cluster runs on: the transport of every server and client, its limits, and
/// the namespace settings.
#[derive(Clone, Debug)]
pub struct Setup {
    /// `Tcp` (on 127.0.0.1) or `Mem` (in this process, with fault injection).
    pub transport: Backend,
    /// Limits and timeouts of every endpoint of the cluster (servers and clients).
    pub limits: TransportConfig,
    /// The metadata server's namespace settings.
    pub namespace: meta_server::NamespaceConfig,
    /// Run without keys (no authentication); by default every connection authenticates
    /// with keys made in the cluster's temporary directory.
    pub insecure: bool,
    /// The metadata server's `grant_lifetime_ms`.
    pub grant_lifetime_ms: u64,
    /// The data servers' `grant_clock_skew_ms`.
    pub grant_clock_skew_ms: u64,
}

impl Setup {
    /// The defaults of [`InProcessCluster::start`] on `transport`.
    pub fn on(transport: Backend) -> Setup {
        Setup {
            transport,
            limits: TransportConfig::default(),
            namespace: InProcessCluster::namespace_config(),
            insecure: false,
            grant_lifetime_ms: meta_server::grants::DEFAULT_GRANT_LIFETIME_MS,
            grant_clock_skew_ms: proto::grant::CLOCK_SKEW_MS,
        }
    }
}

/// A cluster inside the test process, with temporary directories.
pub struct InProcessCluster {
    meta: Option<MetaServer>,
    setup: Setup,
    /// The data servers, in start order.
    pub data: Vec<DataServer>,
    /// Each data server's directory.
    pub data_dirs: Vec<PathBuf>,
    dir: TempDir,
}

impl InProcessCluster {
    /// Starts one metadata server and `n` data servers on `tcp` and waits until all
    /// registered.
    pub async fn start(n: usize) -> InProcessCluster {
        Self::start_with(n, Self::namespace_config()).await
    }

    /// As [`InProcessCluster::start`], with these namespace settings.
    pub async fn start_with(n: usize, namespace: meta_server::NamespaceConfig) -> InProcessCluster {
        let setup = Setup {
            namespace,
            ..Setup::on(Backend::Tcp)
        };
        Self::start_setup(n, setup).await
    }

    /// As [`InProcessCluster::start`], on `setup`'s transport and settings.
    pub async fn start_setup(n: usize, setup: Setup) -> InProcessCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        make_keys(&dir.path().join("keys"));
        let meta = MetaServer::start(Self::meta_config(&setup, "127.0.0.1:0", dir.path()))
            .await
            .expect("metadata server starts");
        let mut data = Vec::new();
        let mut data_dirs = Vec::new();
        for i in 0..n {
            let d = dir.path().join(format!("data-{i}"));
            data.push(Self::start_data(&setup, &meta, d.clone()).await);
            data_dirs.push(d);
        }
        let cluster = InProcessCluster {
            meta: Some(meta),
            setup,
            data,
            data_dirs,
            dir,
        };
        cluster.wait_healthy().await;
        cluster
    }

    /// Waits until every chain has `min(3, servers up)` members, all serving.
    pub async fn wait_healthy(&self) {
        self.wait_healthy_within(READY).await;
    }

    /// [`Self::wait_healthy`], for at most `limit`: a resync after a fault may take
    /// longer than a start does on a loaded machine.
    pub async fn wait_healthy_within(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let map = self.meta().namespace().cluster_map().expect("cluster map");
            if crate::healthy(&map) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "cluster not healthy: {map:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until data server `i` knows cluster map `version` or a newer one (from
    /// its heartbeats): it then refuses requests made with an older map as `Stale`,
    /// which is what this asks it, with a read of nothing.
    pub async fn wait_map_known(&self, i: usize, version: u64) {
        let ep = self.endpoint();
        let conn = ep.connect(&self.data_addr(i)).await.expect("connect");
        let probe = Request::new(ReadChunk {
            chunk: ChunkId {
                inode: InodeId::ROOT,
                index: 0,
            },
            place: Placement {
                chain: ChainId(0),
                map_version: version.saturating_sub(1),
                replicas: 1,
            },
            chunk_size_bytes: 4 << 20,
            offset: 0,
            len: 0,
            dest: RemoteBuf {
                addr: 0,
                len: 0,
                key: MrKey(0),
            },
            grant: self.grant(InodeId::ROOT, GrantMode::Read),
        });
        let request = Bytes::from(probe.encode(4096).expect("encode"));
        let deadline = tokio::time::Instant::now() + READY;
        loop {
            let reply = conn.call(request.clone()).await.expect("probe answered");
            match probe.decode_reply(&reply).expect("decode") {
                // Refused for its map alone ("cluster map N is older than M").
                Err(e) if e.code == ErrorCode::Stale && e.message.contains("older than") => return,
                other => assert!(
                    tokio::time::Instant::now() < deadline,
                    "data server {i} never learned map {version}: {other:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops data server `i` as a crash would: its connections close, heartbeats stop.
    pub fn stop_data(&self, i: usize) {
        self.data[i].shutdown();
    }

    /// Starts data server `i` again on its directory (on a new port), once the stopped
    /// instance has let go of its store.
    pub async fn restart_data(&mut self, i: usize) {
        let old = self.data.remove(i);
        old.shutdown();
        drop(old);
        let deadline = tokio::time::Instant::now() + READY;
        loop {
            let config = Self::data_config(&self.setup, self.meta(), self.data_dirs[i].clone());
            match DataServer::start(config).await {
                Ok(s) => {
                    s.wait_registered(READY)
                        .await
                        .expect("data server registers");
                    self.data.insert(i, s);
                    return;
                }
                Err(e) if tokio::time::Instant::now() < deadline => {
                    let _ = e; // the stopped instance still holds the store lock
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("data server did not restart: {e}"),
            }
        }
    }

    /// Leases short enough that a stopped server leaves its chains within a second
    /// (data servers beat every 100 ms here).
    pub fn namespace_config() -> meta_server::NamespaceConfig {
        meta_server::NamespaceConfig {
            node_lease_ms: 1000,
            replace_after_ms: 600_000,
            ..Default::default()
        }
    }

    fn meta_config(setup: &Setup, listen: &str, dir: &std::path::Path) -> MetaConfig {
        let key = |k: &str| match setup.insecure {
            true => PathBuf::new(),
            false => dir.join("keys").join(k),
        };
        MetaConfig {
            key_file: key(CLUSTER_KEY),
            admin_key_file: key(ADMIN_KEY),
            listen: listen.into(),
            data_dir: dir.join("meta"),
            namespace: setup.namespace.clone(),
            transport: setup.transport,
            transport_limits: setup.limits.clone(),
            grant_lifetime_ms: setup.grant_lifetime_ms,
            ..MetaConfig::default()
        }
    }

    fn data_config(setup: &Setup, meta: &MetaServer, data_dir: PathBuf) -> DataConfig {
        let keys = data_dir.parent().expect("in the cluster dir").join("keys");
        DataConfig {
            key_file: match setup.insecure {
                true => PathBuf::new(),
                false => keys.join(CLUSTER_KEY),
            },
            listen: "127.0.0.1:0".into(),
            meta_addr: meta.local_addr().to_string(),
            data_dir,
            capacity_bytes: 8 << 30,
            heartbeat_ms: 100,
            transport: setup.transport,
            transport_limits: setup.limits.clone(),
            grant_clock_skew_ms: setup.grant_clock_skew_ms,
            ..DataConfig::default()
        }
    }

    async fn start_data(setup: &Setup, meta: &MetaServer, data_dir: PathBuf) -> DataServer {
        let s = DataServer::start(Self::data_config(setup, meta, data_dir))
            .await
            .expect("data server starts");
        s.wait_registered(READY)
            .await
            .expect("data server registers");
        s
    }

    /// Stops the metadata server and starts it again on the same address and store, as
    /// after a crash of its process: sessions and locks are gone, every committed change
    /// stays. Retries while the old instance still holds its store (an exclusive lock
    /// released once its last connection task has ended).
    pub async fn restart_meta(&mut self) {
        let old = self.meta.take().expect("metadata server running");
        let addr = old.local_addr();
        let ns = Arc::downgrade(old.namespace());
        old.shutdown();
        drop(old);
        // The store closes when the last request task lets go of the namespace.
        let deadline = tokio::time::Instant::now() + READY;
        while ns.strong_count() > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the stopped metadata server's namespace is still held {} times",
                ns.strong_count()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let config = Self::meta_config(&self.setup, &addr.to_string(), self.dir.path());
        let deadline = tokio::time::Instant::now() + READY;
        loop {
            match MetaServer::start(config.clone()).await {
                Ok(m) => return self.meta = Some(m),
                Err(e) if tokio::time::Instant::now() < deadline => {
                    let _ = e; // typically "store already open": the old one is closing
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("metadata server did not restart: {e}"),
            }
        }
    }

    /// The running metadata server.
    pub fn meta(&self) -> &MetaServer {
        self.meta.as_ref().expect("metadata server running")
    }

    /// The metadata server's address.
    pub fn meta_addr(&self) -> String {
        self.meta().local_addr().to_string()
    }

    /// A client connected to this cluster.
    pub async fn client(&self) -> Arc<Client> {
        Client::connect(self.client_config())
            .await
            .expect("client connects")
    }

    /// The configuration [`InProcessCluster::client`] uses, to change before connecting.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig {
            key_file: match self.setup.insecure {
                true => PathBuf::new(),
                false => self.key_file(ADMIN_KEY),
            },
            meta_addr: self.meta_addr(),
            transport: self.setup.transport,
            transport_limits: self.setup.limits.clone(),
            ..ClientConfig::default()
        }
    }

    /// Runs `f` on a thread outside the runtime (the library API's calls block) with an
    /// API connection to this cluster; a panic in `f` fails the caller with its own
    /// message. Writes to stopped data servers fail within a second.
    pub async fn with_api<R: Send + 'static>(
        &self,
        f: impl FnOnce(fs_client::api::Tessera) -> R + Send + 'static,
    ) -> R {
        let mut options = fs_client::api::Options {
            config: self.client_config(),
            ..fs_client::api::Options::new()
        };
        options.config.failover_timeout_ms = 1000;
        let addr = self.meta_addr();
        let thread = std::thread::spawn(move || {
            let fs = fs_client::api::Tessera::connect(&[addr], options).expect("the API connects");
            f(fs)
        });
        match tokio::task::spawn_blocking(move || thread.join()).await {
            Ok(Ok(r)) => r,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(e) => panic!("joining the API thread: {e}"),
        }
    }

    /// A key file of the cluster: [`CLUSTER_KEY`] or [`ADMIN_KEY`].
    pub fn key_file(&self, name: &str) -> PathBuf {
        self.dir.path().join("keys").join(name)
    }

    /// A client key for `name` with `caps`, derived from the cluster key as `tessera key
    /// create` does and recorded through `admin`; saved as `<name>.key` in the cluster's
    /// directory (replacing one made before, there and at the metadata server).
    pub async fn make_client_key(
        &self,
        admin: &fs_client::Client,
        name: &str,
        caps: proto::auth::Caps,
    ) -> ClientKeyFile {
        let cluster = Key::load(&self.key_file(CLUSTER_KEY)).expect("cluster key");
        let id = transport::auth::new_key_id().expect("key id");
        let file = ClientKeyFile::derive(&cluster, name, id, caps.clone());
        admin
            .key_create(name, id, caps, true)
            .await
            .expect("key create");
        let path = self.dir().join(format!("{name}.key"));
        let _ = std::fs::remove_file(&path);
        file.save(&path).expect("key saved");
        file
    }

    /// An endpoint for wire-level tests, authenticated as the administrator (unless the
    /// cluster runs insecure).
    pub fn endpoint(&self) -> Endpoint {
        let ep = Endpoint::new(
            self.transport(),
            self.setup.limits.clone(),
            PROTOCOL_VERSION,
        )
        .expect("endpoint");
        if self.setup.insecure {
            return ep;
        }
        let admin = ClientKeyFile::load(&self.key_file(ADMIN_KEY)).expect("admin key");
        ep.with_credentials(Credentials::client(admin))
    }

    /// A grant on `ino` of `mode` for the client [`endpoint`](Self::endpoint) names
    /// (`admin`), sealed with the cluster key for a minute, as the metadata server
    /// seals them; `None` when the cluster runs insecure (data servers check none).
    pub fn grant(&self, ino: InodeId, mode: GrantMode) -> Option<Grant> {
        if self.setup.insecure {
            return None;
        }
        let key = Key::load(&self.key_file(CLUSTER_KEY)).expect("cluster key");
        let expires = proto::grant::unix_ms() + 60_000;
        Some(seal(key.bytes(), ino, "admin", mode, expires, 0))
    }

    /// The transport every server and client of this cluster runs on.
    pub fn transport(&self) -> Backend {
        self.setup.transport
    }

    /// The address data server `i` listens on (on `mem`, what fault filters match).
    pub fn data_addr(&self, i: usize) -> String {
        self.data[i].local_addr().to_string()
    }

    /// The cluster's temporary directory.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}
