//! The FUSE mount: kernel requests in, `Client` calls out.
//!
//! Each callback hands its work, with the reply object, to the tokio runtime and returns
//! at once, so no event loop ever waits on the network: the work is polled once on the
//! event loop (up to its first wait: a server call is sent from there) and spawned as a
//! task if it must wait (`TesseraFs::spawn`). Several event loops read `/dev/fuse`
//! (`fuse_threads`).

mod attr;
mod callers;
mod dir;
mod errno;
mod flags;
mod io;
mod ops;
mod releases;
mod replies;
mod shown;

#[cfg(test)]
pub(crate) use replies::dot_attr;

pub use errno::{errno, errno_of};

use crate::client::Client;
use crate::error::ClientError;
use crate::file::FileHandle;
use dir::DirHandle;
use parking_lot::Mutex;
use proto::{InodeId, Timestamp};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tracing::{info, warn};

/// Attributes last shown to the kernel per inode, to decide at open whether its page
/// cache is still valid; bounded, forgotten wholesale when full.
const MAX_SEEN: usize = 262_144;

/// Attributes last shown to the kernel per directory, to answer `fstat` on an open
/// directory once it is removed; bounded, forgotten wholesale when full (an open handle
/// keeps its own copy).
const MAX_DIRS_SEEN: usize = 65_536;

/// Files open here whose last name this mount removed, remembered until their last
/// close so that a reopen of one through `/proc/self/fd` is told from an open through a
/// name another mount removed; bounded, forgotten wholesale when full (such a reopen of
/// a file then fails with ESTALE).
const MAX_UNLINKED: usize = 65_536;

/// The mounted file system.
pub struct TesseraFs {
    inner: Arc<Inner>,
    rt: tokio::runtime::Handle,
    /// fuser's handle on the mount, taken when the session ends (see `forget_mount`).
    unmounter: Arc<Mutex<Option<fuser::SessionUnmounter>>>,
    /// The groups of recent callers (see `callers`).
    callers: callers::Callers,
}

struct Inner {
    client: Arc<Client>,
    attr_ttl: Duration,
    entry_ttl: Duration,
    blksize: u32,
    files: Mutex<HashMap<u64, OpenFile>>,
    dirs: Mutex<HashMap<u64, OpenDir>>,
    /// See [`MAX_DIRS_SEEN`].
    dirs_seen: Mutex<HashMap<InodeId, proto::Attr>>,
    /// The names shown to the kernel and what they led to (see `shown`).
    shown: shown::Shown,
    next_fh: AtomicU64,
    /// (mtime, size) of each file when it was last opened or looked at.
    seen: Mutex<HashMap<InodeId, (Timestamp, u64)>>,
    /// Files on which this mount ever took a lock: only their closes need to tell the
    /// metadata server to drop locks (every other close skips that round trip).
    locked: Mutex<HashSet<InodeId>>,
    /// Files whose last name this mount removed (see [`Inner::unlinked_here`]).
    unlinked: Mutex<HashSet<InodeId>>,
    /// Per open file handle, the lock owners that took locks through it and have not
    /// flushed it since. A process's POSIX locks go at its flush (every close flushes
    /// with the process as owner); what is left at release are OFD locks
    /// (`F_OFD_SETLK`), whose owner is the open file itself and which the kernel never
    /// asks to drop: without this they would outlive their last close until the
    /// mount's connection ends.
    lock_owners: Mutex<HashMap<u64, HashSet<u64>>>,
    /// Releases of locks at a last close still on their way to the metadata server.
    releases: Arc<releases::Releases>,
    /// Sends cache invalidations to the kernel; set once the session exists.
    notifier: OnceLock<fuser::Notifier>,
    /// The kernel took `FUSE_WRITEBACK_CACHE` at init: it owns the length of the files
    /// this mount writes and holds their written bytes in its page cache for a while.
    writeback: AtomicBool,
}

/// An open file handle of the mount.
struct OpenFile {
    file: Arc<FileHandle>,
    /// Opened with `FOPEN_DIRECT_IO`: the kernel holds no page locked while its writes
    /// wait for us, so a write through it may wait for a page invalidation (through any
    /// other handle, the kernel may hold the very pages).
    direct_io: bool,
}

/// An open directory handle of the mount.
struct OpenDir {
    handle: Arc<tokio::sync::Mutex<DirHandle>>,
    ino: InodeId,
    /// The directory's attributes as the kernel last saw them when it was opened, if
    /// this mount showed them: a removed directory has no inode left on the metadata
    /// server, and `fstat` through the handle answers from these (with no link), as it
    /// does for a file unlinked while open.
    attr: Option<proto::Attr>,
}

/// What an open found compared with what this mount saw of the file before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Freshness {
    /// Never seen (or forgotten): nothing cached can be trusted or needs dropping.
    New,
    /// Same mtime and size: the kernel's cached pages are still the file's bytes.
    Same,
    /// Changed elsewhere: drop the cached pages and the cached attributes.
    Changed,
}

impl TesseraFs {
    /// A file system over `client`, running its work on `rt`.
    pub fn new(client: Arc<Client>, rt: tokio::runtime::Handle) -> TesseraFs {
        let c = client.config();
        let defer_removes = client.may_defer_removes();
        let inner = Inner {
            attr_ttl: Duration::from_millis(c.attr_ttl_ms),
            entry_ttl: Duration::from_millis(c.entry_ttl_ms),
            blksize: c.io_buffer_bytes as u32,
            client,
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            dirs_seen: Mutex::new(HashMap::new()),
            shown: shown::Shown::new(defer_removes),
            next_fh: AtomicU64::new(1),
            seen: Mutex::new(HashMap::new()),
            notifier: OnceLock::new(),
            locked: Mutex::new(HashSet::new()),
            unlinked: Mutex::new(HashSet::new()),
            lock_owners: Mutex::new(HashMap::new()),
            releases: Arc::default(),
            writeback: AtomicBool::new(false),
        };
        TesseraFs {
            inner: Arc::new(inner),
            rt,
            unmounter: Arc::default(),
            callers: callers::Callers::default(),
        }
    }

    /// Runs `f`, the work of kernel request `req`, in the runtime: every metadata
    /// call it makes is made for `req`'s caller.
    ///
    /// It is polled once here first, on the FUSE thread that read the request
    /// ([`crate::eager`]): its first server call leaves at once, and work that needs no
    /// wait is answered with no task at all. A panic in that first poll is caught: the
    /// request's reply, dropped with the future, answers it with an I/O error.
    fn spawn(&self, req: &fuser::Request, f: impl Future<Output = ()> + Send + 'static) {
        let (who, unique) = (self.callers.of(req), req.unique().0);
        if !crate::eager::spawn(&self.rt, crate::client::acting_as(who, f)) {
            warn!(
                unique,
                "a request's work panicked: answered with an I/O error if not answered yet"
            );
        }
    }
}

impl Inner {
    fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// Records an open file handle; returns its number.
    fn add_file(&self, file: FileHandle, direct_io: bool) -> u64 {
        let n = self.new_fh();
        let file = Arc::new(file);
        self.files.lock().insert(n, OpenFile { file, direct_io });
        n
    }

    /// Whether a handle of this mount has `ino` open (not yet released).
    fn has_open(&self, ino: InodeId) -> bool {
        self.client.open_file(ino).is_some()
    }

    /// A handle of `ino` was released, or a link gave it a name: once no handle of
    /// this mount has it open (or it has a name again), it leaves the files whose last
    /// name this mount removed.
    fn linked_or_closed(&self, ino: InodeId, linked: bool) {
        if linked || !self.has_open(ino) {
            self.unlinked.lock().remove(&ino);
        }
    }

    /// This mount removed the last name of `ino` while holding it open (or made it
    /// without one, `O_TMPFILE`): its kernel reaches it only through a descriptor until
    /// the last handle goes.
    fn unlinked_here(&self, ino: InodeId) {
        let mut set = self.unlinked.lock();
        if set.len() >= MAX_UNLINKED {
            set.clear();
        }
        set.insert(ino);
    }

    /// Whether [`Inner::unlinked_here`] noted `ino`.
    fn was_unlinked_here(&self, ino: InodeId) -> bool {
        self.unlinked.lock().contains(&ino)
    }

    fn file(&self, fh: u64) -> Result<Arc<FileHandle>, ClientError> {
        self.files
            .lock()
            .get(&fh)
            .map(|o| o.file.clone())
            .ok_or_else(|| ClientError::Invalid(format!("unknown file handle {fh}")))
    }

    /// Whether opens with these flags get `FOPEN_DIRECT_IO`. Without the writeback
    /// cache, O_APPEND and O_DIRECT handles stay out of the page cache: an append goes
    /// where the metadata server says the end is. With it, the kernel's page cache may
    /// hold written bytes we have not seen, and its length is the file's: it must see
    /// every read and write, so that an O_DIRECT read writes those bytes back first
    /// and an append lands at the end it knows (as on a local file system).
    fn direct_open(&self, flags: i32) -> bool {
        !self.writeback_on() && flags & (libc::O_DIRECT | libc::O_APPEND) != 0
    }

    /// Whether a write with these open flags appends where the metadata server says the
    /// end is (not with the writeback cache: the kernel chose the offset; see
    /// [`Inner::direct_open`]).
    fn server_append(&self, flags: i32) -> bool {
        !self.writeback_on() && flags & libc::O_APPEND != 0
    }

    /// See [`Inner::writeback`].
    fn writeback_on(&self) -> bool {
        self.writeback.load(Ordering::Relaxed)
    }

    /// Records that the kernel took the writeback cache (at init).
    fn set_writeback(&self) {
        self.writeback.store(true, Ordering::Relaxed);
    }

    /// Whether handle `fh` was opened with `FOPEN_DIRECT_IO`.
    fn direct_io(&self, fh: u64) -> bool {
        self.files.lock().get(&fh).is_some_and(|o| o.direct_io)
    }

    /// Forgets `owner` among the lock owners of handle `fh`: it flushed, so its POSIX
    /// locks are being dropped and the release has nothing more to drop for it.
    fn forget_lock_owner(&self, fh: u64, owner: u64) {
        if let Some(owners) = self.lock_owners.lock().get_mut(&fh) {
            owners.remove(&owner);
        }
    }

    /// Drops the locks of a kernel lock owner on `ino`, if this mount ever locked it.
    async fn unlock_owner(&self, ino: InodeId, owner: u64) -> Result<(), ClientError> {
        if !self.locked.lock().contains(&ino) {
            return Ok(());
        }
        self.client.release_locks(ino, owner).await
    }

    /// Hands a block read around a small random read to the kernel's page cache, if no
    /// writable open or truncation of the file came in between (`file/around.rs`).
    ///
    /// The store may wait for a page that a read in flight holds locked, so it runs on a
    /// blocking thread with its own copy of the block.
    fn store_around(self: &Arc<Self>, fh: &Arc<FileHandle>, start: u64, block: &[u8], stamp: u64) {
        if self.notifier.get().is_none() {
            return;
        }
        let (inner, fh, block) = (self.clone(), fh.clone(), block.to_vec());
        drop(tokio::task::spawn_blocking(move || {
            let Some(n) = inner.notifier.get() else {
                return;
            };
            fh.state.gate.store_if_unchanged(stamp, || {
                if let Err(e) = n.store(fuser::INodeNo(fh.ino().0), start, &block) {
                    tracing::debug!(error = %e, "page cache store refused");
                }
            });
        }));
    }

    /// Attributes from the metadata server for a file: the kernel (told
    /// `FUSE_EXPLICIT_INVAL_DATA`) keeps its cached pages when the mtime or length
    /// moves, so that this mount's own writes do not throw away what it just wrote
    /// (`FUSE_AUTO_INVAL_DATA` dropped the whole cache at the first `getattr` after a
    /// write). A change seen here of a file this mount opened before drops the pages,
    /// before the reply, unless a handle of this mount has the file open for writing
    /// (writers on two mounts at once get no coherence, as on NFS). This mount's own
    /// changes go through [`Inner::note_own`] instead.
    async fn revalidate(self: &Arc<Self>, attr: &proto::Attr) {
        if self.note_seen_unless_writing(attr) == Freshness::Changed {
            self.changed(attr).await;
        }
    }

    /// [`Inner::note_seen`], but for a file a handle of this mount writes: its pages stay
    /// (see [`Inner::changed`]), so what it records stays what they were read under (and
    /// this mount's own commits), for the next lock's check ([`Inner::fresh_under_lock`]).
    fn note_seen_unless_writing(&self, attr: &proto::Attr) -> Freshness {
        let writing = self.client.open_file(attr.ino);
        if writing.is_some_and(|s| s.gate.has_writers()) {
            return Freshness::Same;
        }
        self.note_seen(attr, false)
    }

    /// After a lock on `ino` is granted: what another mount wrote under its own lock and
    /// published before releasing it must be read here (SQLite, and any program that
    /// reads a shared file after locking it, relies on that; NFS looks at the file at
    /// every lock for it). The file's attributes are asked for afresh; if its mtime or
    /// length moved since this mount last saw them, its cached pages and segments go,
    /// even while a handle here has it open for writing (which [`Inner::changed`]
    /// spares: without a lock, writers on two mounts get no coherence). A page written
    /// here is never dirty in the kernel without the writeback cache, and with it the
    /// kernel writes such pages back before dropping them.
    async fn fresh_under_lock(self: &Arc<Self>, ino: InodeId) {
        let since = self.client.attr_epoch();
        let Ok(attr) = self.client.getattr_asked(ino).await else {
            return;
        };
        if self.note_seen(&attr, false) != Freshness::Changed {
            return;
        }
        // The kernel's next `getattr` gets these (with this mount's own unsent writes
        // over them), not a copy kept from this mount's last commit.
        self.client
            .keep_attr(self.client.overlay(attr.clone()), since);
        self.drop_changed(&attr).await;
    }

    /// What [`Inner::revalidate`] does for a file whose mtime or length moved.
    async fn changed(self: &Arc<Self>, attr: &proto::Attr) {
        let state = self.client.open_file(attr.ino);
        if state.is_some_and(|s| s.gate.has_writers()) {
            return;
        }
        self.drop_changed(attr).await;
    }

    /// Drops what this mount caches of a file another mount changed (to `attr`): the
    /// client's segments, as at an open that finds a change, and the kernel's pages.
    async fn drop_changed(self: &Arc<Self>, attr: &proto::Attr) {
        if let Some(s) = self.client.open_file(attr.ino) {
            s.opened(attr);
        }
        self.drop_pages(attr.ino, 0, 0).await;
    }

    /// Attributes after this mount's own change (a commit, a new mtime or length):
    /// recorded, nothing to drop.
    fn note_own(&self, attr: &proto::Attr) {
        self.note_seen(attr, false);
    }

    /// After a flush or fsync of `file`: the length and mtime its commit brought are this
    /// mount's own change. Without this the next open of the file found them new (the
    /// kernel need not ask for attributes between a close and an open) and dropped the
    /// pages the writes had just filled: a file read back after it was written, as
    /// `git`, compilers and checkpoint checks do, came from the data servers again.
    fn flushed(&self, file: &FileHandle, r: crate::error::Result<()>) -> crate::error::Result<()> {
        if let Some(attr) = file.take_committed_attr() {
            self.note_own(&attr);
        }
        r
    }

    /// Records `attr`'s mtime and length as what this mount last saw of the file, and
    /// compares them with the previous ones. Without `insert`, a file not seen before
    /// (never opened through this mount, or forgotten) stays unrecorded: `New`.
    fn note_seen(&self, attr: &proto::Attr, insert: bool) -> Freshness {
        let now = (attr.mtime, attr.size);
        let mut seen = self.seen.lock();
        let before = match seen.get_mut(&attr.ino) {
            Some(b) => std::mem::replace(b, now),
            None if insert => {
                if seen.len() >= MAX_SEEN {
                    seen.clear();
                }
                seen.insert(attr.ino, now);
                return Freshness::New;
            }
            None => return Freshness::New,
        };
        if before == now {
            Freshness::Same
        } else {
            Freshness::Changed
        }
    }

    /// Drops the kernel's cached pages of `ino` from `offset`, `len` bytes (0: to the
    /// end), and its cached attributes; returns once the kernel has. On a blocking
    /// thread: the kernel may wait for a page that a read in flight holds locked, and
    /// that read needs the async workers. Never awaited while the kernel may hold a page
    /// of the file locked for the request being answered (see `drop_pages_later`).
    async fn drop_pages(self: &Arc<Self>, ino: InodeId, offset: u64, len: u64) {
        if let Some(done) = self.start_dropping(ino, offset, len) {
            let _ = done.await;
        }
    }

    /// `drop_pages` without waiting: for a write through a handle whose writes go
    /// through the page cache (`fuse_perform_write` holds the written pages locked
    /// until we answer, so waiting here would wait for ourselves).
    fn drop_pages_later(self: &Arc<Self>, ino: InodeId, offset: u64, len: u64) {
        drop(self.start_dropping(ino, offset, len));
    }

    fn start_dropping(
        self: &Arc<Self>,
        ino: InodeId,
        offset: u64,
        len: u64,
    ) -> Option<tokio::task::JoinHandle<()>> {
        self.notifier.get()?;
        let inner = self.clone();
        let (offset, len) = (
            offset.min(i64::MAX as u64) as i64,
            len.min(i64::MAX as u64) as i64,
        );
        Some(tokio::task::spawn_blocking(move || {
            if let Some(n) = inner.notifier.get() {
                if let Err(e) = n.inval_inode(fuser::INodeNo(ino.0), offset, len) {
                    tracing::debug!(error = %e, "page invalidation refused");
                }
            }
        }))
    }

    /// Close-to-open: compares `attr` with what this mount saw of the file before. The
    /// kernel keeps its cached pages only for `Same`. Otherwise its cached attributes
    /// (the length above all) go too, so that `fstat` and reads see the file as the
    /// open found it: for `Changed`, and also for `New`, since a `stat` or lookup may
    /// have left attributes in the kernel from before another mount changed the file.
    /// The kernel's next `getattr` then takes these from the kept copy, without a round
    /// trip, and no copy kept from an earlier commit of this mount is handed out.
    /// `since`: `Client::attr_epoch` before the open was sent; `None` when the open's
    /// own truncation kept the copy already (its `setattr` moved the epoch since).
    fn freshness(&self, attr: &proto::Attr, since: Option<u64>) -> Freshness {
        let f = self.note_seen(attr, true);
        if f != Freshness::Same {
            if let Some(since) = since {
                self.client.keep_attr(attr.clone(), since);
            }
            if let Some(n) = self.notifier.get() {
                // Offset -1: attributes only; the pages go because KEEP_CACHE is unset.
                if let Err(e) = n.inval_inode(fuser::INodeNo(attr.ino.0), -1, 0) {
                    tracing::debug!(error = %e, "attribute invalidation refused");
                }
            }
        }
        f
    }

    /// Records the attributes of a directory shown to the kernel (see [`OpenDir::attr`]).
    fn note_dir(&self, attr: &proto::Attr) {
        if attr.kind != proto::FileKind::Directory || attr.nlink == 0 {
            return;
        }
        let mut seen = self.dirs_seen.lock();
        if seen.len() >= MAX_DIRS_SEEN && !seen.contains_key(&attr.ino) {
            seen.clear();
        }
        seen.insert(attr.ino, attr.clone());
    }

    /// Opens a handle on directory `ino`; returns its number.
    fn open_dir(&self, ino: InodeId) -> u64 {
        let n = self.new_fh();
        let handle = Arc::new(tokio::sync::Mutex::new(DirHandle::new(ino, ino)));
        let attr = self.dirs_seen.lock().get(&ino).cloned();
        self.dirs.lock().insert(n, OpenDir { handle, ino, attr });
        n
    }

    /// The attributes of directory `ino`, removed on the metadata server, if this mount
    /// has it open: what the kernel last saw, with no link left.
    fn removed_dir_attr(&self, ino: InodeId) -> Option<proto::Attr> {
        let dirs = self.dirs.lock();
        let held: Vec<&OpenDir> = dirs.values().filter(|d| d.ino == ino).collect();
        if held.is_empty() {
            return None;
        }
        // The latest seen (a chmod after the open), else the handle's own copy.
        let seen = self.dirs_seen.lock().get(&ino).cloned();
        let mut a = seen.or_else(|| held.iter().find_map(|d| d.attr.clone()))?;
        a.nlink = 0;
        Some(a)
    }

    /// Records a file this mount just created (or opened in a create that found it):
    /// the kernel's attributes come from this reply, nothing older to drop.
    fn note_created(&self, attr: &proto::Attr) {
        self.note_seen(attr, true);
    }
}

/// The extended attribute of the mount's root that reads as this mount's call counts
/// (`getfattr -n tessera.stats MOUNT`): answered by the mount, never stored; setting or
/// removing it is refused. Not listed by `listxattr`, so `cp -a` and `tar` do not copy it.
pub const STATS_XATTR: &[u8] = b"tessera.stats";

/// Whether a request for xattr `name` of `ino` is for [`STATS_XATTR`].
pub(super) fn is_stats_xattr(ino: InodeId, name: &[u8]) -> bool {
    ino == InodeId::ROOT && name == STATS_XATTR
}

impl Inner {
    /// [`STATS_XATTR`]'s value: one `name value` line per counter of
    /// [`crate::RpcCounts`].
    fn stats_text(&self) -> Vec<u8> {
        let c = self.client.rpc_counts();
        format!(
            "meta_calls {}\ndata_calls {}\nretries {}\nrelease_batches {}\nlookups {}\n",
            c.meta_calls, c.data_calls, c.retries, c.release_batches, c.lookups
        )
        .into_bytes()
    }
}

/// Mount options and the event-loop count for `client`'s configuration.
fn session_config(client: &Client) -> fuser::Config {
    use fuser::MountOption as O;
    let c = client.config();
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        O::FSName(c.fsname.clone()),
        O::Subtype("tessera".into()),
        // The kernel checks permission bits against the attributes we return.
        O::DefaultPermissions,
        O::NoAtime,
        if c.dev { O::Dev } else { O::NoDev },
        if c.suid { O::Suid } else { O::NoSuid },
    ];
    if !c.exec {
        config.mount_options.push(O::NoExec);
    }
    // A read-only key or mount: the kernel answers EROFS itself, before asking the
    // server.
    if client.caps().read_only || c.read_only {
        config.mount_options.push(O::RO);
    }
    if c.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(c.fuse_threads);
    config.clone_fd = true;
    config
}

/// Mounts `client` on `mountpoint` and serves it until it is unmounted, or until SIGINT
/// or SIGTERM arrive (then it unmounts cleanly first). `mounted` runs once the mount is
/// in place (a `stat` of it then waits for this process, not for the directory below).
pub fn mount_and_serve(
    client: Arc<Client>,
    mountpoint: &Path,
    rt: &tokio::runtime::Runtime,
    mounted: impl FnOnce(),
) -> std::io::Result<()> {
    // Watched from before the mount exists: a stop that comes as soon as the mount is
    // ready (systemd's, after `mounted` says so) unmounts instead of killing the
    // process under a mount that would then answer ENOTCONN.
    let signals = {
        let _in = rt.enter();
        use tokio::signal::unix::{signal, SignalKind};
        signal(SignalKind::terminate()).and_then(|t| Ok((t, signal(SignalKind::interrupt())?)))
    };
    let config = session_config(&client);
    let fs = TesseraFs::new(client, rt.handle().clone());
    let inner = fs.inner.clone();
    let unmounter = fs.unmounter.clone();
    let mut session = fuser::Session::new(fs, mountpoint, &config)?;
    *unmounter.lock() = Some(session.unmount_callable());
    let _ = inner.notifier.set(session.notifier());
    let ra_bytes = inner.client.config().kernel_readahead_bytes;
    let target = mountpoint.to_path_buf();
    // Stat answers only once the session runs: do it off this thread.
    std::thread::spawn(move || set_readahead(&target, ra_bytes));
    info!(mountpoint = %mountpoint.display(), "mounted");
    mounted();
    let target = mountpoint.to_path_buf();
    rt.spawn(async move {
        let (mut term, mut int) = match signals {
            Ok(s) => s,
            Err(e) => return warn!(error = %e, "cannot watch SIGTERM and SIGINT"),
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        info!("signal received, unmounting");
        if let Err(e) = unmount(&target) {
            warn!(error = %e, "unmount failed");
        }
    });
    let served = session.run();
    // Unlinks answered before the server had them go first, also when the session
    // ended in an error: the server is not to lose one for an unmount. The last closes
    // may still wait to be batched: ended now, their files are not taken for ones this
    // client left open (see `Client::send_releases`).
    rt.block_on(async {
        inner.client.removes_sent().await;
        inner.client.send_releases().await
    });
    served?;
    info!("unmounted");
    Ok(())
}

impl TesseraFs {
    /// Takes fuser's handle on the mount when the session ends. The session ends because
    /// the mount is gone (our SIGTERM handler, `tessera down` or `umount` unmounted it);
    /// fuser would then unmount again when the session is dropped and log "Failed to
    /// umount filesystem: Invalid argument" at every clean unmount (its check for an
    /// unmounted device answers "mounted"). Taken here, that unmount fails quietly with
    /// EINVAL, and one that does unmount (a session ended by an error) still happens.
    pub(crate) fn forget_mount(&mut self) {
        let Some(mut unmounter) = self.unmounter.lock().take() else {
            return;
        };
        match unmounter.unmount() {
            Ok(()) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => {}
            Err(e) => warn!(error = %e, "unmount at the end of the session failed"),
        }
    }
}

/// Sets the kernel's readahead window of the mount (root only; best effort). The default
/// window is smaller than one request, so sequential reads would arrive in pieces smaller
/// than the 1 MiB the session allows; a window of several requests keeps several in
/// flight, which the client serves in parallel.
fn set_readahead(mountpoint: &Path, bytes: u64) {
    use std::os::unix::fs::MetadataExt;
    let dev = match std::fs::metadata(mountpoint) {
        Ok(m) => m.dev(),
        Err(e) => return warn!(error = %e, "cannot stat the mount to set readahead"),
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    match std::fs::write(&path, (bytes / 1024).to_string()) {
        Ok(()) => info!(kib = bytes / 1024, "readahead window set"),
        Err(e) => tracing::debug!(%path, error = %e, "readahead window left as is"),
    }
}

/// Unmounts a FUSE mount: a plain unmount, or a lazy one if files are still open (the
/// session then ends when the last of them closes).
pub fn unmount(mountpoint: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("mount point contains a NUL byte"))?;
    for flags in [0, libc::MNT_DETACH] {
        // SAFETY: `c` is a valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EBUSY) => continue,
            Some(libc::EPERM) => return fusermount_unmount(mountpoint),
            _ => return Err(e),
        }
    }
    Err(std::io::Error::other("unmount failed"))
}

/// Unprivileged users unmount through the setuid helper.
fn fusermount_unmount(mountpoint: &Path) -> std::io::Result<()> {
    let status = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mountpoint)
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "fusermount3 -u failed: {status}"
        )))
    }
}
