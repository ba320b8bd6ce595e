//! The caller of each kernel request, with its supplementary groups: the kernel hands
//! FUSE the uid, gid and pid only, so the groups are read from `/proc/PID/status` and
//! kept briefly per pid (a process asks many times in a row: `ls -l`, `tar x`).

use fuser::Request;
use parking_lot::Mutex;
use proto::meta::Caller;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a process's groups are kept: a process that changes its groups
/// (`setgroups`, rare after start) without changing its uid or gid is judged with the
/// old ones this long; a pid reused this soon by another process of the same uid and
/// gid is too (a change of either misses the cache).
const GROUPS_TTL: Duration = Duration::from_secs(1);
/// Most processes whose groups are kept; the cache empties when full.
const MAX_PROCESSES: usize = 4096;

/// A caller's process, user and group: a change of any is another caller.
type Who = (u32, u32, u32);

/// Supplementary groups of recent callers, and when each was read.
#[derive(Default)]
pub(super) struct Callers {
    groups: Mutex<HashMap<Who, (Instant, Vec<u32>)>>,
}

impl Callers {
    /// The caller of `req`: its uid and gid (the file system ids) and its groups.
    pub(super) fn of(&self, req: &Request) -> Caller {
        let (uid, gid, pid) = (req.uid(), req.gid(), req.pid());
        let now = Instant::now();
        if let Some((at, groups)) = self.groups.lock().get(&(pid, uid, gid)) {
            if now.duration_since(*at) < GROUPS_TTL {
                return Caller::with_groups(uid, gid, groups.iter().copied());
            }
        }
        // A process gone meanwhile (or a kernel-internal request, pid 0) is named with
        // its gid alone.
        let groups = read_groups(pid).unwrap_or_default();
        let mut cache = self.groups.lock();
        if cache.len() >= MAX_PROCESSES {
            cache.clear();
        }
        cache.insert((pid, uid, gid), (now, groups.clone()));
        Caller::with_groups(uid, gid, groups)
    }
}

/// The `Groups:` line of `/proc/PID/status`.
fn read_groups(pid: u32) -> Option<Vec<u32>> {
    if pid == 0 {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    Some(
        line.split_whitespace()
            .filter_map(|g| g.parse().ok())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_of_a_live_process_are_read_and_of_a_missing_one_are_none() {
        let mine = read_groups(std::process::id()).expect("this process is alive");
        // SAFETY: getgroups(0, NULL) only counts.
        let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        assert_eq!(mine.len(), usize::try_from(n).unwrap());
        assert_eq!(read_groups(0), None);
        assert_eq!(read_groups(u32::MAX), None);
    }
}
