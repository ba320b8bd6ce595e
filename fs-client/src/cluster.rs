//! `tessera up` and `tessera down`: a local cluster (one metadata server, several data
//! servers on 127.0.0.1) and its mount, as child processes whose PIDs are recorded in the
//! cluster's state directory.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long each process may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the data servers may take to have every copy of every chain serving before
/// `up` settles for every chain having one (see `wait_healthy`).
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a process may take to exit after SIGTERM before it gets SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
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
    /// Metadata store engine ("sled" or "redb"); `None`: the server's default.
    pub store: Option<String>,
    /// Directory holding `tessera-meta` and `tessera-data`; `None`: next to this program.
    pub bin_dir: Option<PathBuf>,
    /// Copies of each chunk; `None`: the metadata server's default (3).
    pub replicas: Option<u8>,
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
    let root = if unsafe { libc::geteuid() } == 0 {
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

/// The state directory of a mount: the named one, or the one `up` recorded, or the
/// default.
fn resolve_state(mountpoint: &Path, named: Option<&Path>) -> PathBuf {
    if let Some(s) = named {
        return s.to_path_buf();
    }
    let default = default_state_dir(mountpoint);
    match fs::read_to_string(default.join("redirect")) {
        Ok(s) if !s.trim().is_empty() => PathBuf::from(s.trim()),
        _ => default,
    }
}

/// Whether `mountpoint` is a mounted Tessera file system (a FUSE mount whose source is
/// "tessera": mounted without the setuid helper, the kernel shows no subtype).
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

struct Pids {
    file: PathBuf,
    entries: Vec<(String, i32)>,
}

impl Pids {
    fn load(state: &Path) -> Pids {
        let file = state.join("pids");
        let entries = fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (role, pid) = l.split_once(' ')?;
                Some((role.to_string(), pid.trim().parse().ok()?))
            })
            .collect();
        Pids { file, entries }
    }

    fn push(&mut self, role: &str, pid: u32) -> Result<(), ClusterError> {
        self.entries.push((role.to_string(), pid as i32));
        let text: String = self
            .entries
            .iter()
            .map(|(r, p)| format!("{r} {p}\n"))
            .collect();
        fs::write(&self.file, text).map_err(io_err(format!("writing {}", self.file.display())))
    }

    fn alive(&self) -> Vec<(String, i32)> {
        self.entries
            .iter()
            .filter(|(_, p)| is_ours(*p))
            .cloned()
            .collect()
    }
}

/// Whether `pid` is alive and one of Tessera's programs (a recycled PID is not ours).
fn is_ours(pid: i32) -> bool {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
    let name = Path::new(std::ffi::OsStr::from_bytes(argv0));
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = stat
        .rsplit(')')
        .next()
        .is_some_and(|r| r.trim_start().starts_with('Z'));
    !zombie
        && name
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("tessera"))
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

/// Starts `cmd` detached from the terminal (own process group), logging to `log`.
fn spawn(mut cmd: Command, log: &Path) -> Result<std::process::Child, ClusterError> {
    use std::os::unix::process::CommandExt;
    let out = fs::File::create(log).map_err(io_err(format!("creating {}", log.display())))?;
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
        "{what} was not ready after {}s; see {}",
        READY_TIMEOUT.as_secs(),
        log.display()
    )))
}

/// Waits until all `n` data servers have registered and every chain has its copies
/// serving, so that files created on the new mount spread over every server at once.
/// A restarted server resyncs its chains first, comparing every chunk; if that is still
/// under way at the deadline but every chain has a serving copy, the cluster is usable
/// (writes reach the resyncing copies too) and the wait ends with a note on stderr.
fn wait_healthy(meta_addr: &str, n: usize, replicas: u8) -> Result<(), ClusterError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_err("starting a runtime"))?;
    // Only the map is read: one I/O buffer is enough.
    let config = crate::ClientConfig {
        meta_addr: meta_addr.to_string(),
        io_buffers: 1,
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

fn read_addr(file: &Path) -> Option<String> {
    fs::read_to_string(file)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().into())
}

/// Starts the cluster and mounts it; returns the state directory once the mount is usable.
pub fn up(opts: &UpOptions) -> Result<PathBuf, ClusterError> {
    let mnt = absolute(&opts.mountpoint)?;
    let state = match &opts.state_dir {
        Some(s) => absolute(s)?,
        None => default_state_dir(&mnt),
    };
    let logs = state.join("logs");
    fs::create_dir_all(&logs).map_err(io_err(format!("creating {}", logs.display())))?;
    if opts.state_dir.is_some() {
        let d = default_state_dir(&mnt);
        fs::create_dir_all(&d).map_err(io_err(format!("creating {}", d.display())))?;
        fs::write(d.join("redirect"), state.to_string_lossy().as_bytes())
            .map_err(io_err("recording the state directory"))?;
    }
    let old = Pids::load(&state);
    if let Some((role, pid)) = old.alive().first() {
        return Err(ClusterError::Other(format!(
            "a cluster is already running from {} ({role}, pid {pid}): run `tessera down {}`",
            state.display(),
            mnt.display()
        )));
    }
    if is_mounted(&mnt) {
        return Err(ClusterError::Other(format!(
            "{} is already mounted",
            mnt.display()
        )));
    }
    let mut pids = Pids {
        file: state.join("pids"),
        entries: Vec::new(),
    };
    let result = start_all(opts, &mnt, &state, &mut pids);
    if result.is_err() {
        // Leave nothing half-started behind.
        stop_pids(&pids);
        let _ = fs::remove_file(&pids.file);
    }
    result.map(|()| state)
}

fn start_all(
    opts: &UpOptions,
    mnt: &Path,
    state: &Path,
    pids: &mut Pids,
) -> Result<(), ClusterError> {
    let logs = state.join("logs");
    let meta_addr_file = state.join("meta.addr");
    let _ = fs::remove_file(&meta_addr_file);
    let mut cmd = Command::new(bin(&opts.bin_dir, "tessera-meta")?);
    cmd.arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(state.join("meta"));
    cmd.arg("--addr-file").arg(&meta_addr_file);
    if let Some(s) = &opts.store {
        cmd.arg("--store").arg(s);
    }
    if let Some(r) = opts.replicas {
        cmd.arg("--replicas").arg(r.to_string());
    }
    let log = logs.join("meta.log");
    let mut meta = spawn(cmd, &log)?;
    pids.push("meta", meta.id())?;
    wait_ready(&mut meta, "the metadata server", &log, || {
        read_addr(&meta_addr_file).is_some()
    })?;
    let meta_addr = read_addr(&meta_addr_file).unwrap_or_default();
    // All started before any is waited for: after a crash each counts its store's
    // chunks before it is ready (about 6 s per 20,000 chunks on a cold disk), and they
    // count at once.
    let mut started = Vec::new();
    for i in 0..opts.data_servers {
        let addr_file = state.join(format!("data-{i}.addr"));
        let _ = fs::remove_file(&addr_file);
        let mut cmd = Command::new(bin(&opts.bin_dir, "tessera-data")?);
        cmd.arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--meta")
            .arg(&meta_addr);
        cmd.arg("--data-dir").arg(state.join(format!("data-{i}")));
        cmd.arg("--addr-file").arg(&addr_file);
        let log = logs.join(format!("data-{i}.log"));
        let child = spawn(cmd, &log)?;
        pids.push(&format!("data-{i}"), child.id())?;
        started.push((child, addr_file, log));
    }
    for (i, (child, addr_file, log)) in started.iter_mut().enumerate() {
        let what = format!("data server {i}");
        wait_ready(child, &what, log, || read_addr(addr_file).is_some())?;
    }
    wait_healthy(&meta_addr, opts.data_servers, opts.replicas.unwrap_or(3))?;
    let mut cmd = Command::new(std::env::current_exe().map_err(io_err("finding this program"))?);
    cmd.arg("mount").arg("--meta").arg(&meta_addr).arg(mnt);
    let log = logs.join("mount.log");
    let mut child = spawn(cmd, &log)?;
    pids.push("mount", child.id())?;
    wait_ready(&mut child, "the mount", &log, || is_mounted(mnt))?;
    Ok(())
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: plain kill(2) on a PID we started and checked is still ours.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Stops recorded processes: the mount first, then data servers, then the metadata
/// server; SIGTERM, then SIGKILL after a grace period.
fn stop_pids(pids: &Pids) {
    let mut order = pids.alive();
    order.sort_by_key(|(role, _)| match role.as_str() {
        "mount" => 0,
        "meta" => 2,
        _ => 1,
    });
    for (_, pid) in &order {
        signal(*pid, libc::SIGTERM);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while is_ours(*pid) && Instant::now() < deadline {
            reap(*pid);
            std::thread::sleep(POLL);
        }
        if is_ours(*pid) {
            signal(*pid, libc::SIGKILL);
            while is_ours(*pid) {
                reap(*pid);
                std::thread::sleep(POLL);
            }
        }
        reap(*pid);
    }
}

/// Collects the exit status of a child of this process (no-op for others).
fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid with WNOHANG on a PID; fails harmlessly if it is not our child.
    unsafe {
        libc::waitpid(pid, &mut status, libc::WNOHANG);
    }
}

/// Unmounts `mountpoint` and stops every process `up` started for it.
pub fn down(mountpoint: &Path, state_dir: Option<&Path>) -> Result<PathBuf, ClusterError> {
    let mnt = fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let state = resolve_state(&mnt, state_dir);
    if is_mounted(&mnt) {
        crate::fuse::unmount(&mnt).map_err(io_err(format!("unmounting {}", mnt.display())))?;
    }
    let pids = Pids::load(&state);
    stop_pids(&pids);
    let _ = fs::remove_file(&pids.file);
    Ok(state)
}
