//! A metadata server and data servers running inside the test process.

use data_server::{DataConfig, DataServer};
use fs_client::{Client, ClientConfig};
use meta_server::server::{MetaConfig, MetaServer};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;

/// How long servers may take to start and register.
const READY: Duration = Duration::from_secs(30);

/// A cluster inside the test process, on 127.0.0.1 with temporary directories.
pub struct InProcessCluster {
    meta: Option<MetaServer>,
    /// The data servers, in start order.
    pub data: Vec<DataServer>,
    /// Each data server's directory.
    pub data_dirs: Vec<PathBuf>,
    dir: TempDir,
}

impl InProcessCluster {
    /// Starts one metadata server and `n` data servers and waits until all registered.
    pub async fn start(n: usize) -> InProcessCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let meta = MetaServer::start(MetaConfig {
            listen: "127.0.0.1:0".into(),
            data_dir: dir.path().join("meta"),
            ..MetaConfig::default()
        })
        .await
        .expect("metadata server starts");
        let mut data = Vec::new();
        let mut data_dirs = Vec::new();
        for i in 0..n {
            let d = dir.path().join(format!("data-{i}"));
            data.push(Self::start_data(&meta, d.clone()).await);
            data_dirs.push(d);
        }
        InProcessCluster {
            meta: Some(meta),
            data,
            data_dirs,
            dir,
        }
    }

    async fn start_data(meta: &MetaServer, data_dir: PathBuf) -> DataServer {
        let s = DataServer::start(DataConfig {
            listen: "127.0.0.1:0".into(),
            meta_addr: meta.local_addr().to_string(),
            data_dir,
            capacity_bytes: 8 << 30,
            heartbeat_ms: 100,
            ..DataConfig::default()
        })
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
        let config = MetaConfig {
            listen: addr.to_string(),
            data_dir: self.dir.path().join("meta"),
            ..MetaConfig::default()
        };
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
        let config = ClientConfig {
            meta_addr: self.meta_addr(),
            ..ClientConfig::default()
        };
        Client::connect(config).await.expect("client connects")
    }

    /// The cluster's temporary directory.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}
