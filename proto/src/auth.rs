//! The authentication handshake's messages and a client's capabilities.
//!
//! Every connection to a server that has keys starts with this exchange, as ordinary calls
//! on the connection (so every backend carries it alike):
//!
//! 1. `Hello { name, claim, nonce }` from the connecting side (a client's claim: its
//!    key id and capabilities), answered by `Challenge { nonce }` whatever the name (a
//!    server says nothing about which names it knows);
//! 2. `Proof { mac }` (HMAC-SHA256 of the client's domain, the name and both nonces under
//!    the peer's key), answered by `Welcome { mac }` (the same under the server's domain)
//!    or by one `Refused` that says nothing of what was wrong.
//!
//! A client's key is never sent, nor stored by a server: every server derives it from
//! the cluster key, the name and the claim ([`derive_client_key`]), so a claim of
//! capabilities the key was not made for derives another key and fails the proof.
//!
//! A handshake request starts with [`AUTH_MAGIC`], which no application message starts
//! with (its first byte would be an enum tag of 255 and more), so a server without keys
//! can tell a client that tries to authenticate from one that sends work.

use crate::codec;
use crate::error::ProtoError;
use serde::{Deserialize, Serialize};

/// First bytes of every handshake request.
pub const AUTH_MAGIC: [u8; 4] = [0xFF, b'T', b'A', 1];

/// Longest client or server name, in bytes.
pub const MAX_PEER_NAME_BYTES: usize = 64;

/// Longest path of a client's capabilities ([`Caps::path`]), in bytes.
pub const MAX_CAPS_PATH_BYTES: usize = 1024;

/// Largest encoded handshake message, in bytes: a name, a claim (a key id and
/// capabilities with their path), a nonce and framing.
pub const MAX_AUTH_MSG_BYTES: usize = 1280;

/// Bytes of a key id.
pub const KEY_ID_BYTES: usize = 16;

/// The salt of every client key's derivation (HKDF's domain: no other use of the
/// cluster key derives with it).
const CLIENT_KEY_SALT: &[u8] = b"tessera client key 1";

/// First byte of [`Caps::to_bytes`]: the version of that encoding.
const CAPS_ENCODING_VERSION: u8 = 1;

/// Which one of the keys made under a client name: 16 random bytes chosen when the key
/// is made. A key made again under the same name gets a new id, and the old one is
/// revoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KeyId(pub [u8; KEY_ID_BYTES]);

impl KeyId {
    /// The administrator's key id: the key `admin` is derived under this fixed id, so
    /// every server knows it without a record.
    pub const ADMIN: KeyId = KeyId([0; KEY_ID_BYTES]);
}

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// What a client claims in its `Hello`: which of its name's keys it holds, and the
/// capabilities that key was derived for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The key's id.
    pub key_id: KeyId,
    /// The capabilities bound into the key.
    pub caps: Caps,
}

/// The name of the administrator's key: derived from the cluster key under
/// [`KeyId::ADMIN`] with [`Caps::admin`].
pub const ADMIN_NAME: &str = "admin";

/// A client's key: HKDF-SHA256 of the cluster key, under a fixed salt, its info the
/// length-prefixed name, key id and capabilities ([`Caps::to_bytes`]). Every server
/// computes it; none stores it, and none sends it.
pub fn derive_client_key(cluster_key: &[u8], name: &str, claim: &Claim) -> [u8; AUTH_BYTES] {
    let caps = claim.caps.to_bytes();
    crate::mac::derive(
        cluster_key,
        CLIENT_KEY_SALT,
        &[name.as_bytes(), &claim.key_id.0, &caps],
    )
}

/// Bytes of a nonce and of a MAC (HMAC-SHA256).
pub const AUTH_BYTES: usize = 32;

/// What the connecting side sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthRequest {
    /// Opens the handshake: who this is, and its fresh nonce.
    Hello {
        /// The peer's name: a client's key name, or a server's `server/...` name.
        name: String,
        /// A client's key id and capabilities; `None` for a server (it proves the
        /// cluster key itself).
        claim: Option<Claim>,
        /// 32 random bytes, new for this connection.
        nonce: [u8; AUTH_BYTES],
    },
    /// Proves the key: the MAC over both nonces and the name.
    Proof {
        /// HMAC-SHA256 under the client's key (see the module doc).
        mac: [u8; AUTH_BYTES],
    },
}

/// What the listening side answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthReply {
    /// The server's fresh nonce, sent whatever the name was.
    Challenge {
        /// 32 random bytes, new for this connection.
        nonce: [u8; AUTH_BYTES],
    },
    /// The proof was good; the server proves the key in turn.
    Welcome {
        /// HMAC-SHA256 under the same key, with the server's domain.
        mac: [u8; AUTH_BYTES],
    },
    /// Unknown name, wrong key, revoked, or out of order: the server's log says which.
    Refused,
}

/// What a client may do, kept with its key by the metadata server and carried on every
/// connection it authenticates.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caps {
    /// The directory the client sees as its root (absolute; `/` for all of it).
    pub path: Vec<u8>,
    /// Every change fails with EROFS.
    pub read_only: bool,
    /// uid and gid 0 are mapped to nobody.
    pub root_squash: bool,
    /// May call the administration requests (status, fsck, key management).
    pub admin: bool,
}

impl Caps {
    /// The administrator's capabilities: everything, root not squashed.
    pub fn admin() -> Caps {
        Caps {
            path: b"/".to_vec(),
            read_only: false,
            root_squash: false,
            admin: true,
        }
    }

    /// A stable encoding, bound into a derived key and written in key files: a version
    /// byte, a byte of flags (read-only 1, root squash 2, admin 4), then the path. Kept
    /// apart from serde so that a change of the wire type cannot change a derived key.
    pub fn to_bytes(&self) -> Vec<u8> {
        let flags = u8::from(self.read_only)
            | (u8::from(self.root_squash) << 1)
            | (u8::from(self.admin) << 2);
        let mut out = Vec::with_capacity(2 + self.path.len());
        out.extend_from_slice(&[CAPS_ENCODING_VERSION, flags]);
        out.extend_from_slice(&self.path);
        out
    }

    /// Parses [`Caps::to_bytes`], checking the path ([`check_caps_path`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Caps, String> {
        let [CAPS_ENCODING_VERSION, flags, path @ ..] = bytes else {
            return Err("not capabilities of encoding version 1".into());
        };
        if flags & !7 != 0 {
            return Err(format!("unknown capability flags {flags:#x}"));
        }
        check_caps_path(path)?;
        Ok(Caps {
            path: path.to_vec(),
            read_only: flags & 1 != 0,
            root_squash: flags & 2 != 0,
            admin: flags & 4 != 0,
        })
    }
}

/// The rule for a capability path: absolute, at most [`MAX_CAPS_PATH_BYTES`].
pub fn check_caps_path(path: &[u8]) -> Result<(), String> {
    if !path.starts_with(b"/") || path.len() > MAX_CAPS_PATH_BYTES {
        return Err(format!(
            "a key's path starts at / and has at most {MAX_CAPS_PATH_BYTES} bytes"
        ));
    }
    Ok(())
}

impl Default for Caps {
    /// The whole tree, read-write, root squashed, no administration.
    fn default() -> Self {
        Caps {
            path: b"/".to_vec(),
            read_only: false,
            root_squash: true,
            admin: false,
        }
    }
}

/// Whether `bytes` is a handshake request (starts with [`AUTH_MAGIC`]).
pub fn is_auth_request(bytes: &[u8]) -> bool {
    bytes.starts_with(&AUTH_MAGIC)
}

/// Encodes a handshake request with its magic.
pub fn encode_request(msg: &AuthRequest) -> Result<Vec<u8>, ProtoError> {
    let body = codec::encode(msg, MAX_AUTH_MSG_BYTES - AUTH_MAGIC.len())?;
    let mut out = Vec::with_capacity(AUTH_MAGIC.len() + body.len());
    out.extend_from_slice(&AUTH_MAGIC);
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes a handshake request: the magic, a bounded size, a bounded name.
pub fn decode_request(bytes: &[u8]) -> Result<AuthRequest, ProtoError> {
    if bytes.len() > MAX_AUTH_MSG_BYTES {
        return Err(ProtoError::TooBig {
            size: bytes.len(),
            limit: MAX_AUTH_MSG_BYTES,
        });
    }
    let Some(body) = bytes.strip_prefix(&AUTH_MAGIC[..]) else {
        return Err(ProtoError::Malformed("not a handshake message".into()));
    };
    let msg: AuthRequest = codec::decode(body)?;
    if let AuthRequest::Hello { name, claim, .. } = &msg {
        check_peer_name(name).map_err(ProtoError::Malformed)?;
        let is_server = name.starts_with(SERVER_NAME_PREFIX);
        match claim {
            Some(c) if !is_server => {
                check_caps_path(&c.caps.path).map_err(ProtoError::Malformed)?
            }
            None if is_server => {}
            _ => {
                return Err(ProtoError::Malformed(
                    "a client claims a key id and capabilities, a server none".into(),
                ))
            }
        }
    }
    Ok(msg)
}

/// Encodes a handshake reply.
pub fn encode_reply(msg: &AuthReply) -> Result<Vec<u8>, ProtoError> {
    codec::encode(msg, MAX_AUTH_MSG_BYTES)
}

/// Decodes a handshake reply.
pub fn decode_reply(bytes: &[u8]) -> Result<AuthReply, ProtoError> {
    if bytes.len() > MAX_AUTH_MSG_BYTES {
        return Err(ProtoError::TooBig {
            size: bytes.len(),
            limit: MAX_AUTH_MSG_BYTES,
        });
    }
    codec::decode(bytes)
}

/// Names servers authenticate with start with this; client names cannot contain `/`.
pub const SERVER_NAME_PREFIX: &str = "server/";

/// The rule for a peer name: 1 to [`MAX_PEER_NAME_BYTES`] bytes of letters, digits,
/// `.`, `_`, `-`, and for servers the [`SERVER_NAME_PREFIX`] before them.
pub fn check_peer_name(name: &str) -> Result<(), String> {
    let bare = name.strip_prefix(SERVER_NAME_PREFIX).unwrap_or(name);
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.len() > MAX_PEER_NAME_BYTES || bare.is_empty() || !bare.chars().all(ok_char) {
        return Err(format!(
            "a key name is 1 to {MAX_PEER_NAME_BYTES} letters, digits, '.', '_' or '-'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_carry_the_magic_and_bounded_names() {
        let claim = Claim {
            key_id: KeyId([3; KEY_ID_BYTES]),
            caps: Caps::default(),
        };
        let hello = AuthRequest::Hello {
            name: "alice".into(),
            claim: Some(claim.clone()),
            nonce: [7; AUTH_BYTES],
        };
        let bytes = encode_request(&hello).unwrap();
        assert!(is_auth_request(&bytes));
        assert_eq!(decode_request(&bytes).unwrap(), hello);
        assert!(decode_request(&bytes[AUTH_MAGIC.len()..]).is_err());
        let long = AuthRequest::Hello {
            name: "a".repeat(MAX_PEER_NAME_BYTES + 1),
            claim: Some(claim.clone()),
            nonce: [0; AUTH_BYTES],
        };
        assert!(decode_request(&encode_request(&long).unwrap()).is_err());
        let mut far = claim.clone();
        far.caps.path = [b"/".as_slice(), &[b'a'; MAX_CAPS_PATH_BYTES]].concat();
        let far = AuthRequest::Hello {
            name: "alice".into(),
            claim: Some(far),
            nonce: [0; AUTH_BYTES],
        };
        assert!(decode_request(&encode_request(&far).unwrap()).is_err());
        for (name, claim) in [("alice", None), ("server/d", Some(claim))] {
            let odd = AuthRequest::Hello {
                name: name.into(),
                claim,
                nonce: [0; AUTH_BYTES],
            };
            let bytes = encode_request(&odd).unwrap();
            assert!(decode_request(&bytes).is_err(), "{name}");
        }
        let widest = AuthRequest::Hello {
            name: "a".repeat(MAX_PEER_NAME_BYTES),
            claim: Some(Claim {
                key_id: KeyId([0xff; KEY_ID_BYTES]),
                caps: Caps {
                    path: vec![b'/'; MAX_CAPS_PATH_BYTES],
                    ..Caps::default()
                },
            }),
            nonce: [0xff; AUTH_BYTES],
        };
        assert!(encode_request(&widest).is_ok(), "the largest Hello fits");
        let reply = AuthReply::Welcome {
            mac: [1; AUTH_BYTES],
        };
        assert_eq!(decode_reply(&encode_reply(&reply).unwrap()).unwrap(), reply);
    }

    #[test]
    fn names_are_checked() {
        assert!(check_peer_name("team-a.ci_1").is_ok());
        assert!(check_peer_name("server/data-3").is_ok());
        for bad in ["", "a/b", "server/", "a b", "é"] {
            assert!(check_peer_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn caps_encode_stably_and_bind_into_the_derived_key() {
        let caps = Caps {
            path: b"/teamA".to_vec(),
            read_only: true,
            root_squash: true,
            admin: false,
        };
        assert_eq!(
            caps.to_bytes(),
            b"\x01\x03/teamA",
            "the encoding never changes"
        );
        assert_eq!(Caps::from_bytes(&caps.to_bytes()), Ok(caps.clone()));
        assert!(Caps::from_bytes(b"\x02\x00/").is_err());
        assert!(Caps::from_bytes(b"\x01\x08/").is_err());
        assert!(Caps::from_bytes(b"\x01\x00a").is_err());
        let claim = Claim {
            key_id: KeyId([1; KEY_ID_BYTES]),
            caps,
        };
        let k = derive_client_key(b"cluster", "alice", &claim);
        let mut admin = claim.clone();
        admin.caps.admin = true;
        let mut other_id = claim.clone();
        other_id.key_id.0[0] = 2;
        assert_ne!(k, derive_client_key(b"cluster", "alice", &admin));
        assert_ne!(k, derive_client_key(b"cluster", "alice", &other_id));
        assert_ne!(k, derive_client_key(b"cluster", "bob", &claim));
        assert_ne!(k, derive_client_key(b"other", "alice", &claim));
        assert_eq!(k, derive_client_key(b"cluster", "alice", &claim));
    }
}
