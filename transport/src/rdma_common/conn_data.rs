//! What two `rdma` endpoints tell each other, over a TCP side channel, to connect their
//! queue pairs; and the header of every SEND message.
//!
//! Connection data (64 bytes, little endian):
//!
//! | bytes  | field            | meaning                                             |
//! |--------|------------------|-----------------------------------------------------|
//! | 0..4   | magic            | `TSRQ`                                               |
//! | 4..6   | format version   | [`CONN_DATA_VERSION`]                                |
//! | 6..8   | app version      | application protocol version                         |
//! | 8..12  | qpn              | queue pair number (24 bits)                          |
//! | 12..16 | psn              | first packet sequence number (24 bits)               |
//! | 16..18 | lid              | port LID (InfiniBand)                                |
//! | 18     | link             | 1 InfiniBand, 2 Ethernet (RoCE)                      |
//! | 19     | mtu              | active path MTU as the verbs enum (1 = 256 .. 5 = 4096) |
//! | 20..36 | gid              | port GID (RoCE: the chosen RoCE v2 GID)              |
//! | 36..40 | max_msg_bytes    | size of each pre-posted receive buffer               |
//! | 40..44 | recv_credits     | data receive buffers posted for the peer             |
//! | 44..48 | status           | 0 accepted; else a refusal (see [`Refusal`])         |
//! | 48..64 | reserved         | zero                                                 |

/// Connection-data format version; bumped on any change to the layout above.
pub const CONN_DATA_VERSION: u16 = 1;
/// First bytes of connection data.
pub const CONN_DATA_MAGIC: [u8; 4] = *b"TSRQ";
/// Encoded size of [`ConnData`].
pub const CONN_DATA_LEN: usize = 64;
/// Largest queue pair number or packet sequence number (24 bits).
pub const MAX_QPN: u32 = (1 << 24) - 1;
/// Most receive buffers one side may post for the other.
pub const MAX_RECV_CREDITS: u32 = 4096;

/// The link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID.
    InfiniBand,
    /// Ethernet: RoCE, addressed by GID.
    Ethernet,
}

/// A path MTU, as verbs numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    B256 = 1,
    /// 512 bytes.
    B512 = 2,
    /// 1024 bytes.
    B1024 = 3,
    /// 2048 bytes.
    B2048 = 4,
    /// 4096 bytes.
    B4096 = 5,
}

impl Mtu {
    /// From the verbs enum value.
    pub fn from_code(c: u8) -> Option<Mtu> {
        Some(match c {
            1 => Mtu::B256,
            2 => Mtu::B512,
            3 => Mtu::B1024,
            4 => Mtu::B2048,
            5 => Mtu::B4096,
            _ => return None,
        })
    }

    /// From a size in bytes (one of the five).
    pub fn from_bytes(b: u32) -> Option<Mtu> {
        Mtu::from_code(match b {
            256 => 1,
            512 => 2,
            1024 => 3,
            2048 => 4,
            4096 => 5,
            _ => return None,
        })
    }

    /// Size in bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

/// The path MTU both sides use: the smaller active MTU, capped by configuration.
pub fn negotiate_mtu(ours: Mtu, theirs: Mtu, cap: Mtu) -> Mtu {
    ours.min(theirs).min(cap)
}

/// Why an accepting side refused a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Another application protocol version.
    Version = 1,
    /// The two ports have different link layers (InfiniBand and Ethernet).
    LinkLayer = 2,
    /// The listener has its maximum number of connections.
    Full = 3,
}

/// One side's connection data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnData {
    /// Application protocol version.
    pub app_version: u16,
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number of this side's send queue.
    pub psn: u32,
    /// Port LID.
    pub lid: u16,
    /// Link layer of the port.
    pub link: LinkLayer,
    /// Active MTU of the port.
    pub mtu: Mtu,
    /// GID (RoCE), zero on InfiniBand without a global route.
    pub gid: [u8; 16],
    /// Size of each receive buffer.
    pub max_msg_bytes: u32,
    /// Data receive buffers posted for the peer (its initial credits).
    pub recv_credits: u32,
    /// 0, or a [`Refusal`] number.
    pub status: u32,
}

impl ConnData {
    /// Encodes to the fixed layout.
    pub fn encode(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0u8; CONN_DATA_LEN];
        b[0..4].copy_from_slice(&CONN_DATA_MAGIC);
        b[4..6].copy_from_slice(&CONN_DATA_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.app_version.to_le_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.psn.to_le_bytes());
        b[16..18].copy_from_slice(&self.lid.to_le_bytes());
        b[18] = match self.link {
            LinkLayer::InfiniBand => 1,
            LinkLayer::Ethernet => 2,
        };
        b[19] = self.mtu as u8;
        b[20..36].copy_from_slice(&self.gid);
        b[36..40].copy_from_slice(&self.max_msg_bytes.to_le_bytes());
        b[40..44].copy_from_slice(&self.recv_credits.to_le_bytes());
        b[44..48].copy_from_slice(&self.status.to_le_bytes());
        b
    }

    /// Decodes and validates what a peer sent; the error says what is wrong.
    pub fn decode(b: &[u8]) -> Result<ConnData, String> {
        let b: &[u8; CONN_DATA_LEN] = b
            .try_into()
            .map_err(|_| format!("connection data of {} bytes, expected 64", b.len()))?;
        if b[0..4] != CONN_DATA_MAGIC {
            return Err("not Tessera RDMA connection data (bad magic)".into());
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let version = u16_at(4);
        if version != CONN_DATA_VERSION {
            return Err(format!(
                "connection data format v{version}, we speak v{CONN_DATA_VERSION}"
            ));
        }
        let link = match b[18] {
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            x => return Err(format!("unknown link layer {x}")),
        };
        let mtu = Mtu::from_code(b[19]).ok_or_else(|| format!("invalid MTU code {}", b[19]))?;
        let d = ConnData {
            app_version: u16_at(6),
            qpn: u32_at(8),
            psn: u32_at(12),
            lid: u16_at(16),
            link,
            mtu,
            gid: b[20..36].try_into().expect("16 bytes"),
            max_msg_bytes: u32_at(36),
            recv_credits: u32_at(40),
            status: u32_at(44),
        };
        d.check()?;
        Ok(d)
    }

    fn check(&self) -> Result<(), String> {
        if self.qpn > MAX_QPN || self.psn > MAX_QPN {
            return Err(format!(
                "qpn {} or psn {} exceeds 24 bits",
                self.qpn, self.psn
            ));
        }
        if self.status == 0 && !(1..=MAX_RECV_CREDITS).contains(&self.recv_credits) {
            return Err(format!(
                "{} receive credits (1 to 4096 allowed)",
                self.recv_credits
            ));
        }
        if self.status == 0 && !(4096..=16 << 20).contains(&self.max_msg_bytes) {
            return Err(format!("receive buffers of {} bytes", self.max_msg_bytes));
        }
        if self.link == LinkLayer::Ethernet && self.status == 0 && self.gid == [0; 16] {
            return Err("a RoCE peer sent no GID".into());
        }
        Ok(())
    }
}

/// Kind of a SEND message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsgKind {
    /// A request.
    Call = 1,
    /// Its reply.
    Reply = 2,
    /// The peer refused the call; status holds the code, the payload the reason.
    CallError = 3,
    /// Returns credits only (no payload, uses no data credit).
    Credit = 4,
}

/// Length of [`MsgHeader`].
pub const MSG_HEADER_LEN: usize = 24;

/// The header at the start of every SEND: what the message is and the credits it
/// returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsgHeader {
    /// What the message is.
    pub kind: MsgKind,
    /// 0 or an error code.
    pub status: u16,
    /// Call id, echoed by the reply.
    pub id: u64,
    /// Receive buffers the sender reposted since its last message (credits returned).
    pub credits: u32,
    /// Credit-only messages the sender has received so far (wrapping counter).
    pub updates_seen: u32,
}

impl MsgHeader {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; MSG_HEADER_LEN] {
        let mut b = [0u8; MSG_HEADER_LEN];
        b[0] = self.kind as u8;
        b[2..4].copy_from_slice(&self.status.to_le_bytes());
        b[4..8].copy_from_slice(&self.credits.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..20].copy_from_slice(&self.updates_seen.to_le_bytes());
        b
    }

    /// Decodes a header from the start of a received message.
    pub fn decode(b: &[u8]) -> Result<MsgHeader, String> {
        if b.len() < MSG_HEADER_LEN {
            return Err(format!("message of {} bytes has no header", b.len()));
        }
        let kind = match b[0] {
            1 => MsgKind::Call,
            2 => MsgKind::Reply,
            3 => MsgKind::CallError,
            4 => MsgKind::Credit,
            k => return Err(format!("unknown message kind {k}")),
        };
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[8..16]);
        Ok(MsgHeader {
            kind,
            status: u16::from_le_bytes([b[2], b[3]]),
            credits: u32_at(4),
            id: u64::from_le_bytes(id),
            updates_seen: u32_at(16),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ConnData {
        ConnData {
            app_version: 3,
            qpn: 0x00ab_cdef,
            psn: 0x0012_3456,
            lid: 17,
            link: LinkLayer::Ethernet,
            mtu: Mtu::B4096,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7],
            max_msg_bytes: 128 * 1024,
            recv_credits: 64,
            status: 0,
        }
    }

    #[test]
    fn conn_data_round_trips() {
        let d = sample();
        let b = d.encode();
        assert_eq!(&b[0..4], b"TSRQ");
        assert_eq!(ConnData::decode(&b), Ok(d));
        let ib = ConnData {
            link: LinkLayer::InfiniBand,
            gid: [0; 16],
            mtu: Mtu::B2048,
            ..d
        };
        assert_eq!(ConnData::decode(&ib.encode()), Ok(ib));
    }

    /// Guards against trusting malformed connection data from a peer.
    #[test]
    fn bad_conn_data_is_refused_with_a_reason() {
        let good = sample().encode();
        let mut cases: Vec<(Vec<u8>, &str)> = vec![(good[..63].to_vec(), "63 bytes")];
        let mut bad = good;
        bad[0] = b'X';
        cases.push((bad.to_vec(), "magic"));
        let mut bad = good;
        bad[4] = 9;
        cases.push((bad.to_vec(), "format v9"));
        let mut bad = good;
        bad[11] = 1; // qpn past 24 bits
        cases.push((bad.to_vec(), "24 bits"));
        let mut bad = good;
        bad[19] = 6;
        cases.push((bad.to_vec(), "MTU"));
        let mut bad = good;
        bad[18] = 3;
        cases.push((bad.to_vec(), "link layer"));
        let mut bad = good;
        bad[40..44].copy_from_slice(&0u32.to_le_bytes());
        cases.push((bad.to_vec(), "receive credits"));
        let mut bad = good;
        bad[20..36].fill(0);
        cases.push((bad.to_vec(), "no GID"));
        for (bytes, want) in cases {
            let e = ConnData::decode(&bytes).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn mtu_is_the_smallest_of_both_ports_and_the_cap() {
        assert_eq!(
            negotiate_mtu(Mtu::B4096, Mtu::B1024, Mtu::B4096),
            Mtu::B1024
        );
        assert_eq!(
            negotiate_mtu(Mtu::B2048, Mtu::B4096, Mtu::B4096),
            Mtu::B2048
        );
        assert_eq!(negotiate_mtu(Mtu::B4096, Mtu::B4096, Mtu::B512), Mtu::B512);
        assert_eq!(Mtu::B4096.bytes(), 4096);
        assert_eq!(Mtu::B256.bytes(), 256);
        assert_eq!(Mtu::from_bytes(2048), Some(Mtu::B2048));
        assert_eq!(Mtu::from_bytes(1500), None);
    }

    #[test]
    fn message_header_round_trips_and_rejects_junk() {
        let h = MsgHeader {
            kind: MsgKind::CallError,
            status: 12,
            id: u64::MAX - 1,
            credits: 31,
            updates_seen: u32::MAX,
        };
        assert_eq!(MsgHeader::decode(&h.encode()), Ok(h));
        assert!(MsgHeader::decode(&[1; 23]).is_err());
        let mut b = h.encode();
        b[0] = 0;
        assert!(MsgHeader::decode(&b).unwrap_err().contains("kind 0"));
    }
}
