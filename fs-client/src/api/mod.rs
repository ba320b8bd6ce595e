//! The library API: one cluster's namespace by path, with blocking calls, for programs
//! that read and write files without a mount (the Python package, data loaders, tools).
//!
//! It is the same [`Client`] a mount runs on, with the same caches, readahead, write
//! buffers and consistency: a file written here is read through a mount after its
//! close, and the other way round. What a mount gets from the kernel, this module does
//! itself: it resolves paths (following symbolic links, keeping the inodes of
//! directories it walked for `entry_ttl_ms`, as the kernel keeps its dentries), and it
//! applies the process's umask to the modes of what it creates.
//!
//! A [`Tessera`] owns a small tokio runtime; its calls block the calling thread, and
//! many threads may call at once. Do not call it from inside an async task (the calls
//! would block that task's worker): use [`Tessera::client`], the async API, there. It
//! does not survive `fork()`: a child process connects anew.
//!
//! ```no_run
//! use fs_client::api::{OpenOptions, Options, Tessera};
//!
//! # fn main() -> fs_client::Result<()> {
//! let fs = Tessera::connect(&["127.0.0.1:7600"], Options::new())?;
//! fs.create_dir_all("/ckpt", 0o755)?;
//! fs.write("/ckpt/step-100.bin", b"weights")?;
//! let file = fs.open("/ckpt/step-100.bin", &OpenOptions::new())?;
//! let mut buf = vec![0; 7];
//! assert_eq!(file.read_at(&mut buf, 0)?, 7);
//! file.close()?;
//! let all = fs.read_many(&["/ckpt/step-100.bin"]);
//! assert_eq!(all[0].as_deref().ok(), Some(&b"weights"[..]));
//! # Ok(())
//! # }
//! ```

mod file;
mod path;
mod resolve;

pub use file::{File, OpenOptions};
pub use path::MAX_PATH_BYTES;

use crate::client::Client;
use crate::config::ClientConfig;
use crate::error::{ClientError, Result};
use proto::meta::{Caller, RenameMode};
use proto::{Attr, ErrorCode, FileKind, WireError};
use resolve::Resolver;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How many worker threads the runtime gets by default at most: the transfers are
/// asynchronous, the threads only copy bytes and run the protocol.
const MAX_DEFAULT_THREADS: usize = 8;

/// How a [`Tessera`] connects and works.
#[derive(Clone, Debug)]
pub struct Options {
    /// The client settings, as a mount's configuration file has them (`meta_addr` is
    /// set from the addresses [`Tessera::connect`] gets).
    pub config: ClientConfig,
    /// Worker threads of the runtime (default: the cores, 2 to 8).
    pub threads: usize,
    /// Files [`Tessera::read_many`] reads at once at most (default 16).
    pub parallel: usize,
}

impl Default for Options {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Options {
            config: ClientConfig::default(),
            threads: cores.clamp(2, MAX_DEFAULT_THREADS),
            parallel: 16,
        }
    }
}

impl Options {
    /// The defaults.
    pub fn new() -> Options {
        Options::default()
    }

    /// The defaults with client settings set by name, as a mount's `-o name=value`
    /// options are (`io_buffers`, `readahead_max_bytes`, `transport_limits.
    /// rpc_timeout_ms`, ...), each read as the type of its default. An unknown name or
    /// a value of the wrong type fails with [`ClientError::Config`].
    pub fn with_settings<N: AsRef<str>, V: AsRef<str>>(settings: &[(N, V)]) -> Result<Options> {
        let settings: Vec<(String, String)> = settings
            .iter()
            .map(|(n, v)| (n.as_ref().to_string(), v.as_ref().to_string()))
            .collect();
        let config = crate::cli::mount_helper::config_with("", &settings, false)
            .map_err(|e| ClientError::Config(format!("{e:#}")))?;
        Ok(Options {
            config,
            ..Options::default()
        })
    }
}

/// What kind of inode a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (seen only by [`Tessera::symlink_metadata`] and listings).
    Symlink,
    /// A FIFO, socket or device node.
    Other,
}

impl From<FileKind> for FileType {
    fn from(k: FileKind) -> FileType {
        match k {
            FileKind::Regular => FileType::File,
            FileKind::Directory => FileType::Dir,
            FileKind::Symlink => FileType::Symlink,
            _ => FileType::Other,
        }
    }
}

/// A file's attributes, as `stat(2)` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// The inode number (`st_ino`).
    pub ino: u64,
    /// The kind of inode.
    pub kind: FileType,
    /// `st_mode`: the file type bits and the permission bits.
    pub mode: u32,
    /// Length in bytes.
    pub size: u64,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Space held, in 512-byte blocks (holes hold none).
    pub blocks: u64,
    /// Last access.
    pub atime: SystemTime,
    /// Last change of the contents.
    pub mtime: SystemTime,
    /// Last change of the inode.
    pub ctime: SystemTime,
}

impl Metadata {
    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.kind == FileType::Dir
    }

    /// Whether it is a regular file.
    pub fn is_file(&self) -> bool {
        self.kind == FileType::File
    }
}

/// `ts` as a `SystemTime` (times before 1970 included).
fn system_time(ts: proto::Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(ts.nanos));
    if ts.secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(ts.secs.unsigned_abs()) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(ts.secs.unsigned_abs()) + nanos
    }
}

impl From<&Attr> for Metadata {
    fn from(a: &Attr) -> Metadata {
        let type_bits = match a.kind {
            FileKind::Regular => libc::S_IFREG,
            FileKind::Directory => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
            FileKind::CharDevice => libc::S_IFCHR,
            FileKind::BlockDevice => libc::S_IFBLK,
        };
        Metadata {
            ino: a.ino.0,
            kind: a.kind.into(),
            mode: type_bits | (a.perm & 0o7777),
            size: a.size,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            blocks: a.blocks,
            atime: system_time(a.atime),
            mtime: system_time(a.mtime),
            ctime: system_time(a.ctime),
        }
    }
}

/// One name in a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The name (a name that is not UTF-8 shows U+FFFD where its bytes are not).
    pub name: String,
    /// The inode it names.
    pub ino: u64,
    /// The kind of that inode.
    pub kind: FileType,
}

/// What the handles and the runtime share; dropped after the last of them.
struct Shared {
    /// Kept in an `Option` to be shut down without waiting in `Drop`.
    rt: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    client: Arc<Client>,
    paths: Resolver,
    parallel: usize,
    /// The process's umask, read once at connect.
    umask: u32,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Closes without a commit are batched for a moment: end them before the
        // connection goes (as an unmount does), unless dropped inside a runtime, where
        // blocking is not allowed (the server ends them with the connection then).
        if tokio::runtime::Handle::try_current().is_err() {
            self.handle.block_on(self.client.send_releases());
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Shared {
    /// Runs `f` on the runtime and waits for it.
    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.handle.block_on(f)
    }

    fn mode(&self, mode: u32) -> u32 {
        mode & 0o7777 & !self.umask
    }
}

/// The process's umask, from `/proc/self/status` (calling `umask(2)` to read it would
/// change it for a moment under the process's other threads); 0o022 if unreadable.
fn process_umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .unwrap_or(0o022)
}

/// A connection to one Tessera cluster, by path. Cheap to clone; every clone shares
/// the connection.
#[derive(Clone)]
pub struct Tessera {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Tessera {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tessera")
            .field("meta_addr", &self.shared.client.config().meta_addr)
            .finish()
    }
}

impl Tessera {
    /// Connects to the first of `meta_addrs` (`host:port`) that answers. One metadata
    /// server serves a cluster today: the others are tried only when connecting.
    pub fn connect<S: AsRef<str>>(meta_addrs: &[S], options: Options) -> Result<Tessera> {
        if meta_addrs.is_empty() {
            return Err(ClientError::Config(
                "no metadata server address given".into(),
            ));
        }
        if !(1..=256).contains(&options.threads) || !(1..=1024).contains(&options.parallel) {
            return Err(ClientError::Config(
                "threads must be between 1 and 256 and parallel between 1 and 1024".into(),
            ));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.threads)
            .thread_name("tessera-api")
            .enable_all()
            .build()
            .map_err(|e| ClientError::Config(format!("starting the runtime: {e}")))?;
        let connected = rt.block_on(async {
            let mut last = None;
            for addr in meta_addrs {
                let mut config = options.config.clone();
                config.meta_addr = addr.as_ref().to_string();
                match Client::connect(config).await {
                    Ok(c) => return Ok(c),
                    Err(e @ ClientError::Transport(_)) => last = Some(e),
                    Err(e) => return Err(e),
                }
            }
            Err(last.expect("at least one address was tried"))
        });
        let client = connected?;
        let entry_ttl = Duration::from_millis(client.config().entry_ttl_ms);
        Ok(Tessera {
            shared: Arc::new(Shared {
                handle: rt.handle().clone(),
                rt: Some(rt),
                client,
                paths: Resolver::new(entry_ttl),
                parallel: options.parallel,
                umask: process_umask(),
            }),
        })
    }

    /// The async client underneath, for use inside async code.
    pub fn client(&self) -> &Arc<Client> {
        &self.shared.client
    }

    fn sh(&self) -> &Shared {
        &self.shared
    }

    /// Opens a file as `how` says.
    pub fn open(&self, path: &str, how: &OpenOptions) -> Result<File> {
        let sh = self.shared.clone();
        let path = path.to_string();
        let how = how.clone();
        self.sh()
            .block_on(async move { file::open(sh, &path, &how).await })
    }

    /// The attributes of what `path` names, following symbolic links.
    pub fn metadata(&self, path: &str) -> Result<Metadata> {
        let sh = self.sh();
        sh.block_on(sh.paths.resolve(&sh.client, path, true))
            .map(|a| Metadata::from(&a))
    }

    /// The attributes of what `path` names, not following a symbolic link at its end.
    pub fn symlink_metadata(&self, path: &str) -> Result<Metadata> {
        let sh = self.sh();
        sh.block_on(sh.paths.resolve(&sh.client, path, false))
            .map(|a| Metadata::from(&a))
    }

    /// The names in a directory, without "." and "..", in the server's order.
    pub fn read_dir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let sh = self.sh();
        sh.block_on(async {
            let dir = sh.paths.resolve(&sh.client, path, true).await?;
            if dir.kind != FileKind::Directory {
                return Err(not_a_directory(path));
            }
            let all = sh.client.readdir_all(dir.ino).await?;
            sh.client.accessed(dir.ino).await;
            Ok(all
                .into_iter()
                .filter(|e| e.name != b"." && e.name != b"..")
                .map(|e| DirEntry {
                    name: String::from_utf8_lossy(&e.name).into_owned(),
                    ino: e.ino.0,
                    kind: e.kind.into(),
                })
                .collect())
        })
    }

    /// Creates a directory with `mode` (less the umask).
    pub fn create_dir(&self, path: &str, mode: u32) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let (parent, name) = sh.paths.parent(&sh.client, path).await?;
            let caller = caller();
            sh.client
                .mkdir(parent, name.as_bytes(), sh.mode(mode), caller)
                .await
                .map(drop)
        })
    }

    /// Creates a directory and every missing one above it; a directory that exists
    /// already is fine, anything else under one of the names fails.
    pub fn create_dir_all(&self, path: &str, mode: u32) -> Result<()> {
        let names = path::components(path)?;
        for end in 1..=names.len() {
            let at = path::canonical(&names[..end]);
            match self.create_dir(&at, mode) {
                Ok(()) => {}
                Err(e) if e.errno() == libc::EEXIST => {
                    if !self.metadata(&at)?.is_dir() {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Removes a name of a file (not of a directory).
    pub fn remove_file(&self, path: &str) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let (parent, name) = sh.paths.parent(&sh.client, path).await?;
            sh.client.unlink(parent, name.as_bytes()).await
        })
    }

    /// Removes an empty directory.
    pub fn remove_dir(&self, path: &str) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let (parent, name) = sh.paths.parent(&sh.client, path).await?;
            sh.paths.forget();
            sh.client.rmdir(parent, name.as_bytes()).await
        })
    }

    /// Renames `from` to `to` atomically, replacing what `to` named (a file, or an
    /// empty directory when `from` is one).
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let (p1, n1) = sh.paths.parent(&sh.client, from).await?;
            let (p2, n2) = sh.paths.parent(&sh.client, to).await?;
            sh.paths.forget();
            let (n1, n2) = (n1.as_bytes(), n2.as_bytes());
            sh.client.rename(p1, n1, p2, n2, RenameMode::Replace).await
        })
    }

    /// Makes a symbolic link at `path` that points to `target` (a namespace path or one
    /// relative to the link's directory; this API resolves an absolute target from the
    /// namespace root).
    pub fn symlink(&self, target: &str, path: &str) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let (parent, name) = sh.paths.parent(&sh.client, path).await?;
            let (name, target) = (name.as_bytes(), target.as_bytes());
            sh.client
                .symlink(parent, name, target, caller())
                .await
                .map(drop)
        })
    }

    /// The target of the symbolic link at `path`.
    pub fn read_link(&self, path: &str) -> Result<String> {
        let sh = self.sh();
        let target = sh.block_on(async {
            let attr = sh.paths.resolve(&sh.client, path, false).await?;
            if attr.kind != FileKind::Symlink {
                let msg = format!("{path:?} is not a symbolic link");
                return Err(ClientError::Remote(WireError::new(
                    ErrorCode::InvalidArgument,
                    msg,
                )));
            }
            sh.client.readlink(attr.ino).await
        })?;
        String::from_utf8(target)
            .map_err(|_| ClientError::Invalid(format!("{path:?}: the target is not UTF-8")))
    }

    /// The whole file.
    pub fn read(&self, path: &str) -> Result<Vec<u8>> {
        let sh = self.shared.clone();
        let path = path.to_string();
        self.sh().block_on(file::read_whole(sh, path))
    }

    /// Reads into `buf` from `offset` of the file: fewer bytes only at its end.
    pub fn read_into(&self, path: &str, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let file = self.open(path, &OpenOptions::new())?;
        let n = file.read_exact_or_eof(buf, offset)?;
        file.close()?;
        Ok(n)
    }

    /// Reads many whole files at once, at most `Options::parallel` at a time, each on
    /// the runtime's threads: the results are in the order of `paths`.
    pub fn read_many<S: AsRef<str>>(&self, paths: &[S]) -> Vec<Result<Vec<u8>>> {
        let sh = self.shared.clone();
        let paths: Vec<String> = paths.iter().map(|p| p.as_ref().to_string()).collect();
        self.sh().block_on(file::read_many(sh, paths))
    }

    /// Creates or empties the file at `path` (mode 0o666 less the umask) and writes
    /// `data` into it; the close's error, if any, is returned.
    pub fn write(&self, path: &str, data: &[u8]) -> Result<()> {
        let how = OpenOptions {
            read: false,
            write: true,
            create: true,
            truncate: true,
            ..OpenOptions::new()
        };
        let file = self.open(path, &how)?;
        file.write_at(data, 0)?;
        file.close()
    }
}

/// The credentials a call is judged by: this process's.
fn caller() -> Caller {
    crate::client::current_caller()
}

/// `ENOTDIR` for `path`.
fn not_a_directory(path: &str) -> ClientError {
    let msg = format!("{path:?} is not a directory");
    ClientError::Remote(WireError::new(ErrorCode::NotADirectory, msg))
}

/// `EISDIR` for `path`.
fn is_a_directory(path: &str) -> ClientError {
    let msg = format!("{path:?} is a directory");
    ClientError::Remote(WireError::new(ErrorCode::IsADirectory, msg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::InodeId;

    #[test]
    fn metadata_carries_the_type_bits_in_its_mode() {
        let t = proto::Timestamp { secs: 1, nanos: 0 };
        let a = Attr {
            ino: InodeId(9),
            kind: FileKind::Directory,
            perm: 0o4755,
            nlink: 2,
            uid: 1,
            gid: 2,
            rdev: 0,
            size: 0,
            atime: t,
            mtime: t,
            ctime: t,
            xattr_count: 0,
            blocks: 0,
        };
        let m = Metadata::from(&a);
        assert_eq!(m.mode, libc::S_IFDIR | 0o4755);
        assert!(m.is_dir() && !m.is_file());
        assert_eq!(m.ino, 9);
    }

    #[test]
    fn times_before_1970_stay_before_it() {
        let t = system_time(proto::Timestamp {
            secs: -2,
            nanos: 500_000_000,
        });
        assert_eq!(
            UNIX_EPOCH.duration_since(t).unwrap(),
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn settings_are_set_by_name_and_unknown_names_refused() {
        let o = Options::with_settings(&[("io_buffers", "8")]).unwrap();
        assert_eq!(o.config.io_buffers, 8);
        let e = Options::with_settings(&[("no_such_setting", "1")]).unwrap_err();
        assert!(e.to_string().contains("no_such_setting"), "{e}");
        assert!(Options::with_settings(&[("io_buffers", "many")]).is_err());
    }

    #[test]
    fn the_umask_is_read_from_proc() {
        // The test process's umask, set through the call that reads and sets it.
        // SAFETY: umask cannot fail; it is set back at once.
        let real = unsafe {
            let m = libc::umask(0o022);
            libc::umask(m);
            m
        };
        assert_eq!(process_umask(), real);
    }
}
