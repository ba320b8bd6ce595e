//! Entry points for the fuzz targets in `fuzz/` (issue 23): decode bytes as a peer's
//! message, as a server or a client would, and assert what must hold of whatever decodes.
//! Not part of the API: nothing in Tessera calls these.

use crate::codec;
use crate::rpc::{Rpc, RpcResult};
use serde::{de::DeserializeOwned, Serialize};

/// Decodes `bytes` as a `T`; what decodes encodes to bytes that decode to a value with
/// the same encoding (postcard has one encoding per value once decoded). Returns whether
/// the bytes decoded.
pub fn message<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> bool {
    let Ok(msg) = codec::decode::<T>(bytes) else {
        return false;
    };
    let once = codec::encode(&msg, usize::MAX).expect("a decoded message encodes");
    let back = codec::decode::<T>(&once).expect("an encoded message decodes");
    let twice = codec::encode(&back, usize::MAX).expect("and encodes again");
    assert_eq!(once, twice, "a message survives a round trip");
    true
}

/// Decodes `bytes` as the answer to request `R`, as a client does ([`message`]).
pub fn reply<R: Rpc>(bytes: &[u8]) -> bool {
    message::<RpcResult<R>>(bytes)
}
