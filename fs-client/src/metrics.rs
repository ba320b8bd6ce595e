//! The client's metrics: calls sent by server kind and type with their latency, chunk
//! bytes moved to and from data servers, retries and failovers, readahead hits and
//! misses, checksum failures reported by data servers, the segment buffers in use and
//! the mount's own connections. Served by a mount on `[metrics] listen` (see
//! `cli::commands`).

use crate::segpool::SegPool;
use proto::data::DataRequest;
use proto::meta::MetaRequest;
use std::sync::Arc;
use telemetry::TelemetryError;
use telemetry::{InFlight, IntCounter, Metrics, RequestFamilies, RequestMetrics};

/// What one client counts.
pub struct ClientMetrics {
    metrics: Arc<Metrics>,
    meta: RequestMetrics,
    data: RequestMetrics,
    /// Chunk bytes read and written by data calls that succeeded (the two label sets of
    /// `tessera_client_data_bytes_total`, resolved once: no lookup per call).
    read_bytes: IntCounter,
    written_bytes: IntCounter,
    pub(crate) retries: IntCounter,
    /// Reads served from segments cached or on their way (`hit`), and reads that had
    /// to fetch for themselves (`miss`).
    readahead_hits: IntCounter,
    readahead_misses: IntCounter,
    /// Data calls that went to another chain member after one failed, by operation.
    failovers: [IntCounter; 2],
    /// Data calls answered `Corrupt`: a copy failed its checksum on the server.
    checksum_failures: IntCounter,
    /// Unlinks answered before the metadata server had them, and those it refused.
    deferred_removes: IntCounter,
    deferred_remove_failures: IntCounter,
}

/// The data operations a failover is counted for (the label of
/// `tessera_client_failovers_total`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum FailoverOp {
    /// A read of a piece, from another serving member.
    Read = 0,
    /// A write of a piece, through another head of its chain.
    Write = 1,
}

/// What the scrape-time connection gauges read from the client.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LinkCounts {
    /// Whether the metadata connection is open.
    pub meta_open: bool,
    /// Open connections to data servers.
    pub data_open: usize,
    /// Metadata connections made so far, the first included.
    pub meta_made: u64,
}

impl ClientMetrics {
    /// Registers the client's metrics in a registry of its own.
    pub fn new() -> Result<ClientMetrics, TelemetryError> {
        let metrics = Metrics::new()?;
        let families = RequestFamilies::register(&metrics, "tessera_client")?;
        let meta = families.server("meta", &MetaRequest::names());
        let data = families.server("data", DataRequest::NAMES);
        let data_bytes = metrics.counter_vec(
            "tessera_client_data_bytes_total",
            "Chunk bytes moved by data calls that succeeded (one-sided transfers and \
             inline writes), by direction (read, written); readahead included.",
            &["direction"],
        )?;
        let retries = metrics.counter(
            "tessera_client_retries_total",
            "Requests tried again after a failure: a stale map, a busy or unreachable \
             server, another member of the chain (a failover), a metadata call on a new \
             connection.",
        )?;
        let readahead = metrics.counter_vec(
            "tessera_client_readahead_total",
            "Reads by whether readahead had their bytes: hit (served from segments already \
             cached or being fetched), miss (the read fetched for itself: a segment it \
             started, or a direct read).",
            &["result"],
        )?;
        let failovers = metrics.counter_vec(
            "tessera_client_failovers_total",
            "Data calls sent to another chain member after a call to one failed (each is \
             also a retry), by operation (read, write).",
            &["op"],
        )?;
        let checksum_failures = metrics.counter(
            "tessera_client_checksum_failures_total",
            "Data calls a data server answered Corrupt: its copy failed its checksum (the \
             read goes to another member; no such bytes are ever returned).",
        )?;
        let deferred_removes = metrics.counter(
            "tessera_client_deferred_removes_total",
            "Unlinks the mount answered before the metadata server had them (defer_removes).",
        )?;
        let deferred_remove_failures = metrics.counter(
            "tessera_client_deferred_remove_failures_total",
            "Of those, the ones the metadata server refused: the file is still there, and \
             the directory's next fsync fails.",
        )?;
        Ok(ClientMetrics {
            metrics,
            meta,
            data,
            read_bytes: data_bytes.with_label_values(&["read"]),
            written_bytes: data_bytes.with_label_values(&["written"]),
            retries,
            readahead_hits: readahead.with_label_values(&["hit"]),
            readahead_misses: readahead.with_label_values(&["miss"]),
            failovers: ["read", "write"].map(|op| failovers.with_label_values(&[op])),
            checksum_failures,
            deferred_removes,
            deferred_remove_failures,
        })
    }

    /// The registry, for the endpoint.
    pub fn registry(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Metadata calls sent so far.
    pub(crate) fn meta_calls(&self) -> u64 {
        self.meta.total()
    }

    /// Metadata calls `name` sent so far.
    pub(crate) fn meta_calls_of(&self, name: &str) -> u64 {
        self.meta.count(name)
    }

    /// Data calls sent so far.
    pub(crate) fn data_calls(&self) -> u64 {
        self.data.total()
    }

    /// Counts a metadata call `name` as sent (what `RpcCounts` reads); finish the
    /// guard with its outcome.
    pub(crate) fn meta_call(&self, name: &str) -> InFlight<'_> {
        self.meta.start(name)
    }

    /// Counts a data call as sent; finish the guard with its outcome.
    pub(crate) fn data_call(&self, req: &DataRequest) -> InFlight<'_> {
        self.data.start(req.name())
    }

    /// Counts the chunk bytes data call `req` moved, once it succeeded.
    pub(crate) fn data_moved(&self, req: &DataRequest) {
        match req {
            DataRequest::ReadChunk(r) => self.read_bytes.inc_by(u64::from(r.len)),
            DataRequest::ReadInline(r) => self.read_bytes.inc_by(u64::from(r.len)),
            DataRequest::WriteChunk(r) => self.written_bytes.inc_by(r.src.len),
            DataRequest::WriteInline(r) => self.written_bytes.inc_by(r.data.len() as u64),
            DataRequest::WriteRanges(r) => {
                let bytes = r.ranges.iter().map(|x| x.data.len() as u64).sum();
                self.written_bytes.inc_by(bytes)
            }
            _ => {}
        }
    }

    /// Counts a read served from readahead (`hit`) or not.
    pub(crate) fn readahead(&self, hit: bool) {
        match hit {
            true => self.readahead_hits.inc(),
            false => self.readahead_misses.inc(),
        }
    }

    /// Counts a data call of `op` sent to another member after one failed.
    pub(crate) fn failover(&self, op: FailoverOp) {
        self.failovers[op as usize].inc();
    }

    /// Counts an unlink answered before the metadata server had it.
    pub(crate) fn deferred_remove(&self) {
        self.deferred_removes.inc();
    }

    /// Counts such an unlink the metadata server refused.
    pub(crate) fn deferred_remove_failed(&self) {
        self.deferred_remove_failures.inc();
    }

    /// Counts a data call answered `Corrupt`.
    pub(crate) fn checksum_failure(&self) {
        self.checksum_failures.inc();
    }

    /// Shows the mount's connections and the metadata reconnects at each scrape, from
    /// what `counts` reads (`None`: the client is gone, nothing changes). `transport`
    /// is the backend's name.
    pub(crate) fn watch_links(
        &self,
        transport: &'static str,
        counts: impl Fn() -> Option<LinkCounts> + Send + Sync + 'static,
    ) -> Result<(), TelemetryError> {
        let conns = self.metrics.gauge_vec(
            "tessera_client_connections",
            "Open connections this mount made, by transport and peer kind (meta, data).",
            &["transport", "peer"],
        )?;
        let reconnects = self.metrics.counter(
            "tessera_client_meta_reconnects_total",
            "Metadata connections made after the first: the connection was lost (a \
             server restart, a network cut) and made again.",
        )?;
        let (meta, data) = (
            conns.with_label_values(&[transport, "meta"]),
            conns.with_label_values(&[transport, "data"]),
        );
        self.metrics.on_scrape(move || {
            let Some(c) = counts() else {
                return;
            };
            meta.set(i64::from(c.meta_open));
            data.set(c.data_open as i64);
            // The link counts its connections; the counter catches up with it (hooks
            // run one scrape at a time).
            let again = c.meta_made.saturating_sub(1);
            reconnects.inc_by(again.saturating_sub(reconnects.get()));
        });
        Ok(())
    }

    /// Shows the bytes of segment buffers in use at each scrape: readahead (`read`) and
    /// buffered writes not yet on the data servers (`write`, the write-behind).
    pub(crate) fn watch_pools(
        &self,
        read: &Arc<SegPool>,
        write: &Arc<SegPool>,
    ) -> Result<(), TelemetryError> {
        let g = self.metrics.gauge_vec(
            "tessera_client_buffer_bytes",
            "Bytes of registered segment buffers in use, by pool (read: readahead; write: \
             written data not yet sent, the write-behind).",
            &["pool"],
        )?;
        let (read, write) = (Arc::downgrade(read), Arc::downgrade(write));
        self.metrics.on_scrape(move || {
            for (pool, p) in [("read", &read), ("write", &write)] {
                if let Some(p) = p.upgrade() {
                    g.with_label_values(&[pool]).set(p.in_use_bytes() as i64);
                }
            }
        });
        Ok(())
    }
}
