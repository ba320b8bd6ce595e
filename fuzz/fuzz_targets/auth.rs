//! The authentication handshake as a peer may send it: the first byte picks a request (what
//! a listener decodes before it knows who is calling: a `Hello` carries a client's key id
//! and capabilities), a reply (what a connecting side decodes from a server it has not
//! yet verified), a cluster key file's text or a client key file's line. Whatever decodes
//! re-encodes to bytes that decode to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::auth::{decode_reply, decode_request, encode_reply, encode_request};
use transport::auth::{ClientKeyFile, Key};

fuzz_target!(|data: &[u8]| {
    let [which, rest @ ..] = data else {
        return;
    };
    match which % 4 {
        0 => {
            if let Ok(msg) = decode_request(rest) {
                let again = encode_request(&msg).expect("a decoded request encodes");
                assert_eq!(decode_request(&again).expect("and decodes again"), msg);
            }
        }
        1 => {
            if let Ok(msg) = decode_reply(rest) {
                let again = encode_reply(&msg).expect("a decoded reply encodes");
                assert_eq!(decode_reply(&again).expect("and decodes again"), msg);
            }
        }
        2 => {
            if let Some(key) = std::str::from_utf8(rest).ok().and_then(Key::from_hex) {
                let hex = key.to_hex();
                assert_eq!(Key::from_hex(&hex).map(|k| k.to_hex()), Some(hex));
            }
        }
        _ => {
            let text = std::str::from_utf8(rest).unwrap_or_default();
            if let Ok(file) = ClientKeyFile::from_line(text) {
                let again = ClientKeyFile::from_line(&file.to_line()).expect("decodes again");
                assert_eq!(again, file);
            }
        }
    }
});
