//! Limits and timeouts of a transport endpoint.

use serde::{Deserialize, Serialize};

/// Limits and timeouts of one endpoint; every connection it makes or accepts obeys them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransportConfig {
    /// Largest two-sided message (request or reply), in bytes. On RDMA this is the size of
    /// each pre-posted receive buffer.
    pub max_msg_bytes: usize,
    /// Calls one connection may have in flight (the credits of a peer's receive queue).
    pub max_inflight_calls: usize,
    /// Largest single one-sided read or write, in bytes.
    pub max_one_sided_bytes: usize,
    /// One-sided operations one connection may have in flight.
    pub max_inflight_one_sided: usize,
    /// How long a call waits for its reply before failing.
    pub call_timeout_ms: u64,
    /// How long a one-sided operation waits for completion before failing.
    pub one_sided_timeout_ms: u64,
    /// How long connecting (TCP connect plus handshake) may take.
    pub connect_timeout_ms: u64,
    /// Connections one listener accepts at once; more are refused.
    pub max_connections: usize,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            max_msg_bytes: 128 * 1024,
            max_inflight_calls: 64,
            max_one_sided_bytes: 64 * 1024 * 1024,
            max_inflight_one_sided: 64,
            call_timeout_ms: 30_000,
            one_sided_timeout_ms: 30_000,
            connect_timeout_ms: 5_000,
            max_connections: 1024,
        }
    }
}

impl TransportConfig {
    /// Checks that the limits are usable; returns a sentence naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        let checks: [(bool, &str); 7] = [
            (
                self.max_msg_bytes >= 4096,
                "max_msg_bytes must be at least 4096",
            ),
            (
                self.max_msg_bytes <= 16 * 1024 * 1024,
                "max_msg_bytes must be at most 16 MiB",
            ),
            (
                self.max_inflight_calls >= 1,
                "max_inflight_calls must be at least 1",
            ),
            (
                self.max_one_sided_bytes >= 4096 && self.max_one_sided_bytes <= 1 << 30,
                "max_one_sided_bytes must be between 4 KiB and 1 GiB",
            ),
            (
                self.max_inflight_one_sided >= 1,
                "max_inflight_one_sided must be at least 1",
            ),
            (
                self.call_timeout_ms >= 1 && self.one_sided_timeout_ms >= 1,
                "timeouts must be at least 1 ms",
            ),
            (
                self.max_connections >= 1,
                "max_connections must be at least 1",
            ),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, why)) => Err(why.to_string()),
            None => Ok(()),
        }
    }
}
