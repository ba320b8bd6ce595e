//! Tessera's metadata server, without its network wiring: the embedded key-value store
//! ([`kv`]) and the namespace that answers every [`proto::meta::MetaRequest`]
//! ([`namespace`]).
//!
//! The network layer owns connections: it numbers each one with a [`ConnId`], passes
//! every request to [`Namespace::handle`], and calls [`Namespace::connection_closed`]
//! when a connection ends, so the sessions it opened end too.

pub mod clock;
pub mod config;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod gate;
pub mod grants;
pub mod keys;
pub mod kv;
pub(crate) mod membership;
pub(crate) mod metrics;
pub mod migrate;
pub mod namespace;
pub mod server;
mod service;

pub use clock::{Clock, ManualClock, SystemClock};
pub use config::NamespaceConfig;
pub use error::{MetaError, MigrateError, StartError};
pub use kv::{
    open_engine, open_store, EtcdConfig, KvError, KvPair, KvStore, ReadCheck, Revision, StoreKind,
    TxnLimits, TxnStore, Versioned, WriteBatch,
};
pub use namespace::{ConnId, DirPage, FsStats, Made, Namespace, Opened, SessionOwner};
