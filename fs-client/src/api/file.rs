//! Open files of the library API: positioned reads and writes into and out of the
//! caller's buffers, `fsync`, truncation, and a close that reports what failed.

use super::{is_a_directory, Metadata, Shared};
use crate::error::{ClientError, Result};
use crate::file::FileHandle;
use futures::stream::{self, StreamExt, TryStreamExt};
use proto::meta::OpenAccess;
use proto::{FileKind, SetAttr};
use std::sync::Arc;

/// Reads of one I/O buffer each that one `read_at` keeps in flight: a large read is
/// fetched from several data servers at once, in buffers the pool bounds.
const WINDOWS_IN_FLIGHT: usize = 8;

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
    /// Permission bits of a created file (less the umask).
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

/// An open file. Dropping it closes it without reporting a failed write: call
/// [`File::close`] to learn of one.
pub struct File {
    shared: Arc<Shared>,
    fh: Option<FileHandle>,
    append: bool,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ino = self.fh.as_ref().map(|fh| fh.ino());
        f.debug_struct("File")
            .field("ino", &ino)
            .field("append", &self.append)
            .finish()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let Some(fh) = self.fh.take() else { return };
        let client = self.shared.client.clone();
        let release = async move {
            if let Err(e) = client.release(&fh).await {
                tracing::warn!(ino = %fh.ino(), error = %e, "a file dropped without close failed to close");
            }
        };
        // Blocking is not allowed inside a runtime: the close then runs on its own.
        if tokio::runtime::Handle::try_current().is_err() {
            self.shared.handle.block_on(release);
        } else {
            self.shared.handle.spawn(release);
        }
    }
}

/// Opens `path` as `how` says.
pub(super) async fn open(sh: Arc<Shared>, path: &str, how: &OpenOptions) -> Result<File> {
    let access = how.access()?;
    let client = &sh.client;
    let (attr, fh) = if how.create || how.create_new {
        let (parent, name) = sh.paths.parent(client, path).await?;
        let caller = super::caller();
        let flags = (how.create_new, how.truncate, access);
        client
            .create_for(parent, name.as_bytes(), sh.mode(how.mode), caller, flags)
            .await?
    } else {
        let attr = sh.paths.resolve(client, path, true).await?;
        if attr.kind == FileKind::Directory {
            return Err(is_a_directory(path));
        }
        client.open_for(attr.ino, access, how.truncate).await?
    };
    if attr.kind == FileKind::Directory {
        // A create of a name that is a directory opens nothing: close it again.
        let _ = client.release(&fh).await;
        return Err(is_a_directory(path));
    }
    Ok(File {
        shared: sh.clone(),
        fh: Some(fh),
        append: how.append,
    })
}

/// Reads into `buf` from `offset` until it is full or the file ends, several buffers
/// at once.
async fn read_into(sh: &Shared, fh: &FileHandle, buf: &mut [u8], offset: u64) -> Result<usize> {
    let client = &*sh.client;
    let step = client.io_buffer_bytes();
    let mut reads = Vec::new();
    for (i, window) in buf.chunks_mut(step).enumerate() {
        reads.push(read_window(client, fh, offset + (i * step) as u64, window));
    }
    let got: Vec<(usize, usize)> = stream::iter(reads)
        .buffered(WINDOWS_IN_FLIGHT)
        .try_collect()
        .await?;
    let mut total = 0;
    for (n, asked) in got {
        total += n;
        if n < asked {
            break;
        }
    }
    Ok(total)
}

/// One buffer's read into `window`: the bytes read, and how many were asked.
async fn read_window(
    client: &crate::Client,
    fh: &FileHandle,
    at: u64,
    window: &mut [u8],
) -> Result<(usize, usize)> {
    let bytes = client.read_buf(fh, at, window.len()).await?;
    let n = bytes.len();
    bytes.with(|b| window[..n].copy_from_slice(b));
    Ok((n, window.len()))
}

impl File {
    fn fh(&self) -> &FileHandle {
        self.fh
            .as_ref()
            .expect("a File has its handle until it is closed")
    }

    /// Reads up to `buf.len()` bytes at `offset`; 0 at or past the end. It fills `buf`
    /// unless the file ends first.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.shared
            .block_on(read_into(&self.shared, self.fh(), buf, offset))
    }

    /// [`File::read_at`]; the name says what callers rely on.
    pub(super) fn read_exact_or_eof(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.read_at(buf, offset)
    }

    /// Writes `buf` at `offset`, or at the end if the file was opened to append (as
    /// `pwrite(2)` does on Linux). The bytes are buffered: a failure to store them is
    /// returned by a later write, [`File::flush`], [`File::sync_all`] or
    /// [`File::close`].
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<usize> {
        if self.append {
            return self.append(buf).map(|_| buf.len());
        }
        let client = &self.shared.client;
        self.shared.block_on(client.write(self.fh(), offset, buf))
    }

    /// Writes `buf` at the end of the file as the metadata server sees it (appends
    /// from several clients never overlap); returns where it went.
    pub fn append(&self, buf: &[u8]) -> Result<u64> {
        let client = &self.shared.client;
        self.shared.block_on(client.append(self.fh(), buf))
    }

    /// The length as this client sees it, its own writes included.
    pub fn len(&self) -> u64 {
        self.fh().state.size()
    }

    /// Whether the length is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file's attributes.
    pub fn metadata(&self) -> Result<Metadata> {
        let client = &self.shared.client;
        let attr = self.shared.block_on(client.getattr(self.fh().ino()))?;
        Ok(Metadata::from(&attr))
    }

    /// Cuts or extends the file to `size` bytes.
    pub fn set_len(&self, size: u64) -> Result<()> {
        let client = &self.shared.client;
        let set = SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        let ino = self.fh().ino();
        self.shared.block_on(client.setattr(ino, set)).map(drop)
    }

    /// Sends buffered writes and commits the length, so other clients see them.
    pub fn flush(&self) -> Result<()> {
        let client = &self.shared.client;
        self.shared.block_on(client.flush(self.fh()))
    }

    /// Makes every byte written durable on the data servers and commits the length
    /// (`fsync(2)`).
    pub fn sync_all(&self) -> Result<()> {
        let client = &self.shared.client;
        self.shared.block_on(client.fsync(self.fh()))
    }

    /// Closes the file: buffered writes are sent and the length committed; a write that
    /// failed on the way is returned here.
    pub fn close(mut self) -> Result<()> {
        let fh = self
            .fh
            .take()
            .expect("a File has its handle until it is closed");
        let client = &self.shared.client;
        self.shared.block_on(client.release(&fh))
    }
}

/// The whole file at `path`: its length as the open saw it (a read never goes past
/// the length this client knows).
pub(super) async fn read_whole(sh: Arc<Shared>, path: String) -> Result<Vec<u8>> {
    let mut file = open(sh.clone(), &path, &OpenOptions::new()).await?;
    let fh = file.fh.take().expect("just opened");
    let size = usize::try_from(fh.state.size())
        .map_err(|_| ClientError::TooLarge(format!("{path:?} does not fit in memory")))?;
    let mut out = vec![0; size];
    let read = read_into(&sh, &fh, &mut out, 0).await;
    let closed = sh.client.release(&fh).await;
    out.truncate(read?);
    closed?;
    Ok(out)
}

/// Whole files, at most `sh.parallel` read at once, each in a task of its own.
pub(super) async fn read_many(sh: Arc<Shared>, paths: Vec<String>) -> Vec<Result<Vec<u8>>> {
    let parallel = sh.parallel;
    stream::iter(paths)
        .map(|p| {
            let sh = sh.clone();
            async move {
                match tokio::spawn(read_whole(sh, p)).await {
                    Ok(r) => r,
                    Err(e) => Err(ClientError::Invalid(format!("a read task failed: {e}"))),
                }
            }
        })
        .buffered(parallel)
        .collect()
        .await
}
