//! The authentication handshake's messages and a client's capabilities.
//!
//! Every connection to a server that has keys starts with this exchange, as ordinary calls
//! on the connection (so every backend carries it alike):
//!
//! 1. `Hello { name, nonce }` from the connecting side, answered by `Challenge { nonce }`
//!    whatever the name (a server says nothing about which names it knows);
//! 2. `Proof { mac }` (HMAC-SHA256 of the client's domain, the name and both nonces under
//!    the peer's key), answered by `Welcome { mac }` (the same under the server's domain)
//!    or by one `Refused` that says nothing of what was wrong.
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

/// Largest encoded handshake message, in bytes (a name, a nonce and framing).
pub const MAX_AUTH_MSG_BYTES: usize = 128;

/// Bytes of a nonce and of a MAC (HMAC-SHA256).
pub const AUTH_BYTES: usize = 32;

/// What the connecting side sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthRequest {
    /// Opens the handshake: who this is, and its fresh nonce.
    Hello {
        /// The peer's name: a client's key name, or a server's `server/...` name.
        name: String,
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
    if let AuthRequest::Hello { name, .. } = &msg {
        if let Err(why) = check_peer_name(name) {
            return Err(ProtoError::Malformed(why));
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
        let hello = AuthRequest::Hello {
            name: "alice".into(),
            nonce: [7; AUTH_BYTES],
        };
        let bytes = encode_request(&hello).unwrap();
        assert!(is_auth_request(&bytes));
        assert_eq!(decode_request(&bytes).unwrap(), hello);
        assert!(decode_request(&bytes[AUTH_MAGIC.len()..]).is_err());
        let long = AuthRequest::Hello {
            name: "a".repeat(MAX_PEER_NAME_BYTES + 1),
            nonce: [0; AUTH_BYTES],
        };
        assert!(decode_request(&encode_request(&long).unwrap()).is_err());
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
}
