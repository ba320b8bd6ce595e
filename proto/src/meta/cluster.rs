//! The calls data servers make to the metadata server ([`ClusterRequest`]): membership,
//! leases, the cluster map and the checks of their chunks against the namespace.

use super::{ClusterMap, FileLayout, GcTask, MetaRequest, ResyncReport};
use crate::auth::KeyId;
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
        InodeCopies => Vec<Option<u8>>, "inode_copies", idempotent: true;
        Revocations => RevocationPage, "revocations", idempotent: true;
    }
}

/// Most revocations a metadata server records, and a data server keeps (each revoke,
/// and each key made again under a name, adds one); beyond it both refuse. Rotating
/// the cluster key empties the list: every key on it was derived from the previous
/// cluster key, which no server holds any more.
pub const MAX_REVOCATIONS: usize = 100_000;

/// Most revocations one [`Revocations`] answer carries; the data server asks again
/// for the rest.
pub const MAX_REVOCATIONS_PER_PAGE: usize = 1024;

/// A data server pulls the revoked client keys it has not seen: those recorded after
/// version `since` (0: from the start). Answered only on a connection authenticated as
/// a server. No key travels: a data server derives every client key itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocations {
    /// The last version the data server has.
    pub since: u64,
}

/// One revoked key: a name and the id of the key under it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Revoked {
    /// The client's name.
    pub name: String,
    /// The revoked key's id (a key made again under the name has another).
    pub key_id: KeyId,
}

/// The reply to [`Revocations`]: at most [`MAX_REVOCATIONS_PER_PAGE`], in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationPage {
    /// Revocations after `since`, oldest first.
    pub revoked: Vec<Revoked>,
    /// The version of the last one here (`since` when there is none).
    pub version: u64,
    /// No revocation follows the last one.
    pub done: bool,
    /// Drawn at random by the metadata server at each start: versions compare only
    /// within one epoch (a crash can lose the last versions handed out before they
    /// were durable, a restored store or a rotated cluster key starts them anew), so a
    /// data server that sees another epoch pulls the whole list again.
    pub epoch: u64,
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

/// How many copies each of these inodes' files asks for: `None` for an inode that is
/// not a regular file, or no longer exists. A file asking for `n` copies lives on the
/// first `n` members of each of its chains ([`super::ChainInfo::used`]): a data server
/// resyncing a chain asks this before it copies a chunk, or drops one its source
/// lacks, so that a member that never held a file's chunks is not taken for one that
/// lost them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodeCopies {
    /// The inodes, at most [`MAX_COPIES_QUERY`].
    pub inodes: Vec<InodeId>,
}

/// Most inodes one [`InodeCopies`] asks about.
pub const MAX_COPIES_QUERY: usize = 1024;

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
