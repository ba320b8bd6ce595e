//! The server side: a handler wrapped around the application's, which answers the
//! handshake and passes a request on only once its connection has authenticated.

use super::handshake::{mac, mac_ok, nonce, Side};
use super::{Lookup, PeerIdentity, Verifier};
use crate::conn::{AuthStep, Closed, ConnId, Connection, Handler, HandlerFuture};
use bytes::Bytes;
use proto::auth::{AuthReply, AuthRequest};
use proto::ErrorCode;
use std::sync::Arc;
use tracing::warn;

/// What a client without a key is told by a server with keys.
const NEEDS_KEY: &str = "this server requires authentication and this client has no key \
                         (give it one: key_file in its config, or --key-file)";

/// What a client with a key is told by a server without keys.
const HAS_NO_KEYS: &str = "this server runs without authentication (--insecure) and \
                           takes no key: connect without one, or give the server its keys";

/// Wraps a listener's application handler; every listener of an endpoint has one.
pub(crate) struct Gate {
    app: Arc<dyn Handler>,
    /// `None`: the endpoint serves without authentication.
    verifier: Option<Arc<dyn Verifier>>,
}

impl Gate {
    pub(crate) fn new(app: Arc<dyn Handler>, verifier: Option<Arc<dyn Verifier>>) -> Gate {
        Gate { app, verifier }
    }
}

impl Handler for Gate {
    fn handle(&self, conn: Connection, request: Bytes) -> HandlerFuture {
        let Some(verifier) = &self.verifier else {
            if proto::auth::is_auth_request(&request) {
                warn!(peer = %conn.peer(), "refused a client that has a key: {HAS_NO_KEYS}");
                return refuse(&conn, ErrorCode::PermissionDenied, HAS_NO_KEYS, "has a key");
            }
            return self.app.handle(conn, request);
        };
        if conn.core().identity().is_some() {
            return self.app.handle(conn, request);
        }
        if !proto::auth::is_auth_request(&request) {
            warn!(peer = %conn.peer(), "refused a client with no key before any request");
            return refuse(&conn, ErrorCode::PermissionDenied, NEEDS_KEY, "no key");
        }
        Box::pin(step(verifier.clone(), conn, request))
    }

    fn disconnected(&self, conn: ConnId, how: Closed) {
        self.app.disconnected(conn, how);
    }
}

/// Answers `message` with a refusal and closes the connection.
fn refuse(conn: &Connection, code: ErrorCode, message: &str, why: &str) -> HandlerFuture {
    *conn.core().auth_step.lock() = AuthStep::Over;
    let why = format!("authentication refused: {why}");
    conn.core()
        .close_after_reply(Some((code, message.to_string())), why);
    Box::pin(async { Bytes::new() })
}

/// Answers one handshake message.
async fn step(verifier: Arc<dyn Verifier>, conn: Connection, request: Bytes) -> Bytes {
    let peer = conn.peer().to_string();
    let msg = match proto::auth::decode_request(&request) {
        Ok(m) => m,
        Err(e) => return refused(&conn, &peer, "?", &format!("malformed handshake: {e}")),
    };
    let prev = std::mem::replace(&mut *conn.core().auth_step.lock(), AuthStep::Over);
    match (msg, prev) {
        (
            AuthRequest::Hello {
                name,
                claim,
                nonce: nonce_c,
            },
            AuthStep::Fresh,
        ) => {
            let Ok(nonce_s) = nonce() else {
                return refused(&conn, &peer, &name, "no random numbers for a nonce");
            };
            *conn.core().auth_step.lock() = AuthStep::Challenged {
                name,
                claim,
                nonce_c,
                nonce_s,
            };
            reply(&AuthReply::Challenge { nonce: nonce_s })
        }
        (
            AuthRequest::Proof { mac: got },
            AuthStep::Challenged {
                name,
                claim,
                nonce_c,
                nonce_s,
            },
        ) => {
            let (key, verdict) = match verifier.lookup(&name, claim.as_ref()).await {
                Lookup::Known { key, role } => (key, Ok(role)),
                Lookup::Refused { key, why } => (key, Err(why)),
                Lookup::Unavailable => return unavailable(&conn, &peer, &name),
            };
            // The proof is checked even when the claim is refused: a refusal costs the
            // same derivation and MAC whatever its reason.
            let good = mac_ok(&key, Side::Client, &name, (&nonce_c, &nonce_s), &got);
            let role = match (verdict, good) {
                (Err(why), _) => return refused(&conn, &peer, &name, why),
                (Ok(_), false) => return refused(&conn, &peer, &name, "bad key"),
                (Ok(role), true) => role,
            };
            let key_id = claim.map(|c| c.key_id);
            let who = Arc::new(PeerIdentity { name, key_id, role });
            // Claimed first, checked second (see `Verifier::revoked`).
            conn.set_claimed(who.clone());
            if verifier.revoked(&who) {
                return refused(&conn, &peer, &who.name, "revoked");
            }
            let mac_s = mac(&key, Side::Server, &who.name, &nonce_c, &nonce_s);
            conn.set_identity(who);
            reply(&AuthReply::Welcome { mac: mac_s })
        }
        (_, _) => refused(&conn, &peer, "?", "handshake out of order"),
    }
}

/// Logs the precise reason once, answers the generic `Refused`, and closes.
fn refused(conn: &Connection, peer: &str, name: &str, reason: &str) -> Bytes {
    warn!("authentication of '{name}' from {peer} refused: {reason}");
    conn.core()
        .close_after_reply(None, format!("authentication refused: {reason}"));
    reply(&AuthReply::Refused)
}

/// Closes a handshake whose name cannot be checked now, answering `Unavailable`: the
/// client takes it as it takes a server that is away (it tries again later), and learns
/// nothing about its key.
fn unavailable(conn: &Connection, peer: &str, name: &str) -> Bytes {
    warn!(
        "authentication of '{name}' from {peer} cannot be checked now: closed, to be tried again"
    );
    let why = "cannot check the key now; try again later".to_string();
    conn.core()
        .close_after_reply(Some((ErrorCode::Unavailable, why.clone())), why);
    reply(&AuthReply::Refused)
}

fn reply(msg: &AuthReply) -> Bytes {
    // A reply is a tag and at most 32 bytes: far under the limit it is encoded with.
    Bytes::from(proto::auth::encode_reply(msg).unwrap_or_default())
}
