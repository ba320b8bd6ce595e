//! A cluster of real processes (`tessera-meta`, `tessera-data`) and real FUSE mounts
//! (`tessera mount`), started from the workspace's built binaries.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;

mod mount;
pub use mount::{Mount, Watchdog};

/// How long a process may take to become ready.
const READY: Duration = Duration::from_secs(60);
/// How long a process may take to exit after SIGTERM.
const STOP: Duration = Duration::from_secs(20);
/// How long any test may keep a mount before its [`Mount::watchdog`] aborts it: far
/// above the slowest test (a few minutes on CI), far below CI's 90-minute limit, so a
/// deadlocked mount fails its test instead of the whole run.
pub const MOUNT_LIMIT: Duration = Duration::from_secs(20 * 60);

/// The directory holding the workspace's binaries (next to the test's `deps/`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target directory")
        .to_path_buf();
    for b in ["tessera", "tessera-meta", "tessera-data"] {
        assert!(
            dir.join(b).is_file(),
            "{} is missing: build the binaries first (`cargo build --workspace --bins`, \
             as scripts/test.sh does)",
            dir.join(b).display()
        );
    }
    dir
}

/// Panics unless the test can mount FUSE file systems: CI runs these tests as root.
pub fn require_fuse() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root && Path::new("/dev/fuse").exists(),
        "FUSE tests need root and /dev/fuse (CI runs them as root)"
    );
}

/// Starts `bin` with `args` (after the command `prefix`, if any), its output appended
/// to `log`.
fn spawn(prefix: &[&str], bin: &Path, args: &[&str], log: &Path) -> Child {
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    let err = out.try_clone().expect("log file");
    let mut cmd = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.args(args)
        .env(
            "TESSERA_LOG",
            std::env::var("TESSERA_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()))
}

fn wait_for(what: &str, child: &mut Child, log: &Path, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + READY;
    while Instant::now() < deadline {
        if ready() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{what} exited with {status}:\n{}",
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!(
        "{what} not ready in {READY:?}:\n{}",
        fs::read_to_string(log).unwrap_or_default()
    );
}

/// Stops a child: SIGTERM, then SIGKILL after a grace period; always reaps it.
fn stop(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    // SAFETY: signalling our own child by its PID. SIGCONT after SIGTERM: a child a
    // test paused (`pause_data`) handles the SIGTERM only once it runs again.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
        libc::kill(child.id() as i32, libc::SIGCONT);
    }
    let deadline = Instant::now() + STOP;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn transport_args(transport: &Option<String>) -> Vec<String> {
    match transport {
        Some(t) => vec!["--transport".into(), t.clone()],
        None => Vec::new(),
    }
}

fn path_text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A loopback address whose port was free a moment ago, below the ephemeral range (see
/// [`transport::ports`]): for a server a test starts there later.
fn free_addr(host: &str) -> String {
    transport::ports::fixed_addr(host)
        .expect("a free port")
        .to_string()
}

fn read_addr(file: &Path) -> Option<String> {
    fs::read_to_string(file)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().into())
}

/// The flags that make a server serve metrics on a free loopback port, recorded in
/// `<dir>/<name>.metrics`.
fn metrics_args(dir: &Path, name: &str) -> [String; 4] {
    [
        "--metrics-listen".into(),
        "127.0.0.1:0".into(),
        "--metrics-addr-file".into(),
        path_text(&dir.join(format!("{name}.metrics"))),
    ]
}

/// How a [`ProcessCluster`] is set up.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Data servers to start.
    pub data_servers: usize,
    /// Lines of the metadata server's configuration before its `[namespace]` section
    /// (e.g. `grant_lifetime_ms = 2000`).
    pub meta_toml: String,
    /// Lines of the metadata server's `[namespace]` configuration section.
    pub namespace_toml: String,
    /// The data servers' heartbeat interval, in milliseconds.
    pub heartbeat_ms: u64,
    /// More lines of the data servers' configuration (after `heartbeat_ms`).
    pub data_toml: String,
    /// Address the metadata server and the data servers listen on.
    pub host: String,
    /// Data servers started another way: index -> (command prefix, listen host), e.g.
    /// `ip netns exec NS` and an address inside that namespace.
    pub data_hosts: std::collections::BTreeMap<usize, (Vec<String>, String)>,
    /// The servers' `--transport` (`tcp`, `rdma`); `None`: their default.
    pub transport: Option<String>,
    /// Where `tessera-meta` and `tessera-data` are; `None`: the workspace's target
    /// directory ([`bin_dir`]).
    pub bin_dir: Option<PathBuf>,
    /// Run without keys; by default the servers, mounts and `tessera` commands
    /// authenticate with keys made in the cluster's directory (`keys/`).
    pub insecure: bool,
    /// Serve every server's Prometheus metrics on a free loopback port, recorded in
    /// `<dir>/<name>.metrics` (see [`ProcessCluster::metrics_addr`]).
    pub metrics: bool,
    /// Reserve a second metadata address (a free port on `host`, nobody listening yet)
    /// and name it after the first in every `--meta` the cluster gives out (`A,B`):
    /// [`ProcessCluster::fail_over_meta`] starts a metadata server there. For a store
    /// both can reach (`store = "etcd"` in `meta_toml`).
    pub standby_meta: bool,
    /// `NAME=value` pairs in the metadata server's environment (fault injection).
    pub meta_env: Vec<String>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            data_servers: 3,
            meta_toml: String::new(),
            namespace_toml: String::new(),
            heartbeat_ms: 1000,
            data_toml: String::new(),
            host: "127.0.0.1".into(),
            data_hosts: Default::default(),
            transport: None,
            bin_dir: None,
            insecure: false,
            metrics: false,
            standby_meta: false,
            meta_env: Vec::new(),
        }
    }
}

pub use crate::inprocess::{ADMIN_KEY, CLUSTER_KEY};

/// Real server processes (on 127.0.0.1 unless told otherwise).
pub struct ProcessCluster {
    dir: TempDir,
    bin: PathBuf,
    opts: ClusterOptions,
    meta: Child,
    data: Vec<Child>,
    /// The address of the metadata server running now.
    meta_addr: String,
    /// What data servers, mounts and commands are given: `meta_addr`, then the standby
    /// address if there is one.
    meta_addrs: String,
    /// The standby address ([`ClusterOptions::standby_meta`]).
    standby: Option<String>,
    /// A metadata server stopped with SIGSTOP and replaced by the standby
    /// ([`ProcessCluster::pause_and_fail_over_meta`]); stopped on drop.
    paused_meta: Option<Child>,
    /// A second metadata server serving beside the first at the standby address
    /// ([`ProcessCluster::start_peer_meta`], a shared etcd prefix); stopped on drop.
    peer_meta: Option<Child>,
}

impl ProcessCluster {
    /// Starts `tessera-meta` and `n` `tessera-data` processes and waits until every data
    /// server has registered.
    pub fn start(n: usize) -> ProcessCluster {
        Self::start_with(ClusterOptions {
            data_servers: n,
            ..ClusterOptions::default()
        })
    }

    /// Starts a cluster as `opts` says.
    pub fn start_with(opts: ClusterOptions) -> ProcessCluster {
        let bin = opts.bin_dir.clone().unwrap_or_else(bin_dir);
        let dir = tempfile::Builder::new()
            .prefix("tessera-test")
            .tempdir()
            .expect("temp dir");
        let d = dir.path();
        fs::write(
            d.join("meta.toml"),
            format!("{}\n[namespace]\n{}\n", opts.meta_toml, opts.namespace_toml),
        )
        .expect("meta config");
        fs::write(
            d.join("data.toml"),
            format!("heartbeat_ms = {}\n{}\n", opts.heartbeat_ms, opts.data_toml),
        )
        .expect("data config");
        if !opts.insecure {
            crate::inprocess::make_keys(&d.join("keys"));
        }
        let listen = format!("{}:0", opts.host);
        let meta = Self::spawn_meta(&bin, d, "meta", &listen, &opts);
        // Built before any wait, so whatever was started is stopped if a wait fails.
        let mut cluster = ProcessCluster {
            dir,
            bin,
            opts,
            meta,
            data: Vec::new(),
            meta_addr: String::new(),
            meta_addrs: String::new(),
            standby: None,
            paused_meta: None,
            peer_meta: None,
        };
        let addr_file = cluster.dir.path().join("meta.addr");
        let log = cluster.dir.path().join("meta.log");
        wait_for("tessera-meta", &mut cluster.meta, &log, || {
            read_addr(&addr_file).is_some()
        });
        cluster.meta_addr = read_addr(&addr_file).expect("meta address");
        cluster.meta_addrs = cluster.meta_addr.clone();
        if cluster.opts.standby_meta {
            let standby = free_addr(&cluster.opts.host);
            cluster.meta_addrs = format!("{},{standby}", cluster.meta_addr);
            cluster.standby = Some(standby);
        }
        for i in 0..cluster.opts.data_servers {
            let child = cluster.spawn_data(i);
            cluster.data.push(child);
            cluster.wait_data(i);
        }
        cluster
    }

    /// Starts `tessera-meta` with `<d>/<name>` as its data directory, writing
    /// `<name>.addr` and `<name>.log`.
    fn spawn_meta(bin: &Path, d: &Path, name: &str, listen: &str, opts: &ClusterOptions) -> Child {
        let addr_file = d.join(format!("{name}.addr"));
        let _ = fs::remove_file(&addr_file);
        let mut args: Vec<String> = [
            "--config",
            &d.join("meta.toml").to_string_lossy(),
            "--listen",
            listen,
            "--data-dir",
            &d.join(name).to_string_lossy(),
            "--addr-file",
            &addr_file.to_string_lossy(),
        ]
        .map(String::from)
        .to_vec();
        args.extend(transport_args(&opts.transport));
        if opts.metrics {
            args.extend(metrics_args(d, name));
        }
        if !opts.insecure {
            let keys = d.join("keys");
            args.extend(["--key-file".into(), path_text(&keys.join(CLUSTER_KEY))]);
            args.extend(["--admin-key-file".into(), path_text(&keys.join(ADMIN_KEY))]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut prefix: Vec<&str> = Vec::new();
        if !opts.meta_env.is_empty() {
            prefix.push("env");
            prefix.extend(opts.meta_env.iter().map(String::as_str));
        }
        spawn(
            &prefix,
            &bin.join("tessera-meta"),
            &args,
            &d.join(format!("{name}.log")),
        )
    }

    fn spawn_data(&self, i: usize) -> Child {
        self.spawn_data_at(i, &self.meta_addrs)
    }

    fn spawn_data_at(&self, i: usize, meta: &str) -> Child {
        let d = self.dir.path();
        let addr_file = d.join(format!("data-{i}.addr"));
        let _ = fs::remove_file(&addr_file);
        let log = d.join(format!("data-{i}.log"));
        let (prefix, host) = match self.opts.data_hosts.get(&i) {
            Some((p, h)) => (p.clone(), h.clone()),
            None => (Vec::new(), self.opts.host.clone()),
        };
        let mut owned = vec![
            "--config".to_string(),
            d.join("data.toml").to_string_lossy().into(),
            "--listen".into(),
            format!("{host}:0"),
            "--meta".into(),
            meta.to_string(),
            "--data-dir".into(),
            d.join(format!("data-{i}")).to_string_lossy().into(),
            "--addr-file".into(),
            addr_file.to_string_lossy().into(),
            "--capacity-bytes".into(),
            (16u64 << 30).to_string(),
        ];
        owned.extend(transport_args(&self.opts.transport));
        if self.opts.metrics {
            owned.extend(metrics_args(d, &format!("data-{i}")));
        }
        if !self.opts.insecure {
            owned.extend(["--key-file".into(), path_text(&self.key_file(CLUSTER_KEY))]);
        }
        let args: Vec<&str> = owned.iter().map(String::as_str).collect();
        let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
        spawn(&prefix, &self.bin.join("tessera-data"), &args, &log)
    }

    fn wait_data(&mut self, i: usize) {
        let d = self.dir.path().to_path_buf();
        let addr_file = d.join(format!("data-{i}.addr"));
        let log = d.join(format!("data-{i}.log"));
        wait_for("tessera-data", &mut self.data[i], &log, || {
            read_addr(&addr_file).is_some()
        });
    }

    /// Kills data server `i` with SIGKILL and reaps it.
    pub fn kill_data(&mut self, i: usize) {
        let _ = self.data[i].kill();
        let _ = self.data[i].wait();
    }

    /// Stops data server `i` with SIGSTOP: it hangs with its connections open, as a
    /// server whose disk or kernel is stuck does. [`ProcessCluster::resume_data`] (or
    /// dropping the cluster) lets it run again.
    pub fn pause_data(&self, i: usize) {
        // SAFETY: signalling our own child by its PID.
        unsafe {
            libc::kill(self.data[i].id() as i32, libc::SIGSTOP);
        }
    }

    /// Lets data server `i`, stopped by [`ProcessCluster::pause_data`], run again.
    pub fn resume_data(&self, i: usize) {
        // SAFETY: signalling our own child by its PID.
        unsafe {
            libc::kill(self.data[i].id() as i32, libc::SIGCONT);
        }
    }

    /// Starts data server `i` again on its directory (a new port); returns once it
    /// listens.
    pub fn restart_data(&mut self, i: usize) {
        stop(&mut self.data[i]);
        self.data[i] = self.spawn_data(i);
        self.wait_data(i);
    }

    /// Starts data server `i` again on its directory with `meta` (an address, or a list
    /// tried in its order) as its `--meta`; returns once it listens.
    pub fn restart_data_at(&mut self, i: usize, meta: &str) {
        stop(&mut self.data[i]);
        self.data[i] = self.spawn_data_at(i, meta);
        self.wait_data(i);
    }

    /// Kills the metadata server with SIGKILL and reaps it.
    pub fn kill_meta(&mut self) {
        let _ = self.meta.kill();
        let _ = self.meta.wait();
    }

    /// Waits at most `limit` until every chain has all its members serving, as the
    /// metadata server's map says (a client connects to ask).
    pub fn wait_healthy(&self, limit: Duration) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let client = fs_client::Client::connect(self.client_config())
                .await
                .expect("client connects");
            crate::wait_healthy(&client, limit).await;
        });
    }

    /// Whether the metadata server this cluster started last is still running (it has
    /// not exited, for instance on a lost owner key).
    pub fn meta_running(&mut self) -> bool {
        matches!(self.meta.try_wait(), Ok(None))
    }

    /// Sets the metadata server's environment from its next start on
    /// ([`ClusterOptions::meta_env`]).
    pub fn set_meta_env(&mut self, env: &[&str]) {
        self.opts.meta_env = env.iter().map(|v| v.to_string()).collect();
    }

    /// Starts the metadata server again on the same address and store.
    pub fn restart_meta(&mut self) {
        stop(&mut self.meta);
        let d = self.dir.path().to_path_buf();
        self.meta = Self::spawn_meta(&self.bin, &d, "meta", &self.meta_addr, &self.opts);
        let addr_file = d.join("meta.addr");
        wait_for("tessera-meta", &mut self.meta, &d.join("meta.log"), || {
            read_addr(&addr_file).is_some()
        });
    }

    /// Stops the metadata server with SIGSTOP (it keeps its connections open and answers
    /// nothing, as a hung process or a paused machine does) and starts another at the
    /// standby address, as [`ProcessCluster::fail_over_meta`] does; returns once it
    /// listens. [`ProcessCluster::resume_paused_meta`] lets the stopped one run again.
    pub fn pause_and_fail_over_meta(&mut self) {
        // SAFETY: signalling our own child by its PID.
        unsafe {
            libc::kill(self.meta.id() as i32, libc::SIGSTOP);
        }
        self.start_standby(true);
    }

    /// Starts a metadata server at the standby address ([`ClusterOptions::standby_meta`])
    /// with a data directory of its own (`meta-b`), as a standby machine would, in place
    /// of the current one (kept as the paused one with `keep`, else already reaped);
    /// returns once it listens. Its address is then [`ProcessCluster::meta_addr`].
    fn start_standby(&mut self, keep: bool) {
        let standby = self.standby.clone().expect("a cluster with standby_meta");
        let d = self.dir.path().to_path_buf();
        let b = Self::spawn_meta(&self.bin, &d, "meta-b", &standby, &self.opts);
        let old = std::mem::replace(&mut self.meta, b);
        if keep {
            self.paused_meta = Some(old);
        } else {
            // Reaped already: this answers its status again.
            let mut old = old;
            let _ = old.wait();
        }
        let addr_file = d.join("meta-b.addr");
        wait_for(
            "tessera-meta",
            &mut self.meta,
            &d.join("meta-b.log"),
            || read_addr(&addr_file).is_some(),
        );
        self.meta_addr = standby;
    }

    /// Lets the metadata server stopped by [`ProcessCluster::pause_and_fail_over_meta`]
    /// run again and waits up to `limit` for it to exit by itself; its exit status, or
    /// `None` if it still runs (then it is stopped on drop).
    pub fn resume_paused_meta(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let child = self.paused_meta.as_mut().expect("a paused metadata server");
        // SAFETY: signalling our own child by its PID.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGCONT);
        }
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Stops the metadata server with SIGSTOP, waits `frozen` (a client's next call
    /// reaches it and stays unanswered), then kills it with SIGKILL and starts another
    /// at the standby address, as [`ProcessCluster::fail_over_meta`] does: the call
    /// that was under way breaks with its connection.
    pub fn freeze_then_fail_over_meta(&mut self, frozen: Duration) {
        self.freeze_then_kill_meta(frozen);
        self.start_standby(false);
    }

    /// Starts a second metadata server at the standby address
    /// ([`ClusterOptions::standby_meta`]) with a data directory of its own (`meta-b`)
    /// beside the first, which keeps running: for a prefix both serve at once
    /// (`etcd.shared` in `meta_toml`). Returns once it listens.
    pub fn start_peer_meta(&mut self) {
        let standby = self.standby.clone().expect("a cluster with standby_meta");
        let d = self.dir.path().to_path_buf();
        // Kept before the wait: a peer that never listens is still stopped on drop.
        let b = self.peer_meta.insert(Self::spawn_meta(
            &self.bin, &d, "meta-b", &standby, &self.opts,
        ));
        let addr_file = d.join("meta-b.addr");
        wait_for("tessera-meta", b, &d.join("meta-b.log"), || {
            read_addr(&addr_file).is_some()
        });
    }

    /// Whether the second metadata server ([`ProcessCluster::start_peer_meta`]) still
    /// runs.
    pub fn peer_meta_running(&mut self) -> bool {
        let peer = self.peer_meta.as_mut().expect("a second metadata server");
        matches!(peer.try_wait(), Ok(None))
    }

    /// The second metadata server's address ([`ProcessCluster::start_peer_meta`]).
    pub fn peer_meta_addr(&self) -> &str {
        self.standby
            .as_deref()
            .expect("a cluster with standby_meta")
    }

    /// Stops the metadata server with SIGSTOP, waits `frozen` (a client's next call
    /// reaches it and stays unanswered), then kills it with SIGKILL and reaps it: the
    /// call under way breaks with its connection.
    pub fn freeze_then_kill_meta(&mut self, frozen: Duration) {
        // SAFETY: signalling our own child by its PID.
        unsafe {
            libc::kill(self.meta.id() as i32, libc::SIGSTOP);
        }
        std::thread::sleep(frozen);
        self.kill_meta();
    }

    /// Kills the metadata server with SIGKILL and starts another at the standby address
    /// ([`ClusterOptions::standby_meta`]) with a data directory of its own (`meta-b`),
    /// as a standby machine would; returns once it listens. Its address is then
    /// [`ProcessCluster::meta_addr`].
    pub fn fail_over_meta(&mut self) {
        self.kill_meta();
        self.start_standby(false);
    }

    /// Runs the `tessera` command with `args` and `--meta` of this cluster; returns its
    /// exit code and standard output.
    pub fn tessera(&self, args: &[&str]) -> (i32, String) {
        self.tessera_at(&self.meta_addrs, args)
    }

    /// Runs the `tessera` command with `args` and `--meta META` (one address or a
    /// list); returns its exit code and standard output.
    pub fn tessera_at(&self, meta: &str, args: &[&str]) -> (i32, String) {
        let mut key = Vec::new();
        if !self.opts.insecure && !args.contains(&"--key-file") {
            key = vec![
                "--key-file".to_string(),
                path_text(&self.key_file(ADMIN_KEY)),
            ];
        }
        let out = Command::new(self.bin.join("tessera"))
            .args(args)
            .args(["--meta", meta])
            .args(&key)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running tessera {args:?}: {e}"));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            eprintln!(
                "tessera {args:?}: {}\n{text}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        (out.status.code().unwrap_or(-1), text)
    }

    /// The data servers whose state is `Up` in `tessera status --json` through `meta`
    /// (`None` if the command fails).
    pub fn up_nodes(&self, meta: &str) -> Option<usize> {
        let (code, out) = self.tessera_at(meta, &["status", "--json"]);
        if code != 0 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        let nodes = v["map"]["nodes"].as_array()?;
        Some(nodes.iter().filter(|n| n["state"] == "Up").count())
    }

    /// The address of the metadata server running now.
    pub fn meta_addr(&self) -> &str {
        &self.meta_addr
    }

    /// What data servers, mounts and commands are given as `--meta`: the server's
    /// address, then the standby's if there is one (`A,B`).
    pub fn meta_addrs(&self) -> &str {
        &self.meta_addrs
    }

    /// A client configuration that reaches this cluster as its administrator.
    pub fn client_config(&self) -> fs_client::ClientConfig {
        fs_client::ClientConfig {
            meta_addr: self.meta_addrs.clone(),
            key_file: match self.opts.insecure {
                true => PathBuf::new(),
                false => self.key_file(ADMIN_KEY),
            },
            ..fs_client::ClientConfig::default()
        }
    }

    /// A key file of the cluster ([`CLUSTER_KEY`], [`ADMIN_KEY`]).
    pub fn key_file(&self, name: &str) -> PathBuf {
        self.dir.path().join("keys").join(name)
    }

    /// The cluster's scratch directory (logs, server state).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Prints the last `lines` lines of every log in [`ProcessCluster::dir`] (servers'
    /// and mounts'), for a test that failed: the directory goes with the cluster.
    pub fn print_log_tails(&self, lines: usize) {
        print_log_tails(self.dir(), lines);
    }

    /// The address of the metrics endpoint of `name` (`meta`, `data-0`, ..., or a mount
    /// whose configuration named `<dir>/<name>.metrics` as `metrics.addr_file`), once
    /// the process wrote it.
    pub fn metrics_addr(&self, name: &str) -> Option<String> {
        read_addr(&self.dir.path().join(format!("{name}.metrics")))
    }

    /// Mounts the cluster at `<dir>/<name>` with a new `tessera mount` process.
    pub fn mount(&self, name: &str) -> Mount {
        self.mount_with_config(name, "")
    }

    /// Mounts like [`ProcessCluster::mount`], with `meta` (an address, or a list tried
    /// in its order) as the mount's `--meta`.
    pub fn mount_at(&self, name: &str, meta: &str) -> Mount {
        self.mount_with(name, "", meta)
    }

    /// Mounts like [`ProcessCluster::mount`], with `config` (client configuration TOML,
    /// e.g. `writeback_cache = true`) as the mount's `--config` file.
    pub fn mount_with_config(&self, name: &str, config: &str) -> Mount {
        self.mount_with(name, config, &self.meta_addrs)
    }

    /// Mounts with both: `config` as the mount's `--config` file and `meta` as its
    /// `--meta`.
    pub fn mount_with(&self, name: &str, config: &str, meta: &str) -> Mount {
        require_fuse();
        let path = self.dir.path().join(name);
        fs::create_dir_all(&path).expect("mount point");
        let log = self.dir.path().join(format!("{name}.log"));
        let conf = self.dir.path().join(format!("{name}.toml"));
        fs::write(&conf, config).expect("mount config file");
        let mut args = ["mount", "--config", &conf.to_string_lossy(), "--meta", meta]
            .map(String::from)
            .to_vec();
        if !self.opts.insecure && !config.contains("key_file") {
            args.extend(["--key-file".into(), path_text(&self.key_file(ADMIN_KEY))]);
        }
        args.push(path_text(&path));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = spawn(&[], &self.bin.join("tessera"), &args, &log);
        // The guard exists before the wait, so a mount that never becomes ready is still
        // unmounted and stopped.
        let mut m = Mount {
            path,
            child,
            log,
            _dog: None,
        };
        let (p, l) = (m.path.clone(), m.log.clone());
        wait_for("tessera mount", &mut m.child, &l, || {
            fs_client::cli::local_cluster::is_mounted(&p)
        });
        m._dog = Some(m.watchdog(MOUNT_LIMIT));
        m
    }
}

/// `tessera down` of a cluster made by `tessera up MNT --state-dir STATE` when dropped,
/// so a failing test leaves nothing behind; then the redirect `up --state-dir` left
/// under the default state root.
pub struct UpGuard {
    /// The mount point given to `up`.
    pub mnt: PathBuf,
    /// Its `--state-dir`.
    pub state: PathBuf,
}

impl Drop for UpGuard {
    fn drop(&mut self) {
        // A failed test prints the tails of its cluster's logs: they go with its
        // temporary directory, and a CI failure is read from them.
        if std::thread::panicking() {
            print_log_tails(&self.state.join("logs"), 40);
        }
        // --forget: also the record `up --state-dir` left under the default state root.
        let _ = Command::new(bin_dir().join("tessera"))
            .arg("down")
            .arg("--forget")
            .arg(&self.mnt)
            .arg("--state-dir")
            .arg(&self.state)
            .output();
    }
}

/// Prints the last `lines` lines of every `*.log` file in `dir`.
fn print_log_tails(dir: &Path, lines: usize) {
    let mut logs: Vec<_> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    for p in logs {
        let text = fs::read_to_string(&p).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        println!("--- {} (last {lines} lines)", p.display());
        for l in &all[all.len().saturating_sub(lines)..] {
            println!("{l}");
        }
    }
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        for c in &mut self.data {
            stop(c);
        }
        stop(&mut self.meta);
        if let Some(c) = &mut self.peer_meta {
            stop(c);
        }
        if let Some(c) = &mut self.paused_meta {
            stop(c);
        }
    }
}
