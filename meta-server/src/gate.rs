//! A client's capabilities applied at the metadata server's entry, before a request
//! reaches its handler: root squash, read-only, the path scope, and the administration
//! calls. Decided from the request tables (`FsRequest::changes`, `FsRequest::inodes_mut`),
//! so a new request type is decided here without anyone remembering to.

use crate::keys;
use crate::namespace::scope::Scope;
use crate::namespace::Namespace;
use proto::auth::Caps;
use proto::auth::ADMIN_NAME;
use proto::meta::{AdminRequest, ClusterRequest, FsCall, FsRequest};
use proto::{ErrorCode, InodeId, WireError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tracing::warn;
use transport::{PeerIdentity, Role};

/// The scopes of the keys that have connected, by key (name and key id: a key made again
/// under a name, perhaps with another path, resolves its own): resolved at a key's first
/// file-system call after the server starts and kept until it stops (see [`Gate::admit`]).
#[derive(Default)]
pub struct Gate {
    scopes: Mutex<HashMap<String, Arc<Scope>>>,
    refused: AtomicU64,
}

/// What [`Gate::admit`] lets through: the call as the handler must see it, and the
/// scope whose noted files its reply feeds.
pub type Admitted = (FsCall, Option<Arc<Scope>>);

impl Gate {
    /// Applies the peer's capabilities to `call`: its caller squashed, a change refused
    /// to a read-only key (EROFS), and for a scoped key the inode 1 (the client's root)
    /// mapped to the scope's root and every other inode named checked to be inside it
    /// (ENOENT if not). A peer without an identity (a server without keys) or a server
    /// of the cluster is let through unchanged.
    pub fn admit(
        &self,
        ns: &Namespace,
        who: Option<&PeerIdentity>,
        mut call: FsCall,
    ) -> Result<Admitted, WireError> {
        let Some(
            peer @ PeerIdentity {
                name,
                role: Role::Client(caps),
                ..
            },
        ) = who
        else {
            return Ok((call, None));
        };
        if caps.root_squash {
            call.caller = call.caller.squashed();
        }
        if caps.read_only && call.req.changes() {
            return Err(WireError::new(
                ErrorCode::ReadOnly,
                format!("{} refused: key '{name}' is read-only", call.req.name()),
            ));
        }
        if is_whole_tree(caps) {
            return Ok((call, None));
        }
        let scope = self.scope(ns, peer, caps)?;
        if let FsRequest::Resume(r) = &call.req {
            // A restart forgot which files this key reached inside its scope: a grant
            // the cluster sealed for it and the file shows it did.
            for s in &r.sessions {
                if s.grant.as_ref().is_some_and(|g| ns.vouches(g, name, s.ino)) {
                    scope.note(s.ino);
                }
            }
        }
        let what = call.req.name();
        for ino in call.req.inodes_mut() {
            if *ino == InodeId::ROOT {
                *ino = scope.root;
            } else if !ns.inside(&scope, *ino).map_err(WireError::from)? {
                let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
                warn!(key = %name, op = what, ino = ino.0, refused = n,
                      "request naming an inode outside the key's scope refused");
                return Err(WireError::new(
                    ErrorCode::NotFound,
                    format!("no inode {} in this key's scope", ino.0),
                ));
            }
        }
        Ok((call, Some(scope)))
    }

    /// How many requests naming an inode outside their scope were refused.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The key's scope, resolved from its path at its first call. Kept by inode from
    /// then on: a rename of the directory neither widens nor breaks it for this server's
    /// life; a restart resolves the path again.
    fn scope(
        &self,
        ns: &Namespace,
        peer: &PeerIdentity,
        caps: &Caps,
    ) -> Result<Arc<Scope>, WireError> {
        let (name, label) = (&peer.name, peer.key_label());
        if let Some(s) = self.lock().get(&label) {
            return Ok(s.clone());
        }
        let root = ns.resolve_dir(&caps.path).map_err(|e| {
            let path = String::from_utf8_lossy(&caps.path);
            warn!(key = %name, %path, error = %e, "the key's scope does not resolve");
            WireError::new(
                ErrorCode::NotFound,
                format!("the scope {path} of key '{name}' is not a directory"),
            )
        })?;
        let scope = Arc::new(Scope::new(root));
        Ok(self.lock().entry(label).or_insert(scope).clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Scope>>> {
        self.scopes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether `caps` scope nothing: the path is `/`.
pub fn is_whole_tree(caps: &Caps) -> bool {
    caps.path.iter().all(|&b| b == b'/')
}

/// Whether the peer's key is scoped to a directory below `/`.
pub fn is_scoped(who: Option<&PeerIdentity>) -> bool {
    matches!(who.map(|w| &w.role), Some(Role::Client(c)) if !is_whole_tree(c))
}

/// The capabilities of the peer's key, for its `MyCaps`: a peer without an identity (a
/// server without keys) or a server of the cluster may do everything.
pub fn caps_of(who: Option<&PeerIdentity>) -> Caps {
    match who.map(|w| &w.role) {
        Some(Role::Client(caps)) => caps.clone(),
        None | Some(Role::Server) => Caps {
            root_squash: false,
            admin: true,
            ..Caps::default()
        },
    }
}

/// Refuses an administration call to a key without the admin capability (EPERM).
pub fn admin_call(who: Option<&PeerIdentity>, req: &AdminRequest) -> Result<(), WireError> {
    match keys::may_administer(who) {
        true => Ok(()),
        false => Err(refusal(who, req.name())),
    }
}

/// Refuses the calls of data servers (registration, heartbeats, the inode lists of
/// their collection) to a client without the admin capability (EPERM). The map is
/// every client's to read; the revocation list is answered elsewhere, to servers only.
pub fn cluster_call(who: Option<&PeerIdentity>, req: &ClusterRequest) -> Result<(), WireError> {
    let for_everyone = matches!(
        req,
        ClusterRequest::GetMap(_) | ClusterRequest::Revocations(_)
    );
    match for_everyone || keys::is_server(who) || keys::may_administer(who) {
        true => Ok(()),
        false => Err(refusal(who, req.name())),
    }
}

fn refusal(who: Option<&PeerIdentity>, what: &str) -> WireError {
    let name = who.map_or(ADMIN_NAME, |w| w.name.as_str());
    warn!(key = %name, op = what, "administration call refused: the key is not an admin's");
    keys::not_permitted(&format!("{what} (an administration call)"))
}
