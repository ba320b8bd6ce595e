//! A running data server: the listener, its registration with the metadata server, and
//! the heartbeat that carries garbage-collection work back.

use crate::cluster_view::{ClusterView, MetaContact};
use crate::config::DataConfig;
use crate::error::{DataError, StartError};
use crate::keys::DataVerifier;
use crate::metrics::DataMetrics;
use crate::service::{DataService, GrantCheck, Pools, Resync};
use crate::store::{open_files_for, ChunkStore};
use parking_lot::Mutex;
use proto::meta::cluster::{self, Beat, RegisterData};
use proto::meta::GcTask;
use proto::{NodeId, PROTOCOL_VERSION};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use telemetry::MetricsServer;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};
use transport::{BufferPool, Credentials, Endpoint, Key, Listener};

/// Deletions one heartbeat round carries out at most (the rest wait for the next round).
const MAX_GC_PER_HEARTBEAT: usize = 256;

/// With a `key_file`: connections out authenticate as `server/data` with the cluster
/// key, the listener checks every handshake ([`DataVerifier`]), and the service every
/// client's grants ([`GrantCheck`]).
fn with_keys(
    ep: Endpoint,
    config: &DataConfig,
    contact: &Arc<MetaContact>,
) -> Result<Keyed, StartError> {
    if config.key_file.as_os_str().is_empty() {
        warn!(listen = %config.listen, "serving WITHOUT authentication: anyone who \
              reaches this address can read and overwrite every chunk");
        return Ok((ep, None, None));
    }
    let cluster = Key::load(&config.key_file).map_err(StartError::Key)?;
    let skew = config.grant_clock_skew_ms;
    let grants = GrantCheck::new(cluster.clone(), skew, contact.clone());
    let out = ep.with_credentials(Credentials::server("data", cluster.clone()));
    let dir = Some(config.data_dir.as_path());
    let verifier = DataVerifier::new(cluster, out.clone(), config.meta_addr.clone(), dir);
    Ok((
        out.with_verifier(Arc::new(verifier.clone())),
        Some(verifier),
        Some(grants),
    ))
}

/// The endpoint [`with_keys`] makes, its verifier and the grant check (both `None`
/// without keys).
type Keyed = (Endpoint, Option<DataVerifier>, Option<GrantCheck>);

/// A data server running inside this process.
pub struct DataServer {
    listener: Arc<Listener>,
    /// Closes revoked clients' connections (with keys).
    revocations: Option<JoinHandle<()>>,
    advertise: String,
    node: watch::Receiver<Option<NodeId>>,
    heartbeat: JoinHandle<()>,
    resync: JoinHandle<()>,
    store: Arc<ChunkStore>,
    service: DataService,
    /// The Prometheus endpoint, when configured.
    metrics: Option<MetricsServer>,
}

impl DataServer {
    /// Opens the store, listens, and starts registering with the metadata server (which
    /// may not be up yet: registration is retried until it answers).
    pub async fn start(config: DataConfig) -> Result<DataServer, StartError> {
        config.validate().map_err(StartError::Config)?;
        // Two descriptors per chunk file kept open come on top of connections.
        // A limit that cannot be read is taken as the usual soft limit.
        let nofile = transport::raise_open_file_limit().unwrap_or(1024);
        let open_files = open_files_for(nofile, config.transport_limits.max_connections);
        tracing::debug!(nofile, open_files, "chunk files kept open at most");
        let dir = config.data_dir.clone();
        let capacity = match config.capacity_bytes {
            0 => fs_size(&dir)?,
            n => n,
        };
        let (direct_io, disk_reserve) = (config.direct_io, config.disk_reserve_bytes);
        let metrics = Arc::new(DataMetrics::new().map_err(StartError::Metrics)?);
        let io = metrics.store_io().map_err(StartError::Metrics)?;
        let store = tokio::task::spawn_blocking(move || match ChunkStore::open(&dir, capacity) {
            Ok(s) => Ok(s
                .keep_open(open_files)
                .direct_io(direct_io)
                .disk_reserve(disk_reserve)
                .count_io(io)),
            Err(source) => Err(StartError::Store { dir, source }),
        })
        .await??;
        let store = Arc::new(store);
        let limits = config.transport_limits.clone();
        let ep = Endpoint::new(config.transport, limits.clone(), PROTOCOL_VERSION)
            .map_err(StartError::Transport)?;
        let contact = Arc::new(MetaContact::new());
        let (ep, verifier, grants) = with_keys(ep, &config, &contact)?;
        let buffers = |count| {
            BufferPool::new(&ep, count, config.io_buffer_bytes).map_err(StartError::Buffers)
        };
        let pools = Pools {
            io: buffers(config.io_buffers)?,
            relay: buffers(config.io_buffers.div_ceil(2))?,
            tail: buffers(config.io_buffers.div_ceil(2))?,
        };
        let meta_addr = config.meta_addr.clone();
        let view = Arc::new(ClusterView::with_contact(ep.clone(), meta_addr, contact));
        let max_msg = limits.max_msg_bytes;
        let service = DataService::new(store.clone(), pools, max_msg, view.clone(), grants);
        let interval = Duration::from_millis(config.heartbeat_ms);
        let resync_task = service.resync(interval);
        service.count_in(metrics.clone());
        let listener = ep
            .listen(&config.listen, Arc::new(service.clone()))
            .await
            .map_err(|source| StartError::Listen {
                addr: config.listen.clone(),
                source,
            })?;
        let listener = Arc::new(listener);
        let transport = ep.backend().name();
        let metrics = metrics.serve(&config.metrics, &store, &listener, transport);
        let metrics = metrics.await?;
        let revocations = verifier.map(|v| v.watch(Arc::downgrade(&listener)));
        let advertise = match config.advertise.as_str() {
            "" => listener.local_addr().to_string(),
            a => a.to_string(),
        };
        let (tx, rx) = watch::channel(None);
        let beat = Heartbeat {
            store: store.clone(),
            advertise: advertise.clone(),
            interval,
            view,
            resync: resync_task.clone(),
            gc: Collector::default(),
        };
        let heartbeat = tokio::spawn(beat.run(tx));
        let resync = tokio::spawn(resync_task.run());
        info!(addr = %listener.local_addr(), %advertise, "data server started");
        Ok(DataServer {
            listener,
            revocations,
            advertise,
            node: rx,
            heartbeat,
            resync,
            store,
            service,
            metrics,
        })
    }

    /// The address of the metrics endpoint, when one serves.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::local_addr)
    }

    /// Chunk requests refused for their grant so far, per reason (empty without keys).
    pub fn grant_refusals(&self) -> Vec<(String, u64)> {
        self.service.grant_refusals()
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// The address clients are told to use.
    pub fn advertise(&self) -> &str {
        &self.advertise
    }

    /// The id the metadata server gave this server, once registered.
    pub fn node_id(&self) -> Option<NodeId> {
        *self.node.borrow()
    }

    /// The chunk store (for tests and tools).
    pub fn store(&self) -> &Arc<ChunkStore> {
        &self.store
    }

    /// Waits until the metadata server has registered this server, or `timeout` passes.
    pub async fn wait_registered(&self, timeout: Duration) -> Option<NodeId> {
        let mut rx = self.node.clone();
        let wait = async { rx.wait_for(|n| n.is_some()).await.ok().and_then(|n| *n) };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }

    /// Stops serving: closes every connection and the heartbeat.
    pub fn shutdown(&self) {
        self.heartbeat.abort();
        self.resync.abort();
        if let Some(r) = &self.revocations {
            r.abort();
        }
        self.listener.shutdown();
    }
}

impl Drop for DataServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Size of the file system holding `dir` (created if missing).
fn fs_size(dir: &std::path::Path) -> Result<u64, StartError> {
    let dir = dir.to_path_buf();
    if let Err(source) = std::fs::create_dir_all(&dir) {
        return Err(StartError::DataDir { dir, source });
    }
    match transport::disk_space(&dir) {
        Ok((total, _)) => Ok(total),
        Err(source) => Err(StartError::DiskSize { dir, source }),
    }
}

struct Heartbeat {
    store: Arc<ChunkStore>,
    advertise: String,
    interval: Duration,
    view: Arc<ClusterView>,
    resync: Resync,
    gc: Collector,
}

/// Deletions carried out beside the heartbeats, never in their way: a batch of big
/// files (`rm -rf` of a folder of checkpoints) can take longer than the server's lease,
/// and a beat that waited for it let the lease run out, so the metadata server took
/// the server out of its chains.
#[derive(Clone, Default)]
struct Collector {
    /// A batch is being carried out; tasks handed out meanwhile come again later
    /// (the metadata server repeats them until they are reported done).
    busy: Arc<AtomicBool>,
    /// Deletions done and not yet reported.
    done: Arc<Mutex<Vec<GcTask>>>,
}

/// Clears a [`Collector`]'s `busy` flag when dropped.
struct Idle(Arc<AtomicBool>);

impl Drop for Idle {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Collector {
    /// Starts carrying out `tasks` (at most [`MAX_GC_PER_HEARTBEAT`]) unless a batch
    /// is under way. One hand-off to the blocking pool for the whole batch: most files
    /// removed have no chunk here (empty files), and a hand-off per file cost more than
    /// deleting such a file.
    fn start(&self, store: &Arc<ChunkStore>, tasks: Vec<GcTask>) {
        if tasks.is_empty() || self.busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let (store, gc) = (store.clone(), self.clone());
        let batch: Vec<GcTask> = tasks.into_iter().take(MAX_GC_PER_HEARTBEAT).collect();
        tokio::task::spawn_blocking(move || {
            // Idle again however the batch ends, a panic included: else no deletion
            // would ever start again.
            let _idle = Idle(gc.busy.clone());
            let mut done = Vec::with_capacity(batch.len());
            for task in batch {
                let GcTask::DeleteFile(ino) = task;
                match store.delete_file(ino) {
                    Ok(()) => done.push(task),
                    Err(e) => warn!(%ino, error = %e, "deleting chunks failed"),
                }
            }
            gc.done.lock().extend(done);
        });
    }

    /// The deletions done since the last call, to report.
    fn take_done(&self) -> Vec<GcTask> {
        std::mem::take(&mut *self.done.lock())
    }

    /// Deletions whose report did not arrive: reported again with the next beat.
    fn unreported(&self, done: Vec<GcTask>) {
        self.done.lock().extend(done);
    }
}

impl Heartbeat {
    /// Capacity and use as `statfs` should see them ([`ChunkStore::reported_usage`]).
    async fn usage(&self) -> (u64, u64) {
        let store = self.store.clone();
        let r = tokio::task::spawn_blocking(move || store.reported_usage());
        match r.await {
            Ok(Ok(u)) => u,
            _ => (0, 0),
        }
    }

    async fn register(&self) -> Result<NodeId, DataError> {
        let store = self.store.clone();
        let known = tokio::task::spawn_blocking(move || store.load_node_id())
            .await
            .map_err(|e| DataError::Task(e.to_string()))??;
        let (capacity_bytes, used_bytes) = self.usage().await;
        let req = RegisterData {
            node: known,
            addr: self.advertise.clone(),
            capacity_bytes,
            used_bytes,
        };
        let node = self.view.meta_call(req).await?;
        if known != Some(node) {
            let store = self.store.clone();
            tokio::task::spawn_blocking(move || store.save_node_id(node))
                .await
                .map_err(|e| DataError::Task(e.to_string()))??;
        }
        Ok(node)
    }

    async fn run(self, registered: watch::Sender<Option<NodeId>>) {
        let mut failures = 0u32;
        let node = loop {
            match self.register().await {
                Ok(n) => break n,
                Err(e) => {
                    failures += 1;
                    if failures % 20 == 1 {
                        warn!(error = %e, meta = %self.view.meta_addr(), "registration failed, retrying");
                    }
                    tokio::time::sleep(self.interval.min(Duration::from_millis(200))).await;
                }
            }
        };
        info!(%node, "registered with the metadata server");
        self.view.set_me(node);
        let _ = registered.send(Some(node));
        loop {
            tokio::time::sleep(self.interval).await;
            let (capacity_bytes, used_bytes) = self.usage().await;
            let done = self.gc.take_done();
            let req = cluster::Heartbeat {
                node,
                capacity_bytes,
                used_bytes,
                done: done.clone(),
                map_version: self.view.current().version,
                resync: self.resync.report(),
            };
            match self.view.meta_call(req).await {
                Ok(Beat { gc, map }) => {
                    if let Some(map) = map {
                        self.view.offer(map);
                    }
                    self.gc.start(&self.store, gc);
                }
                Err(e) => {
                    warn!(error = %e, "heartbeat failed");
                    self.gc.unreported(done);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a bad data directory being reported as a request's error kind.
    #[tokio::test]
    async fn a_data_dir_that_cannot_be_made_is_a_start_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let config = DataConfig {
            listen: "127.0.0.1:0".into(),
            meta_addr: "127.0.0.1:1".into(),
            data_dir: file.join("data"),
            ..DataConfig::default()
        };
        let Err(e) = DataServer::start(config).await else {
            panic!("started on a data directory below a regular file");
        };
        // capacity_bytes 0 (the default) sizes the disk first, which creates the directory.
        assert!(matches!(&e, StartError::DataDir { dir, .. } if *dir == file.join("data")));
        assert!(e.to_string().contains("file/data"), "{e}");
    }
}
