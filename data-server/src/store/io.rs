//! What the chunk store counts of its own work: operations, bytes and time of its
//! reads, writes and fsyncs, and the checksum failures it finds, by what it was doing.
//! The counters are resolved once when the store is given them
//! ([`ChunkStore::count_io`]), so an operation adds to atomics and looks nothing up.

use super::ChunkStore;
use crate::error::DataError;
use std::time::{Duration, Instant};
use telemetry::{Histogram, IntCounter, Metrics, TelemetryError};

/// A store operation timed and counted (the `op` label of the store's metrics).
#[derive(Clone, Copy, Debug)]
pub(crate) enum IoOp {
    /// Chunk bytes read (a client's read, a whole chunk for a peer or a check).
    Read = 0,
    /// Chunk bytes written (a piece of a write, zeros, a copy installed).
    Write = 1,
    /// Chunk files and their directories made durable.
    Fsync = 2,
}

const IO_OPS: [&str; 3] = ["read", "write", "fsync"];

/// What the store was reading when it found a checksum failure (the `found` label of
/// `tessera_data_checksum_failures_total`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Found {
    /// Blocks of a read (a client's, or a peer's piece).
    Read = 0,
    /// The block a partial write merges with (the write is refused).
    Write = 1,
    /// A whole chunk: for a peer's resync or repair, or a `fsck` check.
    Fetch = 2,
    /// A chunk's header and replica fields: before every read and chain write, and
    /// for the chunk listings of the resync and the store sweep.
    Header = 3,
}

const FOUND: [&str; 4] = ["read", "write", "fetch", "header"];

/// The store's counters (see the module docs).
pub struct StoreIo {
    ops: [IntCounter; 3],
    /// Bytes of reads and writes (no bytes for an fsync).
    bytes: [IntCounter; 2],
    seconds: [Histogram; 3],
    checksum_failures: [IntCounter; 4],
}

impl StoreIo {
    /// Registers the store's metrics in `m`.
    pub fn register(m: &Metrics) -> Result<StoreIo, TelemetryError> {
        let ops = m.counter_vec(
            "tessera_data_store_operations_total",
            "Chunk store operations (read, write, fsync), failed ones included.",
            &["op"],
        )?;
        let bytes = m.counter_vec(
            "tessera_data_store_bytes_total",
            "Chunk bytes the store read and wrote (client requests, chain writes and \
             resync copies alike), by operation (read, write).",
            &["op"],
        )?;
        let seconds = m.histogram_vec(
            "tessera_data_store_duration_seconds",
            "Time of one chunk store operation (read, write, fsync): a read's chunk lock \
             wait included, a write's not (taken before it).",
            telemetry::latency_buckets(),
            &["op"],
        )?;
        let failures = m.counter_vec(
            "tessera_data_checksum_failures_total",
            "Checksum failures the chunk store detected (a block whose crc32c did not \
             match, or a damaged chunk header; a damaged chunk counts at every \
             detection until repaired), by what was being read: read (blocks of a \
             read), write (the block a partial write merges with), fetch (a whole chunk \
             for a peer's resync or repair, or fsck), header (a chunk's header, before \
             reads and in the listings of the resync and the sweep).",
            &["found"],
        )?;
        Ok(StoreIo {
            ops: IO_OPS.map(|op| ops.with_label_values(&[op])),
            bytes: [IO_OPS[0], IO_OPS[1]].map(|op| bytes.with_label_values(&[op])),
            seconds: IO_OPS.map(|op| seconds.with_label_values(&[op])),
            checksum_failures: FOUND.map(|f| failures.with_label_values(&[f])),
        })
    }

    fn done(&self, op: IoOp, bytes: u64, took: Duration, ok: bool) {
        self.ops[op as usize].inc();
        self.seconds[op as usize].observe(took.as_secs_f64());
        if ok {
            if let Some(b) = self.bytes.get(op as usize) {
                b.inc_by(bytes);
            }
        }
    }

    fn checksum_failure(&self, found: Found) {
        self.checksum_failures[found as usize].inc();
    }
}

impl ChunkStore {
    /// Counts this store's operations in `io` from now on.
    pub fn count_io(mut self, io: StoreIo) -> ChunkStore {
        self.io = Some(io);
        self
    }

    /// Runs store operation `op` of `bytes` bytes, counting it (its bytes if it
    /// succeeds) and its time.
    pub(super) fn counted<T>(
        &self,
        op: IoOp,
        bytes: u64,
        f: impl FnOnce() -> Result<T, DataError>,
    ) -> Result<T, DataError> {
        let Some(io) = &self.io else {
            return f();
        };
        let started = Instant::now();
        let r = f();
        io.done(op, bytes, started.elapsed(), r.is_ok());
        r
    }

    /// Counts the failure of `r`, if it is a checksum failure, as found in `found`;
    /// returns `r`.
    pub(super) fn noted<T>(&self, found: Found, r: Result<T, DataError>) -> Result<T, DataError> {
        if let (Some(io), Err(e)) = (&self.io, &r) {
            if e.is_checksum_failure() {
                io.checksum_failure(found);
            }
        }
        r
    }
}
