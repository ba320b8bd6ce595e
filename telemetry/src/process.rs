//! The process's CPU time, memory and descriptors, read from `/proc/self` at each
//! scrape under the names Prometheus client libraries use (`process_*`).

use prometheus::{Counter, Gauge, IntGauge, Registry};

/// The process gauges, brought up to date by [`ProcessMetrics::update`].
pub(crate) struct ProcessMetrics {
    cpu_seconds: Counter,
    resident_bytes: IntGauge,
    virtual_bytes: IntGauge,
    open_fds: IntGauge,
    threads: IntGauge,
    start_time_seconds: Gauge,
}

/// What `/proc/self/stat` says, in base units.
#[derive(Debug, Default, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    threads: i64,
    virtual_bytes: i64,
    resident_bytes: i64,
    /// Seconds after boot the process started.
    started_after_boot_seconds: f64,
}

impl ProcessMetrics {
    /// Registers the process metrics in `registry`.
    pub(crate) fn register(registry: &Registry) -> Result<ProcessMetrics, prometheus::Error> {
        let m = ProcessMetrics {
            cpu_seconds: Counter::new(
                "process_cpu_seconds_total",
                "User and system CPU time spent, in seconds.",
            )?,
            resident_bytes: IntGauge::new(
                "process_resident_memory_bytes",
                "Resident memory size, in bytes.",
            )?,
            virtual_bytes: IntGauge::new(
                "process_virtual_memory_bytes",
                "Virtual memory size, in bytes.",
            )?,
            open_fds: IntGauge::new("process_open_fds", "Open file descriptors.")?,
            threads: IntGauge::new("process_threads", "Operating system threads.")?,
            start_time_seconds: Gauge::new(
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds.",
            )?,
        };
        registry.register(Box::new(m.cpu_seconds.clone()))?;
        registry.register(Box::new(m.resident_bytes.clone()))?;
        registry.register(Box::new(m.virtual_bytes.clone()))?;
        registry.register(Box::new(m.open_fds.clone()))?;
        registry.register(Box::new(m.threads.clone()))?;
        registry.register(Box::new(m.start_time_seconds.clone()))?;
        Ok(m)
    }

    /// Reads `/proc/self`; a file that cannot be read leaves its gauges as they were.
    pub(crate) fn update(&self) {
        let stat = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat(&s, clock_ticks(), page_bytes()));
        if let Some(s) = stat {
            // A counter only goes up: add what was spent since the last scrape.
            let delta = s.cpu_seconds - self.cpu_seconds.get();
            if delta > 0.0 {
                self.cpu_seconds.inc_by(delta);
            }
            self.resident_bytes.set(s.resident_bytes);
            self.virtual_bytes.set(s.virtual_bytes);
            self.threads.set(s.threads);
            if let Some(boot) = boot_time_seconds() {
                self.start_time_seconds
                    .set(boot + s.started_after_boot_seconds);
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(dir.count() as i64);
        }
    }
}

/// Parses `/proc/self/stat` (proc(5)): the fields after the command's closing
/// parenthesis, which may itself hold spaces and parentheses.
fn parse_stat(text: &str, ticks: f64, page: i64) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `f[0]` is field 3 (state): field n is `f[n - 3]`.
    let num = |n: usize| -> Option<f64> { f.get(n - 3)?.parse().ok() };
    Some(Stat {
        cpu_seconds: (num(14)? + num(15)?) / ticks,
        threads: num(20)? as i64,
        started_after_boot_seconds: num(22)? / ticks,
        virtual_bytes: num(23)? as i64,
        resident_bytes: num(24)? as i64 * page,
    })
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn page_bytes() -> i64 {
    // SAFETY: as above.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as i64
    } else {
        4096
    }
}

/// The boot time (`btime` of `/proc/stat`), in seconds since the Unix epoch.
fn boot_time_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().find(|l| l.starts_with("btime "))?;
    line[6..].trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_a_parenthesis_in_the_name_parses() {
        let line = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 \
                    1000 8192000 300 18446744073709551615";
        let s = parse_stat(line, 100.0, 4096).unwrap();
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.threads, 7);
        assert_eq!(s.started_after_boot_seconds, 10.0);
        assert_eq!(s.virtual_bytes, 8192000);
        assert_eq!(s.resident_bytes, 300 * 4096);
        assert_eq!(parse_stat("garbage", 100.0, 4096), None);
    }
}
