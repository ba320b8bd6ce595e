//! The calls of an administrator's tools (`tessera status`, `tessera fsck`) to the
//! metadata server ([`AdminRequest`]).

use super::{ClusterStatus, MetaRequest};
use crate::auth::Caps;
use serde::{Deserialize, Serialize};

crate::rpc_requests! {
    /// A call of an administration tool.
    pub enum AdminRequest => MetaRequest {
        Status => ClusterStatus, "status", idempotent: true;
        CheckNamespace => Vec<String>, "check_namespace", idempotent: true;
        KeyCreate => String, "key_create", idempotent: false;
        KeyList => Vec<KeyInfo>, "key_list", idempotent: true;
        KeyRevoke => (), "key_revoke", idempotent: true;
    }
}

/// Makes a client key with these capabilities; answers the key (64 hex digits), which
/// the server keeps and never sends to clients again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyCreate {
    /// The client's name (see `proto::auth::check_peer_name`); must be new.
    pub name: String,
    /// What it may do.
    pub caps: Caps,
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
