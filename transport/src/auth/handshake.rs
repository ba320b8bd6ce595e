//! The MACs of the handshake and its client side.

use super::{Credentials, Key, PeerIdentity, Role};
use crate::conn::Connection;
use crate::error::TransportError;
use bytes::Bytes;
use proto::auth::{AuthReply, AuthRequest, AUTH_BYTES};
use proto::ErrorCode;
use std::sync::Arc;
use tracing::warn;

/// 32 bytes, as nonces and MACs are.
pub(crate) type Block = [u8; AUTH_BYTES];

/// Which side a MAC proves: the two never verify each other's (no reflection).
#[derive(Clone, Copy)]
pub(crate) enum Side {
    Client,
    Server,
}

impl Side {
    fn domain(self) -> &'static [u8] {
        match self {
            Side::Client => b"tessera-auth-1 client",
            Side::Server => b"tessera-auth-1 server",
        }
    }
}

/// The MAC `side` sends: over the side's domain, the name and both nonces
/// (`proto::mac`, every field length-prefixed).
pub(crate) fn mac(key: &Key, side: Side, name: &str, nonce_c: &Block, nonce_s: &Block) -> Block {
    proto::mac::tag(
        key.bytes(),
        &[side.domain(), name.as_bytes(), nonce_c, nonce_s],
    )
}

/// Whether `got` is the MAC `side` must send, compared in constant time.
pub(crate) fn mac_ok(
    key: &Key,
    side: Side,
    name: &str,
    nonces: (&Block, &Block),
    got: &Block,
) -> bool {
    let fields: [&[u8]; 4] = [side.domain(), name.as_bytes(), nonces.0, nonces.1];
    proto::mac::tag_ok(key.bytes(), &fields, got)
}

/// A fresh nonce from the operating system's random number generator.
pub(crate) fn nonce() -> Result<Block, TransportError> {
    use rand::TryRngCore;
    let mut n = [0u8; AUTH_BYTES];
    rand::rngs::OsRng
        .try_fill_bytes(&mut n)
        .map_err(|e| TransportError::Io(std::io::Error::other(e.to_string())))?;
    Ok(n)
}

/// Runs the client side on a fresh connection to `addr`; on success the connection
/// carries the server's identity. Any failure is one line naming the address.
pub(crate) async fn client_handshake(
    conn: &Connection,
    creds: &Credentials,
    addr: &str,
) -> Result<(), TransportError> {
    let fail = |why: String| {
        conn.close();
        warn!("{why}");
        TransportError::Auth {
            peer: addr.to_string(),
            why,
        }
    };
    let nonce_c = nonce()?;
    let hello = AuthRequest::Hello {
        name: creds.name.clone(),
        claim: creds.claim.clone(),
        nonce: nonce_c,
    };
    let nonce_s = match exchange(conn, &hello, addr).await? {
        AuthReply::Challenge { nonce } => nonce,
        other => return Err(fail(unexpected(addr, &other))),
    };
    let proof = AuthRequest::Proof {
        mac: mac(&creds.key, Side::Client, &creds.name, &nonce_c, &nonce_s),
    };
    let mac_s = match exchange(conn, &proof, addr).await? {
        AuthReply::Welcome { mac } => mac,
        AuthReply::Refused => {
            return Err(fail(format!(
                "the server at {addr} refused key '{}': unknown name, wrong key, other \
                 capabilities than the key's, or revoked (the server's log says which)",
                creds.name
            )))
        }
        other => return Err(fail(unexpected(addr, &other))),
    };
    if !mac_ok(
        &creds.key,
        Side::Server,
        &creds.name,
        (&nonce_c, &nonce_s),
        &mac_s,
    ) {
        return Err(fail(format!(
            "the server at {addr} did not prove the key: wrong cluster, or not a Tessera \
             server of yours"
        )));
    }
    conn.set_identity(Arc::new(PeerIdentity {
        name: addr.to_string(),
        key_id: None,
        role: Role::Server,
    }));
    Ok(())
}

fn unexpected(addr: &str, reply: &AuthReply) -> String {
    format!("the server at {addr} broke the handshake (answered {reply:?} out of turn)")
}

/// Sends one handshake request and decodes the reply, turning a server without keys
/// into one clear line.
async fn exchange(
    conn: &Connection,
    req: &AuthRequest,
    addr: &str,
) -> Result<AuthReply, TransportError> {
    let bytes = proto::auth::encode_request(req).map_err(|e| TransportError::Auth {
        peer: addr.to_string(),
        why: format!("cannot encode the handshake: {e}"),
    })?;
    let reply = match conn.call(Bytes::from(bytes)).await {
        Ok(r) => r,
        Err(TransportError::Refused {
            code: ErrorCode::Unavailable,
            message,
        }) => {
            // The server cannot check keys now (a data server whose metadata server is
            // away): as if it were away itself, so the caller waits and tries again.
            conn.close();
            return Err(TransportError::Connect {
                addr: addr.to_string(),
                source: std::io::Error::new(std::io::ErrorKind::ConnectionRefused, message),
            });
        }
        // Closed under the key exchange (the server died, or dropped it): nothing was
        // asked of it yet. Not so when this side closed it for a broken protocol: that
        // server is not one to try again.
        Err(TransportError::Disconnected { why, .. })
            if !why.starts_with(crate::conn::PROTOCOL_ERROR) =>
        {
            let e = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, why);
            return Err(TransportError::cut_in_handshake(addr, e));
        }
        Err(TransportError::Refused { message, .. }) => {
            conn.close();
            let why = format!("the server at {addr} refused the handshake: {message}");
            warn!("{why}");
            return Err(TransportError::Auth {
                peer: addr.to_string(),
                why,
            });
        }
        Err(e) => return Err(e),
    };
    proto::auth::decode_reply(&reply).map_err(|e| {
        conn.close();
        TransportError::Auth {
            peer: addr.to_string(),
            why: format!("the server at {addr} answered the handshake with garbage: {e}"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_macs_differ_and_bind_every_field() {
        let k = Key::generate().unwrap();
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let c = mac(&k, Side::Client, "x", &a, &b);
        assert!(mac_ok(&k, Side::Client, "x", (&a, &b), &c));
        assert!(!mac_ok(&k, Side::Server, "x", (&a, &b), &c));
        assert!(!mac_ok(&k, Side::Client, "y", (&a, &b), &c));
        assert!(!mac_ok(&k, Side::Client, "x", (&b, &a), &c));
        let other = Key::generate().unwrap();
        assert!(!mac_ok(&other, Side::Client, "x", (&a, &b), &c));
    }
}
