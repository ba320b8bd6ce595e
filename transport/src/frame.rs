//! The `tcp` backend's wire format: a handshake, then frames.
//!
//! Handshake (16 bytes each way, little endian): magic `TSRA`, transport version (u16),
//! application protocol version (u16), largest message the sender accepts (u32), and a
//! status (u32: 0 accepted, 1 refused for a version mismatch). The connecting side sends
//! first; the accepting side answers and closes if it refuses.
//!
//! Frame: a 32-byte header, then `len` payload bytes.
//!
//! | bytes | field  | meaning                                                        |
//! |-------|--------|----------------------------------------------------------------|
//! | 0     | kind   | see [`Kind`]                                                   |
//! | 1     | -      | zero                                                           |
//! | 2..4  | status | 0, or an error code ([`proto::ErrorCode`] number)               |
//! | 4..8  | key    | remote key of a one-sided operation                            |
//! | 8..16 | id     | request id chosen by the initiator, echoed by the completion   |
//! | 16..24| addr   | remote address of a one-sided operation                        |
//! | 24..28| len    | payload length                                                 |
//! | 28..32| rlen   | bytes asked for by a one-sided read                            |
//!
//! This module is public so tests can speak the wire directly (malformed frames).

/// Transport wire version; bumped on any change to this format.
pub const TRANSPORT_VERSION: u16 = 1;
/// First bytes of every handshake.
pub const MAGIC: [u8; 4] = *b"TSRA";
/// Length of a handshake message.
pub const HELLO_LEN: usize = 16;
/// Length of a frame header.
pub const HEADER_LEN: usize = 32;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A two-sided request; payload = message.
    Call = 1,
    /// The reply to a call; payload = message.
    Reply = 2,
    /// The peer's engine refused a call; status = code, payload = UTF-8 reason.
    CallError = 3,
    /// One-sided write: store the payload at (key, addr).
    Write = 4,
    /// Completion of a write; status = 0 or a code.
    WriteAck = 5,
    /// One-sided read: send back `rlen` bytes at (key, addr).
    Read = 6,
    /// Completion of a read; payload = the bytes, or status = a code.
    ReadResp = 7,
    /// The sender gives the connection up but lives on (a call on it timed out): the
    /// receiver closes it as broken, not as closed by its peer (tcp only).
    Abandon = 8,
}

impl Kind {
    /// Parses a kind byte.
    pub fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Call,
            2 => Kind::Reply,
            3 => Kind::CallError,
            4 => Kind::Write,
            5 => Kind::WriteAck,
            6 => Kind::Read,
            7 => Kind::ReadResp,
            8 => Kind::Abandon,
            _ => return None,
        })
    }
}

/// A decoded frame header. `kind` stays a raw byte so an unknown kind can be reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Raw kind byte (see [`Kind`]).
    pub kind: u8,
    /// Status or error code.
    pub status: u16,
    /// Remote key.
    pub key: u32,
    /// Request id.
    pub id: u64,
    /// Remote address.
    pub addr: u64,
    /// Payload length.
    pub len: u32,
    /// Length asked for by a read.
    pub rlen: u32,
}

impl Header {
    /// A header of `kind` for request `id` with no payload.
    pub fn new(kind: Kind, id: u64) -> Header {
        Header {
            kind: kind as u8,
            id,
            ..Header::default()
        }
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind;
        b[2..4].copy_from_slice(&self.status.to_le_bytes());
        b[4..8].copy_from_slice(&self.key.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..32].copy_from_slice(&self.rlen.to_le_bytes());
        b
    }

    /// Decodes a header (any bytes decode; the engine validates the fields).
    pub fn decode(b: &[u8; HEADER_LEN]) -> Header {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        Header {
            kind: b[0],
            status: u16_at(2),
            key: u32_at(4),
            id: u64_at(8),
            addr: u64_at(16),
            len: u32_at(24),
            rlen: u32_at(28),
        }
    }
}

/// One side's handshake message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Transport wire version.
    pub transport_version: u16,
    /// Application protocol version.
    pub app_version: u16,
    /// Largest message the sender accepts.
    pub max_msg_bytes: u32,
    /// 0 accepted, 1 refused.
    pub status: u32,
}

impl Hello {
    /// Encodes the handshake message.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&self.transport_version.to_le_bytes());
        b[6..8].copy_from_slice(&self.app_version.to_le_bytes());
        b[8..12].copy_from_slice(&self.max_msg_bytes.to_le_bytes());
        b[12..16].copy_from_slice(&self.status.to_le_bytes());
        b
    }

    /// Decodes a handshake message; `None` if the magic is wrong (not a Tessera peer).
    pub fn decode(b: &[u8; HELLO_LEN]) -> Option<Hello> {
        if b[0..4] != MAGIC {
            return None;
        }
        Some(Hello {
            transport_version: u16::from_le_bytes([b[4], b[5]]),
            app_version: u16::from_le_bytes([b[6], b[7]]),
            max_msg_bytes: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            status: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = Header {
            kind: Kind::Read as u8,
            status: 7,
            key: 0xdead_beef,
            id: u64::MAX - 3,
            addr: 0x7fff_0000_1000,
            len: 12,
            rlen: 1 << 20,
        };
        assert_eq!(Header::decode(&h.encode()), h);
        assert_eq!(Kind::from_u8(h.kind), Some(Kind::Read));
        assert_eq!(Kind::from_u8(0), None);
        assert_eq!(Kind::from_u8(8), Some(Kind::Abandon));
        assert_eq!(Kind::from_u8(9), None);
    }

    #[test]
    fn hello_rejects_wrong_magic() {
        let h = Hello {
            transport_version: 1,
            app_version: 9,
            max_msg_bytes: 4096,
            status: 0,
        };
        let mut b = h.encode();
        assert_eq!(Hello::decode(&b), Some(h));
        b[0] = b'X';
        assert_eq!(Hello::decode(&b), None);
    }
}
