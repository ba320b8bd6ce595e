//! Tessera's data server: file chunks on local disk, each block guarded by a crc32c, moved
//! to and from clients with one-sided transfers.
//!
//! [`store::ChunkStore`] is the transport-independent part: it reads, writes, truncates,
//! deletes and syncs chunks with plain synchronous file I/O (the network layer runs it
//! where blocking is allowed: `block_in_place` on an async worker, or a blocking pool).
//! The on-disk format is described in [`store`].
//! [`service::DataService`] answers requests; [`server::DataServer`] runs it.

pub mod cluster_view;
pub mod config;
pub mod error;
pub mod keys;
pub mod metrics;
pub mod server;
pub mod service;
pub mod store;

pub use config::DataConfig;
pub use error::{DataError, StartError};
pub use server::DataServer;
pub use store::{ChunkStore, Usage};
