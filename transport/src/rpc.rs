//! The one encode -> call -> decode of a typed request, used by every caller: clients
//! calling the metadata server and the data servers, data servers calling the metadata
//! server and each other.

use crate::{Connection, TransportError};
use proto::{ProtoError, Request, Rpc, WireError};

/// Sends `req` on `conn` (refused unsent past `limit_bytes` encoded) and decodes the
/// answer as the request's own reply type. The error type is the caller's: anything
/// built from the three ways a call fails (the connection, the codec, the server's
/// refusal).
pub async fn call<R, E>(
    conn: &Connection,
    req: &Request<R>,
    limit_bytes: usize,
) -> Result<R::Reply, E>
where
    R: Rpc,
    E: From<TransportError> + From<ProtoError> + From<WireError>,
{
    let bytes = req.encode(limit_bytes)?;
    let reply = conn.call(bytes.into()).await?;
    Ok(req.decode_reply(&reply)??)
}
