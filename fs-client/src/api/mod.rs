//! The library API: one cluster's namespace by path, with blocking calls, for programs
//! that read and write files without a mount (the Python package, data loaders, tools).
//!
//! It is the same [`Client`] a mount runs on, with the same caches, readahead, write
//! buffers and consistency: a file written here is read through a mount after its
//! close, and the other way round. What a mount gets from the kernel, this module does
//! itself: it resolves paths (following symbolic links, keeping the inodes of
//! directories it walked for `entry_ttl_ms`, as the kernel keeps its dentries), and it
//! sends the process's umask with what it creates (the metadata server applies it, or a
//! directory's default ACL in its place, as a local file system does).
//!
//! A [`Tessera`] owns a small tokio runtime; its calls block the calling thread, and
//! many threads may call at once. Inside async code use [`Tessera::client`], the async
//! API (a blocking call there takes its worker out of the runtime for the wait, and
//! fails on a current-thread runtime). It does not survive `fork()`: in a child every
//! call fails with `EBADF` and dropping does nothing (the parent owns the opens); the
//! child connects anew. Paths are the namespace's: an absolute symbolic link target is
//! resolved from the namespace root, where a mount resolves it from the host's root,
//! so links meant for both are best relative.
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

mod attrs;
mod file;
mod path;
mod resolve;
mod types;

pub use attrs::XattrMode;
pub use file::{File, OpenOptions};
pub use path::MAX_PATH_BYTES;
pub use transport::StableBytes;
pub use types::{DirEntry, FileType, Metadata};

use crate::client::{Client, FsStats};
use crate::config::ClientConfig;
use crate::error::{ClientError, Result};
use file::Closer;
use path::refused;
use proto::meta::{Caller, RenameMode};
use proto::{ErrorCode, FileKind, InodeId};
use resolve::Resolver;
use std::sync::Arc;
use std::time::Duration;

/// Files a caller of [`Tessera::open_many`] should hold open at once at most (Python's
/// `read_many` opens this many at a time): each is a session on the metadata server and
/// read grants until it is read.
pub const OPEN_WINDOW: usize = 256;

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
    /// call_timeout_ms`, ...), each read as the type of its default. An unknown name or
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

/// What the handles and the runtime share; dropped after the last of them.
struct Shared {
    /// Kept in an `Option` to be moved out in `Drop`.
    rt: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    client: Arc<Client>,
    paths: Resolver,
    parallel: usize,
    /// The process's umask, read once at connect.
    umask: u32,
    /// The process that connected: in a forked child the runtime's threads are gone.
    pid: u32,
    /// Ends the opens of files dropped without `close`, on a thread of its own.
    closer: Closer,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let rt = self.rt.take();
        if std::process::id() != self.pid {
            // A forked child: the runtime's threads are the parent's; touching what
            // they own could wait forever.
            std::mem::forget(rt);
            return;
        }
        // Closes without a commit are batched for a moment: end them before the
        // connection goes (as an unmount does). On a thread of its own, so that a drop
        // never waits on the network (in Python it would hold the GIL meanwhile); at
        // process exit it may not finish, and the server ends them with the connection.
        let client = self.client.clone();
        let spawned = std::thread::Builder::new()
            .name("tessera-drop".into())
            .spawn(move || {
                if let Some(rt) = rt {
                    rt.block_on(client.send_releases());
                    drop(client);
                    rt.shutdown_background();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread to end the connection on");
        }
    }
}

impl Shared {
    /// Runs `f` on the runtime and waits for it: from a plain thread as is; from a
    /// worker of a multi-thread runtime (async code calling the blocking API) after
    /// handing its other tasks to other workers; from a current-thread runtime, or in
    /// a process forked from the one that connected, it fails.
    fn block_on<T, F: std::future::Future<Output = Result<T>>>(&self, f: F) -> Result<T> {
        self.usable()?;
        match tokio::runtime::Handle::try_current() {
            Err(_) => self.handle.block_on(f),
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.handle.block_on(f))
            }
            Ok(_) => Err(ClientError::BadHandle(
                "a blocking call of the library API from a current-thread runtime: use \
                 Tessera::client(), the async API, there"
                    .into(),
            )),
        }
    }

    /// Fails in a process forked from the one that connected.
    fn usable(&self) -> Result<()> {
        if std::process::id() != self.pid {
            return Err(ClientError::BadHandle(format!(
                "this connection was made by process {}, and this is {} (a fork): connect \
                 anew in the child",
                self.pid,
                std::process::id()
            )));
        }
        Ok(())
    }

    /// Whom a call that makes an inode is made for: this process, with the umask the
    /// server applies (unless the directory's default ACL replaces it).
    fn creator(&self) -> Caller {
        caller().with_umask(self.umask)
    }

    /// The directory holding `path`'s last name, and the name; the root has none, and
    /// fails with `at_root` (the errno Linux gives for the call).
    async fn parent(&self, path: &str, at_root: ErrorCode) -> Result<(InodeId, String)> {
        let Some((dir, name)) = path::split_last(path)? else {
            return Err(refused(at_root, format!("{path:?} is the root")));
        };
        let ino = self.paths.dir(&self.client, path, &dir).await?;
        Ok((ino, name.to_string()))
    }
}

/// The umask in the text of `/proc/self/status`, if it has one.
fn umask_in(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
}

/// The process's umask, from `/proc/self/status` (calling `umask(2)` to read it would
/// change it for a moment under the process's other threads); 0o022 if unreadable.
fn process_umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    umask_in(&status).unwrap_or(0o022)
}

/// A connection to one Tessera cluster, by path. Cheap to clone; every clone shares
/// the connection.
#[derive(Clone)]
pub struct Tessera {
    shared: Arc<Shared>,
}

impl Drop for Tessera {
    fn drop(&mut self) {
        if self.shared.usable().is_err() {
            // A forked child: see `Shared::drop`; nothing it owns is touched here.
            std::mem::forget(self.shared.clone());
        }
    }
}

impl std::fmt::Debug for Tessera {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tessera")
            .field("meta_addr", &self.shared.client.config().meta_addr)
            .finish()
    }
}

impl Tessera {
    /// Connects to the first of `meta_addrs` (`host:port`) that answers, and moves on to
    /// the next when it stops answering (a standby metadata server on the same etcd;
    /// see `ClientConfig::meta_addr`).
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
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(ClientError::Config(
                "Tessera::connect blocks: call it outside async code (or use Client::connect)"
                    .into(),
            ));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.threads)
            .thread_name("tessera-api")
            .enable_all()
            .build()
            .map_err(|e| ClientError::Config(format!("starting the runtime: {e}")))?;
        let mut config = options.config.clone();
        let addrs: Vec<&str> = meta_addrs.iter().map(AsRef::as_ref).collect();
        config.meta_addr = addrs.join(",");
        let connected = rt.block_on(Client::connect(config));
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
                pid: std::process::id(),
                closer: Closer::start()?,
            }),
        })
    }

    /// The async client underneath, for use inside async code. It works while this
    /// `Tessera`, a clone or one of its files lives (they own its runtime).
    pub fn client(&self) -> &Arc<Client> {
        &self.shared.client
    }

    fn sh(&self) -> &Shared {
        &self.shared
    }

    /// Opens a file as `how` says.
    pub fn open(&self, path: &str, how: &OpenOptions) -> Result<File> {
        let sh = self.shared.clone();
        self.sh().block_on(file::open(sh, path, how))
    }

    /// The attributes of what `path` names, following symbolic links.
    pub fn metadata(&self, path: &str) -> Result<Metadata> {
        let sh = self.sh();
        let attr = sh.block_on(sh.paths.resolve(&sh.client, path, true))?;
        if path::wants_dir(path) && attr.kind != FileKind::Directory {
            return Err(not_a_directory(path));
        }
        Ok(Metadata::from(&attr))
    }

    /// The attributes of what `path` names, not following a symbolic link at its end.
    pub fn symlink_metadata(&self, path: &str) -> Result<Metadata> {
        let sh = self.sh();
        let follow = path::wants_dir(path);
        let attr = sh.block_on(sh.paths.resolve(&sh.client, path, follow))?;
        Ok(Metadata::from(&attr))
    }

    /// Whether `path` names something (links followed); errors other than "no such
    /// name" are returned.
    pub fn exists(&self, path: &str) -> Result<bool> {
        match self.metadata(path) {
            Ok(_) => Ok(true),
            Err(e) if e.errno() == libc::ENOENT => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The names in a directory, without "." and "..", in the server's order.
    pub fn read_dir(&self, path: &str) -> Result<Vec<DirEntry>> {
        self.list(path, false)
    }

    /// [`Tessera::read_dir`] with each entry's attributes, in the same calls (for
    /// `scandir` and listings with details: no call per entry).
    pub fn read_dir_plus(&self, path: &str) -> Result<Vec<DirEntry>> {
        self.list(path, true)
    }

    fn list(&self, path: &str, plus: bool) -> Result<Vec<DirEntry>> {
        let sh = self.sh();
        sh.block_on(async {
            let dir = sh.paths.resolve(&sh.client, path, true).await?;
            if dir.kind != FileKind::Directory {
                return Err(not_a_directory(path));
            }
            let all = sh.client.readdir_all_plus(dir.ino, plus).await?;
            sh.client.accessed(dir.ino).await;
            Ok(all
                .into_iter()
                .filter(|e| e.name != b"." && e.name != b"..")
                .map(|e| DirEntry {
                    name: String::from_utf8_lossy(&e.name).into_owned(),
                    ino: e.ino.0,
                    kind: e.kind.into(),
                    metadata: e.attr.as_ref().map(Metadata::from),
                })
                .collect())
        })
    }

    /// Creates a directory with `mode` (less the umask, or as the parent's default ACL
    /// gives).
    pub fn create_dir(&self, path: &str, mode: u32) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let (parent, name) = sh.parent(path, ErrorCode::AlreadyExists).await?;
            let made = sh
                .client
                .mkdir(parent, name.as_bytes(), mode & 0o7777, sh.creator())
                .await;
            made.map(drop)
        })
    }

    /// Creates a directory and every missing one above it; a directory that exists
    /// already is fine, anything else under one of the names fails (`ENOTDIR` above the
    /// last, `EEXIST` for the last), as `mkdir -p` does. Only missing directories are
    /// made, so existing ones need no write permission in their parents.
    pub fn create_dir_all(&self, path: &str, mode: u32) -> Result<()> {
        let names = path::components(path)?;
        for end in 1..=names.len() {
            let at = path::canonical(&names[..end]);
            match self.metadata(&at) {
                Ok(m) if m.is_dir() => continue,
                Ok(_) if end < names.len() => return Err(not_a_directory(&at)),
                Ok(_) => {
                    return Err(refused(
                        ErrorCode::AlreadyExists,
                        format!("{at:?} exists and is not a directory"),
                    ))
                }
                Err(e) if e.errno() == libc::ENOENT => {}
                Err(e) => return Err(e),
            }
            match self.create_dir(&at, mode) {
                Ok(()) => {}
                // Made meanwhile by another client (fine), or a link that leads
                // nowhere (the EEXIST stands); any other failure to look is its own.
                Err(e) if e.errno() == libc::EEXIST => match self.metadata(&at) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => return Err(e),
                    Err(m) if matches!(m.errno(), libc::ENOENT | libc::ELOOP) => return Err(e),
                    Err(m) => return Err(m),
                },
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Removes a name of a file (not of a directory).
    pub fn remove_file(&self, path: &str) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let (parent, name) = sh.parent(path, ErrorCode::IsADirectory).await?;
            if path::wants_dir(path) {
                // "f/" names a directory or nothing: unlink(2) says which.
                let attr = sh.client.lookup(parent, name.as_bytes()).await?;
                return Err(match attr.kind {
                    FileKind::Directory => is_a_directory(path),
                    _ => not_a_directory(path),
                });
            }
            sh.client.unlink(parent, name.as_bytes()).await.map(drop)
        })
    }

    /// Removes an empty directory.
    pub fn remove_dir(&self, path: &str) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let (parent, name) = sh.parent(path, ErrorCode::Busy).await?;
            let key = canonical_of(path)?;
            sh.paths.forget_under(&key);
            let r = sh.client.rmdir(parent, name.as_bytes()).await;
            sh.paths.forget_under(&key);
            r
        })
    }

    /// Renames `from` to `to` atomically, replacing what `to` named (a file, or an
    /// empty directory when `from` is one).
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rename_as(from, to, RenameMode::Replace)
    }

    /// Renames `from` to `to` atomically if nothing is named `to` (`RENAME_NOREPLACE`),
    /// else fails with `EEXIST`.
    pub fn rename_noreplace(&self, from: &str, to: &str) -> Result<()> {
        self.rename_as(from, to, RenameMode::NoReplace)
    }

    fn rename_as(&self, from: &str, to: &str, mode: RenameMode) -> Result<()> {
        if path::ends_in_dot(from) || path::ends_in_dot(to) {
            // "d/." or "d/..", which must not be read as "d": rename(2) walks both
            // paths first (ENOENT, ENOTDIR, ...), then refuses them, EBUSY (EEXIST for
            // such a target of a no-replace rename).
            let sh = self.sh();
            for p in [from, to] {
                if path::ends_in_dot(p) {
                    self.metadata(p)?;
                } else {
                    sh.block_on(sh.parent(p, ErrorCode::Busy))?;
                }
            }
            let code = match mode {
                RenameMode::NoReplace if !path::ends_in_dot(from) => ErrorCode::AlreadyExists,
                _ => ErrorCode::Busy,
            };
            let msg = format!("rename of {from:?} to {to:?}: a path ends in . or ..");
            return Err(refused(code, msg));
        }
        let sh = self.sh();
        sh.block_on(async {
            let (p1, n1) = sh.parent(from, ErrorCode::Busy).await?;
            let (p2, n2) = sh.parent(to, ErrorCode::Busy).await?;
            if path::wants_dir(from) || path::wants_dir(to) {
                // "f/" names a directory: rename(2) of anything else so is ENOTDIR.
                let attr = sh.client.lookup(p1, n1.as_bytes()).await?;
                if attr.kind != FileKind::Directory {
                    return Err(not_a_directory(from));
                }
            }
            let (k1, k2) = (canonical_of(from)?, canonical_of(to)?);
            let forget = || {
                sh.paths.forget_under(&k1);
                sh.paths.forget_under(&k2);
            };
            forget();
            let (n1, n2) = (n1.as_bytes(), n2.as_bytes());
            let r = sh.client.rename(p1, n1, p2, n2, mode).await;
            forget();
            r
        })
    }

    /// Makes a symbolic link at `path` that points to `target` (see the module's note
    /// on absolute targets).
    pub fn symlink(&self, target: &str, path: &str) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let (parent, name) = sh.parent(path, ErrorCode::AlreadyExists).await?;
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
        sh.block_on(async {
            let attr = sh.paths.resolve(&sh.client, path, false).await?;
            if attr.kind != FileKind::Symlink {
                let msg = format!("{path:?} is not a symbolic link");
                return Err(refused(ErrorCode::InvalidArgument, msg));
            }
            resolve::link_target(&sh.client, attr.ino, path).await
        })
    }

    /// Adds the name `link` for the file at `path` (a hard link).
    pub fn hard_link(&self, path: &str, link: &str) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let attr = sh.paths.resolve(&sh.client, path, false).await?;
            let (parent, name) = sh.parent(link, ErrorCode::AlreadyExists).await?;
            sh.client
                .link(attr.ino, parent, name.as_bytes(), false)
                .await
                .map(drop)
        })
    }

    /// The file system's totals (`statvfs`).
    pub fn statfs(&self) -> Result<FsStats> {
        let sh = self.sh();
        sh.block_on(sh.client.statfs())
    }

    /// Sends every open file's buffered writes and commits them, and ends the closes
    /// waiting to be batched: what a program calls before it exits (Python's `atexit`),
    /// since files it did not close are otherwise closed by nobody. Handles stay open.
    pub fn flush_all(&self) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let mut first_error = None;
            for st in sh.client.open_files() {
                if let Err(e) = sh.client.commit_pending(&st).await {
                    first_error.get_or_insert(e);
                }
            }
            sh.client.send_releases().await;
            first_error.map_or(Ok(()), Err)
        })
    }

    /// The whole file.
    pub fn read(&self, path: &str) -> Result<Vec<u8>> {
        let sh = self.shared.clone();
        self.sh().block_on(file::read_whole(sh, path.to_string()))
    }

    /// Reads into `buf` from `offset` of the file: fewer bytes only at its end.
    pub fn read_into(&self, path: &str, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let sh = self.shared.clone();
        let how = OpenOptions::new();
        let file = self.sh().block_on(file::open_for(sh, path, &how, true))?;
        let read = file.read_at(buf, offset);
        let closed = file.close();
        let n = read?;
        closed?;
        Ok(n)
    }

    /// Reads many whole files at once, at most `Options::parallel` at a time, each on
    /// the runtime's threads: the results are in the order of `paths`, and all of them
    /// are held until the last is read (pass batches to bound the memory).
    pub fn read_many<S: AsRef<str>>(&self, paths: &[S]) -> Vec<Result<Vec<u8>>> {
        let sh = self.shared.clone();
        let paths: Vec<String> = paths.iter().map(|p| p.as_ref().to_string()).collect();
        let n = paths.len();
        let all = self
            .sh()
            .block_on(async { Ok(file::read_many(sh, paths).await) });
        all.unwrap_or_else(|e: ClientError| fail_each(n, &e))
    }

    /// Opens many files to be read whole ([`Tessera::read_whole_into`]), at most
    /// `Options::parallel` at once: each result is in the place of its path. With the
    /// lengths the opens saw, a caller makes the buffers itself, on its own thread,
    /// between the two calls: Python's bindings make `bytes` objects, under the GIL
    /// taken once for all of them. Each file stays open (a session on the metadata
    /// server, read grants) until it is read or dropped: pass windows of a few hundred
    /// ([`OPEN_WINDOW`]).
    ///
    /// ```no_run
    /// # fn demo(fs: &fs_client::api::Tessera) {
    /// let opened = fs.open_many(&["/data/a.bin", "/data/b.bin"]);
    /// let jobs: Vec<_> = opened
    ///     .into_iter()
    ///     .map(|r| r.expect("open"))
    ///     .map(|f| { let n = f.len() as usize; (f, vec![0u8; n]) })
    ///     .collect();
    /// for r in fs.read_whole_into(jobs) {
    ///     let (buf, n) = r.expect("read");
    ///     println!("{} bytes", buf[..n].len());
    /// }
    /// # }
    /// ```
    pub fn open_many<S: AsRef<str>>(&self, paths: &[S]) -> Vec<Result<File>> {
        let sh = self.shared.clone();
        let paths: Vec<String> = paths.iter().map(|p| p.as_ref().to_string()).collect();
        let n = paths.len();
        let all = self
            .sh()
            .block_on(async { Ok(file::open_many(sh, paths).await) });
        all.unwrap_or_else(|e: ClientError| fail_each(n, &e))
    }

    /// Reads each file from its start into its buffer (as much as fits) and closes it,
    /// at most `Options::parallel` at once, each on the runtime's threads: the buffer
    /// and the bytes read (fewer than its length only if the file shrank), in the order
    /// given. One copy from the transfer into the caller's buffer. A buffer's first
    /// borrow (`as_mut`) is on a blocking thread for a file of 1 MiB or more. A file of
    /// another `Tessera`, or one not open for reading, fails with `EBADF`.
    pub fn read_whole_into<B>(&self, files: Vec<(File, B)>) -> Vec<Result<(B, usize)>>
    where
        B: AsMut<[u8]> + Send + 'static,
    {
        let sh = self.shared.clone();
        let n = files.len();
        let all = self
            .sh()
            .block_on(async { Ok(file::read_whole_into(sh, files).await) });
        all.unwrap_or_else(|e: ClientError| fail_each(n, &e))
    }

    /// [`Tessera::read_whole_into`] with no copy: each buffer is lent to the transport
    /// ([`transport::Endpoint::lend`]) while its file is read, and the data servers
    /// write the file's bytes straight into it (over `tcp` the socket's bytes land in
    /// it; over `rdma` the NIC writes it). A file this client has written and not yet
    /// sent is read with one copy, as `read_whole_into` reads it.
    pub fn read_whole_lent<B: StableBytes>(
        &self,
        files: Vec<(File, B)>,
    ) -> Vec<Result<(B, usize)>> {
        let sh = self.shared.clone();
        let n = files.len();
        let all = self
            .sh()
            .block_on(async { Ok(file::read_whole_lent(sh, files).await) });
        all.unwrap_or_else(|e: ClientError| fail_each(n, &e))
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
        let wrote = file.write_at(data, 0);
        let closed = file.close();
        wrote?;
        closed
    }
}

/// `n` results that each fail as `e` says: a batch not run at all (a fork, a
/// current-thread runtime).
fn fail_each<T>(n: usize, e: &ClientError) -> Vec<Result<T>> {
    let msg = e.to_string();
    (0..n)
        .map(|_| Err(ClientError::BadHandle(msg.clone())))
        .collect()
}

/// The credentials a call is judged by: this process's.
fn caller() -> Caller {
    crate::client::current_caller()
}

/// `path` in canonical form, the key of kept directories.
fn canonical_of(path: &str) -> Result<String> {
    Ok(path::canonical(&path::components(path)?))
}

/// `ENOTDIR` for `path`.
fn not_a_directory(path: &str) -> ClientError {
    refused(
        ErrorCode::NotADirectory,
        format!("{path:?} is not a directory"),
    )
}

/// `EISDIR` for `path`.
fn is_a_directory(path: &str) -> ClientError {
    refused(ErrorCode::IsADirectory, format!("{path:?} is a directory"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_set_by_name_and_unknown_names_refused() {
        let o = Options::with_settings(&[("io_buffers", "8")]).unwrap();
        assert_eq!(o.config.io_buffers, 8);
        let e = Options::with_settings(&[("no_such_setting", "1")]).unwrap_err();
        assert!(e.to_string().contains("no_such_setting"), "{e}");
        assert!(Options::with_settings(&[("io_buffers", "many")]).is_err());
    }

    #[test]
    fn the_umask_is_read_from_procs_status_text() {
        let status = "Name:\tx\nUmask:\t0027\nState:\tR (running)\n";
        assert_eq!(umask_in(status), Some(0o027));
        assert_eq!(umask_in("Name:\tx\n"), None);
    }
}
