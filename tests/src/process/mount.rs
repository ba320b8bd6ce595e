//! A FUSE mount of a [`super::ProcessCluster`]: its log, its unmount, and the watchdog
//! that aborts one a test keeps too long.

use super::stop;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

/// A FUSE mount served by a `tessera mount` process; unmounted and stopped on drop,
/// aborted if a test keeps it longer than [`super::MOUNT_LIMIT`].
pub struct Mount {
    /// Where it is mounted.
    pub path: PathBuf,
    pub(super) child: Child,
    pub(super) log: PathBuf,
    /// Dropped after `Drop::drop` unmounted, so it never aborts a mount being taken down.
    pub(super) _dog: Option<Watchdog>,
}

impl Mount {
    /// The calls the mount has sent so far, from its root's `tessera.stats` attribute.
    pub fn counts(&self) -> fs_client::RpcCounts {
        let out = crate::posix::getxattr(&self.path, "tessera.stats").expect("tessera.stats");
        let text = String::from_utf8(out).expect("text");
        let field = |name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {text:?}"))
        };
        fs_client::RpcCounts {
            meta_calls: field("meta_calls"),
            data_calls: field("data_calls"),
            retries: field("retries"),
            release_batches: field("release_batches"),
            lookups: field("lookups"),
        }
    }

    /// What the mount process has logged so far, without terminal colour codes.
    pub fn log_text(&self) -> String {
        let raw = fs::read_to_string(&self.log).unwrap_or_default();
        let mut out = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                // An SGR sequence: ESC '[' parameters 'm'.
                for c in chars.by_ref() {
                    if c == 'm' {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    /// Unmounts and waits for the mount process to exit; returns its log.
    pub fn unmount(mut self) -> String {
        self.stop();
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Crashes the client: kills the mount process with SIGKILL (it unmounts nothing and
    /// says goodbye to no server), reaps it, then detaches the dead mount lazily, since
    /// processes may still hold files open on it. Dropping the `Mount` afterwards is a
    /// no-op; if the detach failed here, the drop tries again.
    pub fn kill_client(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if fs_client::cli::local_cluster::is_mounted(&self.path) {
            if let Err(e) = fs_client::fuse::unmount(&self.path) {
                eprintln!("detaching {} after a kill: {e}", self.path.display());
            }
        }
    }

    /// Aborts this mount's FUSE connection if the returned guard is still alive after
    /// `limit`: a request that never gets its answer (a deadlock in the mount) then
    /// fails with ENOTCONN and the test fails, instead of hanging the whole suite in a
    /// process no signal can end.
    pub fn watchdog(&self, limit: Duration) -> Watchdog {
        use std::os::unix::fs::MetadataExt;
        let dev = fs::metadata(&self.path).map(|m| m.dev()).ok();
        let path = self.path.clone();
        let (cancel, expired) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            // The guard sends nothing: its drop disconnects the channel, which ends
            // the wait early with `Disconnected`. Only the limit passing aborts.
            if !matches!(
                expired.recv_timeout(limit),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            ) {
                return;
            }
            let Some(dev) = dev else { return };
            eprintln!(
                "watchdog: {} still busy after {limit:?}: aborting its FUSE connection",
                path.display()
            );
            let conns = Path::new("/sys/fs/fuse/connections");
            // The control file system, mounted here if it is not (and unmounted after).
            let mounted = fs::read_dir(conns).is_ok_and(|mut d| d.next().is_none())
                && Command::new("mount")
                    .args(["-t", "fusectl", "none"])
                    .arg(conns)
                    .status()
                    .is_ok_and(|s| s.success());
            let abort = conns.join(libc::minor(dev).to_string()).join("abort");
            if let Err(e) = fs::write(&abort, "1") {
                eprintln!("watchdog: cannot write {}: {e}", abort.display());
            }
            if mounted {
                let _ = Command::new("umount").arg(conns).status();
            }
        });
        Watchdog { _cancel: cancel }
    }

    fn stop(&mut self) {
        // SIGTERM makes the mount process unmount itself; unmount here too in case it
        // is stuck, lazily if files are still open.
        if fs_client::cli::local_cluster::is_mounted(&self.path) {
            let _ = fs_client::fuse::unmount(&self.path);
        }
        stop(&mut self.child);
    }
}

/// Cancels a [`Mount::watchdog`] when dropped.
pub struct Watchdog {
    _cancel: std::sync::mpsc::Sender<()>,
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.stop();
    }
}
