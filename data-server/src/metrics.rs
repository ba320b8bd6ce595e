//! The data server's metrics: requests served by type, bytes moved, the one-sided
//! transfers it issues (bytes and time), the chunk store's I/O and checksum failures
//! (`store/io.rs`), and what the store and the listener say at each scrape.

use crate::error::StartError;
use crate::store::{ChunkStore, StoreIo};
use proto::data::{DataRequest, InlineRange, ReplicaData};
use std::sync::{Arc, Weak};
use std::time::Duration;
use telemetry::{Histogram, IntCounter, Metrics, RequestFamilies, RequestMetrics};
use telemetry::{MetricsConfig, MetricsServer, TelemetryError};
use transport::Listener;

/// What the request handler counts.
pub struct DataMetrics {
    metrics: Arc<Metrics>,
    requests: RequestMetrics,
    /// Bytes by direction (`read`, `written`, `replicated`: the label sets of
    /// `tessera_data_bytes_total`, resolved once, so a request looks nothing up).
    bytes: [IntCounter; 3],
    /// One-sided transfers this server issued, by [`OneSided`]: bytes and time.
    one_sided_bytes: [IntCounter; 2],
    one_sided_seconds: [Histogram; 2],
}

/// A one-sided operation this server issues (the `op` label of its metrics).
#[derive(Clone, Copy, Debug)]
pub(crate) enum OneSided {
    /// A READ of a peer's granted buffer: a client's write, or a chain predecessor's.
    Read = 0,
    /// A WRITE into a peer's granted buffer: a client's read, or a copy for a resync.
    Write = 1,
}

impl DataMetrics {
    /// Registers the request families and the byte counters.
    pub fn new() -> Result<DataMetrics, TelemetryError> {
        let metrics = Metrics::new()?;
        let families = RequestFamilies::register(&metrics, "tessera_server")?;
        let requests = families.server("data", DataRequest::NAMES);
        let bytes = metrics.counter_vec(
            "tessera_data_bytes_total",
            "Chunk bytes moved by requests answered without error, by direction (read: to \
             clients; written: from clients; replicated: from a chain predecessor). A \
             resync's copies are not counted.",
            &["direction"],
        )?;
        let one_sided_bytes = metrics.counter_vec(
            "tessera_data_one_sided_bytes_total",
            "Bytes of the one-sided transfers this server issued and that succeeded, by \
             operation: read (a READ of a client's or a predecessor's buffer, for a \
             write), write (a WRITE into a client's buffer for a read, or a peer's for a \
             resync copy). On tcp, the emulated operations.",
            &["op"],
        )?;
        let one_sided_seconds = metrics.histogram_vec(
            "tessera_data_one_sided_duration_seconds",
            "Time of one one-sided transfer this server issued (at most one buffer), from \
             its start to its completion, by operation (read, write).",
            telemetry::latency_buckets(),
            &["op"],
        )?;
        let ops = ["read", "write"];
        Ok(DataMetrics {
            metrics,
            requests,
            bytes: DIRECTIONS.map(|d| bytes.with_label_values(&[d])),
            one_sided_bytes: ops.map(|op| one_sided_bytes.with_label_values(&[op])),
            one_sided_seconds: ops.map(|op| one_sided_seconds.with_label_values(&[op])),
        })
    }

    /// The chunk store's metrics, registered here (give them to the store with
    /// `ChunkStore::count_io`).
    pub fn store_io(&self) -> Result<StoreIo, TelemetryError> {
        StoreIo::register(&self.metrics)
    }

    /// Counts a one-sided transfer of `bytes` that took `took`.
    pub(crate) fn one_sided(&self, op: OneSided, bytes: u64, took: Duration) {
        self.one_sided_bytes[op as usize].inc_by(bytes);
        self.one_sided_seconds[op as usize].observe(took.as_secs_f64());
    }

    /// Counts one request `name` whose payload was `moved` and whose encoded answer is
    /// `answer`.
    pub(crate) fn record(&self, name: &str, moved: Payload, took: Duration, answer: &[u8]) {
        let failed = proto::rpc::is_error(answer);
        self.requests.record(name, took, failed);
        if let (false, Some((direction, n))) = (failed, moved.0) {
            self.bytes[direction as usize].inc_by(n);
        }
    }

    /// Starts the endpoint `config` asks for, with the store's and `listener`'s gauges.
    pub async fn serve(
        &self,
        config: &MetricsConfig,
        store: &Arc<ChunkStore>,
        listener: &Arc<Listener>,
        transport: &'static str,
    ) -> Result<Option<MetricsServer>, StartError> {
        if !config.enabled() {
            return Ok(None);
        }
        on_scrape(
            &self.metrics,
            Arc::downgrade(store),
            Arc::downgrade(listener),
            transport,
        )
        .map_err(StartError::Metrics)?;
        MetricsServer::from_config(config, self.metrics.clone())
            .await
            .map_err(StartError::Metrics)
    }
}

/// The label values of `tessera_data_bytes_total`, in [`Direction`]'s order.
const DIRECTIONS: [&str; 3] = ["read", "written", "replicated"];

/// Which way a request moves chunk bytes.
#[derive(Clone, Copy, Debug)]
enum Direction {
    Read = 0,
    Written = 1,
    Replicated = 2,
}

/// The chunk bytes a request moves, and which way (`None`: none).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Payload(Option<(Direction, u64)>);

impl Payload {
    /// What `req` moves if it succeeds.
    pub(crate) fn of(req: &DataRequest) -> Payload {
        use DataRequest as D;
        use Direction::{Read, Replicated, Written};
        Payload(match req {
            D::ReadChunk(r) => Some((Read, u64::from(r.len))),
            D::ReadInline(r) => Some((Read, u64::from(r.len))),
            D::WriteChunk(r) => Some((Written, r.src.len)),
            D::WriteInline(r) => Some((Written, r.data.len() as u64)),
            D::WriteRanges(r) => Some((Written, ranges_len(&r.ranges))),
            D::Replicate(r) => match &r.data {
                ReplicaData::Bytes(b) => Some((Replicated, b.len)),
                ReplicaData::Inline(d) => Some((Replicated, d.len() as u64)),
                ReplicaData::Ranges(r) => Some((Replicated, ranges_len(r))),
                ReplicaData::Zeros(_) => None,
            },
            _ => None,
        })
    }
}

/// Bytes of a write's ranges.
fn ranges_len(ranges: &[InlineRange]) -> u64 {
    ranges.iter().map(|r| r.data.len() as u64).sum()
}

fn on_scrape(
    m: &Metrics,
    store: Weak<ChunkStore>,
    listener: Weak<Listener>,
    transport: &'static str,
) -> Result<(), TelemetryError> {
    let capacity = m.gauge("tessera_data_capacity_bytes", "The store's capacity.")?;
    let used = m.gauge("tessera_data_used_bytes", "Bytes charged to chunks.")?;
    let chunks = m.gauge("tessera_data_chunk_files", "Chunk files in the store.")?;
    let connections = m.gauge_vec(
        "tessera_connections",
        "Open connections accepted, by transport and peer kind.",
        &["transport", "peer"],
    )?;
    m.on_scrape(move || {
        if let Some(u) = store.upgrade().and_then(|s| s.usage().ok()) {
            capacity.set(u.capacity_bytes as i64);
            used.set(u.used_bytes as i64);
            chunks.set(u.chunks as i64);
        }
        if let Some(l) = listener.upgrade() {
            for (peer, n) in l.peer_counts().by_kind() {
                connections
                    .with_label_values(&[transport, peer])
                    .set(n as i64);
            }
        }
    });
    Ok(())
}
