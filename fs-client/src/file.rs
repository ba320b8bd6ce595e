//! Open files: reads and writes of chunk bytes with one-sided transfers, length commits,
//! fsync and truncation.

use crate::client::Client;
use crate::error::{ClientError, Result};
use crate::rpc::{self, expect_reply};
use futures::stream::{self, StreamExt, TryStreamExt};
use parking_lot::Mutex;
use proto::data::{DataReply, DataRequest};
use proto::meta::{Commit, MetaReply, MetaRequest};
use proto::{Attr, ChunkId, ErrorCode, InodeId, Layout, NodeId, SessionId, Timestamp, WireError};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tracing::debug;
use transport::{Access, MemoryRegion, PooledBuf, TransportError};

/// Buffer-sized windows of one large read or write kept in flight at once.
const WINDOWS_IN_FLIGHT: usize = 4;

/// What one client knows of a file that it has open, shared by all its handles.
pub struct FileState {
    pub(crate) ino: InodeId,
    pub(crate) layout: Layout,
    inner: Mutex<FileInner>,
}

struct FileInner {
    /// The length as this client sees it: the server's, grown by local writes.
    size: u64,
    /// Time of the last local write.
    mtime: Timestamp,
    /// Writes not yet committed to the metadata server; bumped by every write.
    write_gen: u64,
    committed_gen: u64,
    /// Chunks written since the last fsync, per data server.
    dirty: HashMap<NodeId, BTreeSet<ChunkId>>,
}

impl FileState {
    pub(crate) fn new(attr: &Attr, layout: Layout) -> FileState {
        FileState {
            ino: attr.ino,
            layout,
            inner: Mutex::new(FileInner {
                size: attr.size,
                mtime: attr.mtime,
                write_gen: 0,
                committed_gen: 0,
                dirty: HashMap::new(),
            }),
        }
    }

    /// Another open of the same file: take the server's length unless local writes are
    /// still uncommitted (they can only have grown it).
    pub(crate) fn opened(&self, attr: &Attr) {
        let mut i = self.inner.lock();
        if i.write_gen == i.committed_gen {
            i.size = attr.size;
        }
    }

    /// Replaces length and mtime by the local view while writes are uncommitted.
    pub(crate) fn overlay(&self, attr: &mut Attr) {
        let mut i = self.inner.lock();
        if i.write_gen != i.committed_gen {
            attr.size = attr.size.max(i.size);
            // A write changes the contents and the inode: both times move.
            attr.mtime = i.mtime;
            attr.ctime = attr.ctime.max(i.mtime);
        } else {
            i.size = attr.size;
        }
    }

    pub(crate) fn truncated(&self, size: u64) {
        let mut i = self.inner.lock();
        i.size = size;
        i.mtime = Timestamp::now();
    }

    fn size(&self) -> u64 {
        self.inner.lock().size
    }

    fn wrote(&self, end: u64, chunks: &[(NodeId, ChunkId)]) {
        let mut i = self.inner.lock();
        i.size = i.size.max(end);
        i.mtime = Timestamp::now();
        i.write_gen += 1;
        for (node, chunk) in chunks {
            i.dirty.entry(*node).or_default().insert(*chunk);
        }
    }

    /// The commit to send, with the write generation it covers; `None` if nothing is new.
    fn pending_commit(&self) -> Option<(Commit, u64)> {
        let i = self.inner.lock();
        (i.write_gen != i.committed_gen).then_some((
            Commit {
                size: i.size,
                mtime: i.mtime,
            },
            i.write_gen,
        ))
    }

    fn committed(&self, generation: u64) {
        let mut i = self.inner.lock();
        i.committed_gen = i.committed_gen.max(generation);
    }
}

/// One open of a file (a FUSE file handle).
pub struct FileHandle {
    pub(crate) state: Arc<FileState>,
    pub(crate) session: SessionId,
    /// The first read through this open must move the access time (relatime).
    atime_due: AtomicBool,
}

/// Whether a read now should move the access time, as `relatime` decides: the access
/// time is older than the last change, or more than a day old.
fn atime_due(attr: &Attr) -> bool {
    const DAY_SECS: i64 = 24 * 3600;
    let now = Timestamp::now();
    attr.atime <= attr.mtime || attr.atime <= attr.ctime || attr.atime.secs + DAY_SECS <= now.secs
}

impl FileHandle {
    pub(crate) fn new(state: Arc<FileState>, session: SessionId, attr: &Attr) -> FileHandle {
        let due = attr.kind == proto::FileKind::Regular && atime_due(attr);
        FileHandle {
            state,
            session,
            atime_due: AtomicBool::new(due),
        }
    }

    /// The open file's inode.
    pub fn ino(&self) -> InodeId {
        self.state.ino
    }
}

/// Bytes read into a registered buffer; the buffer returns to the pool when dropped.
pub struct ReadBuf<'a> {
    buf: PooledBuf<'a>,
    len: usize,
}

impl ReadBuf<'_> {
    /// Number of bytes read.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was read (end of file).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Runs `f` on the bytes, without copying them.
    pub fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&self.buf.mr().lock()[..self.len])
    }

    /// The bytes, copied.
    pub fn to_vec(&self) -> Vec<u8> {
        self.with(|b| b.to_vec())
    }
}

/// One piece of a transfer: a range inside one chunk, and where it sits in the buffer.
#[derive(Clone, Copy, Debug)]
struct Piece {
    chunk: ChunkId,
    node: NodeId,
    offset_in_chunk: u32,
    len: u32,
    buf_offset: usize,
}

fn pieces(layout: &Layout, ino: InodeId, offset: u64, len: usize) -> Result<Vec<Piece>> {
    let cs = u64::from(layout.chunk_size_bytes);
    let mut out = Vec::new();
    let mut pos = offset;
    let end = offset + len as u64;
    while pos < end {
        let index = pos / cs;
        let in_chunk = pos % cs;
        let n = (cs - in_chunk).min(end - pos);
        let node = layout.node_for(index).ok_or_else(|| {
            ClientError::Remote(WireError::new(
                ErrorCode::NoSpace,
                "file has no data servers",
            ))
        })?;
        out.push(Piece {
            chunk: ChunkId { inode: ino, index },
            node,
            offset_in_chunk: in_chunk as u32,
            len: n as u32,
            buf_offset: (pos - offset) as usize,
        });
        pos += n;
    }
    Ok(out)
}

fn retryable(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Transport(TransportError::Disconnected { .. })
            | ClientError::Transport(TransportError::Connect { .. })
    )
}

impl Client {
    /// Moves one piece between `mr` and its data server; retried once on a new
    /// connection (and a fresh cluster map) if the old one broke.
    async fn transfer(
        &self,
        layout: &Layout,
        p: Piece,
        mr: &MemoryRegion,
        write: bool,
    ) -> Result<()> {
        let mut attempt = 0;
        loop {
            let r = self.transfer_once(layout, p, mr, write).await;
            match r {
                Err(e) if attempt == 0 && retryable(&e) => {
                    debug!(error = %e, node = %p.node, "data server connection lost, retrying");
                    attempt += 1;
                    let _ = self.refresh_map().await;
                }
                r => return r,
            }
        }
    }

    async fn transfer_once(
        &self,
        layout: &Layout,
        p: Piece,
        mr: &MemoryRegion,
        write: bool,
    ) -> Result<()> {
        let conn = self.data_conn(p.node).await?;
        let access = if write {
            Access::RemoteRead
        } else {
            Access::RemoteWrite
        };
        let grant = conn.grant(mr, p.buf_offset, p.len as usize, access)?;
        let chunk_size_bytes = layout.chunk_size_bytes;
        let req = if write {
            DataRequest::WriteChunk {
                chunk: p.chunk,
                chunk_size_bytes,
                offset: p.offset_in_chunk,
                src: grant.remote(),
            }
        } else {
            DataRequest::ReadChunk {
                chunk: p.chunk,
                chunk_size_bytes,
                offset: p.offset_in_chunk,
                len: p.len,
                dest: grant.remote(),
            }
        };
        let reply = rpc::data_call(&self.ep, &conn, &req).await?;
        drop(grant);
        match reply {
            DataReply::Read { len } | DataReply::Written { len } if len == p.len => Ok(()),
            other => Err(ClientError::Protocol(format!(
                "unexpected reply {other:?} to {req:?}"
            ))),
        }
    }

    /// Reads up to one buffer of bytes at `offset`, stopping at the end of the file. The
    /// bytes stay in the registered buffer, so a FUSE reply can copy them straight out.
    pub async fn read_buf(&self, fh: &FileHandle, offset: u64, len: usize) -> Result<ReadBuf<'_>> {
        let size = fh.state.size();
        let len = len.min(self.pool.buffer_bytes());
        let len = if offset >= size {
            0
        } else {
            len.min((size - offset) as usize)
        };
        if fh.atime_due.swap(false, Ordering::Relaxed) {
            self.accessed(fh.ino()).await;
        }
        let buf = self.pool.take().await;
        if len > 0 {
            let layout = &fh.state.layout;
            let ps = pieces(layout, fh.ino(), offset, len)?;
            let mr = buf.mr();
            futures::future::try_join_all(ps.iter().map(|p| self.transfer(layout, *p, mr, false)))
                .await?;
        }
        Ok(ReadBuf { buf, len })
    }

    /// Reads up to `len` bytes at `offset` (fewer at the end of the file).
    pub async fn read(&self, fh: &FileHandle, offset: u64, len: usize) -> Result<Vec<u8>> {
        let step = self.pool.buffer_bytes();
        let windows: Vec<(u64, usize)> = (0..len)
            .step_by(step)
            .map(|o| (offset + o as u64, step.min(len - o)))
            .collect();
        let parts: Vec<Vec<u8>> =
            stream::iter(windows)
                .map(|(o, n)| async move {
                    Ok::<_, ClientError>(self.read_buf(fh, o, n).await?.to_vec())
                })
                .buffered(WINDOWS_IN_FLIGHT)
                .try_collect()
                .await?;
        let mut out = Vec::with_capacity(len);
        for p in parts {
            let short = p.len() < step;
            out.extend_from_slice(&p);
            if short {
                break;
            }
        }
        Ok(out)
    }

    /// Writes `data` at `offset`; the bytes are on the data servers (not yet durable)
    /// when it returns.
    pub async fn write(&self, fh: &FileHandle, offset: u64, data: &[u8]) -> Result<usize> {
        offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| {
                ClientError::Remote(WireError::new(ErrorCode::TooBig, "offset too large"))
            })?;
        let step = self.pool.buffer_bytes();
        let windows: Vec<usize> = (0..data.len()).step_by(step).collect();
        stream::iter(windows)
            .map(|o| {
                let n = step.min(data.len() - o);
                self.write_window(fh, offset + o as u64, &data[o..o + n])
            })
            .buffered(WINDOWS_IN_FLIGHT)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(data.len())
    }

    async fn write_window(&self, fh: &FileHandle, offset: u64, data: &[u8]) -> Result<()> {
        let buf = self.pool.take().await;
        let mr = buf.mr();
        mr.lock()[..data.len()].copy_from_slice(data);
        let layout = &fh.state.layout;
        let ps = pieces(layout, fh.ino(), offset, data.len())?;
        futures::future::try_join_all(ps.iter().map(|p| self.transfer(layout, *p, mr, true)))
            .await?;
        let chunks: Vec<_> = ps.iter().map(|p| (p.node, p.chunk)).collect();
        fh.state.wrote(offset + data.len() as u64, &chunks);
        Ok(())
    }

    /// Reports the length and mtime of uncommitted writes to the metadata server.
    pub async fn flush(&self, fh: &FileHandle) -> Result<()> {
        self.commit_pending(&fh.state).await
    }

    /// Commits what this client wrote to a file and has not yet reported.
    pub(crate) async fn commit_pending(&self, state: &FileState) -> Result<()> {
        let Some((commit, generation)) = state.pending_commit() else {
            return Ok(());
        };
        let req = MetaRequest::Commit {
            ino: state.ino,
            commit,
        };
        expect_reply!(self.meta(req).await?, MetaReply::Attr(_) => ())?;
        state.committed(generation);
        Ok(())
    }

    /// Makes every byte written through this client durable on the data servers, then
    /// commits the length (steps 1 and 2 of the fsync order in ARCHITECTURE.md).
    pub async fn fsync(&self, fh: &FileHandle) -> Result<()> {
        let dirty = std::mem::take(&mut fh.state.inner.lock().dirty);
        let syncs = dirty.iter().map(|(node, chunks)| async move {
            let conn = self.data_conn(*node).await?;
            let req = DataRequest::Fsync {
                chunks: chunks.iter().copied().collect(),
            };
            rpc::data_call(&self.ep, &conn, &req).await
        });
        if let Err(e) = futures::future::try_join_all(syncs).await {
            // Keep the chunks dirty so that the next fsync tries again.
            let mut i = fh.state.inner.lock();
            for (node, chunks) in dirty {
                i.dirty.entry(node).or_default().extend(chunks);
            }
            return Err(e);
        }
        self.flush(fh).await
    }

    /// Ends the open: commits what is uncommitted and closes the session.
    pub async fn release(&self, fh: &FileHandle) -> Result<()> {
        let pending = fh.state.pending_commit();
        let req = MetaRequest::Release {
            session: fh.session,
            commit: pending.map(|(c, _)| c),
        };
        self.meta(req).await?;
        if let Some((_, generation)) = pending {
            fh.state.committed(generation);
        }
        Ok(())
    }

    /// Appends `data` at the end of the file as the metadata server sees it (`O_APPEND`):
    /// the range is reserved there first, so appenders on several clients never overlap.
    /// Returns where the bytes went.
    pub async fn append(&self, fh: &FileHandle, data: &[u8]) -> Result<u64> {
        self.commit_pending(&fh.state).await?;
        let req = MetaRequest::Append {
            ino: fh.ino(),
            len: data.len() as u64,
        };
        let offset = expect_reply!(self.meta(req).await?, MetaReply::Offset(o) => o)?;
        self.write(fh, offset, data).await?;
        // The reservation already committed the length: nothing is left to report.
        if let Some((_, generation)) = fh.state.pending_commit() {
            fh.state.committed(generation);
        }
        Ok(offset)
    }

    /// `fallocate(2)`: mode 0 grows the file to cover the range; `KEEP_SIZE` alone
    /// changes nothing visible; `PUNCH_HOLE | KEEP_SIZE` makes the range read as zeros.
    /// Other modes are not supported.
    pub async fn fallocate(&self, fh: &FileHandle, offset: u64, len: u64, mode: i32) -> Result<()> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| {
                ClientError::Remote(WireError::new(ErrorCode::TooBig, "range too large"))
            })?;
        let keep = libc::FALLOC_FL_KEEP_SIZE;
        let punch = libc::FALLOC_FL_PUNCH_HOLE | keep;
        match mode {
            0 => {
                if end > fh.state.size() {
                    let set = proto::SetAttr {
                        size: Some(end),
                        ..Default::default()
                    };
                    self.setattr(fh.ino(), set).await?;
                }
                Ok(())
            }
            m if m == keep => Ok(()),
            m if m == punch => self.punch(fh, offset, end).await,
            m => Err(ClientError::Remote(WireError::new(
                ErrorCode::NotSupported,
                format!("fallocate mode {m:#x}"),
            ))),
        }
    }

    /// Zeroes `[offset, end)` (clamped to the file's length) on the data servers.
    async fn punch(&self, fh: &FileHandle, offset: u64, end: u64) -> Result<()> {
        let end = end.min(fh.state.size());
        if offset >= end {
            return Ok(());
        }
        let layout = &fh.state.layout;
        let ps = pieces(layout, fh.ino(), offset, (end - offset) as usize)?;
        let zero = ps.iter().map(|p| async move {
            let conn = self.data_conn(p.node).await?;
            let req = DataRequest::WriteZeros {
                chunk: p.chunk,
                chunk_size_bytes: layout.chunk_size_bytes,
                offset: p.offset_in_chunk,
                len: p.len,
            };
            rpc::data_call(&self.ep, &conn, &req).await
        });
        futures::future::try_join_all(zero).await?;
        let chunks: Vec<_> = ps.iter().map(|p| (p.node, p.chunk)).collect();
        fh.state.wrote(0, &chunks);
        Ok(())
    }

    /// Cuts a file's chunks to `size` on every data server of its layout.
    pub(crate) async fn truncate_data(
        &self,
        ino: InodeId,
        layout: &Layout,
        size: u64,
    ) -> Result<()> {
        let nodes: BTreeSet<NodeId> = layout.stripe.iter().copied().collect();
        let cuts = nodes.into_iter().map(|node| async move {
            let conn = self.data_conn(node).await?;
            let req = DataRequest::TruncateFile {
                inode: ino,
                size,
                chunk_size_bytes: layout.chunk_size_bytes,
            };
            rpc::data_call(&self.ep, &conn, &req).await
        });
        futures::future::try_join_all(cuts).await?;
        Ok(())
    }
}
