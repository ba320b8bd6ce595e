//! The setup of a reliable-connected queue pair as a state machine: RESET, INIT
//! (port, access rights), RTR (the peer's address, QPN and PSN, the path MTU), RTS
//! (our PSN, timeouts, retries). Each step returns the attributes the verbs layer sets
//! with `ibv_modify_qp`; a step out of order, or an address that cannot work (link
//! layers differ, RoCE without a GID) is refused before any verbs call is made.

use super::conn_data::{negotiate_mtu, ConnData, LinkLayer, Mtu};

/// ACK timeout exponent: 4.096 us x 2^14 = 67 ms before a retransmission.
pub const ACK_TIMEOUT: u8 = 14;
/// Transport retries before the queue pair fails (7 is the most verbs allows).
pub const RETRY_COUNT: u8 = 7;
/// Receiver-not-ready retries; 7 means retry forever (credits keep it from happening).
pub const RNR_RETRY: u8 = 7;
/// Receiver-not-ready NAK delay code 12: 0.64 ms.
pub const MIN_RNR_TIMER: u8 = 12;
/// Hop limit of RoCE v2 packets.
pub const HOP_LIMIT: u8 = 64;
/// Most RDMA READs in flight per queue pair that we ask for (devices may allow fewer).
pub const MAX_RD_ATOMIC: u8 = 16;

/// A queue pair's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Just created.
    Reset,
    /// Bound to a port, may post receives.
    Init,
    /// Ready to receive from the peer.
    Rtr,
    /// Ready to send.
    Rts,
    /// Broken; every work request completes with an error.
    Error,
}

/// The local port a queue pair uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalPort {
    /// Port number (from 1).
    pub port: u8,
    /// Link layer.
    pub link: LinkLayer,
    /// LID (InfiniBand).
    pub lid: u16,
    /// GID index used as the source GID (RoCE).
    pub gid_index: Option<u8>,
    /// Active MTU.
    pub mtu: Mtu,
}

/// How packets reach the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressVector {
    /// InfiniBand, by LID within the subnet.
    Lid {
        /// Destination LID.
        dlid: u16,
        /// Our port.
        port: u8,
    },
    /// RoCE v2 (and routed InfiniBand), by GID.
    Global {
        /// Destination GID.
        dgid: [u8; 16],
        /// Our source GID index.
        sgid_index: u8,
        /// Hop limit.
        hop_limit: u8,
        /// Our port.
        port: u8,
    },
}

/// The attributes of one `ibv_modify_qp` step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpAttrs {
    /// RESET to INIT.
    Init {
        /// Port number.
        port: u8,
        /// Partition key index.
        pkey_index: u16,
        /// Let the peer RDMA READ and WRITE our registered memory (keys still decide
        /// what it reaches).
        remote_read_write: bool,
    },
    /// INIT to RTR.
    Rtr {
        /// Negotiated path MTU.
        path_mtu: Mtu,
        /// The peer's queue pair number.
        dest_qpn: u32,
        /// The peer's first PSN.
        rq_psn: u32,
        /// RDMA READs the peer may have in flight against us.
        max_dest_rd_atomic: u8,
        /// RNR NAK delay.
        min_rnr_timer: u8,
        /// How to reach the peer.
        av: AddressVector,
    },
    /// RTR to RTS.
    Rts {
        /// Our first PSN.
        sq_psn: u32,
        /// ACK timeout exponent.
        timeout: u8,
        /// Transport retries.
        retry_cnt: u8,
        /// RNR retries.
        rnr_retry: u8,
        /// RDMA READs we may have in flight.
        max_rd_atomic: u8,
    },
}

/// Walks one queue pair from RESET to RTS, in order.
#[derive(Clone, Debug)]
pub struct QpSetup {
    state: QpState,
    local: LocalPort,
    mtu_cap: Mtu,
    rd_atomic: u8,
}

impl QpSetup {
    /// Setup on `local`, with the MTU capped at `mtu_cap` and at most `device_rd_atomic`
    /// RDMA READs in flight (what the device reports).
    pub fn new(local: LocalPort, mtu_cap: Mtu, device_rd_atomic: u8) -> QpSetup {
        QpSetup {
            state: QpState::Reset,
            local,
            mtu_cap,
            rd_atomic: device_rd_atomic.clamp(1, MAX_RD_ATOMIC),
        }
    }

    /// The state reached so far.
    pub fn state(&self) -> QpState {
        self.state
    }

    fn step(&mut self, from: QpState, to: QpState) -> Result<(), String> {
        if self.state != from {
            return Err(format!(
                "queue pair is {:?}; moving to {to:?} needs {from:?}",
                self.state
            ));
        }
        self.state = to;
        Ok(())
    }

    /// RESET to INIT.
    pub fn to_init(&mut self) -> Result<QpAttrs, String> {
        self.step(QpState::Reset, QpState::Init)?;
        Ok(QpAttrs::Init {
            port: self.local.port,
            pkey_index: 0,
            remote_read_write: true,
        })
    }

    /// INIT to RTR, towards `remote`.
    pub fn to_rtr(&mut self, remote: &ConnData) -> Result<QpAttrs, String> {
        if remote.link != self.local.link {
            self.state = QpState::Error;
            return Err(format!(
                "our port is {:?} and the peer's is {:?}: they cannot connect",
                self.local.link, remote.link
            ));
        }
        let av = match (self.local.link, self.local.gid_index) {
            (LinkLayer::InfiniBand, _) => AddressVector::Lid {
                dlid: remote.lid,
                port: self.local.port,
            },
            (LinkLayer::Ethernet, Some(sgid_index)) => AddressVector::Global {
                dgid: remote.gid,
                sgid_index,
                hop_limit: HOP_LIMIT,
                port: self.local.port,
            },
            (LinkLayer::Ethernet, None) => {
                self.state = QpState::Error;
                return Err("a RoCE port needs a GID index (none was chosen)".into());
            }
        };
        self.step(QpState::Init, QpState::Rtr)?;
        Ok(QpAttrs::Rtr {
            path_mtu: negotiate_mtu(self.local.mtu, remote.mtu, self.mtu_cap),
            dest_qpn: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: self.rd_atomic,
            min_rnr_timer: MIN_RNR_TIMER,
            av,
        })
    }

    /// RTR to RTS, sending from `local_psn`.
    pub fn to_rts(&mut self, local_psn: u32) -> Result<QpAttrs, String> {
        self.step(QpState::Rtr, QpState::Rts)?;
        Ok(QpAttrs::Rts {
            sq_psn: local_psn,
            timeout: ACK_TIMEOUT,
            retry_cnt: RETRY_COUNT,
            rnr_retry: RNR_RETRY,
            max_rd_atomic: self.rd_atomic,
        })
    }

    /// A verbs call failed, or the connection broke.
    pub fn fail(&mut self) {
        self.state = QpState::Error;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(link: LinkLayer) -> ConnData {
        ConnData {
            app_version: 1,
            qpn: 0x42,
            psn: 0x777,
            lid: 9,
            link,
            mtu: Mtu::B2048,
            gid: [0xfe; 16],
            max_msg_bytes: 4096,
            recv_credits: 8,
            status: 0,
        }
    }

    fn port(link: LinkLayer, gid_index: Option<u8>) -> LocalPort {
        LocalPort {
            port: 1,
            link,
            lid: 3,
            gid_index,
            mtu: Mtu::B4096,
        }
    }

    #[test]
    fn infiniband_goes_reset_init_rtr_rts_addressing_by_lid() {
        let mut s = QpSetup::new(port(LinkLayer::InfiniBand, None), Mtu::B4096, 128);
        assert_eq!(
            s.to_init().unwrap(),
            QpAttrs::Init {
                port: 1,
                pkey_index: 0,
                remote_read_write: true
            }
        );
        match s.to_rtr(&remote(LinkLayer::InfiniBand)).unwrap() {
            QpAttrs::Rtr {
                path_mtu,
                dest_qpn,
                rq_psn,
                max_dest_rd_atomic,
                av,
                ..
            } => {
                assert_eq!((path_mtu, dest_qpn, rq_psn), (Mtu::B2048, 0x42, 0x777));
                assert_eq!(max_dest_rd_atomic, MAX_RD_ATOMIC, "clamped to our maximum");
                assert_eq!(av, AddressVector::Lid { dlid: 9, port: 1 });
            }
            other => panic!("{other:?}"),
        }
        match s.to_rts(0x1234).unwrap() {
            QpAttrs::Rts {
                sq_psn, rnr_retry, ..
            } => assert_eq!((sq_psn, rnr_retry), (0x1234, 7)),
            other => panic!("{other:?}"),
        }
        assert_eq!(s.state(), QpState::Rts);
    }

    #[test]
    fn roce_addresses_by_gid_from_the_chosen_index() {
        let mut s = QpSetup::new(port(LinkLayer::Ethernet, Some(3)), Mtu::B1024, 4);
        s.to_init().unwrap();
        match s.to_rtr(&remote(LinkLayer::Ethernet)).unwrap() {
            QpAttrs::Rtr {
                path_mtu,
                av,
                max_dest_rd_atomic,
                ..
            } => {
                assert_eq!(path_mtu, Mtu::B1024, "capped by configuration");
                assert_eq!(max_dest_rd_atomic, 4, "limited by the device");
                assert_eq!(
                    av,
                    AddressVector::Global {
                        dgid: [0xfe; 16],
                        sgid_index: 3,
                        hop_limit: HOP_LIMIT,
                        port: 1
                    }
                );
            }
            other => panic!("{other:?}"),
        }
    }

    /// Guards against modifying a queue pair out of order or towards an unreachable
    /// peer: the verbs layer would fail with a bare EINVAL.
    #[test]
    fn steps_out_of_order_and_mismatched_links_are_refused() {
        let mut s = QpSetup::new(port(LinkLayer::InfiniBand, None), Mtu::B4096, 16);
        assert!(s.to_rts(1).unwrap_err().contains("needs Rtr"));
        assert!(s.to_rtr(&remote(LinkLayer::InfiniBand)).is_err());
        s.to_init().unwrap();
        assert!(s.to_init().is_err(), "INIT twice");
        let e = s.to_rtr(&remote(LinkLayer::Ethernet)).unwrap_err();
        assert!(e.contains("cannot connect"), "{e}");
        assert_eq!(s.state(), QpState::Error);
        let mut r = QpSetup::new(port(LinkLayer::Ethernet, None), Mtu::B4096, 16);
        r.to_init().unwrap();
        assert!(r.to_rtr(&remote(LinkLayer::Ethernet)).is_err());
    }
}
