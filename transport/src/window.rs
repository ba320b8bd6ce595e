//! Grants: slices of registered memory exposed to the peer of one connection under a key
//! (the RDMA memory-window model). The table is what the `tcp` engine and the `mem`
//! backend check every one-sided access against; on `rdma` the NIC checks the key.

use crate::conn::ConnCore;
use crate::mr::{MemoryRegion, MrInner};
use crate::TransportError;
use parking_lot::Mutex;
use proto::{MrKey, RemoteBuf};
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// What a peer may do with a granted slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The peer may RDMA READ it (the slice holds a payload for the peer).
    RemoteRead,
    /// The peer may RDMA WRITE it (the slice receives bytes from the peer).
    RemoteWrite,
    /// Both.
    RemoteReadWrite,
}

impl Access {
    pub(crate) fn allows(self, op: Access) -> bool {
        self == Access::RemoteReadWrite || self == op
    }
}

/// A slice of registered memory exposed to one peer on one connection.
struct Window {
    mr: Weak<MrInner>,
    addr: u64,
    len: u64,
    access: Access,
}

/// The keys one connection has granted. Keys are random and never 0, so a guessed or
/// stale key is unlikely to name a live window, and checking it is cheap.
#[derive(Default)]
pub(crate) struct WindowTable {
    windows: Mutex<HashMap<u32, Window>>,
}

impl WindowTable {
    /// Adds a window over `mr[offset..offset + len]` and returns its remote name.
    pub(crate) fn insert(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<RemoteBuf, TransportError> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= mr.len())
            .ok_or_else(|| {
                TransportError::InvalidArgument(format!(
                    "grant of {len} bytes at {offset} outside a region of {} bytes",
                    mr.len()
                ))
            })?;
        let mut windows = self.windows.lock();
        let key = loop {
            let k: u32 = rand::random();
            if k != 0 && !windows.contains_key(&k) {
                break k;
            }
        };
        let remote = RemoteBuf {
            addr: mr.addr() + offset as u64,
            len: (end - offset) as u64,
            key: MrKey(key),
        };
        let window = Window {
            mr: Arc::downgrade(&mr.inner),
            addr: remote.addr,
            len: remote.len,
            access,
        };
        windows.insert(key, window);
        Ok(remote)
    }

    /// Revokes one key.
    pub(crate) fn remove(&self, key: u32) {
        self.windows.lock().remove(&key);
    }

    /// Revokes every key (the connection closed).
    pub(crate) fn clear(&self) {
        self.windows.lock().clear();
    }

    /// Checks key, access right and bounds of an access of `len` bytes at `addr`; returns
    /// the region and the offset in it. `None` for anything not granted, including a
    /// region that was deregistered while the grant lived.
    pub(crate) fn resolve(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        op: Access,
    ) -> Option<(Arc<MrInner>, usize)> {
        let windows = self.windows.lock();
        let w = windows.get(&key)?;
        let end = addr.checked_add(len)?;
        if !w.access.allows(op) || addr < w.addr || end > w.addr + w.len {
            return None;
        }
        let mr = w.mr.upgrade()?;
        Some((mr.clone(), (addr - mr.addr) as usize))
    }
}

/// A slice of registered memory granted to the peer of one connection. The key works
/// only on that connection and only until the grant is dropped (like an RDMA memory
/// window that is invalidated).
pub struct Grant {
    pub(crate) remote: RemoteBuf,
    pub(crate) core: Weak<ConnCore>,
    /// Backend resources behind the key (an RDMA memory window); released on drop.
    #[allow(dead_code)]
    pub(crate) hw: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl Grant {
    /// The name of the slice to send to the peer.
    pub fn remote(&self) -> RemoteBuf {
        self.remote
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if let Some(core) = self.core.upgrade() {
            core.windows.remove(self.remote.key.0);
        }
    }
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Grant({:?})", self.remote)
    }
}
