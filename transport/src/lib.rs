//! Tessera's transport: an RDMA-shaped API with pluggable backends.
//!
//! The model is the one of RDMA verbs, whatever the wire:
//! - memory is registered once ([`MemoryRegion`]) and a slice of it is named to one peer
//!   by a [`Grant`] on one [`Connection`] (a key that is valid on that connection only);
//! - two-sided [`Connection::call`]s carry small messages, with a bounded size and a
//!   bounded number in flight (credits);
//! - one-sided [`Connection::read`] and [`Connection::write`] move bulk bytes between local
//!   registered memory and a peer's granted slice; the peer's *transport engine* (or its
//!   NIC) serves them, its application is not involved.
//!
//! Backends ([`Backend`], chosen at run time): `tcp` emulates this with frames on one TCP
//! stream per connection; `rdma` (build feature `rdma`) uses verbs on InfiniBand or RoCE
//! v2; `mem` runs peers inside one process with fault injection ([`mem`]); `auto` picks
//! `rdma` when a device is usable and `tcp` otherwise.

pub mod auth;
mod backend;
pub mod blocking;
mod config;
mod conn;
mod endpoint;
mod error;
pub mod frame;
mod host;
pub mod info;
mod link;
pub mod mem;
mod mr;
mod pool;
pub mod ports;
pub mod rdma_common;
pub mod rpc;
mod tcp;
mod window;

#[cfg(feature = "rdma")]
mod rdma;

pub use auth::{ClientKeyFile, Credentials, Key, KeyTable, PeerIdentity, Role, Verifier};
pub use backend::{rdma_probe, Backend, BACKENDS};
pub use config::{RdmaConfig, TransportConfig};
pub use conn::{multi_thread_runtime, Closed, ConnId, Connection, Handler, HandlerFuture};
pub use endpoint::{Endpoint, Listener, PeerCounts, MAX_REGION_BYTES};
pub use error::TransportError;
pub use host::{disk_space, raise_open_file_limit};
pub use link::{next_addr, split_addrs, Link};
pub use mr::{AlignedBuf, MemoryRegion, StableBytes, REGION_ALIGN_BYTES};
pub use pool::{BufferPool, PooledBuf};
pub use proto::{MrKey, RemoteBuf};
pub use window::{Access, Grant};
