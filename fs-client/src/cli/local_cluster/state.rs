//! What a local cluster's state directory records: the processes `up` started (role,
//! PID, start time), each member's command line, and the addresses the servers listen
//! on, and the mount point. `down`, `up` (bringing members back), `status` and `fsck`
//! read it.

use super::{io_err, ClusterError};
use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// Role of the metadata server in the pids file and the state directory.
pub const META: &str = "meta";
/// Role of the mount process.
pub const MOUNT: &str = "mount";

/// The role of data server `i`: the name of its log, address file and directory.
pub fn data_role(i: usize) -> String {
    format!("data-{i}")
}

/// One recorded process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `meta`, `data-N` or `mount`.
    pub role: String,
    /// Its PID.
    pub pid: i32,
    /// Its start time (field 22 of `/proc/PID/stat`, clock ticks since boot); `None` in
    /// a pids file written before start times were recorded.
    pub start: Option<u64>,
}

/// The `pids` file: one `ROLE PID START` line per process `up` started.
pub struct Pids {
    file: PathBuf,
    /// What it lists, in start order.
    pub entries: Vec<Entry>,
}

impl Pids {
    /// The file of `state` (empty if it does not exist or cannot be read).
    pub fn load(state: &Path) -> Pids {
        let file = state.join("pids");
        let entries = fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .filter_map(parse_entry)
            .collect();
        Pids { file, entries }
    }

    /// An empty list that `save` writes to `state`'s pids file.
    pub fn new(state: &Path) -> Pids {
        Pids {
            file: state.join("pids"),
            entries: Vec::new(),
        }
    }

    /// Records `role`'s new process (replacing an earlier one of that role) and saves.
    pub fn set(&mut self, role: &str, pid: i32, start: Option<u64>) -> Result<(), ClusterError> {
        let entry = Entry {
            role: role.to_string(),
            pid,
            start,
        };
        match self.entries.iter_mut().find(|e| e.role == role) {
            Some(e) => *e = entry,
            None => self.entries.push(entry),
        }
        let text: String = self
            .entries
            .iter()
            .map(|e| match e.start {
                Some(s) => format!("{} {} {s}\n", e.role, e.pid),
                None => format!("{} {}\n", e.role, e.pid),
            })
            .collect();
        fs::write(&self.file, text).map_err(io_err(format!("writing {}", self.file.display())))
    }

    /// Deletes the file.
    pub fn remove(&self) {
        let _ = fs::remove_file(&self.file);
    }
}

fn parse_entry(line: &str) -> Option<Entry> {
    let mut words = line.split_whitespace();
    let role = words.next()?.to_string();
    let pid = words.next()?.parse().ok()?;
    let start = words.next().and_then(|s| s.parse().ok());
    Some(Entry { role, pid, start })
}

/// The file holding the address `role` listens on (written by the server itself).
pub fn addr_file(state: &Path, role: &str) -> PathBuf {
    state.join(format!("{role}.addr"))
}

/// The file holding the address of `role`'s metrics endpoint (written by the process).
pub fn metrics_file(state: &Path, role: &str) -> PathBuf {
    state.join(format!("{role}.metrics"))
}

/// The flags that make `role` serve its metrics on a free loopback port and record it.
pub fn metrics_args(state: &Path, role: &str) -> [String; 4] {
    [
        "--metrics-listen".into(),
        "127.0.0.1:0".into(),
        "--metrics-addr-file".into(),
        metrics_file(state, role).to_string_lossy().into_owned(),
    ]
}

/// The metrics endpoints recorded in `state`, by role, in start order.
pub fn metrics_addrs(state: &Path) -> Vec<(String, String)> {
    recorded_roles(state)
        .into_iter()
        .filter_map(|r| Some((r.clone(), read_addr(&metrics_file(state, &r))?)))
        .collect()
}

/// The address recorded in `file`, if any.
pub fn read_addr(file: &Path) -> Option<String> {
    fs::read_to_string(file)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().into())
}

/// The file holding `role`'s command line, one argument per line, to start it again.
fn cmd_file(state: &Path, role: &str) -> PathBuf {
    state.join("cmd").join(role)
}

/// Records the command line `role` was started with.
pub fn save_cmd(state: &Path, role: &str, args: &[String]) -> Result<(), ClusterError> {
    if args.iter().any(|a| a.contains('\n')) {
        return Err(ClusterError::Other(format!(
            "cannot record {role}'s command line: an argument contains a newline"
        )));
    }
    let file = cmd_file(state, role);
    if let Some(dir) = file.parent() {
        fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
    }
    let mut text = args.join("\n");
    text.push('\n');
    fs::write(&file, text).map_err(io_err(format!("writing {}", file.display())))
}

/// The file that names the mount point of the cluster a state directory holds.
fn mountpoint_file(state: &Path) -> PathBuf {
    state.join("mountpoint")
}

/// Records the mount point `up` mounted, so that `down --state-dir DIR` needs no other
/// argument.
pub fn save_mountpoint(state: &Path, mnt: &Path) -> Result<(), ClusterError> {
    let mut text = mnt.as_os_str().as_bytes().to_vec();
    if text.contains(&b'\n') {
        return Err(ClusterError::Other(format!(
            "cannot record the mount point {}: its name contains a newline",
            mnt.display()
        )));
    }
    text.push(b'\n');
    let file = mountpoint_file(state);
    fs::write(&file, text).map_err(io_err(format!("writing {}", file.display())))
}

/// The mount point of the cluster in `state`: the one recorded by `up`, or for a state
/// directory from before that record, the last argument of the mount's command line.
pub fn recorded_mountpoint(state: &Path) -> Option<PathBuf> {
    let from_record = fs::read(mountpoint_file(state)).ok().and_then(|mut b| {
        (b.pop() == Some(b'\n') && !b.is_empty()).then(|| PathBuf::from(OsString::from_vec(b)))
    });
    from_record.or_else(|| load_cmd(state, MOUNT)?.pop().map(PathBuf::from))
}

/// The command line `role` was last started with, if recorded.
pub fn load_cmd(state: &Path, role: &str) -> Option<Vec<String>> {
    let text = fs::read_to_string(cmd_file(state, role)).ok()?;
    let args: Vec<String> = text.lines().map(String::from).collect();
    (!args.is_empty()).then_some(args)
}

/// The roles whose command lines are recorded: the members of the cluster.
pub fn recorded_roles(state: &Path) -> Vec<String> {
    let Ok(dir) = fs::read_dir(state.join("cmd")) else {
        return Vec::new();
    };
    let mut roles: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    roles.sort_by_key(|r| role_order(r));
    roles
}

/// Start order: the etcd members, the metadata servers, the data servers by number,
/// the mount.
pub fn role_order(role: &str) -> (u8, usize) {
    let number = |prefix: &str| {
        role.strip_prefix(prefix)
            .and_then(|n| n.trim_start_matches('m').parse().ok())
            .unwrap_or(usize::MAX)
    };
    match role {
        META => (1, 0),
        MOUNT => (3, 0),
        r if super::etcd::is_etcd_role(r) => (0, number("etcd-")),
        r if super::etcd::is_meta_role(r) => (1, number("meta-")),
        _ => (2, number("data-")),
    }
}

/// Replaces the value of `--listen` in `args` by `addr`.
pub fn with_listen(args: &[String], addr: &str) -> Vec<String> {
    let mut out = args.to_vec();
    if let Some(i) = out.iter().position(|a| a == "--listen") {
        if let Some(v) = out.get_mut(i + 1) {
            *v = addr.to_string();
        }
    }
    out
}

/// The value of option `name` (`--name VALUE` or `--name=VALUE`) in `args`.
pub fn option_value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let eq = format!("{name}=");
    args.iter().enumerate().find_map(|(i, a)| {
        if a == name {
            args.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix(&eq)
        }
    })
}

/// The metadata server's address as `up` recorded it in `state`; on etcd, every
/// metadata server's, comma-separated.
pub fn meta_addr(state: &Path) -> Result<String, ClusterError> {
    if let Some(all) = super::etcd::meta_addrs(state) {
        return Ok(all);
    }
    let file = addr_file(state, META);
    read_addr(&file).ok_or_else(|| {
        ClusterError::Other(format!(
            "no metadata server address in {}: was this cluster started with `tessera up`?",
            file.display()
        ))
    })
}

/// `(address, role)` of each data server recorded in `state`: how `status` names them.
pub fn data_names(state: &Path) -> Vec<(String, String)> {
    let Ok(dir) = fs::read_dir(state) else {
        return Vec::new();
    };
    let mut names: Vec<(String, String)> = dir
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let role = name.strip_suffix(".addr")?;
            role.starts_with("data-").then_some(())?;
            Some((read_addr(&state.join(&name))?, role.to_string()))
        })
        .collect();
    names.sort_by_key(|(_, r)| role_order(r));
    names
}

/// The cluster key of a local cluster (servers authenticate with it).
pub fn cluster_key_file(state: &Path) -> PathBuf {
    state.join("keys").join("cluster.key")
}

/// The administrator's client key of a local cluster (the mount, `status`, `fsck`).
pub fn admin_key_file(state: &Path) -> PathBuf {
    state.join("keys").join("admin.key")
}

/// Makes the cluster key unless it exists (a restart keeps it), and the administrator's
/// key derived from it (mode 0600, in a 0700 directory). An administrator's key that is
/// not the derived one (a state directory of a Tessera that made it at random) is
/// written again.
pub fn ensure_keys(state: &Path) -> Result<(), ClusterError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = state.join("keys");
    let fail = |what: String| move |e: std::io::Error| ClusterError::Io { what, source: e };
    let other = |e: transport::TransportError| ClusterError::Other(e.to_string());
    std::fs::create_dir_all(&dir).map_err(fail(format!("creating {}", dir.display())))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(fail(format!("making {} private", dir.display())))?;
    let cluster_file = cluster_key_file(state);
    if !cluster_file.exists() {
        transport::Key::generate()
            .and_then(|k| k.save(&cluster_file))
            .map_err(other)?;
    }
    let cluster = transport::Key::load(&cluster_file).map_err(other)?;
    let admin = transport::ClientKeyFile::admin(&cluster);
    let admin_file = admin_key_file(state);
    match transport::ClientKeyFile::load(&admin_file) {
        Ok(found) if found == admin => return Ok(()),
        Ok(_) | Err(_) if admin_file.exists() => {
            std::fs::remove_file(&admin_file)
                .map_err(fail(format!("replacing {}", admin_file.display())))?;
            eprintln!(
                "tessera: {} written again: derived from {}",
                admin_file.display(),
                cluster_file.display()
            );
        }
        Ok(_) | Err(_) => {}
    }
    admin.save(&admin_file).map_err(other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_lines_with_and_without_start_times() {
        assert_eq!(
            parse_entry("data-1 42 777"),
            Some(Entry {
                role: "data-1".into(),
                pid: 42,
                start: Some(777)
            })
        );
        assert_eq!(parse_entry("meta 7").and_then(|e| e.start), None);
        assert_eq!(parse_entry("meta"), None);
    }

    #[test]
    fn listen_is_replaced_and_options_found() {
        let args: Vec<String> = ["--listen", "127.0.0.1:0", "--replicas=2", "--meta", "m:1"]
            .map(String::from)
            .to_vec();
        let moved = with_listen(&args, "127.0.0.1:4000");
        assert_eq!(option_value(&moved, "--listen"), Some("127.0.0.1:4000"));
        assert_eq!(option_value(&args, "--replicas"), Some("2"));
        assert_eq!(option_value(&args, "--meta"), Some("m:1"));
        assert_eq!(option_value(&args, "--store"), None);
    }

    #[test]
    fn roles_start_meta_first_and_mount_last() {
        let mut roles = vec![
            "mount", "data-10", "meta-1", "data-2", "etcd-m1", "meta", "etcd-m0",
        ];
        roles.sort_by_key(|r| role_order(r));
        assert_eq!(
            roles,
            ["etcd-m0", "etcd-m1", "meta", "meta-1", "data-2", "data-10", "mount"]
        );
    }
}
