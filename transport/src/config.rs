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
    /// Connections one listener accepts at once. When they are all taken, the one idle
    /// longest (with a verifier: the unauthenticated one) is closed for a new one if it
    /// has been idle `idle_close_ms`; otherwise the new one is refused.
    pub max_connections: usize,
    /// How long a connection must have been idle (no call, no transfer) before a full
    /// listener may close it to make room, in milliseconds; 0: never (new connections
    /// are refused instead).
    pub idle_close_ms: u64,
    /// With authentication: how many of `max_connections` may be held by connections
    /// that have not authenticated yet; a new one beyond it is refused. A full listener
    /// never closes an authenticated connection for an unauthenticated one, so a flood
    /// of half-open handshakes cannot push served clients out.
    pub max_unauthenticated_connections: usize,
    /// Settings of the `rdma` backend (ignored by the others).
    pub rdma: RdmaConfig,
}

/// Which RDMA device, port and address the `rdma` backend uses, and how it waits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RdmaConfig {
    /// Device name (`mlx5_0`); empty: the first device with an active port.
    pub device: String,
    /// Port number on the device (ports count from 1).
    pub port: u8,
    /// GID index for RoCE; -1: the first RoCE v2 GID of the port (from sysfs
    /// `gid_attrs/types`). InfiniBand ports address by LID and ignore it.
    pub gid_index: i32,
    /// Largest path MTU to use, in bytes (256 to 4096); the smaller of both ports'
    /// active MTUs and this one is used.
    pub max_mtu_bytes: u32,
    /// Spin on the completion queue this long before sleeping on the completion
    /// channel; 0: never spin (no busy polling, the default).
    pub busy_poll_us: u64,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            device: String::new(),
            port: 1,
            gid_index: -1,
            max_mtu_bytes: 4096,
            busy_poll_us: 0,
        }
    }
}

impl RdmaConfig {
    /// Checks the values; returns a sentence naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if self.port == 0 {
            return Err("rdma.port must be at least 1".into());
        }
        if !(-1..=255).contains(&self.gid_index) {
            return Err("rdma.gid_index must be -1 (auto) or 0 to 255".into());
        }
        if ![256, 512, 1024, 2048, 4096].contains(&self.max_mtu_bytes) {
            return Err("rdma.max_mtu_bytes must be 256, 512, 1024, 2048 or 4096".into());
        }
        if self.busy_poll_us > 1_000_000 {
            return Err("rdma.busy_poll_us must be at most 1000000".into());
        }
        Ok(())
    }
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
            idle_close_ms: 60_000,
            max_unauthenticated_connections: 64,
            rdma: RdmaConfig::default(),
        }
    }
}

impl TransportConfig {
    /// Checks that the limits are usable; returns a sentence naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        let checks: [(bool, &str); 8] = [
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
            (
                self.max_unauthenticated_connections >= 1,
                "max_unauthenticated_connections must be at least 1",
            ),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, why)) => Err(why.to_string()),
            None => self.rdma.validate(),
        }
    }
}
