//! The data server's configuration (`tessera-data --config FILE`).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use transport::{Backend, TransportConfig};

/// Default of [`DataConfig::disk_reserve_bytes`]: four times the metadata server's own
/// reserve, so that on a shared disk data stops first.
pub const DEFAULT_DISK_RESERVE_BYTES: u64 = 64 << 20;

/// Largest [`DataConfig::grant_clock_skew_ms`]: ten minutes, a grant's default lifetime.
pub const MAX_GRANT_CLOCK_SKEW_MS: u64 = 600_000;

/// Everything a data server can be told; see `tessera-data.example.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Address the transport listens on (port 0: any free port).
    pub listen: String,
    /// Address clients are told to use; empty: the address actually bound.
    pub advertise: String,
    /// Address of the metadata server (`host:port`), or several, comma-separated (a
    /// server and its standbys on one etcd): registration and heartbeats go to the
    /// first that answers, and to the next when it stops answering.
    pub meta_addr: String,
    /// Directory holding the chunks and the node id.
    pub data_dir: PathBuf,
    /// Bytes of chunk data this server may hold; 0: the size of the file system under
    /// `data_dir`.
    pub capacity_bytes: u64,
    /// Interval between heartbeats to the metadata server.
    pub heartbeat_ms: u64,
    /// Registered buffers for chunk transfers (bounds the bytes in flight).
    pub io_buffers: usize,
    /// Size of each transfer buffer; larger requests are moved in several steps.
    pub io_buffer_bytes: usize,
    /// Whole checksum blocks move between disk and transfer buffers with `O_DIRECT` (no
    /// copy through the page cache: less CPU per byte, but this server caches no chunk
    /// data, so bytes read again come from the disk again), and bytes read from small
    /// chunks, which stay buffered, leave the page cache after the read. Off: buffered
    /// I/O, and what is read stays cached for other clients.
    pub direct_io: bool,
    /// Bytes of the disk under `data_dir` this server leaves free: a write that would
    /// leave less fails with ENOSPC, so the metadata store (on the same disk in a local
    /// cluster) and deletions still have room when the disk is otherwise full.
    pub disk_reserve_bytes: u64,
    /// Where to write the bound address once registered (for scripts); empty: nowhere.
    pub addr_file: PathBuf,
    /// Transport backend.
    pub transport: Backend,
    /// Transport limits and timeouts.
    pub transport_limits: TransportConfig,
    /// The cluster key's file (64 hex digits, mode 0600): this server authenticates to
    /// the metadata server and its peers with it, and checks every client's handshake.
    /// Empty: no authentication, which needs a loopback `listen` or `insecure`.
    pub key_file: PathBuf,
    /// Serve without authentication on any address (warned about at every start).
    pub insecure: bool,
    /// How long past its expiry a client's grant is still taken: the most this server's
    /// clock may run ahead of the metadata server's.
    pub grant_clock_skew_ms: u64,
    /// The Prometheus endpoint (off unless `metrics.listen` is set).
    pub metrics: telemetry::MetricsConfig,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            listen: "127.0.0.1:7700".into(),
            advertise: String::new(),
            meta_addr: "127.0.0.1:7600".into(),
            data_dir: PathBuf::from("/var/lib/tessera/data"),
            capacity_bytes: 0,
            heartbeat_ms: 1000,
            io_buffers: 32,
            io_buffer_bytes: 4 << 20,
            direct_io: true,
            disk_reserve_bytes: DEFAULT_DISK_RESERVE_BYTES,
            addr_file: PathBuf::new(),
            transport: Backend::Tcp,
            transport_limits: TransportConfig::default(),
            key_file: PathBuf::new(),
            insecure: false,
            grant_clock_skew_ms: proto::grant::CLOCK_SKEW_MS,
            metrics: telemetry::MetricsConfig::default(),
        }
    }
}

impl DataConfig {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        self.transport_limits.validate()?;
        self.metrics.validate()?;
        if self.listen.is_empty() || transport::split_addrs(&self.meta_addr).is_empty() {
            return Err("listen and meta_addr must be addresses (host:port)".into());
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err("data_dir must be set".into());
        }
        if !(50..=60_000).contains(&self.heartbeat_ms) {
            return Err("heartbeat_ms must be between 50 and 60000".into());
        }
        if !(1..=1024).contains(&self.io_buffers) {
            return Err("io_buffers must be between 1 and 1024".into());
        }
        if !(64 * 1024..=64 << 20).contains(&self.io_buffer_bytes) {
            return Err("io_buffer_bytes must be between 64 KiB and 64 MiB".into());
        }
        if self.io_buffer_bytes > self.transport_limits.max_one_sided_bytes {
            return Err("io_buffer_bytes must not exceed transport max_one_sided_bytes".into());
        }
        if self.grant_clock_skew_ms > MAX_GRANT_CLOCK_SKEW_MS {
            return Err(format!(
                "grant_clock_skew_ms must be at most {MAX_GRANT_CLOCK_SKEW_MS}"
            ));
        }
        let has_key = !self.key_file.as_os_str().is_empty();
        transport::auth::check_listen(&self.listen, has_key, self.insecure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against the example file drifting from the defaults it documents.
    #[test]
    fn example_file_equals_the_defaults() {
        let text = include_str!("../tessera-data.example.toml");
        let parsed: DataConfig = toml::from_str(text).expect("example parses");
        assert_eq!(parsed, DataConfig::default());
        parsed.validate().expect("defaults are valid");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = toml::from_str::<DataConfig>("lisen = \"x\"").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }
}
