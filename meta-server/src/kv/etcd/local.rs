//! etcd members started on 127.0.0.1 for tests and benchmarks: free ports, data on
//! tmpfs (each etcd write costs every member an fsync; on a shared disk that is a few
//! tens of transactions a second), stopped by PID when dropped.
//!
//! The `etcd` binary is Debian's `etcd-server` (or `$TESSERA_ETCD`); [`LocalEtcd::binary`]
//! says whether there is one, so a test without it can say so and be skipped.

use super::EtcdConfig;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long a member may take to answer after its start.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Raft heartbeat and election timeout of test members (etcd's defaults are 100 and
/// 1000 ms; these keep a leader change in tests near one second too).
const HEARTBEAT_MS: u32 = 100;
const ELECTION_MS: u32 = 1000;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// One member: its ports, its process while it runs.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// An etcd cluster of processes this one started.
pub struct LocalEtcd {
    members: Vec<Member>,
    dir: PathBuf,
    token: String,
}

impl LocalEtcd {
    /// The etcd binary: `$TESSERA_ETCD`, or `etcd` on the `PATH`.
    pub fn binary() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("TESSERA_ETCD") {
            return Some(PathBuf::from(p));
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|d| d.join("etcd"))
            .find(|p| p.is_file())
    }

    /// Starts `members` members as one new cluster and waits until each answers, up to
    /// three times: a free port found here may be taken by another test's process
    /// before etcd binds it.
    pub fn start(members: usize) -> Result<LocalEtcd, String> {
        let mut last = String::new();
        for _ in 0..3 {
            match LocalEtcd::start_once(members) {
                Ok(etcd) => return Ok(etcd),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn start_once(members: usize) -> Result<LocalEtcd, String> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let token = format!("tessera-{}-{n}", std::process::id());
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(&token);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut etcd = LocalEtcd {
            members: Vec::new(),
            dir,
            token,
        };
        for i in 0..members {
            etcd.members.push(Member {
                name: format!("m{i}"),
                client_port: free_port()?,
                peer_port: free_port()?,
                child: None,
            });
        }
        for i in 0..members {
            etcd.spawn(i)?;
        }
        etcd.wait_ready()?;
        Ok(etcd)
    }

    /// One shared single-member etcd for the tests of this process, started by the
    /// first caller and stopped when the last holder drops it. Each test keeps to a
    /// prefix of its own ([`LocalEtcd::config`]).
    pub fn shared() -> Result<Arc<LocalEtcd>, String> {
        static SHARED: Mutex<Weak<LocalEtcd>> = Mutex::new(Weak::new());
        let mut slot = SHARED.lock().map_err(|_| "poisoned".to_string())?;
        if let Some(etcd) = slot.upgrade() {
            return Ok(etcd);
        }
        let etcd = Arc::new(LocalEtcd::start(1)?);
        *slot = Arc::downgrade(&etcd);
        Ok(etcd)
    }

    /// A configuration for this cluster with a prefix no other caller gets.
    pub fn config(&self) -> EtcdConfig {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        EtcdConfig {
            endpoints: self.endpoints(),
            prefix: format!("t{n}/"),
            // Calls fail fast rather than wait out the whole default.
            retry_for_ms: 20_000,
            ..EtcdConfig::default()
        }
    }

    /// Client URLs of every member.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let bin = LocalEtcd::binary().ok_or("no etcd binary (install etcd-server)")?;
        let cluster: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let m = &self.members[i];
        let data = self.dir.join(&m.name);
        let log = std::fs::File::create(self.dir.join(format!("{}.log", m.name)))
            .map_err(|e| e.to_string())?;
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let state = if data.exists() { "existing" } else { "new" };
        let child = Command::new(bin)
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&data)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &cluster.join(",")])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.token])
            .args(["--heartbeat-interval", &HEARTBEAT_MS.to_string()])
            .args(["--election-timeout", &ELECTION_MS.to_string()])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting etcd: {e}"))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// Waits until every running member answers a status request.
    pub fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            while status(&self.endpoint(i)).is_none() {
                if Instant::now() > deadline {
                    return Err(format!(
                        "etcd member {} did not answer within {} s; its log: {}",
                        m.name,
                        START_TIMEOUT.as_secs(),
                        self.dir.join(format!("{}.log", m.name)).display()
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// The index of the member that is leader, as a running member sees it.
    pub fn leader(&self) -> Option<usize> {
        let ids: Vec<Option<(u64, u64)>> = (0..self.members.len())
            .map(|i| match self.members[i].child {
                Some(_) => status(&self.endpoint(i)),
                None => None,
            })
            .collect();
        let leader = ids.iter().flatten().map(|(_, l)| *l).find(|l| *l != 0)?;
        ids.iter()
            .position(|s| s.is_some_and(|(me, _)| me == leader))
    }

    /// Kills member `i` with SIGKILL (by its PID) and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data.
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        self.spawn(i)
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port free on 127.0.0.1 a moment ago.
fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// `(member id, leader id)` of the member at `endpoint`, if it answers within a second.
fn status(endpoint: &str) -> Option<(u64, u64)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let endpoint = endpoint.to_string();
    rt.block_on(async move {
        let opts = etcd_client::ConnectOptions::default()
            .with_connect_timeout(Duration::from_millis(500))
            .with_timeout(Duration::from_secs(1));
        let client = etcd_client::Client::connect([endpoint], Some(opts))
            .await
            .ok()?;
        let s = client.maintenance_client().status().await.ok()?;
        let me = s.header()?.member_id();
        Some((me, s.leader()))
    })
}
