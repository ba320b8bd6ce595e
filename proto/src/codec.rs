//! The one codec: postcard 1.x (a stable, specified, compact serde format).
//!
//! Every message on the wire is `postcard(T)`; nothing else in Tessera calls postcard.

use crate::error::ProtoError;
use serde::{de::DeserializeOwned, Serialize};

/// Encodes `msg`, refusing results larger than `limit_bytes`.
pub fn encode<T: Serialize>(msg: &T, limit_bytes: usize) -> Result<Vec<u8>, ProtoError> {
    let bytes = postcard::to_stdvec(msg).map_err(|e| ProtoError::Malformed(e.to_string()))?;
    if bytes.len() > limit_bytes {
        return Err(ProtoError::TooBig {
            size: bytes.len(),
            limit: limit_bytes,
        });
    }
    Ok(bytes)
}

/// Decodes a whole message; trailing bytes are an error, not silently ignored.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ProtoError> {
    let (msg, rest) = postcard::take_from_bytes(bytes).map_err(|e| match e {
        // An enum tag this build does not know: a message type from a newer peer (or
        // garbage); either way it is named as such, not as a generic decoding failure.
        // (serde reports an out-of-range variant index as a custom error).
        postcard::Error::DeserializeBadEnum | postcard::Error::SerdeDeCustom => {
            ProtoError::UnknownMessage
        }
        e => ProtoError::Malformed(e.to_string()),
    })?;
    if !rest.is_empty() {
        return Err(ProtoError::Malformed(format!(
            "{} trailing bytes after the message",
            rest.len()
        )));
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{fs, MetaRequest};
    use crate::rpc::Rpc;
    use crate::InodeId;

    #[test]
    fn messages_round_trip_and_bad_bytes_are_named() {
        let req = fs::Lookup {
            parent: InodeId::ROOT,
            name: b"x".to_vec(),
        }
        .into_envelope();
        let bytes = encode(&req, 1024).unwrap();
        assert_eq!(decode::<MetaRequest>(&bytes).unwrap(), req);
        assert!(matches!(encode(&req, 2), Err(ProtoError::TooBig { .. })));
        assert!(matches!(
            decode::<MetaRequest>(&[100]),
            Err(ProtoError::UnknownMessage)
        ));
        assert!(matches!(
            decode::<MetaRequest>(&bytes[..2]),
            Err(ProtoError::Malformed(_))
        ));
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            decode::<MetaRequest>(&long),
            Err(ProtoError::Malformed(_))
        ));
    }
}
