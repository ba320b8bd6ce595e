//! Requests by type: a count, a count of failures, and a latency histogram, labelled
//! by the server kind and the request's name (both from fixed tables, so the label
//! sets are bounded).
//!
//! Every label set is made when the process starts ([`RequestFamilies::server`]), so
//! counting a request is a lookup in a map that never changes, then atomic adds: no
//! lock, no allocation.

use crate::{latency_buckets, Metrics, TelemetryError};
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts};
use std::collections::HashMap;
use std::time::Duration;

/// The three families of one side (`tessera_client_*` for calls a process sends,
/// `tessera_server_*` for calls it serves).
pub struct RequestFamilies {
    requests: IntCounterVec,
    errors: IntCounterVec,
    seconds: HistogramVec,
}

impl RequestFamilies {
    /// Registers `{prefix}_requests_total`, `{prefix}_request_errors_total` and
    /// `{prefix}_request_duration_seconds`, labelled `server` and `request`.
    pub fn register(metrics: &Metrics, prefix: &str) -> Result<RequestFamilies, TelemetryError> {
        let labels = ["server", "request"];
        let requests = IntCounterVec::new(
            Opts::new(
                format!("{prefix}_requests_total"),
                "Requests, by server kind and type.",
            ),
            &labels,
        )?;
        let errors = IntCounterVec::new(
            Opts::new(
                format!("{prefix}_request_errors_total"),
                "Requests answered with an error (or, sent, that failed), by type.",
            ),
            &labels,
        )?;
        let seconds = HistogramVec::new(
            HistogramOpts::new(
                format!("{prefix}_request_duration_seconds"),
                "Time from a request's arrival (or sending) to its answer, by type.",
            )
            .buckets(latency_buckets()),
            &labels,
        )?;
        metrics.registry.register(Box::new(requests.clone()))?;
        metrics.registry.register(Box::new(errors.clone()))?;
        metrics.registry.register(Box::new(seconds.clone()))?;
        Ok(RequestFamilies {
            requests,
            errors,
            seconds,
        })
    }

    /// The metrics of the requests named `names` of server kind `server` (`meta`,
    /// `data`), every label set made now.
    pub fn server(&self, server: &str, names: &[&'static str]) -> RequestMetrics {
        let by_name = names
            .iter()
            .map(|&name| {
                let labels = [server, name];
                let handles = Handles {
                    requests: self.requests.with_label_values(&labels),
                    errors: self.errors.with_label_values(&labels),
                    seconds: self.seconds.with_label_values(&labels),
                };
                (name, handles)
            })
            .collect();
        RequestMetrics { by_name }
    }
}

struct Handles {
    requests: IntCounter,
    errors: IntCounter,
    seconds: Histogram,
}

/// The request metrics of one server kind.
pub struct RequestMetrics {
    by_name: HashMap<&'static str, Handles>,
}

impl RequestMetrics {
    /// Requests counted so far over every name (a sum over the label sets: for tools
    /// and tests, not for a request's path).
    pub fn total(&self) -> u64 {
        self.by_name.values().map(|h| h.requests.get()).sum()
    }

    /// Requests `name` counted so far (for tools and tests).
    pub fn count(&self, name: &str) -> u64 {
        self.by_name.get(name).map_or(0, |h| h.requests.get())
    }

    /// Counts one call `name` as sent now; its time and outcome are recorded when the
    /// returned guard is finished, or as a failure when it is dropped unfinished (a
    /// call given up on, as a failover's race drops the slower one). A name not in the
    /// table is not counted.
    pub fn start(&self, name: &str) -> InFlight<'_> {
        let handles = self.by_name.get(name);
        if let Some(h) = handles {
            h.requests.inc();
        }
        InFlight {
            handles,
            started: std::time::Instant::now(),
            done: false,
        }
    }

    /// Counts one request `name` that took `elapsed`; a name not in the table given at
    /// start is not counted (it cannot be: every name comes from that table).
    pub fn record(&self, name: &str, elapsed: Duration, failed: bool) {
        if let Some(h) = self.by_name.get(name) {
            h.requests.inc();
            if failed {
                h.errors.inc();
            }
            h.seconds.observe(elapsed.as_secs_f64());
        }
    }
}

/// A call counted as sent (see [`RequestMetrics::start`]).
pub struct InFlight<'a> {
    handles: Option<&'a Handles>,
    started: std::time::Instant,
    done: bool,
}

impl InFlight<'_> {
    /// Records the call's time, and a failure if `failed`.
    pub fn finish(mut self, failed: bool) {
        self.end(failed);
    }

    fn end(&mut self, failed: bool) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        if let Some(h) = self.handles {
            if failed {
                h.errors.inc();
            }
            h.seconds.observe(self.started.elapsed().as_secs_f64());
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.end(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text;

    #[test]
    fn a_recorded_request_counts_under_its_labels_and_others_stay_at_zero() {
        let m = Metrics::new().unwrap();
        let fams = RequestFamilies::register(&m, "t").unwrap();
        let meta = fams.server("meta", &["lookup", "mkdir"]);
        meta.record("lookup", Duration::from_micros(300), false);
        meta.record("lookup", Duration::from_millis(2), true);
        meta.record("unknown", Duration::from_millis(2), true);
        let s = text::parse(&m.render()).unwrap();
        let l = [("server", "meta"), ("request", "lookup")];
        assert_eq!(s.kind("t_requests_total"), Some("counter"));
        assert_eq!(s.kind("t_request_duration_seconds"), Some("histogram"));
        assert_eq!(s.value("t_requests_total", &l), Some(2.0));
        assert_eq!(s.value("t_request_errors_total", &l), Some(1.0));
        assert_eq!(s.value("t_request_duration_seconds_count", &l), Some(2.0));
        let mk = [("server", "meta"), ("request", "mkdir")];
        assert_eq!(s.value("t_requests_total", &mk), Some(0.0));
    }

    #[test]
    fn a_call_counts_when_sent_and_a_dropped_one_as_failed() {
        let m = Metrics::new().unwrap();
        let meta = RequestFamilies::register(&m, "t")
            .unwrap()
            .server("meta", &["lookup"]);
        let call = meta.start("lookup");
        assert_eq!(meta.total(), 1, "counted when sent, before its answer");
        call.finish(false);
        drop(meta.start("lookup"));
        let s = text::parse(&m.render()).unwrap();
        let l = [("server", "meta"), ("request", "lookup")];
        assert_eq!(s.value("t_requests_total", &l), Some(2.0));
        assert_eq!(s.value("t_request_errors_total", &l), Some(1.0));
        assert_eq!(s.value("t_request_duration_seconds_count", &l), Some(2.0));
    }
}
