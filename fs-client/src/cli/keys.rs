//! `tessera key create|list|revoke`: client keys, derived from the cluster key on the
//! administrator's machine, recorded (name, key id, capabilities: never the key) by the
//! metadata server, managed by a client with the admin capability.

use super::commands::KeyCmd;
use crate::client::Client;
use crate::error::{ClientError, Result};
use proto::auth::{Caps, KeyId};
use proto::meta::admin::{KeyCreate, KeyInfo, KeyList, KeyRevoke};
use std::path::{Path, PathBuf};
use transport::{ClientKeyFile, Key};

impl Client {
    /// Records a client key derived here: its name, id and capabilities; `replace`
    /// replaces (and revokes) a valid key the name holds, which is refused otherwise.
    pub async fn key_create(
        &self,
        name: &str,
        key_id: KeyId,
        caps: Caps,
        replace: bool,
    ) -> Result<()> {
        let name = name.to_string();
        self.meta(KeyCreate {
            name,
            key_id,
            caps,
            replace,
        })
        .await
    }

    /// Every client key's name, capabilities and state.
    pub async fn key_list(&self) -> Result<Vec<KeyInfo>> {
        self.meta(KeyList).await
    }

    /// Revokes a client key; its connections close at once.
    pub async fn key_revoke(&self, name: &str) -> Result<()> {
        let name = name.to_string();
        self.meta(KeyRevoke { name }).await
    }
}

/// One line per key: name, key id, path, mode, squash, admin, state.
pub fn render(keys: &[KeyInfo]) -> String {
    let mut out = String::new();
    for k in keys {
        let c = &k.caps;
        let id = k
            .key_id
            .map_or("old-format".to_string(), |id| id.to_string());
        out.push_str(&format!(
            "{} id={id} path={} {}{}{}{}\n",
            k.name,
            String::from_utf8_lossy(&c.path),
            if c.read_only { "ro" } else { "rw" },
            if c.root_squash { " root_squash" } else { "" },
            if c.admin { " admin" } else { "" },
            if k.revoked { " REVOKED" } else { "" },
        ));
    }
    out
}

/// Runs one `tessera key` subcommand; `cluster_key` is the cluster key file found for
/// the cluster asked (a `create` without it, nor `--cluster-key-file`, fails).
pub async fn run(client: &Client, action: KeyCmd, cluster_key: Option<PathBuf>) -> Result<()> {
    match action {
        KeyCmd::Create {
            name,
            path,
            read_only,
            no_root_squash,
            admin,
            replace,
            out,
            cluster_key_file,
            ..
        } => {
            let caps = Caps {
                path: path.into_bytes(),
                read_only,
                // Root squash is on for every client unless turned off; an administrator
                // is trusted with root.
                root_squash: !no_root_squash && !admin,
                admin,
            };
            let Some(cluster_file) = cluster_key_file.or(cluster_key) else {
                return Err(ClientError::Config(
                    "tessera key create derives the key from the cluster key and found no \
                     cluster key file: give --cluster-key-file (a cluster `tessera up` \
                     started keeps it in its state directory)"
                        .into(),
                ));
            };
            let out = out.as_deref();
            create(client, &name, caps, replace, &cluster_file, out).await?;
        }
        KeyCmd::List { .. } => print!("{}", render(&client.key_list().await?)),
        KeyCmd::Revoke { name, .. } => {
            client.key_revoke(&name).await?;
            println!("key {name} revoked; its connections are closed");
        }
    }
    Ok(())
}

/// Derives the key of `name` from the cluster key in `cluster_file`, writes it (to
/// `out`, new, or to standard output), and then records it at the metadata server.
async fn create(
    client: &Client,
    name: &str,
    caps: Caps,
    replace: bool,
    cluster_file: &Path,
    out: Option<&Path>,
) -> Result<()> {
    proto::auth::check_peer_name(name).map_err(ClientError::Config)?;
    proto::auth::check_caps_path(&caps.path).map_err(ClientError::Config)?;
    let cluster = Key::load(cluster_file)?;
    let key_id = transport::auth::new_key_id()?;
    let file = ClientKeyFile::derive(&cluster, name, key_id, caps.clone());
    // Written first: a file that exists already fails before anything is recorded.
    if let Some(path) = out {
        file.save(path)?;
    }
    if let Err(e) = client.key_create(name, key_id, caps, replace).await {
        if let Some(path) = out {
            let _ = std::fs::remove_file(path);
        }
        return Err(e);
    }
    match out {
        None => println!("{}", file.to_line()),
        Some(path) => println!("key {name} ({key_id}) written to {}", path.display()),
    }
    Ok(())
}
