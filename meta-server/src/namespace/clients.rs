//! Client keys: each client's key id, capabilities and whether it was revoked, kept in
//! the store like the rest of the metadata (durable before the reply), and the list of
//! revoked keys the data servers pull. No key is stored: every server derives it from
//! the cluster key.

use super::records::{decode, encode};
use super::txn::Reads;
use super::{keys, Namespace};
use crate::error::MetaError;
use proto::auth::{Caps, KeyId};
use proto::meta::cluster::Revoked;
use serde::{Deserialize, Serialize};

/// Most client keys the store keeps; `key create` beyond it fails with ENOSPC.
pub const MAX_CLIENT_KEYS: usize = 10_000;

/// Most revocations the store keeps; beyond it `key revoke` and `key create` of a name
/// that had a key fail with ENOSPC.
pub use proto::meta::cluster::MAX_REVOCATIONS;

/// First byte of a stored record's body for a derived key. A record of the previous
/// format (which stored the key itself) starts with the length of its 64 hex digits,
/// 64, so the two are told apart.
const DERIVED_RECORD: u8 = 2;

/// One client key as stored under `K` name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientRecord {
    /// `DERIVED_RECORD`.
    pub format: u8,
    /// The id of the name's current key.
    pub key_id: KeyId,
    /// What the client may do.
    pub caps: Caps,
    /// Refused from now on, until a key is made again under the name.
    pub revoked: bool,
}

impl ClientRecord {
    /// A record of a derived key.
    pub fn new(key_id: KeyId, caps: Caps) -> ClientRecord {
        ClientRecord {
            format: DERIVED_RECORD,
            key_id,
            caps,
            revoked: false,
        }
    }
}

/// One revocation as stored under `R` version (a type of its own, not the wire's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationRecord {
    /// The client's name.
    pub name: String,
    /// The revoked key's id.
    pub key_id: KeyId,
}

/// A record of the previous format: the key itself, stored.
#[derive(Deserialize)]
struct StoredKeyRecord {
    _key_hex: String,
    caps: Caps,
    revoked: bool,
}

/// A stored client key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredClient {
    /// A derived key.
    Derived(ClientRecord),
    /// A key of the previous format, made before keys were derived: it cannot be
    /// derived, so it is refused until the operator makes it again.
    Stored {
        /// What it was made for.
        caps: Caps,
        /// Whether it was revoked.
        revoked: bool,
    },
}

fn decode_client(bytes: &[u8]) -> Result<StoredClient, MetaError> {
    if bytes.get(1) == Some(&DERIVED_RECORD) {
        return Ok(StoredClient::Derived(decode(bytes, "client key")?));
    }
    let old: StoredKeyRecord = decode(bytes, "client key")?;
    Ok(StoredClient::Stored {
        caps: old.caps,
        revoked: old.revoked,
    })
}

impl Namespace {
    /// Every client key record, in name order.
    pub fn client_keys(&self) -> Result<Vec<(String, StoredClient)>, MetaError> {
        let prefix = keys::client_key_prefix();
        let end = [prefix[0] + 1];
        let rows = self.store.scan(&prefix, &end, MAX_CLIENT_KEYS + 1)?;
        rows.iter()
            .map(|(k, v)| {
                let name = String::from_utf8_lossy(&k[1..]).to_string();
                Ok((name, decode_client(v)?))
            })
            .collect()
    }

    /// One client's record.
    pub fn client_key(&self, name: &str) -> Result<Option<StoredClient>, MetaError> {
        match self.store.get(&keys::client_key(name))? {
            Some(v) => Ok(Some(decode_client(&v)?)),
            None => Ok(None),
        }
    }

    /// Stores a client's record, durably. A name that holds a valid key is refused
    /// (`AlreadyExists`) unless `replace`: then it gets this one instead, and its
    /// previous key id goes to the revocation list. Decided inside the transaction, so
    /// that two creates of one name cannot both pass the check. The name's current key
    /// id is refused (it would revoke nothing and keep its connections).
    pub fn put_client_key(
        &self,
        name: &str,
        rec: &ClientRecord,
        replace: bool,
    ) -> Result<(), MetaError> {
        self.change_client(name, |old| {
            let superseded = match old {
                Some(StoredClient::Derived(r)) if r.key_id == rec.key_id => {
                    return Err(MetaError::InvalidArgument(format!(
                        "key id {} is client '{name}''s current one: a new key needs a new id",
                        rec.key_id
                    )))
                }
                Some(StoredClient::Derived(r)) if !r.revoked && !replace => {
                    return Err(MetaError::AlreadyExists(format!(
                        "client '{name}' has a valid key ({}): `tessera key create \
                         --replace` makes a new one and revokes it",
                        r.key_id
                    )))
                }
                Some(StoredClient::Derived(r)) if !r.revoked => Some(r.key_id),
                _ => None,
            };
            Ok((rec.clone(), superseded))
        })
    }

    /// Records the mark of the cluster key the client keys are made under (a MAC under
    /// it). Started under another cluster key, every client key is marked revoked (each
    /// was derived from the previous cluster key: none can prove itself any more) and
    /// the revocation list is emptied (its entries name keys no server can derive now;
    /// kept, a list that only grows would fill up after a few rotations). Returns how
    /// many keys were marked revoked then, `None` if the key is the recorded one (or
    /// the first one recorded).
    pub fn adopt_cluster_key(&self, mark: &[u8]) -> Result<Option<usize>, MetaError> {
        self.retry_conflicts("cluster key change", || self.adopt_cluster_key_once(mark))
    }

    fn adopt_cluster_key_once(&self, mark: &[u8]) -> Result<Option<usize>, MetaError> {
        let rotated = self.mutate(|txn, _| {
            let old = txn.raw(&keys::cluster_mark())?;
            if old.as_deref() == Some(mark) {
                return Ok(None);
            }
            txn.put(keys::cluster_mark(), mark.to_vec());
            if old.is_none() {
                // The first start that marks: the keys were made under this key.
                return Ok(None);
            }
            let (start, end) = (keys::revocation(0), keys::revocation_end());
            for (k, _) in self.store.scan(&start, &end, MAX_REVOCATIONS + 1)? {
                txn.delete(k);
            }
            let mut marked = 0;
            for (name, rec) in self.client_keys()? {
                if let StoredClient::Derived(mut r) = rec {
                    if !r.revoked {
                        r.revoked = true;
                        marked += 1;
                        txn.put(keys::client_key(&name), encode(&r)?);
                    }
                }
            }
            Ok(Some(marked))
        })?;
        self.wait_pending()?;
        Ok(rotated)
    }

    /// Marks a client's key revoked and adds it to the revocation list, durably;
    /// `NotFound` if there is none.
    pub fn revoke_client_key(&self, name: &str) -> Result<(), MetaError> {
        self.change_client(name, |old| {
            let mut rec = match old {
                Some(StoredClient::Derived(rec)) => rec,
                Some(StoredClient::Stored { .. }) => {
                    return Err(MetaError::InvalidArgument(format!(
                        "client key {name} was made by an older Tessera and is refused \
                         already; make it again with tessera key create"
                    )))
                }
                None => return Err(MetaError::NotFound(format!("client key {name}"))),
            };
            let revoked = (!rec.revoked).then_some(rec.key_id);
            rec.revoked = true;
            Ok((rec, revoked))
        })
    }

    /// Up to `limit` revocations recorded after version `since`, oldest first, with
    /// their versions, and whether none follows.
    pub fn revocations(
        &self,
        since: u64,
        limit: usize,
    ) -> Result<(Vec<(u64, Revoked)>, bool), MetaError> {
        let start = keys::revocation(since.saturating_add(1));
        let end = keys::revocation_end();
        let rows = self.store.scan(&start, &end, limit + 1)?;
        let done = rows.len() <= limit;
        let page = rows
            .iter()
            .take(limit)
            .map(|(k, v)| {
                let r: RevocationRecord = decode(v, "revocation")?;
                let (name, key_id) = (r.name, r.key_id);
                Ok((keys::revocation_version(k), Revoked { name, key_id }))
            })
            .collect::<Result<_, MetaError>>()?;
        Ok((page, done))
    }

    /// Replaces `name`'s record with what `change` makes of the current one, and adds
    /// the key id it returns to the revocation list: one transaction under the state
    /// lock, so that two changes cannot take the same revocation version.
    fn change_client(
        &self,
        name: &str,
        change: impl Fn(Option<StoredClient>) -> Result<(ClientRecord, Option<KeyId>), MetaError>,
    ) -> Result<(), MetaError> {
        // On a shared engine another server's key change may conflict: read again.
        self.retry_conflicts("client key change", || {
            self.change_client_once(name, &change)
        })
    }

    fn change_client_once(
        &self,
        name: &str,
        change: &dyn Fn(Option<StoredClient>) -> Result<(ClientRecord, Option<KeyId>), MetaError>,
    ) -> Result<(), MetaError> {
        self.mutate(|txn, _| {
            // Read through the transaction: on a shared engine another server's change
            // of the same name conflicts with this one.
            let old = match txn.raw(&keys::client_key(name))? {
                Some(v) => Some(decode_client(&v)?),
                None => None,
            };
            if old.is_none() && self.client_keys()?.len() >= MAX_CLIENT_KEYS {
                return Err(MetaError::NoSpace(format!(
                    "{MAX_CLIENT_KEYS} client keys exist already"
                )));
            }
            let (rec, revoked) = change(old)?;
            txn.put(keys::client_key(name), encode(&rec)?);
            if let Some(key_id) = revoked {
                let version = self.next_revocation()?;
                // Read absent through the transaction: two servers that picked the same
                // version conflict, and one picks again.
                if txn.raw(&keys::revocation(version))?.is_some() {
                    return Err(MetaError::Store(crate::kv::KvError::Conflict {
                        engine: self.store.engine(),
                        key: keys::revocation(version),
                    }));
                }
                let name = name.to_string();
                let rec = RevocationRecord { name, key_id };
                txn.put(keys::revocation(version), encode(&rec)?);
            }
            Ok(())
        })?;
        self.wait_pending()
    }

    /// The version the next revocation gets: one past the last (versions start at 1).
    /// Key changes are rare administrator calls, so reading the list to find its end
    /// is cheap enough.
    fn next_revocation(&self) -> Result<u64, MetaError> {
        let (start, end) = (keys::revocation(1), keys::revocation_end());
        let rows = self.store.scan(&start, &end, MAX_REVOCATIONS + 1)?;
        if rows.len() >= MAX_REVOCATIONS {
            return Err(MetaError::NoSpace(format!(
                "{MAX_REVOCATIONS} revocations recorded: rotate the cluster key"
            )));
        }
        Ok(rows
            .last()
            .map_or(1, |(k, _)| keys::revocation_version(k) + 1))
    }
}
