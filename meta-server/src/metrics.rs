//! The metadata server's metrics: requests served by type, group commits, and what the
//! namespace and the cluster map say at each scrape (sessions, locks, chain members,
//! replication, connections).

use crate::error::StartError;
use crate::namespace::Namespace;
use proto::meta::{ClusterStatus, MemberState, MetaRequest, NodeState};
use std::sync::Arc;
use std::time::{Duration, Instant};
use telemetry::{
    Histogram, IntGauge, IntGaugeVec, Metrics, RequestFamilies, RequestMetrics, TelemetryError,
};
use transport::Listener;

/// Time between two walks of every inode record for the chunk gauges (the last
/// [`ClusterStatus`] is shown meanwhile): a walk is too costly for every scrape.
pub const STATUS_REFRESH: Duration = Duration::from_secs(30);

/// What the request handler counts.
pub(crate) struct MetaMetrics {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) requests: RequestMetrics,
}

impl MetaMetrics {
    /// Registers the request families and the group-commit metrics of `ns`.
    pub(crate) fn new(ns: &Namespace) -> Result<MetaMetrics, StartError> {
        let made = || -> Result<MetaMetrics, TelemetryError> {
            let metrics = Metrics::new()?;
            let families = RequestFamilies::register(&metrics, "tessera_server")?;
            let requests = families.server("meta", &MetaRequest::names());
            observe_commits(&metrics, ns)?;
            Ok(MetaMetrics { metrics, requests })
        };
        made().map_err(StartError::Metrics)
    }
}

/// Counts each durable group: its batches (one per mutation) and how long logging took.
fn observe_commits(metrics: &Metrics, ns: &Namespace) -> Result<(), TelemetryError> {
    let commits = metrics.counter(
        "tessera_meta_commits_total",
        "Namespace mutations made durable (batches staged in the group commit).",
    )?;
    let groups = metrics.counter(
        "tessera_meta_commit_groups_total",
        "Groups the group commit logged durably, each holding one or more mutations.",
    )?;
    let sizes: Histogram = metrics.histogram(
        "tessera_meta_commit_group_size",
        "Mutations per durable group.",
        prometheus_powers_of_two(10),
    )?;
    let seconds = metrics.histogram(
        "tessera_meta_commit_duration_seconds",
        "Time to log one group durably (about one fsync).",
        telemetry::latency_buckets(),
    )?;
    ns.observe_commits(Box::new(move |batches, took| {
        commits.inc_by(batches as u64);
        groups.inc();
        sizes.observe(batches as f64);
        seconds.observe(took.as_secs_f64());
    }));
    Ok(())
}

/// 1, 2, 4, ... 2^(n-1).
fn prometheus_powers_of_two(n: i32) -> Vec<f64> {
    (0..n).map(|i| f64::from(2i32.pow(i as u32))).collect()
}

/// The gauges a scrape brings up to date.
struct ScrapeGauges {
    sessions: IntGauge,
    open_files: IntGauge,
    locks: IntGauge,
    waiting_resume: IntGauge,
    nodes: IntGaugeVec,
    members: IntGaugeVec,
    map_version: IntGauge,
    chunks: IntGauge,
    under_replicated: IntGauge,
    resync: IntGaugeVec,
    connections: IntGaugeVec,
}

impl ScrapeGauges {
    fn register(m: &Metrics) -> Result<ScrapeGauges, TelemetryError> {
        Ok(ScrapeGauges {
            sessions: m.gauge("tessera_meta_open_sessions", "Open-file sessions.")?,
            open_files: m.gauge("tessera_meta_open_files", "Files with a session open.")?,
            locks: m.gauge("tessera_meta_locks_held", "Byte-range locks held.")?,
            waiting_resume: m.gauge(
                "tessera_meta_connections_waiting_resume",
                "Broken client connections whose sessions wait for the client to resume.",
            )?,
            nodes: m.gauge_vec(
                "tessera_data_servers",
                "Data servers in the cluster map, by state (up, down).",
                &["state"],
            )?,
            members: m.gauge_vec(
                "tessera_chain_members",
                "Members of replication chains, by state (serving, syncing, offline).",
                &["state"],
            )?,
            map_version: m.gauge("tessera_cluster_map_version", "The cluster map's version.")?,
            chunks: m.gauge(
                "tessera_chunks",
                "Chunks over every file (as of the last status).",
            )?,
            under_replicated: m.gauge(
                "tessera_under_replicated_chunks",
                "Chunks whose chain has fewer serving members than the file asks for.",
            )?,
            resync: m.gauge_vec(
                "tessera_resync_chunks",
                "Resync progress per resyncing data server: chunks compared, copied, and \
                 the pass's total.",
                &["node", "what"],
            )?,
            connections: m.gauge_vec(
                "tessera_connections",
                "Open connections accepted, by transport and peer kind.",
                &["transport", "peer"],
            )?,
        })
    }

    fn show_status(&self, st: &ClusterStatus) {
        self.chunks.set(st.chunks as i64);
        self.under_replicated.set(st.under_replicated_chunks as i64);
        self.resync.reset();
        for r in &st.resync {
            let node = r.node.0.to_string();
            for (what, v) in [
                ("compared", r.compared),
                ("copied", r.copied),
                ("total", r.total),
            ] {
                self.resync.with_label_values(&[&node, what]).set(v as i64);
            }
        }
    }
}

/// Registers the gauges read at each scrape from `ns` and `listener`, and starts the
/// status walk that refreshes the chunk gauges.
pub(crate) fn on_scrape(
    metrics: &Metrics,
    ns: &Arc<Namespace>,
    listener: &Arc<Listener>,
    transport: &'static str,
) -> Result<(), StartError> {
    let g = Arc::new(ScrapeGauges::register(metrics).map_err(StartError::Metrics)?);
    start_status_walk(Arc::downgrade(ns), g.clone());
    let (ns, listener) = (Arc::downgrade(ns), Arc::downgrade(listener));
    metrics.on_scrape(move || {
        let (Some(ns), Some(listener)) = (ns.upgrade(), listener.upgrade()) else {
            return;
        };
        let n = ns.gauges();
        g.sessions.set(n.open_sessions as i64);
        g.open_files.set(n.open_files as i64);
        g.locks.set(n.locks_held as i64);
        g.waiting_resume.set(n.waiting_resume as i64);
        // The map as last made: a scrape must not reconcile (and perhaps change) it.
        show_map(&g, &ns.current_map());
        show_connections(&g, &listener, transport);
    });
    Ok(())
}

/// Walks every inode for the chunk and resync gauges every [`STATUS_REFRESH`] on a
/// thread of its own, until the namespace is gone: a scrape only reads what the last
/// walk found (on a large namespace a walk outlasts a scrape's timeout).
fn start_status_walk(ns: std::sync::Weak<Namespace>, g: Arc<ScrapeGauges>) {
    const POLL: Duration = Duration::from_secs(1);
    let walk = move || {
        let mut last: Option<Instant> = None;
        loop {
            let Some(ns) = ns.upgrade() else {
                return;
            };
            if last.is_none_or(|t| t.elapsed() >= STATUS_REFRESH) {
                match ns.status() {
                    Ok(st) => g.show_status(&st),
                    Err(e) => tracing::warn!(error = %e, "status walk for metrics failed"),
                }
                last = Some(Instant::now());
            }
            drop(ns);
            std::thread::sleep(POLL);
        }
    };
    if let Err(e) = std::thread::Builder::new()
        .name("metrics-status".into())
        .spawn(walk)
    {
        tracing::warn!(error = %e, "no status walk for metrics: chunk gauges stay 0");
    }
}

fn show_map(g: &ScrapeGauges, map: &proto::meta::ClusterMap) {
    g.map_version.set(map.version as i64);
    let up = map
        .nodes
        .iter()
        .filter(|n| n.state == NodeState::Up)
        .count();
    g.nodes.with_label_values(&["up"]).set(up as i64);
    g.nodes
        .with_label_values(&["down"])
        .set((map.nodes.len() - up) as i64);
    let members = map.chains.iter().flat_map(|c| c.members.iter());
    let mut counts = [0i64; 3];
    for m in members {
        counts[match m.state {
            MemberState::Serving => 0,
            MemberState::Syncing => 1,
            MemberState::Offline => 2,
        }] += 1;
    }
    for (state, n) in ["serving", "syncing", "offline"].into_iter().zip(counts) {
        g.members.with_label_values(&[state]).set(n);
    }
}

fn show_connections(g: &ScrapeGauges, listener: &Listener, transport: &'static str) {
    for (peer, n) in listener.peer_counts().by_kind() {
        g.connections
            .with_label_values(&[transport, peer])
            .set(n as i64);
    }
}

/// Starts the endpoint `config` asks for, with the scrape-time gauges of `ns` and
/// `listener`; `None` when metrics are off.
pub(crate) async fn serve(
    config: &telemetry::MetricsConfig,
    mm: &MetaMetrics,
    ns: &Arc<Namespace>,
    listener: &Arc<Listener>,
    transport: &'static str,
) -> Result<Option<telemetry::MetricsServer>, StartError> {
    if !config.enabled() {
        return Ok(None);
    }
    on_scrape(&mm.metrics, ns, listener, transport)?;
    let server = telemetry::MetricsServer::from_config(config, mm.metrics.clone()).await;
    server.map_err(StartError::Metrics)
}
