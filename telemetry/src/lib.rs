//! Tessera's Prometheus metrics: one [`Metrics`] registry per process, the request
//! counters and latency histograms every server and the client keep ([`requests`]), the
//! process's CPU and memory ([`process`]), the HTTP endpoint that serves them ([`http`]),
//! and a parser of the text format for `tessera top` and the tests ([`text`]).
//!
//! Depends on nothing of Tessera: the servers and the client register what they count.
//! The exposition format is the `prometheus` crate's; counters and histograms are
//! atomics, so counting on a request's path takes no lock.

pub mod errors;
pub mod http;
pub mod process;
pub mod requests;
pub mod text;

pub use http::{scrape, MetricsServer};
pub use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};
pub use requests::{InFlight, RequestFamilies, RequestMetrics};

use hooks::HookList;
use prometheus::{Encoder, HistogramOpts, Opts, Registry, TextEncoder};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::Arc;

/// What can go wrong serving or reading metrics.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The endpoint's address could not be bound.
    #[error("metrics endpoint {addr}: {source}")]
    Bind {
        /// The configured address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The address file could not be written.
    #[error("writing the metrics address to {}: {source}", path.display())]
    AddrFile {
        /// The configured file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A metric could not be made or registered (a name used twice, a bad name).
    #[error("metric: {0}")]
    Register(#[from] prometheus::Error),
    /// A scrape failed.
    #[error("scrape of {addr}: {msg}")]
    Scrape {
        /// The endpoint.
        addr: String,
        /// Why.
        msg: String,
    },
    /// A scraped text did not parse.
    #[error("metrics text, line {line}: {msg}")]
    Parse {
        /// The line (from 1).
        line: usize,
        /// What was wrong.
        msg: String,
    },
}

/// The `[metrics]` section of every process's configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Address of the HTTP endpoint serving `/metrics` (`127.0.0.1:PORT`; port 0: any
    /// free port). Empty: no endpoint. Nothing listens on other interfaces unless this
    /// names one.
    pub listen: String,
    /// Where to write the endpoint's bound address once serving (for scripts and
    /// `tessera up`, with port 0); empty: nowhere.
    pub addr_file: std::path::PathBuf,
}

impl MetricsConfig {
    /// Whether an endpoint is asked for.
    pub fn enabled(&self) -> bool {
        !self.listen.is_empty()
    }

    /// Checks the address; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.enabled() && self.listen.parse::<SocketAddr>().is_err() {
            return Err(format!(
                "metrics.listen must be an IP address and port, like 127.0.0.1:9600 (got {:?})",
                self.listen
            ));
        }
        Ok(())
    }
}

/// One process's metrics: the registry, and the hooks that bring gauges up to date
/// just before each scrape (values that are cheaper to read than to keep current).
pub struct Metrics {
    registry: Registry,
    hooks: HookList,
    process: process::ProcessMetrics,
    /// Held by the one render under way (see [`Metrics::render`]).
    rendering: std::sync::Mutex<()>,
    /// The text the last render made.
    last: std::sync::Mutex<String>,
}

impl Metrics {
    /// An empty registry with the process metrics in it.
    pub fn new() -> Result<Arc<Metrics>, TelemetryError> {
        let registry = Registry::new();
        let process = process::ProcessMetrics::register(&registry)?;
        Ok(Arc::new(Metrics {
            registry,
            hooks: HookList::default(),
            process,
            rendering: std::sync::Mutex::new(()),
            last: std::sync::Mutex::new(String::new()),
        }))
    }

    /// Registers a counter.
    pub fn counter(&self, name: &str, help: &str) -> Result<IntCounter, TelemetryError> {
        let c = IntCounter::new(name, help)?;
        self.registry.register(Box::new(c.clone()))?;
        Ok(c)
    }

    /// Registers counters with labels `labels`.
    pub fn counter_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntCounterVec, TelemetryError> {
        let c = IntCounterVec::new(Opts::new(name, help), labels)?;
        self.registry.register(Box::new(c.clone()))?;
        Ok(c)
    }

    /// Registers a gauge.
    pub fn gauge(&self, name: &str, help: &str) -> Result<IntGauge, TelemetryError> {
        let g = IntGauge::new(name, help)?;
        self.registry.register(Box::new(g.clone()))?;
        Ok(g)
    }

    /// Registers gauges with labels `labels`.
    pub fn gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntGaugeVec, TelemetryError> {
        let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
        self.registry.register(Box::new(g.clone()))?;
        Ok(g)
    }

    /// Registers a histogram with upper bounds `buckets`.
    pub fn histogram(
        &self,
        name: &str,
        help: &str,
        buckets: Vec<f64>,
    ) -> Result<Histogram, TelemetryError> {
        let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))?;
        self.registry.register(Box::new(h.clone()))?;
        Ok(h)
    }

    /// Registers histograms with upper bounds `buckets` and labels `labels`.
    pub fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        buckets: Vec<f64>,
        labels: &[&str],
    ) -> Result<HistogramVec, TelemetryError> {
        let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)?;
        self.registry.register(Box::new(h.clone()))?;
        Ok(h)
    }

    /// Adds a hook run before every scrape (on a blocking thread: it may read a store).
    pub fn on_scrape(&self, hook: impl Fn() + Send + Sync + 'static) {
        self.hooks.push(Box::new(hook));
    }

    /// The text exposition of every metric, after running the hooks. One render at a
    /// time: a scrape that comes while another renders gets that one's predecessor's
    /// text, so scrapes never queue threads behind a slow hook, and the hooks and the
    /// process counters (which add what `/proc` says since their last reading) are
    /// never run twice at once.
    pub fn render(&self) -> String {
        let _only = match self.rendering.try_lock() {
            Ok(g) => g,
            Err(_) => {
                let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if !last.is_empty() {
                    return last;
                }
                // Nothing rendered yet: wait for the first render instead.
                self.rendering.lock().unwrap_or_else(|p| p.into_inner())
            }
        };
        self.process.update();
        self.hooks.run();
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "metrics could not be encoded");
        }
        let text = String::from_utf8(out).unwrap_or_default();
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = text.clone();
        text
    }
}

/// Latency buckets of request histograms, in seconds: 25 us (a cached answer on the
/// loopback) doubling to about 6.5 s (a call waiting out a failover).
pub fn latency_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(25e-6, 2.0, 19).unwrap_or_default()
}

mod hooks {
    //! The scrape hooks: a plain mutex, taken once per scrape, never on a request path.
    use std::sync::Mutex;

    type Hook = Box<dyn Fn() + Send + Sync>;

    #[derive(Default)]
    pub(crate) struct HookList(Mutex<Vec<Hook>>);

    impl HookList {
        pub(crate) fn push(&self, hook: Hook) {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).push(hook);
        }

        pub(crate) fn run(&self) {
            for hook in self.0.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                hook();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_without_listen_is_off_and_a_bad_address_is_refused() {
        let c: MetricsConfig = toml::from_str("").unwrap();
        assert!(!c.enabled());
        assert!(c.validate().is_ok());
        let bad = MetricsConfig {
            listen: "localhost".into(),
            ..MetricsConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("metrics.listen"));
        assert!(toml::from_str::<MetricsConfig>("other = 1").is_err());
    }

    #[test]
    fn a_registered_counter_shows_in_the_text_with_its_type() {
        let m = Metrics::new().unwrap();
        let c = m.counter("t_things_total", "things").unwrap();
        c.inc_by(3);
        let text = m.render();
        let s = text::parse(&text).unwrap();
        assert_eq!(s.kind("t_things_total"), Some("counter"));
        assert_eq!(s.sum("t_things_total"), 3.0);
        assert_eq!(s.kind("process_cpu_seconds_total"), Some("counter"));
        assert!(s.sum("process_resident_memory_bytes") > 0.0);
        // A name registered twice is an error, not a silent second metric.
        assert!(m.counter("t_things_total", "again").is_err());
    }
}
