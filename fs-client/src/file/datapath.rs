//! The data path of one client: its buffer pools, its links to the data servers, the
//! cluster map and its refresh, failover across chain members (`replicas.rs`) and the
//! chunk transfers. The metadata side (`Client`) holds one [`DataPath`] and sees none of
//! its fields; the data path reaches the metadata server only through [`MapSource`],
//! to re-read the cluster map: the dependency goes one way.

use super::grants::{Attach, GrantBook};
use crate::error::{ClientError, Result};
use crate::rpc::{DataLinks, RpcEndpoint};
use crate::segpool::SegPool;
use parking_lot::{Mutex, RwLock};
use proto::grant::Grant;
use proto::meta::ClusterMap;
use proto::{ErrorCode, InodeId, NodeId, SessionId};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use transport::{BufferPool, Connection};

/// A fetch of the cluster map from the metadata server.
pub(crate) type MapFetch<'a> = Pin<Box<dyn Future<Output = Result<ClusterMap>> + Send + 'a>>;

/// A renewal of a grant by the metadata server.
pub(crate) type GrantFetch<'a> = Pin<Box<dyn Future<Output = Result<Option<Grant>>> + Send + 'a>>;

/// Where the data path reads the cluster map from: the metadata side of the client,
/// which owns the metadata connection (and waits for a server that is away).
pub(crate) trait MapSource: Send + Sync {
    /// The cluster map as the metadata server knows it now.
    fn fetch_map(&self) -> MapFetch<'_>;
    /// A new grant for the file of open session `session`.
    fn regrant(&self, session: SessionId) -> GrantFetch<'_>;
}

/// The buffers a data path moves bytes through (see `ClientConfig`).
pub(crate) struct Pools {
    /// Buffers for reads that are not prefetched and for writes that are not buffered.
    pub io: BufferPool,
    /// Segment buffers of prefetched reads (`readahead_mount_bytes`).
    pub read: Arc<SegPool>,
    /// Segment buffers of buffered writes (`write_buffer_mount_bytes`).
    pub write: Arc<SegPool>,
}

/// Moves file bytes between registered buffers and the data servers.
pub(crate) struct DataPath {
    pub(super) ep: Arc<RpcEndpoint>,
    links: DataLinks,
    /// Buffers for reads that are not prefetched and for writes that are not buffered.
    pub(super) pool: BufferPool,
    /// Segment buffers of prefetched reads (`readahead_mount_bytes`).
    pub(super) read_pool: Arc<SegPool>,
    /// Segment buffers of buffered writes (`write_buffer_mount_bytes`).
    pub(super) write_pool: Arc<SegPool>,
    /// The machine's memory: files that fit a quarter of it are read around in larger
    /// blocks (`file::around`).
    pub(super) memory_bytes: u64,
    /// How long a request waits, in all, for the map to route it around a failure.
    pub(super) failover_timeout: Duration,
    /// Where the map is re-read from (the client that holds this data path).
    source: Weak<dyn MapSource>,
    /// The cluster map last fetched.
    map: RwLock<Arc<ClusterMap>>,
    /// When the map was last read from the metadata server (see `refresh_map_shared`).
    pub(super) map_read: Mutex<Option<Instant>>,
    /// The grants chunk requests carry, by file.
    pub(crate) grants: GrantBook,
}

impl DataPath {
    /// A data path over `pools`, with no map yet: `refresh_map` fetches it from
    /// `source`.
    pub(crate) fn new(
        ep: Arc<RpcEndpoint>,
        pools: Pools,
        failover_timeout: Duration,
        source: Weak<dyn MapSource>,
    ) -> DataPath {
        DataPath {
            ep,
            links: DataLinks::default(),
            pool: pools.io,
            read_pool: pools.read,
            write_pool: pools.write,
            memory_bytes: super::around::machine_memory(),
            failover_timeout,
            source,
            map: RwLock::new(Arc::new(ClusterMap::default())),
            map_read: Mutex::new(None),
            grants: GrantBook::default(),
        }
    }

    /// The grant a chunk request of `ino` carries, renewed first when half its lifetime
    /// has passed.
    pub(super) async fn grant_for(&self, ino: InodeId) -> Option<Grant> {
        match self.grants.attach(ino) {
            Attach::Use(g) => g,
            Attach::Renew(session, old) => self.renew(ino, session).await.or(old),
        }
    }

    /// Asks the metadata server for a new grant for `ino` now (a data server refused
    /// the one held); whether one came.
    pub(super) async fn renew_now(&self, ino: InodeId) -> bool {
        match self.grants.session_of(ino) {
            Some(session) => self.renew(ino, session).await.is_some(),
            None => false,
        }
    }

    async fn renew(&self, ino: InodeId, session: SessionId) -> Option<Grant> {
        let source = self.source.upgrade()?;
        match source.regrant(session).await {
            Ok(Some(g)) => {
                self.grants.put(Some(g.clone()), session);
                Some(g)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(%ino, %session, error = %e, "grant renewal refused");
                let gone = e.code() == ErrorCode::Stale;
                self.grants.renewal_failed(ino, session, gone);
                None
            }
        }
    }

    /// The cluster map in use.
    pub(crate) fn map(&self) -> Arc<ClusterMap> {
        self.map.read().clone()
    }

    /// Re-reads the list of data servers.
    pub(crate) async fn refresh_map(&self) -> Result<()> {
        *self.map_read.lock() = Some(Instant::now());
        // The client owns its data path: it is alive while the data path is used.
        let source = self
            .source
            .upgrade()
            .ok_or_else(|| ClientError::Protocol("the client is gone".into()))?;
        let map = source.fetch_map().await?;
        self.links.update(&map.nodes);
        let mut current = self.map.write();
        if map.version >= current.version {
            *current = Arc::new(map);
        }
        Ok(())
    }

    /// A live connection to data server `node`, refreshing the map if it is unknown.
    pub(crate) async fn data_conn(&self, node: NodeId) -> Result<Connection> {
        let link = match self.links.get(node) {
            Some(l) => l,
            None => {
                self.refresh_map().await?;
                self.links.get(node).ok_or_else(|| {
                    ClientError::NotInMap(format!("{node} is not in the cluster map"))
                })?
            }
        };
        Ok(link.get(&self.ep).await?)
    }

    /// Connections to data servers open now (for the metrics).
    pub(crate) fn open_connections(&self) -> usize {
        self.links.open_count()
    }
}
