//! Grants handed out with a file's layout at open and create, and renewed on `Regrant`:
//! sealed with the cluster key for the connection's authenticated client, for reading
//! only when the client's key is read-only, for `grant_lifetime_ms`.

use crate::namespace::{ConnId, Namespace, Origin};
use crate::MetaError;
use proto::grant::{seal, unix_ms, Grant, GrantMode};
use proto::meta::fs::Opened;
use proto::{FileKind, InodeId, SessionId};
use std::sync::Arc;
use transport::{KeyTable, PeerIdentity, Role};

/// Default of `MetaConfig::grant_lifetime_ms`: ten minutes. Clients renew at half of it.
pub const DEFAULT_GRANT_LIFETIME_MS: u64 = 600_000;

/// Bounds of `MetaConfig::grant_lifetime_ms`: from one second (tests) to a day.
pub const GRANT_LIFETIME_RANGE_MS: std::ops::RangeInclusive<u64> = 1000..=86_400_000;

/// Longest life of a grant for the cut of a vanished writer's tail: the opener cuts at
/// once, and the grant allows a truncation to a length the file may outgrow later.
pub const CUT_GRANT_LIFETIME_MS: u64 = 60_000;

/// Seals grants (present on a server with keys).
pub struct Granter {
    lifetime_ms: u64,
    /// The cluster key grants are sealed with, and who is revoked now (a revoked
    /// client gets no new grant).
    table: Arc<KeyTable>,
}

impl Granter {
    /// Seals with `table`'s cluster key for `lifetime_ms`, asking `table` whether a
    /// client is revoked.
    pub fn new(lifetime_ms: u64, table: Arc<KeyTable>) -> Granter {
        Granter { lifetime_ms, table }
    }

    /// A grant on `ino` for the client at the other end of a connection (`None` for a
    /// peer that is no client, or a revoked one), writable if the open `writes` and the
    /// client's key is not read-only.
    pub fn grant(
        &self,
        who: Option<&PeerIdentity>,
        ino: InodeId,
        writes: bool,
        map_version: u64,
    ) -> Option<Grant> {
        let mode = match writes {
            true => GrantMode::ReadWrite,
            false => GrantMode::Read,
        };
        self.sealed(who, ino, mode, self.lifetime_ms, map_version)
    }

    /// A grant of `mode` (`ReadWrite` is `Read` for a read-only key) on `ino` for the
    /// client at the other end of a connection, for `lifetime_ms`.
    fn sealed(
        &self,
        who: Option<&PeerIdentity>,
        ino: InodeId,
        mode: GrantMode,
        lifetime_ms: u64,
        map_version: u64,
    ) -> Option<Grant> {
        let who = who?;
        let Role::Client(caps) = &who.role else {
            return None;
        };
        let valid = who
            .key_id
            .is_some_and(|id| self.table.is_valid(&who.name, &id));
        if !valid {
            return None;
        }
        let mode = match mode {
            GrantMode::ReadWrite if caps.read_only => GrantMode::Read,
            m => m,
        };
        let expires_ms = unix_ms().saturating_add(lifetime_ms);
        Some(seal(
            self.table.cluster_key().bytes(),
            ino,
            &who.name,
            mode,
            expires_ms,
            map_version,
        ))
    }

    /// Adds the grant to an open's reply (regular files only): writable if the open
    /// `writes`; and if it must cut a vanished writer's tail first, a grant for that
    /// cut alone (a truncation to the committed length, a read-only key's too: the
    /// bytes it takes away are past what any reader sees), lasting at most
    /// [`CUT_GRANT_LIFETIME_MS`], so a reader holds no writable grant for it.
    pub fn attach(
        &self,
        who: Option<&PeerIdentity>,
        opened: &mut Opened,
        writes: bool,
        ns: &Namespace,
    ) {
        if opened.attr.kind != FileKind::Regular {
            return;
        }
        let (ino, version) = (opened.attr.ino, ns.map_version());
        opened.grant = self.grant(who, ino, writes, version);
        if opened.cut_tail {
            let cut = GrantMode::CutTo(opened.attr.size, opened.layout.chunk_size_bytes);
            let life = self.lifetime_ms.min(CUT_GRANT_LIFETIME_MS);
            opened.cut_grant = self.sealed(who, ino, cut, life, version);
        }
    }

    /// A new grant for `session`, opened on connection `conn`: refused for a session
    /// that is gone or another connection's, and for a revoked client.
    pub fn regrant(
        &self,
        who: Option<&PeerIdentity>,
        ns: &Namespace,
        session: SessionId,
        conn: ConnId,
    ) -> Result<Option<Grant>, MetaError> {
        let (ino, writes) = ns.session_file(session, conn)?;
        let grant = self.grant(who, ino, writes, ns.map_version());
        if grant.is_none() && who.is_some_and(|w| w.role != Role::Server) {
            return Err(MetaError::NotPermitted(format!(
                "no grant for {session}: the client's key is revoked or unknown"
            )));
        }
        Ok(grant)
    }
}

impl Namespace {
    /// Whether `g` was sealed by this cluster for `name` and file `ino` (whatever its
    /// expiry): the metadata server gave `name` a grant for it, so reached it.
    pub(crate) fn vouches(&self, g: &Grant, name: &str, ino: InodeId) -> bool {
        let Some(granter) = self.granter.get() else {
            return false;
        };
        g.inode == ino
            && g.client == name
            && proto::grant::sealed_by(granter.table.cluster_key().bytes(), g)
    }

    /// Adds the grant of `at`'s client to an open's reply (none without keys).
    pub(crate) fn attach_grant(&self, at: &Origin, opened: &mut Opened, writes: bool) {
        if let Some(g) = self.granter.get() {
            g.attach(at.who.as_deref(), opened, writes, self);
        }
    }

    /// New grants for the sessions a `Resume` took back on `at`'s connection, each of
    /// its session's mode (none without keys, or for a revoked client).
    pub(crate) fn resume_grants(
        &self,
        at: &Origin,
        kept: &[(SessionId, InodeId, bool)],
    ) -> Vec<(SessionId, Grant)> {
        let Some(g) = self.granter.get() else {
            return Vec::new();
        };
        let version = self.map_version();
        kept.iter()
            .filter_map(|&(session, ino, writes)| {
                let grant = g.grant(at.who.as_deref(), ino, writes, version)?;
                Some((session, grant))
            })
            .collect()
    }

    /// A new grant for `session`, opened on `at`'s connection (none without keys).
    pub(crate) fn regrant(
        &self,
        session: SessionId,
        at: &Origin,
    ) -> Result<Option<Grant>, MetaError> {
        match self.granter.get() {
            Some(g) => g.regrant(at.who.as_deref(), self, session, at.conn),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::auth::Caps;
    use proto::auth::KeyId;
    use transport::auth::KeyRecord;
    use transport::Key;

    fn client(name: &str, caps: Caps) -> PeerIdentity {
        PeerIdentity {
            name: name.into(),
            key_id: Some(KeyId([1; 16])),
            role: Role::Client(caps),
        }
    }

    /// Guards against a revoked client, a read-only key or a server being handed a
    /// grant it must not have.
    #[test]
    fn grants_follow_the_key_and_end_with_its_revocation() {
        let cluster = Key::generate().unwrap();
        let table = Arc::new(KeyTable::new(cluster.clone()));
        let record = |caps| KeyRecord {
            key_id: KeyId([1; 16]),
            caps,
            revoked: false,
        };
        let ro = Caps {
            read_only: true,
            ..Caps::default()
        };
        table.insert("alice", record(Caps::default()));
        table.insert("reader", record(ro.clone()));
        let granter = Granter::new(60_000, table.clone());
        let alice = client("alice", Caps::default());
        let g = granter.grant(Some(&alice), InodeId(9), true, 4).unwrap();
        assert_eq!(
            (g.mode, g.client.as_str(), g.map_version),
            (GrantMode::ReadWrite, "alice", 4)
        );
        assert!(proto::grant::sealed_by(cluster.bytes(), &g));
        let read = granter.grant(Some(&alice), InodeId(9), false, 4).unwrap();
        assert_eq!(read.mode, GrantMode::Read);
        let reader = client("reader", ro);
        let g = granter.grant(Some(&reader), InodeId(9), true, 4).unwrap();
        assert_eq!(
            g.mode,
            GrantMode::Read,
            "a read-only key never gets a write grant"
        );
        let server = PeerIdentity {
            name: "server/data".into(),
            key_id: None,
            role: Role::Server,
        };
        assert!(granter.grant(Some(&server), InodeId(9), true, 4).is_none());
        assert!(granter.grant(None, InodeId(9), true, 4).is_none());
        let superseded = PeerIdentity {
            key_id: Some(KeyId([2; 16])),
            ..alice.clone()
        };
        assert!(
            granter
                .grant(Some(&superseded), InodeId(9), true, 4)
                .is_none(),
            "a key made again under the name ends the old key's grants"
        );
        table.revoke("alice");
        assert!(granter.grant(Some(&alice), InodeId(9), true, 4).is_none());
        assert!(granter
            .grant(
                Some(&client("nobody", Caps::default())),
                InodeId(9),
                true,
                4
            )
            .is_none());
    }
}
