//! Tessera's transport: an RDMA-shaped API with pluggable backends.
//!
//! The model is the one of RDMA verbs, whatever the wire:
//! - memory is registered once ([`MemoryRegion`]) and a slice of it is named to one peer
//!   by a [`Grant`] on one [`Connection`] (a key that is valid on that connection only);
//! - two-sided [`Connection::call`]s carry small messages, with a bounded size and a
//!   bounded number in flight (credits);
//! - one-sided [`Connection::read`] and [`Connection::write`] move bulk bytes between local
//!   registered memory and a peer's granted slice; the peer's *transport engine* serves
//!   them, its application is not involved.
//!
//! The `tcp` backend emulates this with frames on one TCP stream per connection.

mod config;
mod conn;
mod endpoint;
mod error;
pub mod frame;
mod link;
mod mr;
mod pool;

pub use config::TransportConfig;
pub use conn::{Access, ConnId, Connection, Grant, Handler, HandlerFuture};
pub use endpoint::{Backend, Endpoint, Listener};
pub use error::TransportError;
pub use link::Link;
pub use mr::MemoryRegion;
pub use pool::{BufferPool, PooledBuf};
pub use proto::{MrKey, RemoteBuf};
