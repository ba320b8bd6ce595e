//! Keys: 256 random bits, kept in a file of 64 hex digits that only its owner can read.

use crate::error::TransportError;
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
        use rand::TryRngCore;
        let mut k = [0u8; KEY_BYTES];
        rand::rngs::OsRng
            .try_fill_bytes(&mut k)
            .map_err(|e| TransportError::Io(std::io::Error::other(e.to_string())))?;
        Ok(Key(k))
    }

    /// The key's bytes (for the MACs: the handshake's, and grants sealed with the
    /// cluster key).
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The key as 64 lower-case hex digits (what a key file holds).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits.
    pub fn from_hex(text: &str) -> Option<Key> {
        let text = text.trim();
        if text.len() != 2 * KEY_BYTES || !text.is_ascii() {
            return None;
        }
        let mut k = [0u8; KEY_BYTES];
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Key(k))
    }

    /// Reads a key file, refusing one that its group or others can read.
    pub fn load(path: &Path) -> Result<Key, TransportError> {
        let fail = |why: String| TransportError::KeyFile {
            path: path.display().to_string(),
            why,
        };
        let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & !KEY_FILE_MODE != 0 {
            return Err(fail(format!(
                "mode {mode:o} lets others read the key; fix: chmod 600 {}",
                path.display()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        Key::from_hex(&text).ok_or_else(|| fail("not a key (64 hex digits)".into()))
    }

    /// Writes the key to a new file of mode 0600; never replaces an existing file.
    pub fn save(&self, path: &Path) -> Result<(), TransportError> {
        let fail = |why: String| TransportError::KeyFile {
            path: path.display().to_string(),
            why,
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(KEY_FILE_MODE)
            .open(path)
            .map_err(|e| fail(e.to_string()))?;
        // The umask may only take bits away; set the mode again to be sure of it.
        f.set_permissions(std::fs::Permissions::from_mode(KEY_FILE_MODE))
            .map_err(|e| fail(e.to_string()))?;
        f.write_all(format!("{}\n", self.to_hex()).as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| fail(e.to_string()))
    }
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
}
