//! etcd members started on 127.0.0.1 for tests, benchmarks and `tessera up --engine
//! etcd`: free ports, data on tmpfs unless told otherwise (each etcd write costs every
//! member an fsync; on a shared disk that is a few tens of transactions a second),
//! stopped by PID when dropped, or left running once [`LocalEtcd::detach`]ed (the local
//! cluster of `tessera up` records their PIDs and `tessera down` stops them).
//!
//! The `etcd` binary is Debian's `etcd-server` (or `$TESSERA_ETCD`); [`LocalEtcd::binary`]
//! says whether there is one, so a test without it can say so and be skipped.

use super::EtcdConfig;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long a member may take to answer after its start.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a new cluster of several members may take to elect its first leader before
/// it is started again on other ports (a second, usually).
pub const FIRST_LEADER_TIMEOUT: Duration = Duration::from_secs(20);
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
    /// Members in process groups of their own, so that a signal to the starting
    /// terminal's group (Ctrl-C) does not reach them: they outlive their starter.
    detached: bool,
}

/// A member left running by [`LocalEtcd::detach`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Running {
    /// Its name in the cluster (`m0`, `m1`, ...).
    pub name: String,
    /// Its PID.
    pub pid: u32,
    /// Its client URL.
    pub client_url: String,
}

/// The directory test members keep their data in: tmpfs (`/dev/shm`) where there is one.
pub fn default_base() -> PathBuf {
    if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    }
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

    /// Whether a test that needs etcd can run here: there is an `etcd` binary
    /// ([`LocalEtcd::binary`]). Without one the test says it is skipped, and under CI
    /// (`$CI` set), where `.ci/run` installs Debian's `etcd-server`, it fails instead.
    pub fn present_for_tests() -> bool {
        if LocalEtcd::binary().is_some() {
            return true;
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "no etcd binary under CI: .ci/run installs etcd-server"
        );
        eprintln!("skipped: no etcd binary (install Debian's etcd-server)");
        false
    }

    /// Starts `members` members as one new cluster and waits until each answers, up to
    /// three times: a free port found here may be taken by another test's process
    /// before etcd binds it.
    pub fn start(members: usize) -> Result<LocalEtcd, String> {
        LocalEtcd::start_in(members, &default_base(), false)
    }

    /// [`LocalEtcd::start`] with the data in a new directory under `base`; `detached`:
    /// each member in a process group of its own (for [`LocalEtcd::detach`]).
    pub fn start_in(members: usize, base: &Path, detached: bool) -> Result<LocalEtcd, String> {
        let mut last = String::new();
        for attempt in 1..=3 {
            match LocalEtcd::start_once(members, base, detached) {
                Ok(etcd) => return Ok(etcd),
                Err(e) => {
                    eprintln!("etcd: start {attempt} of 3 failed: {e}");
                    last = e;
                }
            }
        }
        Err(last)
    }

    fn start_once(members: usize, base: &Path, detached: bool) -> Result<LocalEtcd, String> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let token = format!("tessera-{}-{n}", std::process::id());
        let dir = base.join(&token);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut etcd = LocalEtcd {
            members: Vec::new(),
            dir,
            token,
            detached,
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
        if members > 1 {
            etcd.wait_for_leader(FIRST_LEADER_TIMEOUT)?;
        }
        Ok(etcd)
    }

    /// Waits up to `within` until the running members have a leader (they answer before
    /// they have elected one); the error holds the members' logs.
    pub fn wait_for_leader(&self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        while self.leader().is_none() {
            if Instant::now() > deadline {
                return Err(format!(
                    "no etcd leader within {} s; the members' logs:\n{}",
                    within.as_secs(),
                    self.log_tails(20)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The last `lines` lines of each member's log, for an error.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for m in &self.members {
            let text = std::fs::read_to_string(self.dir.join(format!("{}.log", m.name)))
                .unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- {} (ports {}, {})\n",
                m.name, m.client_port, m.peer_port
            ));
            for l in &all[all.len().saturating_sub(lines)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
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

    /// The directory holding every member's data and log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Leaves the members running and their directory in place: the caller stops them
    /// by PID and removes [`LocalEtcd::dir`]. Returns what runs.
    pub fn detach(mut self) -> Vec<Running> {
        let running = (0..self.members.len())
            .filter_map(|i| {
                let child = self.members[i].child.take()?;
                Some(Running {
                    name: self.members[i].name.clone(),
                    pid: child.id(),
                    client_url: self.endpoint(i),
                })
            })
            .collect();
        // Nothing left for `drop` to stop; the directory stays.
        self.members.clear();
        self.dir = PathBuf::new();
        running
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
        let mut cmd = Command::new(bin);
        if self.detached {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let child = cmd
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
                        "etcd member {} did not answer within {} s; the members' logs:\n{}",
                        m.name,
                        START_TIMEOUT.as_secs(),
                        self.log_tails(20)
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
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A port free on 127.0.0.1 a moment ago, below the ephemeral range, never given to
/// another member of this process: a member killed by a test keeps its ports for its
/// restart.
fn free_port() -> Result<u16, String> {
    transport::ports::fixed_addr("127.0.0.1")
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
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
