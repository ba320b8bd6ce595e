//! The client's metrics: calls sent by server kind and type with their latency, chunk
//! bytes moved to and from data servers, retries, and the segment buffers in use.
//! Served by a mount on `[metrics] listen` (see `cli::commands`).

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
        Ok(ClientMetrics {
            metrics,
            meta,
            data,
            read_bytes: data_bytes.with_label_values(&["read"]),
            written_bytes: data_bytes.with_label_values(&["written"]),
            retries,
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
            DataRequest::WriteChunk(r) => self.written_bytes.inc_by(r.src.len),
            DataRequest::WriteInline(r) => self.written_bytes.inc_by(r.data.len() as u64),
            _ => {}
        }
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
