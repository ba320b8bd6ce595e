//! Client keys: each client's key, capabilities and whether it was revoked, kept in the
//! store like the rest of the metadata (durable before the reply).

use super::records::{decode, encode};
use super::{keys, Namespace, Txn};
use crate::error::MetaError;
use proto::auth::Caps;
use serde::{Deserialize, Serialize};

/// Most client keys the store keeps; `key create` beyond it fails with ENOSPC.
pub const MAX_CLIENT_KEYS: usize = 10_000;

/// One client key as stored under `K` name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientRecord {
    /// The key, as a key file holds it (64 hex digits).
    pub key_hex: String,
    /// What the client may do.
    pub caps: Caps,
    /// Refused from now on; kept so that the name is not given again by mistake.
    pub revoked: bool,
}

impl Namespace {
    /// Every client key record, in name order.
    pub fn client_keys(&self) -> Result<Vec<(String, ClientRecord)>, MetaError> {
        let prefix = keys::client_key_prefix();
        let end = [prefix[0] + 1];
        let rows = self.store.scan(&prefix, &end, MAX_CLIENT_KEYS + 1)?;
        rows.iter()
            .map(|(k, v)| {
                let name = String::from_utf8_lossy(&k[1..]).to_string();
                Ok((name, decode(v, "client key")?))
            })
            .collect()
    }

    /// One client's record.
    pub fn client_key(&self, name: &str) -> Result<Option<ClientRecord>, MetaError> {
        match self.store.get(&keys::client_key(name))? {
            Some(v) => Ok(Some(decode(&v, "client key")?)),
            None => Ok(None),
        }
    }

    /// Stores a new client's record, durably; `AlreadyExists` if the name is taken
    /// (a revoked name too).
    pub fn add_client_key(&self, name: &str, rec: &ClientRecord) -> Result<(), MetaError> {
        if self.client_key(name)?.is_some() {
            return Err(MetaError::AlreadyExists(format!("client key {name}")));
        }
        if self.client_keys()?.len() >= MAX_CLIENT_KEYS {
            return Err(MetaError::NoSpace(format!(
                "{MAX_CLIENT_KEYS} client keys exist already"
            )));
        }
        self.put_client_key(name, rec)
    }

    /// Marks a client's key revoked, durably; `NotFound` if there is none.
    pub fn revoke_client_key(&self, name: &str) -> Result<(), MetaError> {
        let Some(mut rec) = self.client_key(name)? else {
            return Err(MetaError::NotFound(format!("client key {name}")));
        };
        rec.revoked = true;
        self.put_client_key(name, &rec)
    }

    fn put_client_key(&self, name: &str, rec: &ClientRecord) -> Result<(), MetaError> {
        {
            let mut st = self.state.lock();
            let mut txn = Txn::new(&*self.store, &st.sb);
            txn.put(keys::client_key(name), encode(rec)?);
            Self::commit_txn(&mut st, txn)?;
        }
        self.wait_pending()
    }
}
