//! Which running processes belong to a state directory. A PID alone proves nothing (PIDs
//! wrap within minutes on a busy machine, and another cluster's servers carry the same
//! names), so a process is a member only if it is one of Tessera's programs, owned by
//! this user, and its command line names the state directory (the mount: the state
//! directory or its mount point); a recorded PID must also still have its recorded
//! start time.

use super::state::{self, Entry, Pids};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a process may take to exit after SIGTERM before it gets SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a process may take to go after SIGKILL.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// Polling interval while waiting for a process to exit.
const POLL: Duration = Duration::from_millis(50);

/// A running member of a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// `meta`, `data-N` or `mount`.
    pub role: String,
    /// Its PID.
    pub pid: i32,
    /// Its start time: the same PID with another start time is another process.
    pub start: u64,
}

/// The start time of `pid` (field 22 of `/proc/PID/stat`), or `None` if it is not
/// running or is a zombie.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) may hold spaces and parentheses: fields after it follow the
    // last ')'. The state is field 3, the start time field 22.
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether `pid` still is the process that started at `start`.
pub fn alive(pid: i32, start: u64) -> bool {
    start_time(pid) == Some(start)
}

fn argv(pid: i32) -> Vec<PathBuf> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    raw.split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| PathBuf::from(OsStr::from_bytes(a)))
        .collect()
}

/// The command line of `pid`, as text (empty if it is gone).
pub fn cmdline(pid: i32) -> Vec<String> {
    argv(pid)
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// Program name of a command line: the file name of its first argument.
fn program(args: &[PathBuf]) -> String {
    args.first()
        .and_then(|a| a.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn owned_by_us(pid: i32) -> bool {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == uid)
}

/// Resolves `arg` (a path, or the value of `--opt=path`) as process `pid` sees it.
fn resolve(pid: i32, arg: &Path) -> Option<PathBuf> {
    let bytes = arg.as_os_str().as_bytes();
    let value = match bytes.iter().position(|&b| b == b'=') {
        Some(i) if bytes.starts_with(b"--") => Path::new(OsStr::from_bytes(&bytes[i + 1..])),
        _ => arg,
    };
    if value.as_os_str().is_empty() || value.as_os_str().as_bytes().starts_with(b"-") {
        return None;
    }
    let full = if value.is_absolute() {
        value.to_path_buf()
    } else {
        fs::read_link(format!("/proc/{pid}/cwd")).ok()?.join(value)
    };
    // The parent canonical and the name added, never a look at the path itself: it may
    // be the root of a mount (another cluster's, whose server is away, or a stopped
    // mount process), where a look waits or hangs. It need not exist yet either (an
    // address file not yet written).
    match (full.parent(), full.file_name()) {
        (Some(dir), Some(name)) => Some(fs::canonicalize(dir).ok()?.join(name)),
        _ => Some(full),
    }
}

/// The role `pid` plays for `state` (and its mount point `mnt`), or `None` if it is not
/// a member: not Tessera's, not ours, or its command line names neither.
fn role_of(pid: i32, state: &Path, mnt: &Path) -> Option<String> {
    // The name first: reading another process's command line (or stat) waits for locks
    // that a process stuck on a hung FUSE mount holds, and `up`/`down` must not hang on
    // someone else's process. `comm` needs none of them.
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    if comm.trim_end() == "etcd" {
        return etcd_role_of(pid, state);
    }
    if !comm.starts_with("tessera") || !owned_by_us(pid) {
        return None;
    }
    let args = argv(pid);
    let prog = program(&args);
    if !prog.starts_with("tessera") || !owned_by_us(pid) {
        return None;
    }
    let inside = |p: &PathBuf| p.strip_prefix(state).ok().map(Path::to_path_buf);
    match prog.as_str() {
        "tessera-meta" | "tessera-data" => {
            // The role is the state subdirectory its `--data-dir` names.
            let text: Vec<String> = args
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let data_dir = state::option_value(&text, "--data-dir")?;
            let dir = inside(&resolve(pid, Path::new(data_dir))?)?;
            let role = dir.to_string_lossy().into_owned();
            let fits = if prog == "tessera-meta" {
                super::etcd::is_meta_role(&role)
            } else {
                role.starts_with("data-")
            };
            fits.then_some(role)
        }
        "tessera" => {
            let mounting = args.get(1).is_some_and(|a| a.as_os_str() == "mount");
            let names = args[1..]
                .iter()
                .filter_map(|a| resolve(pid, a))
                .any(|p| p == mnt || inside(&p).is_some());
            (mounting && names).then(|| state::MOUNT.to_string())
        }
        _ => None,
    }
}

/// The role of an etcd process of ours whose `--data-dir` is inside the local etcd
/// directory `up` recorded in `state`: `etcd-NAME`, after the directory's name.
fn etcd_role_of(pid: i32, state: &Path) -> Option<String> {
    let dir = super::etcd::local_dir(state)?;
    if !owned_by_us(pid) {
        return None;
    }
    let args = cmdline(pid);
    let data_dir = resolve(pid, Path::new(state::option_value(&args, "--data-dir")?))?;
    let name = data_dir
        .strip_prefix(&dir)
        .ok()?
        .to_string_lossy()
        .into_owned();
    (!name.is_empty() && !name.contains('/')).then(|| super::etcd::role(&name))
}

/// Every running member of the cluster in `state`: the recorded processes that are still
/// themselves, and any other process of this user whose command line names the state
/// directory (a server restarted by hand).
pub fn members(state: &Path, mnt: &Path) -> Vec<Member> {
    let state = fs::canonicalize(state).unwrap_or_else(|_| state.to_path_buf());
    let mut found: Vec<Member> = Pids::load(&state)
        .entries
        .iter()
        .filter_map(|e| recorded_member(e, &state, mnt))
        .collect();
    let Ok(proc_dir) = fs::read_dir("/proc") else {
        return found;
    };
    for entry in proc_dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if found.iter().any(|m| m.pid == pid) {
            continue;
        }
        let (Some(role), Some(start)) = (role_of(pid, &state, mnt), start_time(pid)) else {
            continue;
        };
        found.push(Member { role, pid, start });
    }
    found.sort_by_key(|m| state::role_order(&m.role));
    found
}

fn recorded_member(e: &Entry, state: &Path, mnt: &Path) -> Option<Member> {
    let start = start_time(e.pid)?;
    if e.start.is_some_and(|s| s != start) {
        return None; // the PID was reused
    }
    let role = role_of(e.pid, state, mnt)?;
    Some(Member {
        role,
        pid: e.pid,
        start,
    })
}

fn signal(m: &Member, sig: i32) {
    if alive(m.pid, m.start) {
        // SAFETY: plain kill(2) on a PID whose start time says it is still our member.
        unsafe {
            libc::kill(m.pid, sig);
        }
    }
}

/// Collects the exit status of a child of this process (no-op for others).
pub fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid with WNOHANG on a PID; fails harmlessly if it is not our child.
    unsafe {
        libc::waitpid(pid, &mut status, libc::WNOHANG);
    }
}

fn wait_gone(m: &Member, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        reap(m.pid);
        if !alive(m.pid, m.start) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// Stops `m`: SIGTERM, then SIGKILL after a grace period. Returns whether it is gone.
pub fn stop(m: &Member) -> bool {
    stop_together(std::slice::from_ref(m))[0]
}

/// Stops every member of `ms` at once (SIGTERM to all, then SIGKILL to those left
/// after the grace period): an etcd member stopped alone first hands its leadership
/// to one still running, and the last one waits for peers already gone. Returns, for
/// each, whether it is gone.
pub fn stop_together(ms: &[Member]) -> Vec<bool> {
    for m in ms {
        signal(m, libc::SIGTERM);
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    let mut gone: Vec<bool> = ms
        .iter()
        .map(|m| wait_gone(m, deadline.saturating_duration_since(Instant::now())))
        .collect();
    for (m, g) in ms.iter().zip(gone.iter_mut()) {
        if !*g {
            signal(m, libc::SIGKILL);
            *g = wait_gone(m, KILL_TIMEOUT);
        }
    }
    gone
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_start_time_and_is_not_a_member() {
        let pid = std::process::id() as i32;
        let start = start_time(pid).expect("running");
        assert!(alive(pid, start));
        assert!(
            !alive(pid, start + 1),
            "another start time is another process"
        );
        assert_eq!(
            role_of(pid, Path::new("/nonexistent"), Path::new("/x")),
            None
        );
    }
}
