//! Open files of the library API: positioned reads and writes into and out of the
//! caller's buffers, `fsync`, truncation, and a close that reports what failed.

use super::path::refused;
use super::{is_a_directory, Metadata, Shared};
use crate::client::OpenedByName;
use crate::error::{ClientError, Result};
use crate::file::FileHandle;
use futures::stream::{self, StreamExt};
use parking_lot::RwLock;
use proto::meta::OpenAccess;
use proto::{FileKind, SetAttr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use transport::{MemoryRegion, StableBytes};

/// How to open a file, as `open(2)`'s flags say it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenOptions {
    /// Open for reading.
    pub read: bool,
    /// Open for writing.
    pub write: bool,
    /// Every write goes to the end of the file (`O_APPEND`); implies `write`.
    pub append: bool,
    /// Create the file if it does not exist (`O_CREAT`).
    pub create: bool,
    /// Create it, failing if it exists (`O_CREAT | O_EXCL`).
    pub create_new: bool,
    /// Empty it once open (`O_TRUNC`).
    pub truncate: bool,
    /// Permission bits of a created file (less the umask, or as the directory's default
    /// ACL gives).
    pub mode: u32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read: true,
            write: false,
            append: false,
            create: false,
            create_new: false,
            truncate: false,
            mode: 0o666,
        }
    }
}

impl OpenOptions {
    /// Read only, nothing created.
    pub fn new() -> OpenOptions {
        OpenOptions::default()
    }

    /// Sets whether to read.
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }

    /// Sets whether to write.
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }

    /// Sets whether every write goes to the end.
    pub fn append(&mut self, on: bool) -> &mut Self {
        self.append = on;
        self
    }

    /// Sets whether to create the file if missing.
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }

    /// Sets whether to create the file, failing if it exists.
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }

    /// Sets whether to empty the file once open.
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }

    /// Sets the permission bits of a created file.
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }

    fn access(&self) -> Result<OpenAccess> {
        let write = self.write || self.append;
        match (self.read, write) {
            (true, false) => Ok(OpenAccess::Read),
            (false, true) => Ok(OpenAccess::Write),
            (true, true) => Ok(OpenAccess::ReadWrite),
            (false, false) => Err(ClientError::Invalid(
                "an open must read, write or append".into(),
            )),
        }
    }
}

/// An open file. Many threads may read and write through it at once. Dropping it
/// closes it without reporting a failed write: call [`File::close`] to learn of one.
pub struct File {
    shared: Arc<Shared>,
    /// `None` once closed; a close waits for calls in flight (they hold it shared).
    fh: RwLock<Option<FileHandle>>,
    access: OpenAccess,
    append: bool,
    /// This handle's first write removed what a local write removes (`drop_privs`).
    privs_dropped: AtomicBool,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ino = self.fh.read().as_ref().map(|fh| fh.ino());
        f.debug_struct("File")
            .field("ino", &ino)
            .field("access", &self.access)
            .field("append", &self.append)
            .finish()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let Some(fh) = self.fh.get_mut().take() else {
            return;
        };
        if self.shared.usable().is_err() {
            // A forked child: the parent owns the open and the runtime; nothing of
            // either may be touched here (see `Shared::drop`).
            std::mem::forget(fh);
            std::mem::forget(self.shared.clone());
            return;
        }
        // Never waits here (in Python a drop holds the GIL): the closer thread ends
        // the open, and keeps the runtime alive until it has.
        self.shared.closer.close_later(fh, self.shared.clone());
    }
}

/// One open to end for a `File` dropped without `close`.
struct Closing {
    fh: FileHandle,
    shared: Arc<Shared>,
}

/// A thread that ends the opens of dropped files, one after the other. Its queue is
/// not bounded by a number: each entry is a file the program had open, which the
/// server bounds (and a drop must not wait for room).
pub(super) struct Closer {
    tx: mpsc::Sender<Closing>,
}

impl Closer {
    pub(super) fn start() -> Result<Closer> {
        let (tx, rx) = mpsc::channel::<Closing>();
        std::thread::Builder::new()
            .name("tessera-close".into())
            .spawn(move || {
                // Ends when the `Shared` holding the sender is gone.
                for c in rx {
                    let client = c.shared.client.clone();
                    if let Err(e) = c.shared.handle.block_on(client.release(&c.fh)) {
                        let ino = c.fh.ino();
                        tracing::warn!(%ino, error = %e, "a file dropped without close failed to close");
                    }
                }
            })
            .map_err(|e| ClientError::Config(format!("starting the close thread: {e}")))?;
        Ok(Closer { tx })
    }

    fn close_later(&self, fh: FileHandle, shared: Arc<Shared>) {
        if let Err(mpsc::SendError(c)) = self.tx.send(Closing { fh, shared }) {
            tracing::warn!(ino = %c.fh.ino(), "no close thread: the server ends the open with the connection");
        }
    }
}

/// Opens `path` as `how` says.
pub(super) async fn open(sh: Arc<Shared>, path: &str, how: &OpenOptions) -> Result<File> {
    open_for(sh, path, how, false).await
}

/// [`open`]; `reading`: the caller reads at once (the first read's access time moves
/// with the open).
pub(super) async fn open_for(
    sh: Arc<Shared>,
    path: &str,
    how: &OpenOptions,
    reading: bool,
) -> Result<File> {
    let access = how.access()?;
    if how.truncate && !access.writes() {
        return Err(ClientError::Invalid(format!(
            "{path:?}: truncating needs an open for writing"
        )));
    }
    let client = &sh.client;
    let (attr, fh) = if how.create || how.create_new {
        create(&sh, path, how, access).await?
    } else {
        match open_by_name(&sh, path, (access, how.append), how.truncate, reading).await? {
            Some(opened) => opened,
            None => {
                let attr = sh.paths.resolve(client, path, true).await?;
                if attr.kind == FileKind::Directory {
                    return Err(is_a_directory(path));
                }
                if super::path::wants_dir(path) {
                    return Err(super::not_a_directory(path));
                }
                let open = (access, how.truncate, how.append);
                client.open_named(attr.ino, open, false).await?
            }
        }
    };
    if access.writes() {
        fh.mark_writer().await;
    }
    debug_assert_ne!(attr.kind, FileKind::Directory);
    Ok(File {
        shared: sh.clone(),
        fh: RwLock::new(Some(fh)),
        access,
        append: how.append,
        privs_dropped: AtomicBool::new(false),
    })
}

/// The common open of an existing regular file: its directory (kept, as a walk keeps
/// it) and one `OpenAt` of the last name, where a lookup then an open took two calls.
/// `None` where the walk must do it: a symbolic link at the last name, a device or
/// FIFO, a name not found (a kept directory may be stale: the walk looks again), a
/// refusal of a read-only key, a path that asks for a directory, or `O_TRUNC` (the
/// truncation goes with `Open`).
async fn open_by_name(
    sh: &Shared,
    path: &str,
    (access, append): (OpenAccess, bool),
    truncate: bool,
    reading: bool,
) -> Result<Option<(proto::Attr, FileHandle)>> {
    if truncate || super::path::wants_dir(path) {
        return Ok(None);
    }
    let at = super::canonical_of(path)?;
    let (parent, name) = sh.parent(&at, proto::ErrorCode::IsADirectory).await?;
    let client = &sh.client;
    match client
        .open_at(parent, name.as_bytes(), (access, append), reading)
        .await
    {
        Ok(OpenedByName::File(attr, fh)) => Ok(Some((attr, fh))),
        Ok(OpenedByName::Other(a)) if a.kind == FileKind::Directory => Err(is_a_directory(path)),
        Ok(OpenedByName::Other(_)) => Ok(None),
        // A read-only key's open for writing is refused before the lookup: the walk
        // gives the lookup's error first, as Linux does on a read-only mount.
        Err(e)
            if matches!(
                e.code(),
                proto::ErrorCode::NotFound | proto::ErrorCode::Stale | proto::ErrorCode::ReadOnly
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// `O_CREAT`: a symbolic link at the last name is followed (without `O_EXCL`), and
/// the file is made where it points if nothing is there, as `open(2)` does.
async fn create(
    sh: &Shared,
    path: &str,
    how: &OpenOptions,
    access: OpenAccess,
) -> Result<(proto::Attr, FileHandle)> {
    /// Links followed at the last name at most, as Linux's `MAXSYMLINKS`.
    const MAX_LINKS: usize = 40;
    if super::path::wants_dir(path) {
        return Err(is_a_directory(path));
    }
    let client = &sh.client;
    let mut at = super::canonical_of(path)?;
    for _ in 0..=MAX_LINKS {
        let (parent, name) = sh.parent(&at, proto::ErrorCode::IsADirectory).await?;
        if !how.create_new {
            match client.lookup(parent, name.as_bytes()).await {
                Ok(a) if a.kind == FileKind::Symlink => {
                    let target = super::resolve::link_target(client, a.ino, path).await?;
                    let dir = super::path::components(&at)?;
                    let dir = &dir[..dir.len().saturating_sub(1)];
                    at = super::path::canonical(&super::path::spliced(dir, &target, &[]));
                    continue;
                }
                Ok(a) if a.kind == FileKind::Directory => return Err(is_a_directory(path)),
                _ => {}
            }
        }
        let flags = (how.create_new, how.truncate, access, how.append);
        let mode = how.mode & 0o7777;
        return client
            .create_for(parent, name.as_bytes(), mode, sh.creator(), flags)
            .await;
    }
    Err(ClientError::SymlinkLoop(path.to_string()))
}

impl File {
    /// Runs `f` with the open handle: `EBADF` once closed, or if the open does not
    /// allow the call (`writes`: a write, `reads`: a read).
    fn with<T>(&self, need: Need, f: impl FnOnce(&FileHandle) -> Result<T>) -> Result<T> {
        let allowed = match need {
            Need::Read => self.access != OpenAccess::Write,
            Need::Write => self.access.writes(),
            Need::Any => true,
        };
        if !allowed {
            return Err(ClientError::BadHandle(format!(
                "the file is open for {:?}",
                self.access
            )));
        }
        let guard = self.fh.read();
        let fh = guard
            .as_ref()
            .ok_or_else(|| ClientError::BadHandle("the file is closed".into()))?;
        f(fh)
    }

    /// Reads up to `buf.len()` bytes at `offset`; 0 at or past the end. It fills `buf`
    /// unless the file ends first.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let sh = &self.shared;
        self.with(Need::Read, |fh| {
            sh.block_on(sh.client.read_into(fh, buf, offset))
        })
    }

    /// [`File::read_at`] into memory lent to the transport for the read (see
    /// [`super::Tessera::read_whole_lent`]): the data servers write into `buf` itself,
    /// with no copy, from `offset` until it is full or the file ends. Gives `buf` back
    /// with the bytes read. No readahead: for large reads (several I/O buffers), where
    /// the windows read at once stand in for it.
    pub fn read_lent_at<B: StableBytes>(&self, buf: B, offset: u64) -> Result<(B, usize)> {
        let sh = &self.shared;
        self.with(Need::Read, |fh| sh.block_on(read_lent(sh, fh, buf, offset)))
    }

    /// Writes `buf` at `offset`, or at the end if the file was opened to append (as
    /// `pwrite(2)` does on Linux). The bytes are buffered: a failure to store them is
    /// returned by a later write, [`File::flush`], [`File::sync_all`] or
    /// [`File::close`].
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<usize> {
        if self.append {
            return self.append(buf).map(|_| buf.len());
        }
        let sh = &self.shared;
        self.with(Need::Write, |fh| {
            if buf.is_empty() {
                // As pwrite(2) of nothing: no change, not even of the length.
                return Ok(0);
            }
            fh.state.check_mutable()?;
            self.drop_privs(fh)?;
            sh.block_on(sh.client.write(fh, offset, buf))
        })
    }

    /// Before this handle's first write, what a local write does to the file
    /// (`file_remove_privs`), which no kernel does for the library: removes its file
    /// capabilities (whoever writes), and its setuid bit, and setgid with group-exec (or
    /// for a writer outside its group), for a writer other than root. Once per handle:
    /// a bit set again while the handle is open stays. No call for a file this client
    /// knows to be plain (made by it, or asked within the attribute TTL).
    fn drop_privs(&self, fh: &FileHandle) -> Result<()> {
        if self.privs_dropped.load(Ordering::Relaxed) {
            return Ok(());
        }
        let (sh, ino, attr) = (&self.shared, fh.ino(), fh.state.known_attr());
        let me = super::caller();
        // `kill_privs` decides from fresh attributes; the known ones spare its getattr
        // for the files that have neither bit. The writer's groups as it wants them:
        // the file's group if the writer is in it.
        let in_group = me.in_group(attr.gid).then_some(attr.gid);
        let kill_suid = !me.is_root() && attr.perm & 0o6000 != 0;
        let drop_caps = !sh.client.capability_known_absent(ino);
        sh.block_on(async {
            if kill_suid {
                let groups: &[u32] = in_group.as_slice();
                sh.client.kill_privs(ino, Some(groups)).await?;
            }
            if drop_caps {
                sh.client.drop_capability(ino).await?;
            }
            Ok(())
        })?;
        self.privs_dropped.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Writes `buf` at the end of the file as the metadata server sees it (appends
    /// from several clients never overlap); returns where it went.
    pub fn append(&self, buf: &[u8]) -> Result<u64> {
        let sh = &self.shared;
        self.with(Need::Write, |fh| {
            if buf.is_empty() {
                return Ok(fh.state.size());
            }
            fh.state.check_mutable()?;
            self.drop_privs(fh)?;
            sh.block_on(sh.client.append(fh, buf))
        })
    }

    /// The length as this client sees it, its own writes included (0 once closed).
    pub fn len(&self) -> u64 {
        self.with(Need::Any, |fh| Ok(fh.state.size())).unwrap_or(0)
    }

    /// Whether the length is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file's attributes.
    pub fn metadata(&self) -> Result<Metadata> {
        let sh = &self.shared;
        let attr = self.with(Need::Any, |fh| sh.block_on(sh.client.getattr(fh.ino())))?;
        Ok(Metadata::from(&attr))
    }

    /// Cuts or extends the file to `size` bytes (an open for writing only).
    pub fn set_len(&self, size: u64) -> Result<()> {
        let sh = &self.shared;
        let set = SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        self.with(Need::Write, |fh| {
            sh.block_on(sh.client.setattr(fh.ino(), set)).map(drop)
        })
    }

    /// Sends buffered writes and commits the length, so other clients see them.
    pub fn flush(&self) -> Result<()> {
        let sh = &self.shared;
        self.with(Need::Any, |fh| sh.block_on(sh.client.flush(fh)))
    }

    /// Makes every byte written durable on the data servers and commits the length
    /// (`fsync(2)`).
    pub fn sync_all(&self) -> Result<()> {
        let sh = &self.shared;
        self.with(Need::Any, |fh| sh.block_on(sh.client.fsync(fh)))
    }

    /// Closes the file once calls in flight are done: buffered writes are sent and the
    /// length committed; a write that failed on the way is returned here. A second
    /// close, and any call after it, fails with `EBADF`.
    pub fn close(&self) -> Result<()> {
        self.shared.usable()?;
        let fh = self
            .fh
            .write()
            .take()
            .ok_or_else(|| ClientError::BadHandle("the file is closed".into()))?;
        let sh = &self.shared;
        sh.block_on(sh.client.release(&fh))
    }

    /// Whether [`File::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.fh.read().is_none()
    }
}

/// What a call needs of the open's access mode.
#[derive(Clone, Copy)]
enum Need {
    Read,
    Write,
    Any,
}

/// The whole file at `path`: its length as the open saw it (a read never goes past
/// the length this client knows).
pub(super) async fn read_whole(sh: Arc<Shared>, path: String) -> Result<Vec<u8>> {
    let file = open_for(sh.clone(), &path, &OpenOptions::new(), true).await?;
    let size = usize::try_from(file.len())
        .map_err(|_| ClientError::TooLarge(format!("{path:?} does not fit in memory")))?;
    let (mut out, n) = read_one_lent(sh, file, vec![0; size]).await?;
    out.truncate(n);
    Ok(out)
}

/// Whole files, at most `sh.parallel` read at once, each in a task of its own; in the
/// order of `paths`.
pub(super) async fn read_many(sh: Arc<Shared>, paths: Vec<String>) -> Vec<Result<Vec<u8>>> {
    let parallel = sh.parallel;
    stream::iter(paths)
        .map(|p| spawned(read_whole(sh.clone(), p)))
        .buffered(parallel)
        .collect()
        .await
}

/// `work`'s result, run in a task of its own (on any of the runtime's threads).
async fn spawned<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    match tokio::spawn(work).await {
        Ok(r) => r,
        Err(e) => Err(refused(
            proto::ErrorCode::Io,
            format!("a read task failed: {e}"),
        )),
    }
}

/// Files opened to be read whole, at most `sh.parallel` opens at once, in the order of
/// `paths`.
pub(super) async fn open_many(sh: Arc<Shared>, paths: Vec<String>) -> Vec<Result<File>> {
    let parallel = sh.parallel;
    stream::iter(paths)
        .map(|p| {
            let sh = sh.clone();
            async move { open_for(sh, &p, &OpenOptions::new(), true).await }
        })
        .buffered(parallel)
        .collect()
        .await
}

/// Files at least this long have their buffer's first borrow (which may do work: a
/// fresh Python `bytes` is zeroed then) on a blocking thread, not on the runtime's.
const PREPARE_APART_BYTES: u64 = 1 << 20;

/// Reads each file from its start into its buffer and closes it, at most `sh.parallel`
/// at once, each in a task of its own; in the order given.
pub(super) async fn read_whole_into<B>(
    sh: Arc<Shared>,
    files: Vec<(File, B)>,
) -> Vec<Result<(B, usize)>>
where
    B: AsMut<[u8]> + Send + 'static,
{
    each_whole(sh, files, read_one_into).await
}

/// [`read_whole_into`] with each buffer lent to the transport for its file's read
/// ([`read_one_lent`]): the data servers write into it, with no copy on the way.
pub(super) async fn read_whole_lent<B: StableBytes>(
    sh: Arc<Shared>,
    files: Vec<(File, B)>,
) -> Vec<Result<(B, usize)>> {
    each_whole(sh, files, read_one_lent).await
}

/// Each file read from its start into its buffer by `read_one` (which closes it), at
/// most `sh.parallel` at once, each in a task of its own; in the order given.
async fn each_whole<B, F, Fut>(
    sh: Arc<Shared>,
    files: Vec<(File, B)>,
    read_one: F,
) -> Vec<Result<(B, usize)>>
where
    B: AsMut<[u8]> + Send + 'static,
    F: Fn(Arc<Shared>, File, B) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = Result<(B, usize)>> + Send + 'static,
{
    let parallel = sh.parallel;
    stream::iter(files)
        .map(|(file, buf)| {
            let sh = sh.clone();
            spawned(async move {
                let buf = prepared(&file, buf).await?;
                read_one(sh, file, buf).await
            })
        })
        .buffered(parallel)
        .collect()
        .await
}

/// `buf`, borrowed once (a fresh Python `bytes` is zeroed then) on a blocking thread
/// for a file of [`PREPARE_APART_BYTES`] or more.
async fn prepared<B: AsMut<[u8]> + Send + 'static>(file: &File, mut buf: B) -> Result<B> {
    if file.len() < PREPARE_APART_BYTES {
        return Ok(buf);
    }
    let borrowed = tokio::task::spawn_blocking(move || {
        let _ = buf.as_mut();
        buf
    });
    borrowed
        .await
        .map_err(|e| refused(proto::ErrorCode::Io, format!("a buffer: {e}")))
}

/// Reads `file` from its start into `buf` (as much as fits) and closes it: the buffer
/// and the bytes read, fewer than its length only if the file shrank. Refused for a
/// file of another `Tessera` (its open is that client's) or one not open for reading.
async fn read_one_into<B: AsMut<[u8]>>(
    sh: Arc<Shared>,
    file: File,
    mut buf: B,
) -> Result<(B, usize)> {
    let fh = take_to_read(&sh, &file)?;
    let read = sh.client.read_into(&fh, buf.as_mut(), 0).await;
    let closed = sh.client.release(&fh).await;
    let n = read?;
    closed?;
    Ok((buf, n))
}

/// [`read_one_into`] with `buf` lent to the transport for the read: the data servers
/// write into it, with no I/O buffer between. Read through the I/O buffers, with one
/// copy, where it cannot be lent (a device that cannot pin it) or while this client
/// holds writes to the file it has not sent.
async fn read_one_lent<B: StableBytes>(sh: Arc<Shared>, file: File, buf: B) -> Result<(B, usize)> {
    let fh = take_to_read(&sh, &file)?;
    let read = read_lent(&sh, &fh, buf, 0).await;
    let closed = sh.client.release(&fh).await;
    let read = read?;
    closed?;
    Ok(read)
}

/// Reads `fh` from `offset` into `buf`, lent to the transport for the read; through the
/// I/O buffers, with one copy, where it cannot be lent (a device that cannot pin it) or
/// while this client holds writes to the file it has not sent.
async fn read_lent<B: StableBytes>(
    sh: &Shared,
    fh: &FileHandle,
    mut buf: B,
    offset: u64,
) -> Result<(B, usize)> {
    let span = buf.as_mut();
    let populating = populate_beside(span.as_mut_ptr() as usize, span.len());
    let (read, buf) = match sh.client.ep.lend(buf) {
        Ok(mr) => {
            let read = sh.client.read_into_region(fh, &mr, offset).await;
            (read, reclaimed(mr).await)
        }
        Err((e, buf)) => {
            tracing::debug!(error = %e, "a read's buffer could not be lent; reading through the I/O buffers");
            (Ok(None), Ok(buf))
        }
    };
    // Done before the memory goes back to the caller (it changes no byte either way).
    let _ = populating.await;
    match (read, buf) {
        (Ok(Some(n)), Ok(buf)) => Ok((buf, n)),
        (Ok(None), Ok(mut buf)) => {
            let n = sh.client.read_into(fh, buf.as_mut(), offset).await;
            n.map(|n| (buf, n))
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// Maps in the pages of `len` bytes at `addr`, memory about to receive a read, on a
/// thread of the blocking pool while the read runs. Memory just allocated (the tensor
/// `torch.load` reads a storage into) otherwise takes a page fault per page inside
/// the transport's receive, one after the other with it: 64 MiB reads into fresh memory
/// ran at about half the rate of reads into memory used before. Ahead of the receive,
/// the faults overlap it. `MADV_POPULATE_WRITE` changes no byte, so a page the read
/// has already written keeps its bytes. Best effort: before Linux 5.14, or for memory
/// that cannot be populated so, the pages fault in during the read as before.
fn populate_beside(addr: usize, len: usize) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || {
        if len == 0 {
            return;
        }
        // SAFETY: sysconf reads a constant of the system.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let first = addr - addr % page;
        // SAFETY: the range is the caller's buffer (its start rounded down to the page,
        // which is mapped with it), held until this returns; MADV_POPULATE_WRITE maps
        // pages in without writing, and a failure leaves everything as it was.
        let rc = unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                len + (addr - first),
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            tracing::trace!(error = %e, "a read's memory was not populated ahead");
        }
    })
}

/// How long [`reclaimed`] waits for the transport to let go of lent memory. A transfer
/// into it outlives its read only when the read gave up first (its call timed out)
/// while a data server still wrote: over `tcp` the client's own receive of that frame
/// holds the region until the frame ends or the connection closes. Past the wait the
/// read fails, and the memory stays with the region, alive, until it is let go.
const RECLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The memory lent to `mr`, once no transfer holds the region any more.
async fn reclaimed<B: StableBytes>(mut mr: MemoryRegion) -> Result<B> {
    let started = tokio::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        match mr.reclaim() {
            Ok(buf) => return Ok(buf),
            Err(back) => mr = back,
        }
        if started.elapsed() >= RECLAIM_WAIT {
            return Err(refused(
                proto::ErrorCode::Io,
                format!("a transfer into a read's buffer still ran after {RECLAIM_WAIT:?}"),
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(100));
    }
}

/// `file`'s open, taken to be read whole and closed. Refused for a file of another
/// `Tessera` (its open is that client's) or one not open for reading.
fn take_to_read(sh: &Arc<Shared>, file: &File) -> Result<FileHandle> {
    if !Arc::ptr_eq(sh, &file.shared) {
        return Err(ClientError::BadHandle(
            "the file was opened by another connection".into(),
        ));
    }
    if file.access == OpenAccess::Write {
        return Err(ClientError::BadHandle(format!(
            "the file is open for {:?}",
            file.access
        )));
    }
    file.fh
        .write()
        .take()
        .ok_or_else(|| ClientError::BadHandle("the file is closed".into()))
}
