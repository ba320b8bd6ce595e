//! Keys: 256 bits, kept in a file that only its owner can read. The cluster key is 64 hex
//! digits of random bits; a client's key, derived from it, is one line that also says
//! which key it is ([`ClientKeyFile`]).

use crate::error::TransportError;
use proto::auth::{derive_client_key, Caps, Claim, KeyId, KEY_ID_BYTES};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The mode a key file is made with, and the only bits it may have: owner read/write.
pub const KEY_FILE_MODE: u32 = 0o600;

/// Bytes of a key.
const KEY_BYTES: usize = 32;

/// A secret key: the cluster key, or one client's key.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; KEY_BYTES]);

impl Key {
    /// A new key from the operating system's random number generator.
    pub fn generate() -> Result<Key, TransportError> {
        let mut k = [0u8; KEY_BYTES];
        random(&mut k)?;
        Ok(Key(k))
    }

    /// The key of client `name` holding `claim`, derived from this cluster key
    /// ([`derive_client_key`]).
    pub fn derive_client(&self, name: &str, claim: &Claim) -> Key {
        Key(derive_client_key(&self.0, name, claim))
    }

    /// The key's bytes (for the MACs: the handshake's, and grants sealed with the
    /// cluster key).
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The key as 64 lower-case hex digits (what a key file holds).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits.
    pub fn from_hex(text: &str) -> Option<Key> {
        let mut k = [0u8; KEY_BYTES];
        hex::decode_to_slice(text.trim(), &mut k).ok()?;
        Some(Key(k))
    }

    /// Reads a cluster key file (64 hex digits), refusing one that its group or others
    /// can read.
    pub fn load(path: &Path) -> Result<Key, TransportError> {
        let text = read_private(path)?;
        Key::from_hex(&text).ok_or_else(|| key_file_error(path, "not a key (64 hex digits)"))
    }

    /// Writes the key to a new file of mode 0600; never replaces an existing file.
    pub fn save(&self, path: &Path) -> Result<(), TransportError> {
        write_private(path, &format!("{}\n", self.to_hex()))
    }
}

/// A new key id from the operating system's random number generator.
pub fn new_key_id() -> Result<KeyId, TransportError> {
    let mut id = [0u8; KEY_ID_BYTES];
    random(&mut id)?;
    Ok(KeyId(id))
}

fn random(out: &mut [u8]) -> Result<(), TransportError> {
    use rand::TryRngCore;
    rand::rngs::OsRng
        .try_fill_bytes(out)
        .map_err(|e| TransportError::Io(std::io::Error::other(e.to_string())))
}

/// First word of a client key file's line: the format and its version.
const CLIENT_KEY_FORMAT: &str = "tessera-client-key-1";

/// A client's key file: one line of five words, `tessera-client-key-1 NAME KEY_ID CAPS
/// KEY` (the id, the capabilities' [`Caps::to_bytes`] and the key in hex), mode 0600.
/// The id and capabilities go in the client's `Hello`; the key proves them.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientKeyFile {
    /// The client's name.
    pub name: String,
    /// What the client claims in its `Hello`.
    pub claim: Claim,
    /// The key derived for them.
    pub key: Key,
}

impl ClientKeyFile {
    /// Derives the key of `name` under `key_id` with `caps` from the cluster key.
    pub fn derive(cluster: &Key, name: &str, key_id: KeyId, caps: Caps) -> ClientKeyFile {
        let claim = Claim { key_id, caps };
        let key = cluster.derive_client(name, &claim);
        let name = name.to_string();
        ClientKeyFile { name, claim, key }
    }

    /// The administrator's key: `admin` under [`KeyId::ADMIN`] with every capability.
    pub fn admin(cluster: &Key) -> ClientKeyFile {
        let admin = proto::auth::ADMIN_NAME;
        ClientKeyFile::derive(cluster, admin, KeyId::ADMIN, Caps::admin())
    }

    /// The file's one line (without its newline).
    pub fn to_line(&self) -> String {
        let caps = hex::encode(self.claim.caps.to_bytes());
        let (name, id, key) = (&self.name, self.claim.key_id, self.key.to_hex());
        format!("{CLIENT_KEY_FORMAT} {name} {id} {caps} {key}")
    }

    /// Parses [`ClientKeyFile::to_line`].
    pub fn from_line(line: &str) -> Result<ClientKeyFile, String> {
        let words: Vec<&str> = line.split_ascii_whitespace().collect();
        let [CLIENT_KEY_FORMAT, name, id, caps, key] = words[..] else {
            return Err(format!(
                "not a client key file ({CLIENT_KEY_FORMAT} NAME KEY_ID CAPS KEY); a key \
                 made before client keys were derived must be made again: tessera key create"
            ));
        };
        proto::auth::check_peer_name(name)?;
        let mut key_id = [0u8; KEY_ID_BYTES];
        hex::decode_to_slice(id, &mut key_id).map_err(|_| "bad key id (32 hex digits)")?;
        let caps = hex::decode(caps).map_err(|_| "bad capabilities (hex)".to_string())?;
        let caps = Caps::from_bytes(&caps)?;
        let key = Key::from_hex(key).ok_or("bad key (64 hex digits)")?;
        let claim = Claim {
            key_id: KeyId(key_id),
            caps,
        };
        let name = name.to_string();
        Ok(ClientKeyFile { name, claim, key })
    }

    /// Reads a client key file, refusing one that its group or others can read.
    pub fn load(path: &Path) -> Result<ClientKeyFile, TransportError> {
        let text = read_private(path)?;
        ClientKeyFile::from_line(text.trim()).map_err(|why| key_file_error(path, &why))
    }

    /// Writes the file, new, of mode 0600; never replaces an existing file.
    pub fn save(&self, path: &Path) -> Result<(), TransportError> {
        write_private(path, &format!("{}\n", self.to_line()))
    }
}

impl std::fmt::Debug for ClientKeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientKeyFile({} {})", self.name, self.claim.key_id)
    }
}

fn key_file_error(path: &Path, why: &str) -> TransportError {
    TransportError::KeyFile {
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

/// Reads a small file that only its owner may read (a key file has one line).
fn read_private(path: &Path) -> Result<String, TransportError> {
    let fail = |why: String| key_file_error(path, &why);
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & !KEY_FILE_MODE != 0 {
        return Err(fail(format!(
            "mode {mode:o} lets others read the key; fix: chmod 600 {}",
            path.display()
        )));
    }
    if meta.len() > MAX_KEY_FILE_BYTES {
        return Err(fail(format!("longer than {MAX_KEY_FILE_BYTES} bytes")));
    }
    std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))
}

/// Longest key file read: a client key file's line with the longest name and path.
const MAX_KEY_FILE_BYTES: u64 = 4096;

/// Writes `text` to a new file of mode 0600; never replaces an existing file.
fn write_private(path: &Path, text: &str) -> Result<(), TransportError> {
    let fail = |why: String| key_file_error(path, &why);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(KEY_FILE_MODE)
        .open(path)
        .map_err(|e| fail(e.to_string()))?;
    // The umask may only take bits away; set the mode again to be sure of it.
    f.set_permissions(std::fs::Permissions::from_mode(KEY_FILE_MODE))
        .map_err(|e| fail(e.to_string()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| fail(e.to_string()))
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_through_owner_only_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let k = Key::generate().unwrap();
        assert_ne!(k, Key::generate().unwrap());
        k.save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(Key::load(&path).unwrap(), k);
        assert!(
            k.save(&path).is_err(),
            "an existing key file is never replaced"
        );
        assert_eq!(Key::from_hex(&k.to_hex()), Some(k));
        assert_eq!(Key::from_hex("zz"), None);
    }

    #[test]
    fn a_key_file_others_can_read_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        Key::generate().unwrap().save(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = Key::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("chmod 600") && err.contains(&*path.to_string_lossy()),
            "{err}"
        );
        assert!(!err.contains('\n'), "one line: {err}");
    }

    #[test]
    fn client_key_files_round_trip_and_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c");
        let cluster = Key::generate().unwrap();
        let caps = Caps {
            path: b"/teamA".to_vec(),
            ..Caps::default()
        };
        let file = ClientKeyFile::derive(&cluster, "team-a", new_key_id().unwrap(), caps);
        file.save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(ClientKeyFile::load(&path).unwrap(), file);
        assert!(
            Key::load(&path).is_err(),
            "a client key file is no cluster key"
        );
        let line = file.to_line();
        assert!(line.starts_with("tessera-client-key-1 team-a ") && !line.contains('\n'));
        for bad in [
            line.replace("tessera-client-key-1", "tessera-client-key-2"),
            line.replace("team-a", "team/a"),
            format!("{line} extra"),
            cluster.to_hex(),
        ] {
            assert!(ClientKeyFile::from_line(&bad).is_err(), "{bad}");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = ClientKeyFile::load(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
    }
}
