//! The calls of an administrator's tools (`tessera status`, `tessera fsck`) to the
//! metadata server ([`AdminRequest`]).

use super::{ClusterStatus, MetaRequest};
use crate::auth::{Caps, KeyId};
use serde::{Deserialize, Serialize};

crate::rpc_requests! {
    /// A call of an administration tool.
    pub enum AdminRequest => MetaRequest {
        Status => ClusterStatus, "status", idempotent: true;
        CheckNamespace => Vec<String>, "check_namespace", idempotent: true;
        KeyCreate => (), "key_create", idempotent: false;
        KeyList => Vec<KeyInfo>, "key_list", idempotent: true;
        KeyRevoke => (), "key_revoke", idempotent: true;
    }
}

/// Records a client key the administrator derived on its own machine from the cluster
/// key (`proto::auth::derive_client_key`): its name, id and capabilities, never the key.
/// A name that holds a valid key is refused (`AlreadyExists`) unless `replace`: then it
/// gets this one instead, and its previous key id is revoked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyCreate {
    /// The client's name (see `proto::auth::check_peer_name`).
    pub name: String,
    /// The key's id (16 random bytes chosen by the tool that derived it).
    pub key_id: KeyId,
    /// What it may do (bound into the key).
    pub caps: Caps,
    /// Replace the name's valid key, if it has one (a rotation), instead of refusing.
    pub replace: bool,
}

/// Every client key's name, capabilities and state (never the keys).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyList;

/// Revokes a client key: its next handshake is refused and its connections close.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRevoke {
    /// The client's name.
    pub name: String,
}

/// One client key as [`KeyList`] shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInfo {
    /// The client's name.
    pub name: String,
    /// What it may do.
    pub caps: Caps,
    /// Its current key's id; `None` for a key of the previous format (stored, not
    /// derived), which is refused until made again.
    pub key_id: Option<KeyId>,
    /// Refused from now on.
    pub revoked: bool,
}

/// The map, the number of under-replicated chunks and the resyncs under way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status;

/// Checks the namespace's own consistency (entries, link counts, orphans); returns
/// one line per problem found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckNamespace;
