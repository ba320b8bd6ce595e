//! Running a mount in the background, as `mount(8)` expects of a helper: the process
//! forks before any thread exists, the parent waits until the child has mounted (or
//! failed) and exits with that verdict, so `mount` returns once the file system is
//! usable and reports the child's error if there was one.
//!
//! The child reports on a pipe: one byte `0` once mounted, or `1` and a message. A pipe
//! closed with neither means the child died first.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// Longest error message the child sends to the waiting parent.
const MAX_REPORT_BYTES: u64 = 64 * 1024;

/// Where a daemonized mount logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogTo {
    /// Keep standard error: it is systemd's journal (`JOURNAL_STREAM`).
    Journal,
    /// Append to this file.
    File(std::path::PathBuf),
}

/// The child's end of the pipe: tells the waiting parent how the mount went.
pub struct Ready {
    pipe: Option<File>,
}

impl Ready {
    /// The mount is in place: the parent exits 0.
    pub fn mounted(&mut self) {
        if let Some(mut p) = self.pipe.take() {
            // The parent gone (killed) changes nothing for the mount.
            let _ = p.write_all(b"0");
        }
    }

    /// The mount failed: the parent prints `message` and exits 1.
    pub fn failed(&mut self, message: &str) {
        if let Some(mut p) = self.pipe.take() {
            let _ = p.write_all(format!("1{message}").as_bytes());
        }
    }
}

/// Forks. Returns in the child only, with its log set up and detached from the
/// terminal; the parent waits for the child's report and exits. Must be called before
/// any thread starts (a fork copies only the calling thread).
pub fn daemonize(log: &LogTo) -> std::io::Result<Ready> {
    // Opened before the fork, so that a log the mount cannot write is reported here.
    let log_file = match log {
        LogTo::File(path) => Some(open_log(path)?),
        LogTo::Journal => None,
    };
    let (read, write) = pipe()?;
    // SAFETY: no other thread exists yet (the caller's contract), so the child's copy
    // of the process is whole; it only goes on running this program's code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid > 0 {
        drop(write);
        std::process::exit(wait_for_child(File::from(read), log));
    }
    drop(read);
    detach(log_file.as_ref())?;
    drop(log_file);
    // A descriptor the caller left open (a pipe it reads to its end) would keep the
    // caller waiting as long as the mount lives.
    close_inherited(write.as_raw_fd())?;
    Ok(Ready {
        pipe: Some(File::from(write)),
    })
}

/// The parent: reads the child's report and returns the exit code to use.
fn wait_for_child(pipe: File, log: &LogTo) -> i32 {
    let mut report = Vec::new();
    if let Err(e) = pipe.take(MAX_REPORT_BYTES).read_to_end(&mut report) {
        eprintln!("tessera: reading the mount process's report: {e}");
        return 1;
    }
    let failed = super::mount_helper::EXIT_MOUNT_FAILED;
    match report.split_first() {
        Some((b'0', _)) => 0,
        Some((_, message)) => {
            eprintln!("tessera: {}", String::from_utf8_lossy(message));
            failed
        }
        None => {
            let seen = match log {
                LogTo::File(p) => format!(" (its log: {})", p.display()),
                LogTo::Journal => " (see the journal)".into(),
            };
            eprintln!("tessera: the mount process ended before mounting{seen}");
            failed
        }
    }
}

/// The child: a new session without a terminal, `/` as its directory, standard input
/// from `/dev/null`, standard output and error to the log (or the journal kept).
fn detach(log: Option<&File>) -> std::io::Result<()> {
    // SAFETY: plain system calls on this process; no memory is shared.
    if unsafe { libc::setsid() } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    std::env::set_current_dir("/")?;
    let null = File::open("/dev/null")?;
    redirect(&null, libc::STDIN_FILENO)?;
    match log {
        Some(f) => {
            redirect(f, libc::STDOUT_FILENO)?;
            redirect(f, libc::STDERR_FILENO)?;
        }
        // The journal keeps standard error; standard output goes nowhere.
        None => redirect(
            &File::options().write(true).open("/dev/null")?,
            libc::STDOUT_FILENO,
        )?,
    }
    Ok(())
}

/// Closes every descriptor above standard error but `keep`.
fn close_inherited(keep: libc::c_int) -> std::io::Result<()> {
    let open: Vec<libc::c_int> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    for fd in open
        .into_iter()
        .filter(|&fd| fd > libc::STDERR_FILENO && fd != keep)
    {
        // SAFETY: no thread or object of this process uses these descriptors: they
        // were inherited from the caller (the listing's own is closed already, and
        // closing it again fails harmlessly with EBADF).
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// Whether standard error is systemd's journal: `JOURNAL_STREAM` (which every process
/// a unit starts inherits) names the device and inode of the journal's stream, and
/// standard error is still that stream (not a pipe some script set up since).
pub fn stderr_is_the_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    match std::fs::metadata("/proc/self/fd/2") {
        Ok(m) => dev.parse() == Ok(m.dev()) && ino.parse() == Ok(m.ino()),
        Err(_) => false,
    }
}

fn redirect(from: &File, to: libc::c_int) -> std::io::Result<()> {
    // SAFETY: dup2 on descriptors this process owns; `to` is a standard descriptor.
    if unsafe { libc::dup2(from.as_raw_fd(), to) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are open descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Opens the log for appending, making its directory if needed; not readable by all
/// (it names paths and users).
fn open_log(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    File::options()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("log {}: {e}", path.display())))
}

/// The default log of a mount at `mountpoint`: `/var/log/tessera/mount-<path>.log`, the
/// path's slashes made dashes (`/mnt/a-b` and `/mnt/a/b` share one: `log_file=` sets
/// another).
pub fn default_log(mountpoint: &Path) -> std::path::PathBuf {
    let name: String = mountpoint
        .to_string_lossy()
        .trim_matches('/')
        .chars()
        .map(|c| if c == '/' { '-' } else { c })
        .collect();
    Path::new("/var/log/tessera").join(format!("mount-{name}.log"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_log_is_named_after_the_mount_point() {
        assert_eq!(
            default_log(Path::new("/mnt/data/")),
            Path::new("/var/log/tessera/mount-mnt-data.log")
        );
    }
}
