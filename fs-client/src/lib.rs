//! Tessera's client: the [`Client`] API over the transport, the FUSE mount built on it,
//! and the local-cluster commands behind `tessera up` and `tessera down`.

pub mod api;
mod cache;
pub mod cli;
mod client;
pub mod config;
mod eager;
pub mod error;
mod file;
pub mod fuse;
pub mod metrics;
mod rpc;
mod segpool;

pub use client::{Client, FsStats, LockHow, OpenedByName};
pub use config::ClientConfig;
pub use error::{ClientError, Result};
pub use file::{FileHandle, ReadBuf, Seek};
pub use rpc::RpcCounts;
