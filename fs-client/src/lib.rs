//! Tessera's client: the [`Client`] API over the transport, the FUSE mount built on it,
//! and the local-cluster commands behind `tessera up` and `tessera down`.

pub mod admin;
mod client;
pub mod cluster;
pub mod config;
mod dirattrs;
mod dirnames;
pub mod error;
mod file;
pub mod fuse;
mod leftovers;
mod noxattrs;
mod rpc;
mod segpool;
mod ttlmap;

pub use client::{Client, FsStats};
pub use config::ClientConfig;
pub use error::{ClientError, Result};
pub use file::{FileHandle, ReadBuf};
pub use rpc::RpcCounts;
