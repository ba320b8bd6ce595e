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

/// Appends `trailer`'s encoding to an encoded message (see [`decode_with_trailer`]).
pub fn append<U: Serialize>(message: &mut Vec<u8>, trailer: &U) {
    if let Ok(bytes) = postcard::to_stdvec(trailer) {
        message.extend_from_slice(&bytes);
    }
}

/// Decodes a message that may be followed by a trailer (see [`append`]): the trailer is
/// `None` when nothing follows the message; anything after the trailer is an error.
pub fn decode_with_trailer<T: DeserializeOwned, U: DeserializeOwned>(
    bytes: &[u8],
) -> Result<(T, Option<U>), ProtoError> {
    let (msg, rest) = postcard::take_from_bytes(bytes).map_err(|e| match e {
        postcard::Error::DeserializeBadEnum | postcard::Error::SerdeDeCustom => {
            ProtoError::UnknownMessage
        }
        e => ProtoError::Malformed(e.to_string()),
    })?;
    if rest.is_empty() {
        return Ok((msg, None));
    }
    decode(rest).map(|trailer| (msg, Some(trailer)))
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

    #[test]
    fn a_trailer_is_optional_and_nothing_may_follow_it() {
        let msg: Result<u32, ()> = Ok(7);
        let mut bytes = encode(&msg, 64).unwrap();
        let (m, t) = decode_with_trailer::<Result<u32, ()>, (u64, bool)>(&bytes).unwrap();
        assert_eq!((m, t), (Ok(7), None));
        append(&mut bytes, &(9u64, true));
        let (m, t) = decode_with_trailer::<Result<u32, ()>, (u64, bool)>(&bytes).unwrap();
        assert_eq!((m, t), (Ok(7), Some((9, true))));
        bytes.push(1);
        assert!(decode_with_trailer::<Result<u32, ()>, (u64, bool)>(&bytes).is_err());
    }
}
