//! The client's configuration.

use serde::{Deserialize, Serialize};
use transport::{Backend, TransportConfig};

/// Everything a mount (or a `Client` library user) can tune.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientConfig {
    /// Address of the metadata server (`host:port`).
    pub meta_addr: String,
    /// Transport backend.
    pub transport: Backend,
    /// Transport limits and timeouts.
    pub transport_limits: TransportConfig,
    /// How long the kernel may cache attributes, in milliseconds.
    pub attr_ttl_ms: u64,
    /// How long the kernel may cache name lookups, in milliseconds.
    pub entry_ttl_ms: u64,
    /// Registered I/O buffers in the pool (bounds the bytes in flight to data servers).
    pub io_buffers: usize,
    /// Size of each registered I/O buffer; also the largest FUSE read and write.
    pub io_buffer_bytes: usize,
    /// FUSE event loops (threads reading `/dev/fuse`).
    pub fuse_threads: usize,
    /// Let users other than the mounting one use the mount (`allow_other`).
    pub allow_other: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            meta_addr: "127.0.0.1:7600".into(),
            transport: Backend::Tcp,
            transport_limits: TransportConfig::default(),
            attr_ttl_ms: 1000,
            entry_ttl_ms: 1000,
            io_buffers: 64,
            io_buffer_bytes: 1 << 20,
            fuse_threads: 4,
            allow_other: true,
        }
    }
}

impl ClientConfig {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        self.transport_limits.validate()?;
        if self.meta_addr.is_empty() {
            return Err("meta_addr must name the metadata server".into());
        }
        if !(1..=4096).contains(&self.io_buffers) {
            return Err("io_buffers must be between 1 and 4096".into());
        }
        if !(64 * 1024..=16 << 20).contains(&self.io_buffer_bytes)
            || !self.io_buffer_bytes.is_power_of_two()
        {
            return Err("io_buffer_bytes must be a power of two from 64 KiB to 16 MiB".into());
        }
        if self.io_buffer_bytes > self.transport_limits.max_one_sided_bytes {
            return Err("io_buffer_bytes must not exceed transport max_one_sided_bytes".into());
        }
        if !(1..=64).contains(&self.fuse_threads) {
            return Err("fuse_threads must be between 1 and 64".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against the example file drifting from the defaults it documents.
    #[test]
    fn example_file_equals_the_defaults() {
        let text = include_str!("../tessera.example.toml");
        let parsed: ClientConfig = toml::from_str(text).expect("example parses");
        assert_eq!(parsed, ClientConfig::default());
        parsed.validate().expect("defaults are valid");
    }

    #[test]
    fn bad_values_are_refused_with_the_field_named() {
        let c = ClientConfig {
            io_buffer_bytes: 3 << 20,
            ..ClientConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("io_buffer_bytes"));
        assert!(toml::from_str::<ClientConfig>("attr_ttl = 5").is_err());
    }
}
