//! What the POSIX tests on real mounts share: running code as an unprivileged user,
//! system calls that `std` does not wrap, counting chunk files on the data servers, and
//! waits bounded by a deadline.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The interpreter for helper scripts. The system one, by absolute path: a user's shim
/// (pyenv under `/root`) is out of reach of the unprivileged user.
pub const PYTHON: &str = "/usr/bin/python3";

/// An identity to run commands under: no `/etc/passwd` entry is needed, `setpriv` sets
/// the ids and the supplementary groups directly and drops every capability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// Real and effective user id.
    pub uid: u32,
    /// Real and effective group id.
    pub gid: u32,
    /// Supplementary groups (none if empty).
    pub groups: Vec<u32>,
}

/// The first unprivileged user of the tests.
pub const ALICE_UID: u32 = 4242;
/// A second unprivileged user, to test what one user may do to another's files.
pub const BOB_UID: u32 = 4343;
/// A group that only appears as a supplementary group.
pub const SHARED_GID: u32 = 4444;

impl User {
    /// Root, as the test runs.
    pub fn root() -> User {
        User {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        }
    }

    /// User `uid` whose primary group has the same number, with no other group.
    pub fn plain(uid: u32) -> User {
        User {
            uid,
            gid: uid,
            groups: Vec::new(),
        }
    }

    /// The same user with `groups` as supplementary groups.
    pub fn with_groups(mut self, groups: &[u32]) -> User {
        self.groups = groups.to_vec();
        self
    }

    /// A command that runs `program` as this user, from `/`, with a minimal environment.
    pub fn command(&self, program: &str) -> Command {
        let mut c = if self.uid == 0 {
            Command::new(program)
        } else {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={}", self.uid))
                .arg(format!("--regid={}", self.gid));
            if self.groups.is_empty() {
                c.arg("--clear-groups");
            } else {
                let g: Vec<String> = self.groups.iter().map(u32::to_string).collect();
                c.arg(format!("--groups={}", g.join(",")));
            }
            c.arg("--").arg(program);
            c
        };
        c.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LC_ALL", "C")
            .current_dir("/");
        c
    }

    /// Runs `script` (after [`PY_PRELUDE`]) with `args` as this user and returns what its
    /// `t()` calls printed, by label. Panics if the script itself fails.
    pub fn py(&self, script: &str, args: &[&Path]) -> Outcomes {
        let full = format!("{PY_PRELUDE}\n{script}");
        let out = self
            .command(PYTHON)
            .arg("-I")
            .arg("-c")
            .arg(&full)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("python3 runs");
        Outcomes::parse(&out, self)
    }

    /// Runs `sh -c cmd` as this user; panics unless it succeeds; returns its stdout.
    pub fn sh(&self, cmd: &str) -> String {
        let out = self
            .command("sh")
            .arg("-c")
            .arg(cmd)
            .output()
            .expect("sh runs");
        check_output(cmd, &out)
    }
}

/// Panics with the command's output unless it succeeded; returns its stdout.
pub fn check_output(what: &str, out: &Output) -> String {
    assert!(
        out.status.success(),
        "`{what}` failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The lines a bash `script` prints when run with `$1` = `dir` (made first), as root;
/// panics if it fails. For scripts run on the local disk and on a mount alike.
pub fn script_lines(what: &str, script: &str, dir: &Path) -> Vec<String> {
    std::fs::create_dir_all(dir).expect("the script's directory");
    let out = Command::new("bash")
        .arg("-c")
        .arg(script)
        .arg(what)
        .arg(dir)
        .output()
        .expect("bash runs");
    check_output(what, &out)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The lines of `script` (see [`script_lines`]) run in directory `name` of the local
/// disk beside `cluster`'s state, then in `name` on mount `m`: `(local, mount)`. Both
/// sides, and the cluster's directory (0700) above the local one, are opened to every
/// user first, for scripts that act as other users.
pub fn on_disk_and_mount(
    cluster: &crate::ProcessCluster,
    m: &crate::Mount,
    (what, script): (&str, &str),
    name: &str,
) -> (Vec<String>, Vec<String>) {
    let local = cluster.dir().join("local");
    std::fs::create_dir_all(&local).expect("the local side");
    for p in [cluster.dir(), local.as_path(), m.path.as_path()] {
        open_to_all(p);
    }
    let want = script_lines(what, script, &local.join(name));
    let got = script_lines(what, script, &m.path.join(name));
    (want, got)
}

/// Panics, showing both sides and where they differ, unless the mount's lines `got`
/// equal the local disk's `want` one for one.
pub fn assert_same_lines(want: &[String], got: &[String]) {
    let diff: Vec<String> = want
        .iter()
        .zip(got)
        .filter(|(w, g)| w != g)
        .map(|(w, g)| format!("local: {w}\nmount: {g}"))
        .collect();
    assert!(
        diff.is_empty() && want.len() == got.len(),
        "{}\nlocal:\n{}\nmount:\n{}",
        diff.join("\n"),
        want.join("\n"),
        got.join("\n")
    );
}

/// Python helpers for [`User::py`]: `t(label, f, *args)` runs one operation and prints
/// `label OK [result]` or `label ERRNO_NAME`, so a test sees each outcome by label.
pub const PY_PRELUDE: &str = r#"
import errno, fcntl, os, stat, sys
def t(label, f, *a):
    try:
        r = f(*a)
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, e.errno), flush=True)
    else:
        print(label, "OK" if r is None else "OK %s" % (r,), flush=True)
def rd(p):
    fd = os.open(p, os.O_RDONLY)
    try:
        return len(os.read(fd, 1 << 20))
    finally:
        os.close(fd)
def wr(p, data=b"x", flags=os.O_WRONLY):
    fd = os.open(p, flags, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
def mode(p):
    return oct(stat.S_IMODE(os.lstat(p).st_mode))
def owner(p):
    s = os.lstat(p)
    return "%d:%d" % (s.st_uid, s.st_gid)
"#;

/// The outcomes printed by a [`User::py`] script, by label.
#[derive(Debug)]
pub struct Outcomes {
    map: BTreeMap<String, String>,
    raw: String,
}

impl Outcomes {
    fn parse(out: &Output, who: &User) -> Outcomes {
        let raw = format!(
            "as {who:?}: {}\nstdout:\n{}stderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "python script failed {raw}");
        let map = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Outcomes { map, raw }
    }

    /// What operation `label` printed (`OK`, `OK <value>` or an errno name).
    pub fn get(&self, label: &str) -> &str {
        self.map
            .get(label)
            .unwrap_or_else(|| panic!("no outcome for {label} {}", self.raw))
    }

    /// Asserts that every `(label, outcome)` pair matches, reporting all mismatches.
    pub fn expect(&self, want: &[(&str, &str)]) {
        let bad: Vec<String> = want
            .iter()
            .filter(|(l, w)| self.map.get(*l).map(String::as_str) != Some(*w))
            .map(|(l, w)| format!("{l}: want {w}, got {:?}", self.map.get(*l)))
            .collect();
        assert!(bad.is_empty(), "{}\n{}", bad.join("\n"), self.raw);
    }
}

/// Lets every user reach the mount points below `dir` (the temp dir is created 0700).
pub fn open_to_all(dir: &Path) {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
}

/// Makes a directory with exactly `mode` (no umask) owned by `uid:gid`.
pub fn mkdir_owned(path: &Path, mode: u32, uid: u32, gid: u32) {
    fs::create_dir(path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
    chown(path, uid, gid).expect("chown");
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Writes a file with exactly `mode` (no umask) owned by `uid:gid`.
pub fn file_owned(path: &Path, data: &[u8], mode: u32, uid: u32, gid: u32) {
    fs::write(path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    chown(path, uid, gid).expect("chown");
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Permission bits including setuid, setgid and sticky.
pub fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).expect("lstat").mode() & 0o7777
}

/// A path as a C string for libc.
pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

fn cvt(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The errno of a failed call; panics (with `what`) if it succeeded.
pub fn errno_of<T: std::fmt::Debug>(what: &str, r: io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("{what} succeeded ({v:?}) but should have failed"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("{what}: no errno in {e}")),
    }
}

/// `chown(2)` (a symlink is followed).
pub fn chown(p: &Path, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: a valid C string path.
    cvt(unsafe { libc::chown(cpath(p).as_ptr(), uid, gid) }.into()).map(drop)
}

/// `renameat2(2)` with `flags` (RENAME_NOREPLACE, RENAME_EXCHANGE).
pub fn renameat2(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let (f, t) = (cpath(from), cpath(to));
    // SAFETY: valid C strings; AT_FDCWD makes the paths relative to the cwd or absolute.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    cvt(r).map(drop)
}

/// `mknod(2)`.
pub fn mknod(p: &Path, mode: u32, dev: libc::dev_t) -> io::Result<()> {
    // SAFETY: a valid C string path.
    cvt(unsafe { libc::mknod(cpath(p).as_ptr(), mode, dev) }.into()).map(drop)
}

/// `fallocate(2)` on an open file.
pub fn fallocate(f: &fs::File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: a valid open descriptor.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    cvt(r.into()).map(drop)
}

/// Maps `len` bytes of `f` shared and writable, runs `edit` on them, optionally
/// msyncs, and unmaps.
pub fn with_shared_map(f: &fs::File, len: usize, sync: bool, edit: impl FnOnce(&mut [u8])) {
    let addr = map_shared(f, len, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: the mapping is `len` bytes long and only this slice uses it.
    edit(unsafe { std::slice::from_raw_parts_mut(addr.cast::<u8>(), len) });
    if sync {
        // SAFETY: the mapping made above.
        let r = unsafe { libc::msync(addr, len, libc::MS_SYNC) };
        assert_eq!(r, 0, "msync: {}", std::io::Error::last_os_error());
    }
    // SAFETY: the mapping made above, no longer used.
    assert_eq!(unsafe { libc::munmap(addr, len) }, 0);
}

/// How many of the first `len` bytes' pages of `f` are in the kernel's page cache
/// (`mincore(2)` on a read-only shared mapping, which reads nothing itself).
pub fn resident_pages(f: &fs::File, len: usize) -> usize {
    let addr = map_shared(f, len, libc::PROT_READ);
    let mut vec = vec![0u8; len.div_ceil(4096)];
    // SAFETY: the mapping made above; `vec` has one byte per page of it.
    let r = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = std::io::Error::last_os_error();
    // SAFETY: the mapping made above, no longer used.
    assert_eq!(unsafe { libc::munmap(addr, len) }, 0);
    assert_eq!(r, 0, "mincore: {err}");
    vec.iter().filter(|&&b| b & 1 == 1).count()
}

/// A new shared mapping of the first `len` bytes of `f` with protection `prot`; the
/// caller unmaps it.
fn map_shared(f: &fs::File, len: usize, prot: libc::c_int) -> *mut libc::c_void {
    // SAFETY: a fresh shared mapping of an open file, at an address the kernel picks;
    // nothing else aliases it.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(
        addr,
        libc::MAP_FAILED,
        "{}",
        std::io::Error::last_os_error()
    );
    addr
}

/// `lseek(2)` with any `whence`, SEEK_DATA and SEEK_HOLE included.
pub fn lseek(f: &fs::File, offset: i64, whence: i32) -> io::Result<u64> {
    // SAFETY: a valid open descriptor.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
    cvt(r).map(|o| o as u64)
}

/// `statvfs(3)`.
pub fn statvfs(p: &Path) -> libc::statvfs {
    // SAFETY: zeroed plain data, filled by the call.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string path and a valid out pointer.
    let r = unsafe { libc::statvfs(cpath(p).as_ptr(), &mut s) };
    assert_eq!(r, 0, "statvfs: {}", io::Error::last_os_error());
    s
}

/// `lsetxattr(2)`: sets `name` on the path itself (a symlink is not followed).
pub fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
    let n = CString::new(name).expect("name without NUL");
    // SAFETY: valid C strings and a value buffer of the given length.
    let r = unsafe {
        libc::lsetxattr(
            cpath(p).as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    cvt(r.into()).map(drop)
}

/// `lgetxattr(2)` into a buffer of `size` bytes (0 asks for the value's size only).
pub fn getxattr_sized(p: &Path, name: &str, size: usize) -> io::Result<(usize, Vec<u8>)> {
    let n = CString::new(name).expect("name without NUL");
    let mut buf = vec![0u8; size];
    // SAFETY: valid C strings and a buffer of `size` bytes.
    let r =
        unsafe { libc::lgetxattr(cpath(p).as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) };
    let len = cvt(r as libc::c_long)? as usize;
    buf.truncate(len.min(size));
    Ok((len, buf))
}

/// The value of `name`, whatever its size.
pub fn getxattr(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    getxattr_sized(p, name, 65_536).map(|(_, v)| v)
}

/// `llistxattr(2)` into a buffer of `size` bytes (0 asks for the size only).
pub fn listxattr_sized(p: &Path, size: usize) -> io::Result<(usize, Vec<String>)> {
    let mut buf = vec![0u8; size];
    // SAFETY: a valid C string and a buffer of `size` bytes.
    let r = unsafe { libc::llistxattr(cpath(p).as_ptr(), buf.as_mut_ptr().cast(), size) };
    let len = cvt(r as libc::c_long)? as usize;
    buf.truncate(len.min(size));
    let names = buf
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    Ok((len, names))
}

/// Every xattr name of `p`, sorted.
pub fn listxattr(p: &Path) -> io::Result<Vec<String>> {
    let mut names = listxattr_sized(p, 1 << 20)?.1;
    names.sort();
    Ok(names)
}

/// `lremovexattr(2)`.
pub fn removexattr(p: &Path, name: &str) -> io::Result<()> {
    let n = CString::new(name).expect("name without NUL");
    // SAFETY: valid C strings.
    cvt(unsafe { libc::lremovexattr(cpath(p).as_ptr(), n.as_ptr()) }.into()).map(drop)
}

/// Access, modification and change times of `p` in nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Times {
    /// Last access.
    pub atime: i128,
    /// Last change of the contents.
    pub mtime: i128,
    /// Last change of the inode.
    pub ctime: i128,
}

/// The times of `p` (not following a symlink).
pub fn times(p: &Path) -> Times {
    let m = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
    let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
    Times {
        atime: ns(m.atime(), m.atime_nsec()),
        mtime: ns(m.mtime(), m.mtime_nsec()),
        ctime: ns(m.ctime(), m.ctime_nsec()),
    }
}

/// Waits until `done()` holds, polling; panics with `what` when `timeout` passes first.
pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Chunks held by the data servers of the cluster in `cluster_dir`, each counted once
/// however many servers hold a copy (0 means no copy anywhere); with `ino`, only that
/// inode's.
pub fn chunk_files(cluster_dir: &Path, ino: Option<u64>) -> usize {
    let chunks = crate::chunk_tree::cluster_chunk_files(cluster_dir, ino);
    let distinct: std::collections::BTreeSet<(u64, u64)> =
        chunks.into_iter().map(|(_, c)| c).collect();
    distinct.len()
}

/// How long chunk deletions may take: they travel in heartbeat replies (one a second).
pub const GC_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits until the data servers hold exactly `want` chunk files of `ino` (or of all
/// files with `None`).
pub fn wait_chunks(cluster_dir: &Path, ino: Option<u64>, want: usize) {
    let deadline = Instant::now() + GC_TIMEOUT;
    loop {
        let now = chunk_files(cluster_dir, ino);
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "chunk files of {ino:?}: {now}, not {want} within {GC_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
