//! Who may do what here: the grant a client's chunk request carries for its file, checked
//! on every request, and the requests kept for servers and administrators.
//!
//! A grant's MAC is verified once and remembered (keyed by the MAC, compared field by
//! field on a hit), so the requests after the first of a file cost a table lookup and a
//! few comparisons: the client name against the connection's authenticated name, the
//! file, the mode and the expiry, which are checked on every request. An expiry that fell
//! within an outage of the metadata server is excused until it answers again. Refusals are
//! counted per reason and logged once per connection and reason, not per request.

use crate::cluster_view::MetaContact;
use crate::error::DataError;
use parking_lot::Mutex;
use proto::grant::{check_fields, sealed_by, unix_ms, Grant, GrantFault, GrantMode, Need};
use proto::InodeId;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tracing::warn;
use transport::{ConnId, Connection, Key, Role};

/// Grants whose MAC was verified, kept at most; the table is cleared when full (the next
/// request of each file verifies again).
pub const MAX_VERIFIED_GRANTS: usize = 4096;

/// (connection, reason) pairs already logged, kept at most; cleared when full, and a
/// connection's entries when it closes.
const MAX_LOGGED_REFUSALS: usize = 4096;

/// The data server's checks of grants and roles (present when it has the cluster key).
pub struct GrantCheck {
    key: Key,
    skew_ms: u64,
    /// Whether the metadata server answers: an outage excuses an expiry.
    contact: Arc<MetaContact>,
    verified: Mutex<HashMap<[u8; proto::grant::GRANT_MAC_BYTES], Grant>>,
    refused: [AtomicU64; GrantFault::ALL.len()],
    logged: Mutex<HashSet<(ConnId, GrantFault)>>,
}

impl GrantCheck {
    /// Checks grants sealed with `key` (the cluster key), taking them `skew_ms` past
    /// their expiry, and past it while `contact` says the metadata server is away and
    /// was since before they ran out.
    pub fn new(key: Key, skew_ms: u64, contact: Arc<MetaContact>) -> GrantCheck {
        GrantCheck {
            key,
            skew_ms,
            contact,
            verified: Mutex::new(HashMap::new()),
            refused: Default::default(),
            logged: Mutex::new(HashSet::new()),
        }
    }

    /// Whether the request on `conn` for `inode` may go on: a server of the cluster
    /// needs no grant; a client needs one of `mode` for `inode`, sealed, given to it,
    /// not expired.
    pub fn chunk_access(
        &self,
        conn: &Connection,
        grant: Option<&Grant>,
        inode: InodeId,
        mode: GrantMode,
    ) -> Result<(), DataError> {
        let who = conn.peer_identity();
        let name = match who.as_deref() {
            Some(w) if w.role == Role::Server => return Ok(()),
            Some(w) => w.name.as_str(),
            // A listener with the cluster key authenticates every connection first.
            None => "",
        };
        let need = Need {
            inode,
            client: name,
            mode,
        };
        match self.verdict(grant, need) {
            Ok(()) => Ok(()),
            Err(fault) => Err(self.refuse(conn, name, inode, fault)),
        }
    }

    fn verdict(&self, grant: Option<&Grant>, need: Need<'_>) -> Result<(), GrantFault> {
        let g = grant.ok_or(GrantFault::Missing)?;
        let known = self.verified.lock().get(&g.mac).is_some_and(|v| v == g);
        if !known {
            if !sealed_by(self.key.bytes(), g) {
                return Err(GrantFault::Forged);
            }
            let mut verified = self.verified.lock();
            if verified.len() >= MAX_VERIFIED_GRANTS {
                verified.clear();
            }
            verified.insert(g.mac, g.clone());
        }
        check_fields(g, need, unix_ms(), self.skew_ms, self.contact.reach())
    }

    fn refuse(&self, conn: &Connection, name: &str, ino: InodeId, fault: GrantFault) -> DataError {
        let at = GrantFault::ALL
            .iter()
            .position(|f| *f == fault)
            .unwrap_or(0);
        self.refused[at].fetch_add(1, Ordering::Relaxed);
        let first = {
            let mut logged = self.logged.lock();
            if logged.len() >= MAX_LOGGED_REFUSALS {
                logged.clear();
            }
            logged.insert((conn.id(), fault))
        };
        if first {
            warn!(peer = conn.peer(), client = name, %ino, reason = fault.name(),
                "chunk request refused: bad grant (logged once per connection and reason)");
        }
        DataError::Grant {
            fault,
            why: format!("{ino}: grant {} for client '{name}'", fault.name()),
        }
    }

    /// Refuses `what` unless the peer is a server of the cluster.
    pub fn server_only(&self, conn: &Connection, what: &str) -> Result<(), DataError> {
        match conn.peer_identity().as_deref() {
            Some(w) if w.role == Role::Server => Ok(()),
            _ => Err(DataError::NotPermitted(format!(
                "{what} is for servers only"
            ))),
        }
    }

    /// Refuses `what` unless the peer is a server or a client with the admin capability.
    pub fn admin_only(&self, conn: &Connection, what: &str) -> Result<(), DataError> {
        match conn.peer_identity().as_deref().map(|w| &w.role) {
            Some(Role::Server) => Ok(()),
            Some(Role::Client(caps)) if caps.admin => Ok(()),
            _ => Err(DataError::NotPermitted(format!(
                "{what} needs the admin capability"
            ))),
        }
    }

    /// Refusals so far, per reason (by [`GrantFault::name`]).
    pub fn refusals(&self) -> Vec<(String, u64)> {
        GrantFault::ALL
            .iter()
            .zip(&self.refused)
            .map(|(f, n)| (f.name().to_string(), n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Forgets what was logged for a closed connection.
    pub fn disconnected(&self, conn: ConnId) {
        self.logged.lock().retain(|(c, _)| *c != conn);
    }
}
