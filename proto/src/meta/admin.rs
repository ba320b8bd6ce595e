//! The calls of an administrator's tools (`tessera status`, `tessera fsck`) to the
//! metadata server ([`AdminRequest`]).

use super::{ClusterStatus, MetaRequest};
use serde::{Deserialize, Serialize};

crate::rpc_requests! {
    /// A call of an administration tool.
    pub enum AdminRequest => MetaRequest {
        Status => ClusterStatus, "status", idempotent: true;
        CheckNamespace => Vec<String>, "check_namespace", idempotent: true;
    }
}

/// The map, the number of under-replicated chunks and the resyncs under way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status;

/// Checks the namespace's own consistency (entries, link counts, orphans); returns
/// one line per problem found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckNamespace;
