//! The calls data servers make to the metadata server ([`ClusterRequest`]): membership,
//! leases, the cluster map and the checks of their chunks against the namespace.

use super::{ClusterMap, FileLayout, GcTask, MetaRequest, ResyncReport};
use crate::auth::Caps;
use crate::ids::{InodeId, NodeId};
use serde::{Deserialize, Serialize};

crate::rpc_requests! {
    /// A call of a data server (or of a client reading the map) about the cluster.
    pub enum ClusterRequest => MetaRequest {
        RegisterData => NodeId, "register_data", idempotent: true;
        Heartbeat => Beat, "heartbeat", idempotent: true;
        GetMap => ClusterMap, "cluster_map", idempotent: true;
        ListFiles => FilesPage, "list_files", idempotent: true;
        InodesExist => Vec<bool>, "inodes_exist", idempotent: true;
        ClientKey => ClientKeyAnswer, "client_key", idempotent: true;
    }
}

/// A data server asks for a client's key, to check a client's handshake. Answered only
/// on a connection authenticated as a server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientKey {
    /// The name the client gave.
    pub name: String,
}

/// What the metadata server knows of a client name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientKeyAnswer {
    /// Valid: its key (64 hex digits) and capabilities.
    Known {
        /// The key, as a key file holds it.
        key_hex: String,
        /// What it may do.
        caps: Caps,
    },
    /// No such client.
    Unknown,
    /// Revoked.
    Revoked,
}

/// A data server announces itself (first start: `node` is `None`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterData {
    /// The id it was given before, kept in its data directory.
    pub node: Option<NodeId>,
    /// Where its transport listens.
    pub addr: String,
    /// Bytes of disk it may use.
    pub capacity_bytes: u64,
    /// Bytes it uses.
    pub used_bytes: u64,
}

/// A data server's lease renewal, carrying the deletions it has finished.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The server.
    pub node: NodeId,
    /// Bytes of disk it may use.
    pub capacity_bytes: u64,
    /// Bytes it uses.
    pub used_bytes: u64,
    /// Deletions finished since the last heartbeat.
    pub done: Vec<GcTask>,
    /// The version of the cluster map the server knows.
    pub map_version: u64,
    /// How its resync goes.
    pub resync: ResyncReport,
}

/// The cluster map: data servers, chains and their states.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetMap;

/// Up to `limit` regular files with an inode number above `after`, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListFiles {
    /// Start after this inode.
    pub after: InodeId,
    /// At most this many files.
    pub limit: u32,
}

/// Whether each of these inodes still exists (a data server looking for chunks no
/// file points to).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodesExist {
    /// The inodes to check.
    pub inodes: Vec<InodeId>,
}

/// The answer to a [`Heartbeat`]: deletions to carry out, and the cluster map when the
/// server's version is not the current one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beat {
    /// Deletions for the heartbeating data server.
    pub gc: Vec<GcTask>,
    /// The current map, when the server's is older.
    pub map: Option<ClusterMap>,
}

/// Regular files and their layouts: the reply to [`ListFiles`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesPage {
    /// In inode order.
    pub files: Vec<FileLayout>,
    /// No files follow the last one.
    pub done: bool,
}
