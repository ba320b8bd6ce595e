//! The namespace's part of the metadata server configuration.

use crate::error::MetaError;
use serde::{Deserialize, Serialize};

/// Settings of the namespace; the binary's config embeds this under its own section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NamespaceConfig {
    /// Chunk size given to new regular files, in bytes: a power of two from 64 KiB to
    /// 64 MiB. Existing files keep the chunk size they were created with.
    pub chunk_size_bytes: u32,
    /// A data server counts as alive in the cluster map while its last heartbeat is at
    /// most this old, in milliseconds.
    pub node_lease_ms: u64,
    /// Copies of each chunk new files ask for (the replication factor), 1 to 8; capped
    /// by the number of data servers.
    pub replicas: u8,
    /// A chain member down this long (milliseconds) leaves its chain, and another server
    /// takes its place and copies its chunks.
    pub replace_after_ms: u64,
    /// Bytes of the store's disk kept free for deletions: while less is free, requests
    /// that add records (create, mkdir, mknod, symlink, link, setxattr) fail with ENOSPC.
    /// 0: no check.
    pub disk_reserve_bytes: u64,
    /// How long (milliseconds) the open files and locks of a client whose connection
    /// broke (reset, timed out) wait for it to reconnect and resume them before they
    /// end as a vanished client's. A client whose process ended closes its connection
    /// in order, and its sessions end at once. 0: end them at once too.
    pub session_grace_ms: u64,
    /// How long (milliseconds) a server that started on an existing namespace (a
    /// restart, or a standby taking over) refuses new locks, while the clients that
    /// held locks before take them back (`SetLock::reclaim`): a lock taken meanwhile by
    /// someone else would steal one still held. Clients holding locks reconnect within
    /// about a second of the server listening. 0: no grace (locks taken before may be
    /// lost to another client).
    pub lock_grace_ms: u64,
    /// Answer a client's creates, mkdirs, mknods, symlinks, unlinks, rmdirs, length
    /// commits and attribute changes (not truncations) before the log holds them, when the client keeps them to send again (see `early`): a
    /// restart loses them only with that client. Off: every change is durable before
    /// its reply.
    pub early_replies: bool,
    /// How long (milliseconds) a server that started on a namespace with clients that
    /// took early replies (after a crash; a stop in order leaves none) holds every
    /// request while those clients send again what they kept; it serves as soon as
    /// each has settled. A live client comes back within about one to two seconds (it
    /// checks every second); one that ended with the server costs the whole wait. At
    /// most 30000 (a client's call times out after 30 s). 0: nobody is waited for.
    pub replay_grace_ms: u64,
}

impl Default for NamespaceConfig {
    fn default() -> Self {
        NamespaceConfig {
            chunk_size_bytes: 4 << 20,
            node_lease_ms: 5000,
            replicas: 3,
            replace_after_ms: 600_000,
            disk_reserve_bytes: 16 << 20,
            session_grace_ms: 60_000,
            lock_grace_ms: 5_000,
            early_replies: true,
            replay_grace_ms: 5_000,
        }
    }
}

impl NamespaceConfig {
    /// Smallest chunk size accepted: smaller chunks only multiply per-chunk overhead.
    pub const MIN_CHUNK_SIZE_BYTES: u32 = 64 << 10;
    /// Largest chunk size accepted: the data servers' chunk format holds at most 64 MiB.
    pub const MAX_CHUNK_SIZE_BYTES: u32 = 64 << 20;

    /// Checks every field; `Namespace::open` refuses an invalid configuration.
    pub fn validate(&self) -> Result<(), MetaError> {
        let c = self.chunk_size_bytes;
        if !c.is_power_of_two()
            || !(Self::MIN_CHUNK_SIZE_BYTES..=Self::MAX_CHUNK_SIZE_BYTES).contains(&c)
        {
            return Err(MetaError::InvalidArgument(format!(
                "chunk_size_bytes {c} must be a power of two from {} to {}",
                Self::MIN_CHUNK_SIZE_BYTES,
                Self::MAX_CHUNK_SIZE_BYTES
            )));
        }
        if !(100..=3_600_000).contains(&self.node_lease_ms) {
            return Err(MetaError::InvalidArgument(format!(
                "node_lease_ms {} must be from 100 to 3600000",
                self.node_lease_ms
            )));
        }
        if !(1..=8).contains(&self.replicas) {
            return Err(MetaError::InvalidArgument(format!(
                "replicas {} must be from 1 to 8",
                self.replicas
            )));
        }
        if self.session_grace_ms > 3_600_000 {
            return Err(MetaError::InvalidArgument(format!(
                "session_grace_ms {} must be at most 3600000",
                self.session_grace_ms
            )));
        }
        if self.lock_grace_ms > 600_000 {
            return Err(MetaError::InvalidArgument(format!(
                "lock_grace_ms {} must be at most 600000",
                self.lock_grace_ms
            )));
        }
        if self.replay_grace_ms > 30_000 {
            return Err(MetaError::InvalidArgument(format!(
                "replay_grace_ms {} must be at most 30000",
                self.replay_grace_ms
            )));
        }
        if self.replace_after_ms < self.node_lease_ms {
            return Err(MetaError::InvalidArgument(format!(
                "replace_after_ms {} must be at least node_lease_ms {}",
                self.replace_after_ms, self.node_lease_ms
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_refused() {
        NamespaceConfig::default().validate().unwrap();
        for chunk_size_bytes in [0, 3 << 20, 4096, u32::MAX] {
            let c = NamespaceConfig {
                chunk_size_bytes,
                ..NamespaceConfig::default()
            };
            assert!(c.validate().is_err(), "{chunk_size_bytes}");
        }
        let c = NamespaceConfig {
            node_lease_ms: 0,
            ..NamespaceConfig::default()
        };
        assert!(c.validate().is_err());
    }
}
