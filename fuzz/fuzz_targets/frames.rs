//! The transport's fixed-size wire structures as a peer may send them: the tcp handshake
//! and frame headers, and the rdma connection data and message headers. The first byte
//! picks which; whatever decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use transport::frame::{Header, Hello, Kind, HEADER_LEN, HELLO_LEN};
use transport::rdma_common::conn_data::{ConnData, MsgHeader};

fuzz_target!(|data: &[u8]| {
    let [which, rest @ ..] = data else {
        return;
    };
    match which % 4 {
        0 => {
            for b in rest.chunks_exact(HELLO_LEN) {
                let b: &[u8; HELLO_LEN] = b.try_into().expect("HELLO_LEN bytes");
                if let Some(h) = Hello::decode(b) {
                    assert_eq!(&h.encode(), b, "a handshake message is canonical");
                }
            }
        }
        1 => {
            for b in rest.chunks_exact(HEADER_LEN) {
                let b: &[u8; HEADER_LEN] = b.try_into().expect("HEADER_LEN bytes");
                let h = Header::decode(b);
                if let Some(kind) = Kind::from_u8(h.kind) {
                    assert_eq!(kind as u8, h.kind);
                }
                if b[1] == 0 {
                    assert_eq!(
                        &h.encode(),
                        b,
                        "a frame header with a zero pad is canonical"
                    );
                }
            }
        }
        2 => {
            if let Ok(c) = ConnData::decode(rest) {
                let again = ConnData::decode(&c.encode()).expect("re-encoded data decodes");
                assert_eq!(again, c, "connection data survives a round trip");
            }
        }
        _ => {
            if let Ok(h) = MsgHeader::decode(rest) {
                let again = MsgHeader::decode(&h.encode()).expect("a re-encoded header decodes");
                assert_eq!(again, h, "a message header survives a round trip");
            }
        }
    }
});
