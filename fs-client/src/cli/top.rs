//! `tessera top`: a live view of mounts and servers from their Prometheus endpoints:
//! requests per second by type, bytes per second, latency percentiles over the last
//! interval, and each process's CPU and memory (so each data server's load).
//!
//! Everything shown is a difference of two scrapes ([`view`], a pure function of them);
//! `--once --json` prints one such difference for scripts.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use telemetry::text::{self, Scrape};

/// Endpoints one `tessera top` watches at most.
pub const MAX_ENDPOINTS: usize = 256;

/// Shortest refresh interval (`--interval-ms`).
pub const MIN_INTERVAL_MS: u64 = 100;

/// The quantiles shown.
const QUANTILES: [(&str, f64); 3] = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)];

/// What kind of process an endpoint belongs to, from the metrics it serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A mount (or another client): `tessera_client_*`.
    Mount,
    /// The metadata server.
    Meta,
    /// A data server.
    Data,
    /// None of those.
    Unknown,
}

/// One endpoint over one interval.
#[derive(Clone, Debug, Serialize)]
pub struct EndpointView {
    /// The scraped address.
    pub endpoint: String,
    /// The process's kind.
    pub role: Role,
    /// Why it could not be scraped (then every other field is empty).
    pub error: Option<String>,
    /// Requests per second by type (types with none in the interval left out).
    pub ops_per_second: BTreeMap<String, f64>,
    /// All requests per second.
    pub total_ops_per_second: f64,
    /// Requests per second that failed.
    pub errors_per_second: f64,
    /// Chunk bytes read per second (a mount: from data servers; a data server: served).
    pub read_bytes_per_second: f64,
    /// Chunk bytes written per second (data servers count replication apart).
    pub written_bytes_per_second: f64,
    /// Latency percentiles over the interval, in seconds (`None`: no request).
    pub latency_seconds: Option<BTreeMap<&'static str, f64>>,
    /// CPU seconds per second (1.0: one core busy).
    pub cpu_cores: f64,
    /// Resident memory at the second scrape.
    pub resident_memory_bytes: f64,
}

/// One refresh: every endpoint over the same interval.
#[derive(Clone, Debug, Serialize)]
pub struct Frame {
    /// The interval's length.
    pub interval_seconds: f64,
    /// Each endpoint, in the order given.
    pub endpoints: Vec<EndpointView>,
}

/// The role of the process that served `s`.
pub fn role(s: &Scrape) -> Role {
    if s.kind("tessera_client_requests_total").is_some() {
        return Role::Mount;
    }
    match s
        .all("tessera_server_requests_total")
        .find_map(|x| x.label("server"))
    {
        Some("meta") => Role::Meta,
        Some("data") => Role::Data,
        _ => Role::Unknown,
    }
}

/// The families of requests a process of `role` counts, and of its bytes.
fn families(role: Role) -> (&'static str, &'static str) {
    match role {
        Role::Mount => ("tessera_client", "tessera_client_data_bytes_total"),
        _ => ("tessera_server", "tessera_data_bytes_total"),
    }
}

/// What `endpoint` did between scrapes `a` and `b`, `secs` apart.
pub fn view(endpoint: &str, a: &Scrape, b: &Scrape, secs: f64) -> EndpointView {
    let role = role(b);
    let (prefix, bytes) = families(role);
    let rate = |name: &str, labels: &[(&str, &str)]| {
        ((b.sum_where(name, labels) - a.sum_where(name, labels)) / secs).max(0.0)
    };
    let requests = format!("{prefix}_requests_total");
    let mut ops = BTreeMap::new();
    for s in b.all(&requests) {
        let Some(kind) = s.label("request") else {
            continue;
        };
        let labels: Vec<(&str, &str)> = s
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let r = ((s.value - a.value(&requests, &labels).unwrap_or(0.0)) / secs).max(0.0);
        if r > 0.0 {
            *ops.entry(kind.to_string()).or_insert(0.0) += r;
        }
    }
    let hist = format!("{prefix}_request_duration_seconds");
    let (ba, bb) = (a.buckets(&hist, &[]), b.buckets(&hist, &[]));
    let delta: Vec<(f64, f64)> = bb
        .iter()
        .map(|&(le, n)| (le, n - ba.iter().find(|x| x.0 == le).map_or(0.0, |x| x.1)))
        .collect();
    let latency = text::quantile(&delta, 0.5).map(|_| {
        QUANTILES
            .iter()
            .filter_map(|&(name, q)| Some((name, text::quantile(&delta, q)?)))
            .collect()
    });
    EndpointView {
        endpoint: endpoint.to_string(),
        role,
        error: None,
        total_ops_per_second: ops.values().sum(),
        ops_per_second: ops,
        errors_per_second: rate(&format!("{prefix}_request_errors_total"), &[]),
        read_bytes_per_second: rate(bytes, &[("direction", "read")]),
        written_bytes_per_second: rate(bytes, &[("direction", "written")]),
        latency_seconds: latency,
        cpu_cores: rate("process_cpu_seconds_total", &[]),
        resident_memory_bytes: b.sum("process_resident_memory_bytes"),
    }
}

fn unreachable(endpoint: &str, error: String) -> EndpointView {
    EndpointView {
        endpoint: endpoint.to_string(),
        role: Role::Unknown,
        error: Some(error),
        ops_per_second: BTreeMap::new(),
        total_ops_per_second: 0.0,
        errors_per_second: 0.0,
        read_bytes_per_second: 0.0,
        written_bytes_per_second: 0.0,
        latency_seconds: None,
        cpu_cores: 0.0,
        resident_memory_bytes: 0.0,
    }
}

/// Scrapes every endpoint at once.
async fn scrape_all(endpoints: &[String]) -> Vec<Result<Scrape, String>> {
    let each = endpoints.iter().map(|e| async move {
        let body = telemetry::scrape(e).await.map_err(|e| e.to_string())?;
        text::parse(&body).map_err(|e| e.to_string())
    });
    futures::future::join_all(each).await
}

/// The frame between two rounds of scrapes.
fn frame(
    endpoints: &[String],
    a: &[Result<Scrape, String>],
    b: &[Result<Scrape, String>],
    secs: f64,
) -> Frame {
    let views = endpoints
        .iter()
        .zip(a.iter().zip(b))
        .map(|(e, pair)| match pair {
            (Ok(a), Ok(b)) => view(e, a, b, secs),
            (Err(x), _) | (_, Err(x)) => unreachable(e, x.clone()),
        })
        .collect();
    Frame {
        interval_seconds: secs,
        endpoints: views,
    }
}

/// Runs `tessera top` on `endpoints`: one frame after `interval` (printed as JSON or
/// as a table) with `once`, else a table redrawn every `interval` until interrupted.
pub async fn run(
    endpoints: Vec<String>,
    interval: Duration,
    once: bool,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !endpoints.is_empty(),
        "no metrics endpoint to watch: give --endpoint ADDR (or a mount point of `tessera up`)"
    );
    anyhow::ensure!(
        endpoints.len() <= MAX_ENDPOINTS,
        "at most {MAX_ENDPOINTS} endpoints"
    );
    let mut before = scrape_all(&endpoints).await;
    let mut at = Instant::now();
    loop {
        tokio::time::sleep(interval).await;
        let after = scrape_all(&endpoints).await;
        let now = Instant::now();
        let f = frame(
            &endpoints,
            &before,
            &after,
            now.duration_since(at).as_secs_f64(),
        );
        if json {
            println!("{}", serde_json::to_string_pretty(&f)?);
        } else {
            // Home the cursor and clear the screen, then draw: a plain ANSI redraw.
            let clear = if once { "" } else { "\x1b[H\x1b[2J" };
            print!("{clear}{}", table(&f));
        }
        if once {
            return Ok(());
        }
        (before, at) = (after, now);
    }
}

/// The frame as a table, one line per endpoint and one per request type of each.
pub fn table(f: &Frame) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tessera top: {} endpoints, every {:.1} s\n\n{:<22} {:<6} {:>9} {:>11} {:>11} {:>9} {:>9} {:>9} {:>6} {:>9}",
        f.endpoints.len(), f.interval_seconds,
        "ENDPOINT", "ROLE", "OPS/S", "READ/S", "WRITE/S", "P50", "P90", "P99", "CPU", "RSS"
    );
    for e in &f.endpoints {
        if let Some(err) = &e.error {
            let _ = writeln!(out, "{:<22} down   {err}", e.endpoint);
            continue;
        }
        let q = |k| {
            e.latency_seconds
                .as_ref()
                .and_then(|l| l.get(k))
                .map_or("-".to_string(), |&s| seconds(s))
        };
        let _ = writeln!(
            out,
            "{:<22} {:<6} {:>9.1} {:>11} {:>11} {:>9} {:>9} {:>9} {:>6.2} {:>9}",
            e.endpoint,
            format!("{:?}", e.role).to_lowercase(),
            e.total_ops_per_second,
            bytes(e.read_bytes_per_second),
            bytes(e.written_bytes_per_second),
            q("p50"),
            q("p90"),
            q("p99"),
            e.cpu_cores,
            bytes(e.resident_memory_bytes)
        );
        let mut by_rate: Vec<_> = e.ops_per_second.iter().collect();
        by_rate.sort_by(|a, b| b.1.total_cmp(a.1));
        for (kind, r) in by_rate.into_iter().take(8) {
            let _ = writeln!(out, "    {kind:<24} {r:>9.1}/s");
        }
    }
    out
}

fn seconds(s: f64) -> String {
    match s {
        s if s < 1e-3 => format!("{:.0}us", s * 1e6),
        s if s < 1.0 => format!("{:.1}ms", s * 1e3),
        s => format!("{s:.2}s"),
    }
}

fn bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut u) = (b, 0);
    while v >= 1024.0 && u + 1 < UNITS.len() {
        (v, u) = (v / 1024.0, u + 1);
    }
    format!("{v:.1}{}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(lookups: u64, fast: u64, read: u64) -> Scrape {
        let body = format!(
            "# TYPE tessera_client_requests_total counter\n\
             tessera_client_requests_total{{server=\"meta\",request=\"lookup\"}} {lookups}\n\
             tessera_client_requests_total{{server=\"meta\",request=\"mkdir\"}} 3\n\
             # TYPE tessera_client_request_duration_seconds histogram\n\
             tessera_client_request_duration_seconds_bucket{{server=\"meta\",request=\"lookup\",le=\"0.001\"}} {fast}\n\
             tessera_client_request_duration_seconds_bucket{{server=\"meta\",request=\"lookup\",le=\"+Inf\"}} {lookups}\n\
             # TYPE tessera_client_data_bytes_total counter\n\
             tessera_client_data_bytes_total{{direction=\"read\"}} {read}\n"
        );
        text::parse(&body).unwrap()
    }

    #[test]
    fn a_view_shows_rates_and_percentiles_of_the_interval_only() {
        let (a, b) = (scrape(100, 100, 0), scrape(300, 200, 4096));
        let v = view("x", &a, &b, 2.0);
        assert_eq!(v.role, Role::Mount);
        assert_eq!(v.ops_per_second.get("lookup"), Some(&100.0));
        // mkdir did not move: left out.
        assert_eq!(v.ops_per_second.get("mkdir"), None);
        assert_eq!(v.read_bytes_per_second, 2048.0);
        // Of the 200 in the interval, 100 were under 1 ms and 100 above the last bound.
        let l = v.latency_seconds.clone().unwrap();
        assert!(l["p50"] <= 0.001, "{l:?}");
        assert_eq!(l["p99"], 0.001);
        // No request in the interval: no percentiles.
        assert!(view("x", &b, &b, 1.0).latency_seconds.is_none());
        assert!(table(&Frame {
            interval_seconds: 1.0,
            endpoints: vec![v]
        })
        .contains("lookup"));
    }
}
