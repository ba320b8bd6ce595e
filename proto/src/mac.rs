//! The one keyed MAC of the protocol: HMAC-SHA256 (the `hmac` crate) over a list of
//! fields, each prefixed by its length so that no two lists encode alike. The handshake
//! (`transport::auth`) and the grants ([`crate::grant`]) both use it, each starting its
//! list with a domain of its own so that one's MAC never passes for the other's.

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
}
