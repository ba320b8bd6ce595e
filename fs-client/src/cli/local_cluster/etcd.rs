//! The etcd side of a local cluster (`tessera up --engine etcd`): the etcd members that
//! `tessera-meta local-etcd` starts (its launcher is the one the tests use), recorded
//! here like every other member (role `etcd-mN`, PID, start time, command line), and the
//! two metadata servers on one etcd prefix, one serving and one waiting as a standby on
//! the namespace's owner key.
//!
//! A local cluster's etcd keeps its data on tmpfs (`/dev/shm`) unless `--etcd-dir`
//! names a directory: each etcd write costs every member an fsync, which on one shared
//! disk is a few tens of transactions a second. Its namespace lives as long as the
//! cluster: `tessera down` stops the members and removes their directory, and with it
//! the directories of the servers that held that namespace's chunks and state.

use super::state::{self, Pids};
use super::{io_err, ClusterError};
use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// etcd members `up` starts: the smallest cluster that survives the loss of one.
pub const LOCAL_ETCD_MEMBERS: usize = 3;
/// Metadata servers `up` starts on etcd: one serves, one waits as a standby (both
/// serve with `--etcd-shared`).
pub const META_SERVERS: usize = 2;
/// How long a metadata server waits for the owner key to go: a standby waits as long as
/// the server allows (a day, `etcd.owner_wait_ms`'s maximum).
pub const STANDBY_WAIT_MS: u64 = 86_400_000;
/// The flag of a metadata server that serves the prefix beside the others
/// (`tessera up --etcd-shared`), as its recorded command line holds it.
pub const SHARED_FLAG: &str = "--etcd-shared";
/// What a metadata server logs once it found the owner key held and waits (owner.rs):
/// the sign that a standby reached etcd and is in place.
pub const STANDBY_LOG: &str = "owner key held: waiting for it to go";
/// How long a TCP connect may take in a check whether an address is served.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// File recording the directory of the local etcd cluster's data.
fn dir_file(state: &Path) -> PathBuf {
    state.join("etcd.dir")
}

/// File recording the client URLs of the etcd cluster the metadata servers use.
fn endpoints_file(state: &Path) -> PathBuf {
    state.join("etcd.endpoints")
}

/// The role of etcd member `name`.
pub fn role(name: &str) -> String {
    format!("etcd-{name}")
}

/// Whether `role` is an etcd member's.
pub fn is_etcd_role(role: &str) -> bool {
    role.starts_with("etcd-")
}

/// The role of metadata server `i`: `meta`, then `meta-1`, ...
pub fn meta_role(i: usize) -> String {
    match i {
        0 => state::META.to_string(),
        i => format!("{}-{i}", state::META),
    }
}

/// Whether `role` is a metadata server's.
pub fn is_meta_role(role: &str) -> bool {
    role == state::META
        || role
            .strip_prefix("meta-")
            .is_some_and(|n| n.parse::<usize>().is_ok())
}

/// The directory of the local etcd cluster `up` started for `state`, if any.
pub fn local_dir(state: &Path) -> Option<PathBuf> {
    state::read_addr(&dir_file(state)).map(PathBuf::from)
}

/// The etcd client URLs recorded for `state` (comma-separated), if on etcd.
pub fn endpoints(state: &Path) -> Option<String> {
    state::read_addr(&endpoints_file(state))
}

/// Records the etcd URLs the metadata servers use.
pub fn save_endpoints(state: &Path, urls: &str) -> Result<(), ClusterError> {
    let f = endpoints_file(state);
    fs::write(&f, urls).map_err(io_err(format!("writing {}", f.display())))
}

/// Starts a local etcd cluster with `tessera-meta local-etcd` (`meta_bin`), under
/// `dir` (default tmpfs), records its members in `state` and `pids`; returns the client
/// URLs, comma-separated.
pub fn start_local(
    meta_bin: &Path,
    dir: Option<&Path>,
    state: &Path,
    pids: &mut Pids,
) -> Result<String, ClusterError> {
    let mut cmd = Command::new(meta_bin);
    cmd.args(["local-etcd", "--members", &LOCAL_ETCD_MEMBERS.to_string()]);
    if let Some(d) = dir {
        cmd.arg("--dir").arg(d);
    }
    let out = cmd
        .output()
        .map_err(io_err(format!("starting {}", meta_bin.display())))?;
    if !out.status.success() {
        return Err(ClusterError::Other(format!(
            "starting etcd failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    let data = lines
        .next()
        .ok_or_else(|| ClusterError::Other("tessera-meta local-etcd printed nothing".into()))?;
    fs::write(dir_file(state), data).map_err(io_err("recording etcd's directory"))?;
    let mut urls = Vec::new();
    for line in lines {
        let parsed = {
            let mut w = line.split_whitespace();
            (
                w.next(),
                w.next().and_then(|p| p.parse::<i32>().ok()),
                w.next(),
            )
        };
        let (Some(name), Some(pid), Some(url)) = parsed else {
            return Err(ClusterError::Other(format!(
                "tessera-meta local-etcd printed {line:?}"
            )));
        };
        let role = role(name);
        // Its own command line, to start it again on its data (`up` bringing it back).
        state::save_cmd(state, &role, &super::procs::cmdline(pid))?;
        pids.set(&role, pid, super::procs::start_time(pid))?;
        urls.push(url.to_string());
    }
    let urls = urls.join(",");
    save_endpoints(state, &urls)?;
    Ok(urls)
}

/// Removes the local etcd cluster's data (after its members stopped) and the
/// directories of the servers whose namespace it held. Returns what it removed.
pub fn remove_local(state: &Path) -> Vec<PathBuf> {
    let Some(dir) = local_dir(state) else {
        return Vec::new();
    };
    let mut removed = vec![dir.clone()];
    let _ = fs::remove_dir_all(&dir);
    for role in state::recorded_roles(state) {
        if is_meta_role(&role) || role.starts_with("data-") {
            let d = state.join(&role);
            if fs::remove_dir_all(&d).is_ok() {
                removed.push(d);
            }
            let _ = fs::remove_file(state::addr_file(state, &role));
        }
    }
    for f in [
        dir_file(state),
        endpoints_file(state),
        meta_addrs_file(state),
    ] {
        let _ = fs::remove_file(f);
    }
    let _ = fs::remove_dir_all(state.join("cmd"));
    removed
}

/// An address on 127.0.0.1 whose port was free a moment ago: a metadata server on etcd
/// gets a fixed one, since a standby listens only once it serves and clients must know
/// its address before.
pub fn free_addr() -> Result<String, ClusterError> {
    let addr = transport::ports::fixed_addr("127.0.0.1").map_err(io_err("finding a free port"))?;
    Ok(addr.to_string())
}

/// File recording every metadata server's address (comma-separated).
fn meta_addrs_file(state: &Path) -> PathBuf {
    state.join("meta.addrs")
}

/// Records the metadata servers' addresses.
pub fn save_meta_addrs(state: &Path, addrs: &[String]) -> Result<(), ClusterError> {
    let f = meta_addrs_file(state);
    fs::write(&f, addrs.join(",")).map_err(io_err(format!("writing {}", f.display())))
}

/// Every metadata server's address recorded for `state`, comma-separated, if several.
pub fn meta_addrs(state: &Path) -> Option<String> {
    state::read_addr(&meta_addrs_file(state))
}

/// Whether something accepts connections at `addr` (a URL's `host:port` too): a
/// metadata server on etcd listens only while it serves.
pub fn listening(addr: &str) -> bool {
    let hostport = addr
        .strip_prefix("http://")
        .unwrap_or(addr)
        .trim_end_matches('/');
    hostport
        .parse()
        .is_ok_and(|a| TcpStream::connect_timeout(&a, PROBE_TIMEOUT).is_ok())
}

/// What `tessera status` prints of a cluster on etcd: each etcd member and whether it
/// answers, each metadata server and whether it serves.
pub fn describe(state: &Path) -> Option<String> {
    let urls = endpoints(state)?;
    let mut out = String::new();
    let local = local_dir(state);
    let etcd_roles: Vec<String> = state::recorded_roles(state)
        .into_iter()
        .filter(|r| is_etcd_role(r))
        .collect();
    match &local {
        Some(d) => out.push_str(&format!("etcd: local cluster, data in {}\n", d.display())),
        None => out.push_str(&format!("etcd: {urls} (not started by tessera up)\n")),
    }
    for (i, url) in urls.split(',').enumerate() {
        let name = etcd_roles.get(i).map_or("member", String::as_str);
        let up = if listening(url) { "answers" } else { "DOWN" };
        out.push_str(&format!("  {name} {url}: {up}\n"));
    }
    let addrs = meta_addrs(state).unwrap_or_default();
    out.push_str("metadata servers:\n");
    for (i, addr) in addrs.split(',').filter(|a| !a.is_empty()).enumerate() {
        let what = if listening(addr) {
            "serves"
        } else {
            "standby or down (not listening)"
        };
        out.push_str(&format!("  {} {addr}: {what}\n", meta_role(i)));
    }
    Some(out)
}

/// Starts the metadata servers of a cluster on etcd: the local etcd cluster first
/// unless `opts.etcd` names one, then [`META_SERVERS`] servers on fixed addresses, the
/// first serving, the others waiting as standbys. Returns every address, comma-separated.
pub(super) fn start_metas(
    opts: &super::UpOptions,
    state: &Path,
    pids: &mut Pids,
) -> Result<String, ClusterError> {
    let urls = match &opts.etcd {
        Some(urls) => {
            save_endpoints(state, urls)?;
            urls.clone()
        }
        None => {
            refuse_old_data(state)?;
            let meta_bin = super::bin(&opts.bin_dir, "tessera-meta")?;
            start_local(&meta_bin, opts.etcd_dir.as_deref(), state, pids)?
        }
    };
    let addrs = (0..META_SERVERS)
        .map(|_| free_addr())
        .collect::<Result<Vec<_>, _>>()?;
    save_meta_addrs(state, &addrs)?;
    for (i, addr) in addrs.iter().enumerate() {
        let role = meta_role(i);
        let argv = super::meta_argv(opts, state, (&role, addr), Some(&urls))?;
        launch_meta(
            state,
            &role,
            &argv,
            pids,
            (i > 0 && !opts.etcd_shared, false),
        )?;
    }
    Ok(addrs.join(","))
}

/// Refuses a state directory holding servers' directories: a local etcd cluster's
/// namespace is new, and `down` removes the directories of its servers, which must not
/// be those of an earlier cluster (its store, its chunks).
fn refuse_old_data(state: &Path) -> Result<(), ClusterError> {
    let old: Vec<String> = fs::read_dir(state)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| is_meta_role(n) || n.starts_with("data-"))
                .filter(|n| state.join(n).is_dir())
                .collect()
        })
        .unwrap_or_default();
    if old.is_empty() {
        return Ok(());
    }
    Err(ClusterError::Other(format!(
        "{} holds the data of an earlier cluster ({}): a local etcd cluster starts a new \
         namespace and `tessera down` removes its servers' directories. Name another \
         --state-dir, or `tessera down` the earlier one (a local etcd cluster's) first",
        state.display(),
        old.join(", ")
    )))
}

/// Starts metadata server `role`; `(standby, append_log)`: a standby is ready once it
/// logs that it waits for the owner key ([`STANDBY_LOG`]) and has no address file until
/// it serves, a serving one once it wrote its address file.
pub(super) fn launch_meta(
    state: &Path,
    role: &str,
    argv: &[String],
    pids: &mut Pids,
    (standby, append_log): (bool, bool),
) -> Result<(), ClusterError> {
    if !standby {
        super::launch_server(state, role, argv, pids, append_log)?;
        return Ok(());
    }
    let addr_file = state::addr_file(state, role);
    let _ = fs::remove_file(&addr_file);
    // Measured before the start: a server quick to say it waits (or a parent slow to
    // look, on a loaded machine) wrote its line before a length taken after it.
    let log = super::log_file(state, role);
    let skip = if append_log {
        fs::metadata(&log).map_or(0, |m| m.len() as usize)
    } else {
        0
    };
    let (mut child, log) = super::launch(state, role, argv, pids, append_log)?;
    let waiting = || {
        let text = fs::read(&log).unwrap_or_default();
        let new = String::from_utf8_lossy(text.get(skip..).unwrap_or_default()).into_owned();
        new.contains(STANDBY_LOG) || addr_file.exists()
    };
    let ready = super::wait_ready(&mut child, role, &log, waiting);
    if ready.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    ready
}

/// Starts etcd member `role` again with its recorded command line (on its data: etcd
/// ignores the initial-cluster flags then) and waits until it answers on its client
/// URL. Returns the URL.
pub(super) fn bring_back_member(
    state: &Path,
    role: &str,
    argv: &[String],
    pids: &mut Pids,
) -> Result<String, ClusterError> {
    let url = state::option_value(argv, "--listen-client-urls")
        .ok_or_else(|| ClusterError::Other(format!("{role}'s command line names no URL")))?
        .to_string();
    let (mut child, log) = super::launch(state, role, argv, pids, true)?;
    let ready = super::wait_ready(&mut child, role, &log, || listening(&url));
    if ready.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    ready.map(|()| url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_of_etcd_members_and_metadata_servers() {
        assert_eq!(role("m0"), "etcd-m0");
        assert!(is_etcd_role("etcd-m2") && !is_etcd_role("meta"));
        assert_eq!(meta_role(0), "meta");
        assert_eq!(meta_role(1), "meta-1");
        assert!(is_meta_role("meta") && is_meta_role("meta-1"));
        assert!(!is_meta_role("meta-x") && !is_meta_role("metadata") && !is_meta_role("data-1"));
    }

    #[test]
    fn an_address_nobody_listens_on_is_not_listening() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        assert!(listening(&addr));
        assert!(listening(&format!("http://{addr}")));
        drop(l);
        assert!(!listening(&addr));
        assert!(!listening("not an address"));
    }
}
