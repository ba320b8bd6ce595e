//! `O_APPEND` writes, batched: write-behind for appends.
//!
//! The metadata server places every appended byte (`fs::Append` reserves a range at the
//! end of the file and makes the new length durable), so appends from several clients
//! never overlap. One reservation per `write(2)` cost a round trip each; here the bytes
//! of whole `write(2)` calls wait in a per-file queue, in order, and one reservation
//! then one write-through place them all ("placing"). Each call's bytes stay contiguous
//! inside one reservation, so another mount's appends land before or after them, never
//! inside: appends stay atomic across clients.
//!
//! - The queue lives on the file's shared [`FileState`], so every handle of this mount
//!   appends to it in order. It is one buffer of the mount's write pool (counted against
//!   `write_buffer_mount_bytes`, as buffered writes are), holding at most
//!   [`APPEND_QUEUE_BYTES`]; a write larger than that is placed alone, after the queue.
//! - It is placed when full, after `append_linger_ms` (one linger task per file at
//!   most), and before anything on this client that reads the file's bytes, changes
//!   them or its length, or reports them: reads, plain writes, `getattr` and lookups,
//!   truncation, `fallocate`, fsync, flush and release ([`Client::place_appends`], from
//!   `commit_pending`, `send_for_commit` and the read, write and attribute entries).
//! - One placement per file at a time (`FileState::placing`), so a later batch never
//!   lands before an earlier one, and a caller that must see the bytes placed waits for
//!   a placement in progress too.
//! - A failed placement after the writes were answered is recorded as a failed
//!   background write is: the next fsync or close of each handle reports it, writes
//!   fail early until then.
//! - Before a lock of the file is released (`client/locks.rs`): appends made under a
//!   lock are seen by its next holder on any mount.
//! - Bounds of what this does not cover: a `write(2)` larger than the mount's
//!   `io_buffer_bytes` reaches the client as several FUSE writes, each whole but not
//!   together; a lost reply to a placement's `Append` leaves its reserved range as
//!   zeros and the batch is reported failed; while the metadata server is away, a
//!   read or `fstat` on this mount of a file with queued appends waits for it (up to
//!   `meta_wait_ms`) where other open files answer from what the client knows.
//! - A truncation holds the placement lock across its cut ([`Client::hold_appends`]):
//!   appends made before it are cut by it, appends made during it land after it.

use super::{FileHandle, FileState};
use crate::client::Client;
use crate::error::Result;
use crate::segpool::SegBuf;
use proto::meta::fs;
use proto::WireError;
use std::sync::Arc;
use std::time::Duration;

/// Bytes of queued appends one file holds at most (within one write-pool segment):
/// what a crash of the mount can lose of answered appends, as of buffered writes, and
/// what one placement moves. At 100-byte records that is 10,000 appends per
/// reservation, where the round trip is already a small part of the cost; larger
/// batches would only hold more memory per appending file.
pub const APPEND_QUEUE_BYTES: usize = 1 << 20;

/// Default of `append_linger_ms`: a lone append is seen by other mounts within a few
/// milliseconds (a metrics log tailed elsewhere), while a busy appender still places
/// hundreds of records per reservation.
pub const APPEND_LINGER_MS: u64 = 5;

/// Largest `append_linger_ms`: appends left a minute unplaced are what a test of the
/// batching wants, not a mount.
pub const MAX_APPEND_LINGER_MS: u64 = 60_000;

/// The appends of one file not yet placed.
#[derive(Default)]
pub(crate) struct AppendQueue {
    /// A write-pool buffer holding the queued bytes from offset 0; taken by a placement.
    buf: Option<SegBuf>,
    /// Bytes queued.
    len: usize,
    /// A linger task will place the queue (at most one per file).
    lingering: bool,
}

/// What an attempt to queue an append found.
enum Push {
    /// Queued; `first`: the queue was empty before.
    Queued { first: bool },
    /// No room: place the queue first.
    Full,
    /// The queue has no buffer yet: take one from the write pool.
    NoBuffer,
}

/// The bytes a placement reserves room for and writes.
enum Bytes<'a> {
    /// The first `len` bytes of a queue's buffer.
    Queued(&'a SegBuf, usize),
    /// A caller's bytes (a write too large to queue, or an append that needs its
    /// offset).
    Given(&'a [u8]),
}

impl FileState {
    /// No append queued and none being placed.
    pub(crate) fn appends_idle(&self) -> bool {
        self.appends.lock().len == 0 && self.placing.try_lock().is_ok()
    }
}

impl Client {
    /// Whether appends are queued (else each is placed when it is made).
    fn queues_appends(&self) -> bool {
        self.config.write_buffer_file_bytes > 0 && self.config.append_linger_ms > 0
    }

    /// Bytes one file's queue holds at most.
    fn append_bound(&self) -> usize {
        APPEND_QUEUE_BYTES.min(self.data.write_pool.seg_bytes())
    }

    /// Appends `data` (one `write(2)` on an `O_APPEND` handle) to the file's queue and
    /// returns; it is placed later (see the module's notes). Returns where this mount's
    /// cached pages of the file may have gone stale from, when it may have: the end
    /// this client knew when the write started a new batch, or where a write placed
    /// alone went.
    pub(crate) async fn append_queued(&self, fh: &FileHandle, data: &[u8]) -> Result<Option<u64>> {
        fh.check_write_error()?;
        if data.is_empty() {
            return Ok(None);
        }
        if !self.queues_appends() || data.len() > self.append_bound() {
            return self.append(fh, data).await.map(Some);
        }
        let st = &fh.state;
        let mut spare = None;
        loop {
            let end = st.size();
            match self.push(st, data, &mut spare) {
                Push::Queued { first } => return Ok(first.then_some(end)),
                Push::Full => {
                    self.place_appends(st).await;
                    fh.check_write_error()?;
                }
                Push::NoBuffer => spare = Some(self.take_write_buffer().await?),
            }
        }
    }

    /// Queues `data` at once if the file's queue has begun and has room and no failure
    /// waits to be reported: a FUSE append answered on the thread that read it, as a
    /// plain write is ([`Client::try_write_now`]). `None`: use
    /// `Client::append_queued`.
    pub fn try_append_now(&self, fh: &FileHandle, data: &[u8]) -> Option<Result<usize>> {
        if !self.queues_appends() || data.is_empty() || fh.has_unreported_error() {
            return None;
        }
        match self.push(&fh.state, data, &mut None) {
            Push::Queued { first: false } => Some(Ok(data.len())),
            // Without a spare buffer an empty queue is never pushed to.
            Push::Queued { first: true } | Push::Full | Push::NoBuffer => None,
        }
    }

    /// One attempt to queue `data`, with `spare` as the queue's buffer if it has none.
    fn push(&self, st: &Arc<FileState>, data: &[u8], spare: &mut Option<SegBuf>) -> Push {
        let mut q = st.appends.lock();
        if q.len + data.len() > self.append_bound() {
            return Push::Full;
        }
        if q.buf.is_none() {
            match spare.take() {
                Some(buf) => q.buf = Some(buf),
                None => return Push::NoBuffer,
            }
        }
        let at = q.len;
        let Some(buf) = &q.buf else {
            return Push::NoBuffer;
        };
        buf.mr().lock()[at..at + data.len()].copy_from_slice(data);
        q.len += data.len();
        let arm = !q.lingering;
        q.lingering = true;
        drop(q);
        if arm {
            self.spawn_linger(st);
        }
        Push::Queued { first: at == 0 }
    }

    /// Starts the file's linger task: it places the queue every `append_linger_ms`
    /// while there is one, and ends when it finds the queue empty.
    fn spawn_linger(&self, st: &Arc<FileState>) {
        let (client, st) = (self.arc(), st.clone());
        let linger = Duration::from_millis(self.config.append_linger_ms);
        self.rt.spawn(async move {
            loop {
                tokio::time::sleep(linger).await;
                client.place_appends(&st).await;
                let mut q = st.appends.lock();
                if q.len == 0 {
                    q.lingering = false;
                    return;
                }
            }
        });
    }

    /// Places the file's queued appends and waits for a placement in progress: when it
    /// returns, every append queued before the call is on the data servers and in the
    /// length the metadata server keeps, or its failure is recorded for the handles to
    /// report.
    pub(crate) async fn place_appends(&self, st: &Arc<FileState>) {
        if st.appends_idle() {
            return;
        }
        let _placing = st.placing.lock().await;
        self.place_queue(st).await;
    }

    /// Places the queue and keeps other placements out until the guard is dropped: a
    /// truncation holds it across its cut, so that a linger placement cannot reserve
    /// at the old end and write past the new one.
    pub(crate) async fn hold_appends<'a>(
        &self,
        st: &'a Arc<FileState>,
    ) -> tokio::sync::MutexGuard<'a, ()> {
        let guard = st.placing.lock().await;
        self.place_queue(st).await;
        guard
    }

    /// Places the queue; the caller holds `st.placing`. A failure is recorded.
    async fn place_queue(&self, st: &Arc<FileState>) {
        let (buf, len) = {
            let mut q = st.appends.lock();
            (q.buf.take(), std::mem::take(&mut q.len))
        };
        let Some(buf) = buf.filter(|_| len > 0) else {
            return;
        };
        if let Err(e) = self.reserve_and_store(st, Bytes::Queued(&buf, len)).await {
            tracing::warn!(ino = %st.ino, bytes = len, error = %e, "placing appends failed");
            st.write_failed(WireError::new(e.code(), e.to_string()));
        }
    }

    /// Appends `data` at the end of the file as the metadata server sees it, after the
    /// appends queued before it, and returns where it went: for callers that need the
    /// offset (the library API). A failure of this append is returned; one of the
    /// queue's is recorded, and fails this append too.
    pub async fn append(&self, fh: &FileHandle, data: &[u8]) -> Result<u64> {
        fh.check_write_error()?;
        let _placing = fh.state.placing.lock().await;
        self.place_queue(&fh.state).await;
        fh.check_write_error()?;
        self.reserve_and_store(&fh.state, Bytes::Given(data)).await
    }

    /// Reserves room for `bytes` at the end of the file (`fs::Append`) and writes them
    /// there; returns where. Earlier buffered writes of this client are committed
    /// first, so the end the server knows is past them. The caller holds `st.placing`.
    async fn reserve_and_store(&self, st: &Arc<FileState>, bytes: Bytes<'_>) -> Result<u64> {
        self.commit_written(st).await?;
        let len = match bytes {
            Bytes::Queued(_, len) => len,
            Bytes::Given(data) => data.len(),
        };
        let before = st.write_gen();
        let at = self
            .meta(fs::Append {
                ino: st.ino,
                len: len as u64,
            })
            .await?;
        match bytes {
            Bytes::Queued(buf, _) => {
                let sent = self
                    .data
                    .transfer_range(st, at, len, buf.mr(), 0, true)
                    .await;
                // After the bytes are stored, so that no fetch can cache the old ones.
                st.drop_cache();
                st.stored(&sent?);
                st.wrote(at, at + len as u64);
            }
            Bytes::Given(data) => {
                self.write_through(st, at, data).await?;
            }
        }
        // The reservation already committed this write's length. Writes through other
        // handles that landed meanwhile were not: then the commit stays due.
        if let Some((_, generation)) = st.pending_commit() {
            if generation == before + 1 {
                st.committed(generation);
            }
        }
        Ok(at)
    }
}
