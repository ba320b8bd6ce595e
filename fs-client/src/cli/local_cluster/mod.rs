//! `tessera up` and `tessera down`: a local cluster (one metadata server, several data
//! servers on 127.0.0.1; on etcd, 3 etcd members and 2 metadata servers) and its mount, as child processes whose PIDs, start times,
//! command lines and addresses are recorded in the cluster's state directory. `up` on a
//! running cluster brings back the members that are missing, on their old addresses.

pub mod etcd;
mod procs;
pub mod state;

use procs::Member;
use state::Pids;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long each process may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the data servers may take to have every copy of every chain serving before
/// `up` settles for every chain having one (see `wait_healthy`).
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(60);
/// Readiness polling interval.
const POLL: Duration = Duration::from_millis(50);

/// What `tessera up` starts.
#[derive(Clone, Debug)]
pub struct UpOptions {
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// State directory; `None`: derived from the mount point.
    pub state_dir: Option<PathBuf>,
    /// Number of data servers.
    pub data_servers: usize,
    /// Metadata store engine ("redb", "sled" or "etcd"); `None`: the server's default.
    pub store: Option<String>,
    /// With `store` "etcd": the client URLs of an etcd cluster already running
    /// (comma-separated); `None`: `up` starts a local one of 3 members.
    pub etcd: Option<String>,
    /// Where the local etcd cluster keeps its data; `None`: tmpfs (`/dev/shm`).
    pub etcd_dir: Option<PathBuf>,
    /// With `store` "etcd": both metadata servers serve at once (`--etcd-shared`), not
    /// one and a standby.
    pub etcd_shared: bool,
    /// Directory holding `tessera-meta` and `tessera-data`; `None`: next to this program.
    pub bin_dir: Option<PathBuf>,
    /// Copies of each chunk; `None`: the metadata server's default (3).
    pub replicas: Option<u8>,
    /// Mount even if the mount point is not empty (its files are hidden meanwhile).
    pub nonempty: bool,
}

/// What `up` did.
#[derive(Debug)]
pub struct UpReport {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// The state directory.
    pub state: PathBuf,
    /// The metadata server's address.
    pub meta_addr: String,
    /// Where the processes log.
    pub logs: PathBuf,
    /// The members brought back into a running cluster, with their addresses (the
    /// mount's is its mount point); empty when the whole cluster was started.
    pub restarted: Vec<(String, String)>,
    /// Whether the cluster was already running (then only `restarted` were started).
    pub was_running: bool,
    /// Each member's metrics endpoint (`tessera top` reads them from the state).
    pub metrics: Vec<(String, String)>,
}

impl std::fmt::Display for UpReport {
    /// What `tessera up` prints.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.mountpoint.display();
        for (role, addr) in &self.restarted {
            writeln!(f, "brought back {role} ({addr})")?;
        }
        if self.was_running && self.restarted.is_empty() {
            writeln!(
                f,
                "Every member of the cluster at {m} runs: nothing to bring back."
            )?;
        } else {
            writeln!(
                f,
                "Tessera is mounted at {m}. Stop it with: tessera down {m}"
            )?;
        }
        writeln!(f, "metadata server: {}", self.meta_addr)?;
        for (role, addr) in &self.metrics {
            writeln!(f, "metrics of {role}: http://{addr}/metrics")?;
        }
        writeln!(f, "state: {}", self.state.display())?;
        writeln!(f, "logs: {}", self.logs.display())
    }
}

/// What `down` stopped.
#[derive(Debug)]
pub struct DownReport {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// The state directory.
    pub state: PathBuf,
    /// Roles of the processes stopped.
    pub stopped: Vec<String>,
    /// Whether the mount point was mounted.
    pub was_mounted: bool,
    /// What was removed: a local etcd cluster's data, and the directories of the
    /// servers whose namespace it held.
    pub removed: Vec<PathBuf>,
}

impl std::fmt::Display for DownReport {
    /// What `tessera down` prints.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unmounted = if self.was_mounted { "unmounted, " } else { "" };
        let stopped = if self.stopped.is_empty() {
            "no process was running".to_string()
        } else {
            format!("stopped {}", self.stopped.join(", "))
        };
        writeln!(
            f,
            "Tessera at {} is down: {unmounted}{stopped} (state kept in {}).",
            self.mountpoint.display(),
            self.state.display()
        )?;
        if !self.removed.is_empty() {
            writeln!(f, "The local etcd cluster's namespace is gone; removed:")?;
        }
        for d in &self.removed {
            writeln!(f, "  {}", d.display())?;
        }
        Ok(())
    }
}

/// Errors of `up` and `down`: one sentence for the user.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// `down` found no mount and no process to stop.
    #[error(
        "nothing to stop: {} is not mounted and no process of {} is running",
        mountpoint.display(),
        state.display()
    )]
    NothingRunning {
        /// The mount point.
        mountpoint: PathBuf,
        /// The state directory.
        state: PathBuf,
    },
    /// Anything else, explained.
    #[error("{0}")]
    Other(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Io { what, source }
}

/// The state directory used for `mountpoint` when none is named: under
/// `/var/lib/tessera` for root, `$XDG_STATE_HOME/tessera` (or `~/.local/state/tessera`)
/// otherwise, named after the mount point's path.
pub fn default_state_dir(mountpoint: &Path) -> PathBuf {
    // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let root = if euid == 0 {
        PathBuf::from("/var/lib/tessera")
    } else if let Some(x) = std::env::var_os("XDG_STATE_HOME") {
        PathBuf::from(x).join("tessera")
    } else {
        let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
        PathBuf::from(home).join(".local/state/tessera")
    };
    let name: String = mountpoint
        .to_string_lossy()
        .trim_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    root.join(if name.is_empty() { "root".into() } else { name })
}

fn absolute(p: &Path) -> Result<PathBuf, ClusterError> {
    fs::create_dir_all(p).map_err(io_err(format!("creating {}", p.display())))?;
    fs::canonicalize(p).map_err(io_err(format!("resolving {}", p.display())))
}

/// The absolute path of mount point `p` without creating it, and without looking at
/// `p` itself: its parent is resolved and its name added. A look at a live mount's root
/// goes to its file system, which waits for a metadata server that is away (the one
/// `up` is about to bring back), and a dead mount (its process killed) fails every look
/// with ENOTCONN.
pub fn resolve_mount(p: &Path) -> PathBuf {
    let parent = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match (fs::canonicalize(parent), p.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()),
    }
}

/// The state directory of a mount: the named one, or the one `up` recorded, or the
/// default.
pub fn resolve_state(mountpoint: &Path, named: Option<&Path>) -> PathBuf {
    if let Some(s) = named {
        return s.to_path_buf();
    }
    let default = default_state_dir(mountpoint);
    recorded_state(&default).unwrap_or(default)
}

/// The file in a mount point's default state directory that names the state directory
/// `up --state-dir` used.
const RECORD: &str = "redirect";

/// The state directory recorded in `default` (see [`RECORD`]), if any.
fn recorded_state(default: &Path) -> Option<PathBuf> {
    let text = fs::read_to_string(default.join(RECORD)).ok()?;
    let named = text.trim();
    (!named.is_empty()).then(|| PathBuf::from(named))
}

/// Removes the record of the state directory that `up --state-dir` left for
/// `mountpoint` (and the record's directory, then empty), if it names `state` when that
/// is given; nothing to remove is no error.
pub fn forget_recorded_state(mountpoint: &Path, state: Option<&Path>) -> Result<(), ClusterError> {
    let default = default_state_dir(&resolve_mount(mountpoint));
    let record = default.join(RECORD);
    if let (Some(state), Some(named)) = (state, recorded_state(&default)) {
        let same = |p: &Path| fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        if same(&named) != same(state) {
            return Ok(());
        }
    }
    match fs::remove_file(&record) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(format!("removing {}", record.display()))(e)),
    }
    // Left if something else is in it (a cluster whose state lives there).
    let _ = fs::remove_dir(&default);
    Ok(())
}

/// Whether `mountpoint` is a Tessera mount that `tessera mount` made (a FUSE mount whose
/// source is "tessera"). A mount made by `mount -t fuse.tessera` (its source is
/// `META:/path`) is not one: `tessera down` must never unmount an fstab mount.
pub fn is_mounted(mountpoint: &Path) -> bool {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = mountpoint.to_string_lossy().replace(' ', "\\040");
    text.lines().any(|l| {
        let point = l.split(' ').nth(4);
        let mut tail = l.split(" - ").nth(1).unwrap_or_default().split(' ');
        let (fstype, source) = (tail.next().unwrap_or_default(), tail.next());
        point == Some(want.as_str()) && fstype.starts_with("fuse") && source == Some("tessera")
    })
}

fn bin(dir: &Option<PathBuf>, name: &str) -> Result<PathBuf, ClusterError> {
    let dir = match dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()
            .map_err(io_err("finding this program"))?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    };
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(ClusterError::Other(format!(
            "{} not found: build the workspace first",
            p.display()
        )))
    }
}

/// Starts `cmd` detached from the terminal (own process group), logging to `log` (after
/// what it holds if `append`: a restarted member's log keeps why it stopped).
fn spawn(mut cmd: Command, log: &Path, append: bool) -> Result<std::process::Child, ClusterError> {
    use std::os::unix::process::CommandExt;
    let out = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(log)
        .map_err(io_err(format!("creating {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(io_err("duplicating the log file"))?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    cmd.spawn()
        .map_err(io_err(format!("starting {:?}", cmd.get_program())))
}

fn log_tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Waits until `ready` holds, failing early if the child exits.
fn wait_ready(
    child: &mut std::process::Child,
    what: &str,
    log: &Path,
    mut ready: impl FnMut() -> bool,
) -> Result<(), ClusterError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    while Instant::now() < deadline {
        if ready() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(ClusterError::Other(format!(
                "{what} exited ({status}); its log {} ends with:\n{}",
                log.display(),
                log_tail(log)
            )));
        }
        std::thread::sleep(POLL);
    }
    Err(ClusterError::Other(format!(
        "{what} was not ready after {}s; its log {} ends with:\n{}",
        READY_TIMEOUT.as_secs(),
        log.display(),
        log_tail(log)
    )))
}

/// Waits until all `n` data servers have registered and every chain has its copies
/// serving, so that files created on the new mount spread over every server at once.
/// A restarted server resyncs its chains first, comparing every chunk; if that is still
/// under way at the deadline but every chain has a serving copy, the cluster is usable
/// (writes reach the resyncing copies too) and the wait ends with a note on stderr.
fn wait_healthy(meta_addr: &str, state: &Path, n: usize, replicas: u8) -> Result<(), ClusterError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_err("starting a runtime"))?;
    // Only the map is read: one I/O buffer is enough.
    let config = crate::ClientConfig {
        meta_addr: meta_addr.to_string(),
        io_buffers: 1,
        key_file: state::admin_key_file(state),
        ..crate::ClientConfig::default()
    };
    rt.block_on(async {
        let client = crate::Client::connect(config)
            .await
            .map_err(|e| ClusterError::Other(format!("connecting to {meta_addr}: {e}")))?;
        let deadline = Instant::now() + HEALTHY_TIMEOUT;
        loop {
            let map = client
                .cluster_map()
                .await
                .map_err(|e| ClusterError::Other(format!("reading the cluster map: {e}")))?;
            if map.nodes.len() >= n && map.healthy(replicas) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                if map.nodes.len() >= n && map.usable() {
                    eprintln!(
                        "tessera: some copies are still resyncing after {}s; mounting anyway \
                         (they catch up in the background: `tessera status --meta {meta_addr}`)",
                        HEALTHY_TIMEOUT.as_secs()
                    );
                    return Ok(());
                }
                return Err(ClusterError::Other(format!(
                    "the data servers did not all join their chains within {}s: {map:?}",
                    HEALTHY_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Refuses a mount point that holds files, unless `nonempty`: mounting over them hides
/// them without a word, as `mount` users do not expect.
pub fn check_mountpoint(mountpoint: &Path, nonempty: bool) -> Result<(), ClusterError> {
    let has_files = fs::read_dir(mountpoint).is_ok_and(|mut d| d.next().is_some());
    if has_files && !nonempty {
        return Err(ClusterError::Other(format!(
            "{} is not empty: a mount would hide its files; pass --nonempty to mount anyway",
            mountpoint.display()
        )));
    }
    Ok(())
}

/// The metadata address for `status` and `fsck`: `meta` if given, else the one `tessera
/// up` recorded for the named state directory or mount point; with the state directory,
/// if one was named. `(None, None)` (the configuration's address) if nothing is named.
pub fn meta_of(
    mountpoint: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    meta: Option<String>,
) -> Result<(Option<String>, Option<PathBuf>), ClusterError> {
    let state = match (mountpoint, state_dir) {
        (_, Some(s)) => s,
        (Some(m), None) => resolve_state(&resolve_mount(&m), None),
        (None, None) => return Ok((meta, None)),
    };
    let addr = match meta {
        Some(m) => m,
        None => state::meta_addr(&state)?,
    };
    Ok((Some(addr), Some(state)))
}

/// The state directory named by `state_dir`, or the one of the cluster `tessera up`
/// mounted at `mountpoint`; `None` if neither is given.
pub fn state_of(mountpoint: Option<PathBuf>, state_dir: Option<PathBuf>) -> Option<PathBuf> {
    match (mountpoint, state_dir) {
        (_, Some(s)) => Some(s),
        (Some(m), None) => Some(resolve_state(&resolve_mount(&m), None)),
        (None, None) => None,
    }
}

/// Starts the cluster and mounts it, or, if some of its processes run, brings back the
/// missing ones; returns once the mount is usable.
pub fn up(opts: &UpOptions) -> Result<UpReport, ClusterError> {
    let mnt = match resolve_mount(&opts.mountpoint) {
        dead if is_mounted(&dead) => dead,
        _ => absolute(&opts.mountpoint)?,
    };
    // Unnamed, the state directory an earlier `up --state-dir` recorded for this mount
    // point, as `down`, `status` and `fsck` find it.
    let state = absolute(&resolve_state(&mnt, opts.state_dir.as_deref()))?;
    let logs = state.join("logs");
    fs::create_dir_all(&logs).map_err(io_err(format!("creating {}", logs.display())))?;
    if opts.state_dir.is_some() {
        let d = default_state_dir(&mnt);
        fs::create_dir_all(&d).map_err(io_err(format!("creating {}", d.display())))?;
        fs::write(d.join(RECORD), state.to_string_lossy().as_bytes())
            .map_err(io_err("recording the state directory"))?;
    }
    state::save_mountpoint(&state, &mnt)?;
    let running = procs::members(&state, &mnt);
    let mut report = UpReport {
        mountpoint: mnt.clone(),
        state: state.clone(),
        meta_addr: String::new(),
        logs,
        restarted: Vec::new(),
        was_running: !running.is_empty(),
        metrics: Vec::new(),
    };
    if !running.is_empty() {
        report.restarted = bring_back(&mnt, &state, &running)?;
        report.meta_addr = state::meta_addr(&state)?;
        report.metrics = state::metrics_addrs(&state);
        return Ok(report);
    }
    if is_mounted(&mnt) {
        return Err(ClusterError::Other(format!(
            "{} is already mounted",
            mnt.display()
        )));
    }
    check_mountpoint(&mnt, opts.nonempty)?;
    let mut pids = Pids::new(&state);
    // Command lines of an earlier cluster name members this one may not have.
    let _ = fs::remove_dir_all(state.join("cmd"));
    let result = start_all(opts, &mnt, &state, &mut pids);
    if result.is_err() {
        // Leave nothing half-started behind.
        for m in procs::members(&state, &mnt).iter().rev() {
            procs::stop(m);
        }
        pids.remove();
        etcd::remove_local(&state);
    }
    report.meta_addr = result?;
    report.metrics = state::metrics_addrs(&state);
    Ok(report)
}

/// The log of `role` under `state`.
fn log_file(state: &Path, role: &str) -> PathBuf {
    state.join("logs").join(format!("{role}.log"))
}

/// Starts `role` with the command line `argv` (program first), records it and its PID.
fn launch(
    state: &Path,
    role: &str,
    argv: &[String],
    pids: &mut Pids,
    append_log: bool,
) -> Result<(std::process::Child, PathBuf), ClusterError> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| ClusterError::Other(format!("no command line recorded for {role}")))?;
    state::save_cmd(state, role, argv)?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    let log = log_file(state, role);
    let child = spawn(cmd, &log, append_log)?;
    let pid = child.id() as i32;
    pids.set(role, pid, procs::start_time(pid))?;
    Ok((child, log))
}

/// Starts `role`, a server, and waits until it wrote its address file.
fn launch_server(
    state: &Path,
    role: &str,
    argv: &[String],
    pids: &mut Pids,
    append_log: bool,
) -> Result<String, ClusterError> {
    let addr_file = state::addr_file(state, role);
    let old = state::read_addr(&addr_file);
    let _ = fs::remove_file(&addr_file);
    // A server that did not come up is stopped, and the address it was to take back
    // stays recorded: the next `up` tries it again, `status` and `fsck` still find it.
    let started = launch(state, role, argv, pids, append_log).and_then(|(mut child, log)| {
        let ready = wait_ready(&mut child, role, &log, || {
            state::read_addr(&addr_file).is_some()
        })
        .and_then(|()| {
            state::read_addr(&addr_file)
                .ok_or_else(|| ClusterError::Other(format!("{role} wrote no address")))
        });
        if ready.is_err() {
            let _ = child.kill();
            let _ = child.wait();
        }
        ready
    });
    if let (Err(_), Some(old)) = (&started, &old) {
        let _ = fs::write(&addr_file, old);
    }
    started
}

fn path_arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The command line of metadata server `role` listening on `listen`; on etcd at
/// `etcd` (client URLs), with the standby's long wait for the owner key, or serving
/// beside the other (`etcd_shared`).
fn meta_argv(
    opts: &UpOptions,
    state: &Path,
    (role, listen): (&str, &str),
    etcd: Option<&str>,
) -> Result<Vec<String>, ClusterError> {
    let mut argv = vec![
        path_arg(&bin(&opts.bin_dir, "tessera-meta")?),
        "--listen".into(),
        listen.into(),
        "--data-dir".into(),
        path_arg(&state.join(role)),
        "--addr-file".into(),
        path_arg(&state::addr_file(state, role)),
        "--key-file".into(),
        path_arg(&state::cluster_key_file(state)),
        "--admin-key-file".into(),
        path_arg(&state::admin_key_file(state)),
    ];
    if let Some(s) = &opts.store {
        argv.extend(["--store".into(), s.clone()]);
    }
    if let Some(e) = etcd {
        argv.extend(["--etcd".into(), e.to_string()]);
        if opts.etcd_shared {
            argv.push(etcd::SHARED_FLAG.into());
        } else {
            let wait = etcd::STANDBY_WAIT_MS.to_string();
            argv.extend(["--etcd-owner-wait-ms".into(), wait]);
        }
    }
    if let Some(r) = opts.replicas {
        argv.extend(["--replicas".into(), r.to_string()]);
    }
    argv.extend(state::metrics_args(state, role));
    Ok(argv)
}

fn start_all(
    opts: &UpOptions,
    mnt: &Path,
    state: &Path,
    pids: &mut Pids,
) -> Result<String, ClusterError> {
    state::ensure_keys(state)?;
    let meta_addr = if opts.store.as_deref() == Some("etcd") {
        etcd::start_metas(opts, state, pids)?
    } else {
        let argv = meta_argv(opts, state, (state::META, "127.0.0.1:0"), None)?;
        launch_server(state, state::META, &argv, pids, false)?
    };
    // All started before any is waited for: after a crash each counts its store's
    // chunks before it is ready (a disk read per chunk), and they count at once.
    let data_bin = path_arg(&bin(&opts.bin_dir, "tessera-data")?);
    let mut started = Vec::new();
    for i in 0..opts.data_servers {
        let role = state::data_role(i);
        let addr_file = state::addr_file(state, &role);
        let _ = fs::remove_file(&addr_file);
        let mut argv: Vec<String> = vec![
            data_bin.clone(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--meta".into(),
            meta_addr.clone(),
            "--data-dir".into(),
            path_arg(&state.join(&role)),
            "--addr-file".into(),
            path_arg(&addr_file),
            "--key-file".into(),
            path_arg(&state::cluster_key_file(state)),
        ];
        argv.extend(state::metrics_args(state, &role));
        let (child, log) = launch(state, &role, &argv, pids, false)?;
        started.push((child, addr_file, log, role));
    }
    for (child, addr_file, log, role) in started.iter_mut() {
        wait_ready(child, role, log, || state::read_addr(addr_file).is_some())?;
    }
    wait_healthy(
        &meta_addr,
        state,
        opts.data_servers,
        opts.replicas.unwrap_or(3),
    )?;
    let mut argv = vec![
        path_arg(&std::env::current_exe().map_err(io_err("finding this program"))?),
        "mount".into(),
        "--meta".into(),
        meta_addr.clone(),
        "--key-file".into(),
        path_arg(&state::admin_key_file(state)),
    ];
    if opts.nonempty {
        argv.push("--nonempty".into());
    }
    argv.extend(state::metrics_args(state, state::MOUNT));
    argv.push(path_arg(mnt));
    launch_mount(mnt, state, &argv, pids, false)?;
    Ok(meta_addr)
}

fn launch_mount(
    mnt: &Path,
    state: &Path,
    argv: &[String],
    pids: &mut Pids,
    append_log: bool,
) -> Result<(), ClusterError> {
    let (mut child, log) = launch(state, state::MOUNT, argv, pids, append_log)?;
    wait_ready(&mut child, "the mount", &log, || is_mounted(mnt))
}

/// Starts the recorded members of `state` that are not `running`, each with its recorded
/// command line on its recorded address: clients and data servers know the metadata
/// server by its address, and a data server's peers by theirs. Returns what it started.
fn bring_back(
    mnt: &Path,
    state: &Path,
    running: &[Member],
) -> Result<Vec<(String, String)>, ClusterError> {
    let roles = state::recorded_roles(state);
    if roles.is_empty() {
        return Err(ClusterError::Other(format!(
            "processes of {} are running but no command lines are recorded there: \
             run `tessera down {}` first",
            state.display(),
            mnt.display()
        )));
    }
    let mut pids = Pids::load(state);
    let mut restarted = Vec::new();
    let missing: Vec<&String> = roles
        .iter()
        .filter(|r| !running.iter().any(|m| &m.role == *r))
        .collect();
    for role in &missing {
        let argv = state::load_cmd(state, role)
            .ok_or_else(|| ClusterError::Other(format!("no command line recorded for {role}")))?;
        if role.as_str() == state::MOUNT {
            continue; // last, once the servers are back
        }
        if etcd::is_etcd_role(role) {
            let url = etcd::bring_back_member(state, role, &argv, &mut pids)?;
            restarted.push((role.to_string(), url));
            continue;
        }
        if etcd::is_meta_role(role) && etcd::meta_addrs(state).is_some() {
            // On etcd: on its fixed address; a standby while another serves (unless
            // they serve at once).
            let another = |r: &str| etcd::is_meta_role(r) && r != role.as_str();
            let standby = !argv.iter().any(|a| a == etcd::SHARED_FLAG)
                && (running.iter().any(|m| another(&m.role))
                    || restarted.iter().any(|(r, _)| another(r)));
            etcd::launch_meta(state, role, &argv, &mut pids, (standby, true))?;
            let addr = state::option_value(&argv, "--listen").unwrap_or_default();
            restarted.push((role.to_string(), addr.to_string()));
            continue;
        }
        let addr = state::read_addr(&state::addr_file(state, role)).ok_or_else(|| {
            ClusterError::Other(format!(
                "no address recorded for {role} in {}",
                state.display()
            ))
        })?;
        let got = launch_server(
            state,
            role,
            &state::with_listen(&argv, &addr),
            &mut pids,
            true,
        )?;
        if got != addr {
            return Err(ClusterError::Other(format!(
                "{role} came back on {got}, not on its old address {addr}"
            )));
        }
        restarted.push((role.to_string(), addr));
    }
    if !restarted.is_empty() {
        let meta_argv = state::load_cmd(state, state::META).unwrap_or_default();
        let replicas = state::option_value(&meta_argv, "--replicas")
            .and_then(|r| r.parse().ok())
            .unwrap_or(3);
        let data = roles.iter().filter(|r| r.starts_with("data-")).count();
        wait_healthy(&state::meta_addr(state)?, state, data, replicas)?;
    }
    if missing.iter().any(|r| r.as_str() == state::MOUNT) {
        if is_mounted(mnt) {
            // The mount process died and left its mount point dead (ENOTCONN).
            crate::fuse::unmount(mnt).map_err(io_err(format!("unmounting {}", mnt.display())))?;
        }
        let argv = state::load_cmd(state, state::MOUNT).unwrap_or_default();
        launch_mount(mnt, state, &argv, &mut pids, true)?;
        restarted.push((state::MOUNT.to_string(), path_arg(mnt)));
    }
    Ok(restarted)
}

/// Unmounts `mountpoint` and stops every process of its cluster: the mount first (it
/// unmounts itself on SIGTERM), then the data servers, then the metadata server.
pub fn down(mountpoint: &Path, state_dir: Option<&Path>) -> Result<DownReport, ClusterError> {
    let mnt = resolve_mount(mountpoint);
    let state = resolve_state(&mnt, state_dir);
    let members = procs::members(&state, &mnt);
    let was_mounted = is_mounted(&mnt);
    if !was_mounted && members.is_empty() {
        Pids::load(&state).remove();
        // Its members gone (killed), a local etcd's data is still to remove.
        etcd::remove_local(&state);
        return Err(ClusterError::NothingRunning {
            mountpoint: mnt,
            state,
        });
    }
    let mut report = DownReport {
        mountpoint: mnt.clone(),
        state: state.clone(),
        stopped: Vec::new(),
        was_mounted,
        removed: Vec::new(),
    };
    let mut left = Vec::new();
    let (mount, servers): (Vec<&Member>, Vec<&Member>) =
        members.iter().partition(|m| m.role == state::MOUNT);
    for m in &mount {
        stop_one(m, &mut report, &mut left);
    }
    if is_mounted(&mnt) {
        crate::fuse::unmount(&mnt).map_err(io_err(format!("unmounting {}", mnt.display())))?;
    }
    let (etcd_members, servers): (Vec<&Member>, Vec<&Member>) =
        servers.iter().partition(|m| etcd::is_etcd_role(&m.role));
    // Data servers before the metadata servers: they report to them until they stop;
    // etcd last, and all its members at once (see `procs::stop_together`).
    for m in servers.iter().rev() {
        stop_one(m, &mut report, &mut left);
    }
    let etcd_members: Vec<Member> = etcd_members.into_iter().cloned().collect();
    for (m, gone) in etcd_members.iter().zip(procs::stop_together(&etcd_members)) {
        match gone {
            true => report.stopped.push(m.role.clone()),
            false => left.push(format!("{} (pid {})", m.role, m.pid)),
        }
    }
    Pids::load(&state).remove();
    if left.is_empty() {
        report.removed = etcd::remove_local(&state);
    }
    if !left.is_empty() {
        return Err(ClusterError::Other(format!(
            "could not stop {}",
            left.join(", ")
        )));
    }
    Ok(report)
}

fn stop_one(m: &Member, report: &mut DownReport, left: &mut Vec<String>) {
    if procs::stop(m) {
        report.stopped.push(m.role.clone());
    } else {
        left.push(format!("{} (pid {})", m.role, m.pid));
    }
}
