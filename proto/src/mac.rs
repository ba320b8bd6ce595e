//! The one keyed MAC of the protocol: HMAC-SHA256 (the `hmac` crate) over a list of
//! fields, each prefixed by its length so that no two lists encode alike. The handshake
//! (`transport::auth`) and the grants ([`crate::grant`]) both use it, each starting its
//! list with a domain of its own so that one's MAC never passes for the other's.
//!
//! Client keys are not stored anywhere: [`derive()`] makes them from the cluster key with
//! HKDF-SHA256 (the `hkdf` crate), over the same length-prefixed fields.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of a MAC.
pub const MAC_BYTES: usize = 32;

fn over(key: &[u8], fields: &[&[u8]]) -> Hmac<Sha256> {
    // HMAC takes a key of any length; an error here would be a bug in the crate.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
    for field in fields {
        m.update(&(field.len() as u32).to_be_bytes());
        m.update(field);
    }
    m
}

/// The MAC of `fields` under `key`.
pub fn tag(key: &[u8], fields: &[&[u8]]) -> [u8; MAC_BYTES] {
    over(key, fields).finalize().into_bytes().into()
}

/// Whether `got` is the MAC of `fields` under `key`, compared in constant time.
pub fn tag_ok(key: &[u8], fields: &[&[u8]], got: &[u8]) -> bool {
    over(key, fields).verify_slice(got).is_ok()
}

/// HKDF-SHA256 of `ikm` with `salt`, its info the length-prefixed `fields`: 32 bytes
/// that whoever holds `ikm` computes alike, and nobody else can.
pub fn derive(ikm: &[u8], salt: &[u8], fields: &[&[u8]]) -> [u8; MAC_BYTES] {
    let mut info = Vec::with_capacity(fields.iter().map(|f| 4 + f.len()).sum());
    for field in fields {
        info.extend_from_slice(&(field.len() as u32).to_be_bytes());
        info.extend_from_slice(field);
    }
    let mut out = [0u8; MAC_BYTES];
    // 32 bytes is far under HKDF-SHA256's limit of 255 blocks: an error would be a bug.
    hkdf::Hkdf::<Sha256>::new(Some(salt), ikm)
        .expand(&info, &mut out)
        .unwrap_or_else(|_| unreachable!("HKDF-SHA256 gives up to 8160 bytes"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_length_prefixed_and_the_key_matters() {
        let t = tag(b"k", &[b"ab", b"c"]);
        assert!(tag_ok(b"k", &[b"ab", b"c"], &t));
        assert!(
            !tag_ok(b"k", &[b"a", b"bc"], &t),
            "a moved boundary differs"
        );
        assert!(!tag_ok(b"other", &[b"ab", b"c"], &t));
        assert!(!tag_ok(b"k", &[b"ab", b"c"], &t[..31]));
    }

    #[test]
    fn derivation_binds_key_salt_and_every_field() {
        let d = derive(b"k", b"s", &[b"ab", b"c"]);
        assert_eq!(d, derive(b"k", b"s", &[b"ab", b"c"]), "deterministic");
        assert_ne!(
            d,
            derive(b"k", b"s", &[b"a", b"bc"]),
            "a moved boundary differs"
        );
        assert_ne!(d, derive(b"other", b"s", &[b"ab", b"c"]));
        assert_ne!(d, derive(b"k", b"t", &[b"ab", b"c"]));
    }
}
