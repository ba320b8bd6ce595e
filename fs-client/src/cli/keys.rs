//! `tessera key create|list|revoke`: client keys, kept by the metadata server, managed
//! by a client with the admin capability.

use super::commands::KeyCmd;
use crate::client::Client;
use crate::error::{ClientError, Result};
use proto::auth::Caps;
use proto::meta::admin::{KeyCreate, KeyInfo, KeyList, KeyRevoke};

impl Client {
    /// Makes a client key with `caps`; returns it (64 hex digits).
    pub async fn key_create(&self, name: &str, caps: Caps) -> Result<String> {
        let name = name.to_string();
        self.meta(KeyCreate { name, caps }).await
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

/// One line per key: name, path, mode, squash, admin, state.
pub fn render(keys: &[KeyInfo]) -> String {
    let mut out = String::new();
    for k in keys {
        let c = &k.caps;
        out.push_str(&format!(
            "{} path={} {}{}{}{}\n",
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

/// Runs one `tessera key` subcommand.
pub async fn run(client: &Client, action: KeyCmd) -> Result<()> {
    match action {
        KeyCmd::Create {
            name,
            path,
            read_only,
            no_root_squash,
            admin,
            out,
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
            let key = client.key_create(&name, caps).await?;
            match out {
                None => println!("{key}"),
                Some(file) => {
                    let key = transport::Key::from_hex(&key).ok_or_else(|| {
                        ClientError::Protocol("the server sent a malformed key".into())
                    })?;
                    key.save(&file)?;
                    println!("key {name} written to {}", file.display());
                }
            }
        }
        KeyCmd::List { .. } => print!("{}", render(&client.key_list().await?)),
        KeyCmd::Revoke { name, .. } => {
            client.key_revoke(&name).await?;
            println!("key {name} revoked; its connections are closed");
        }
    }
    Ok(())
}
