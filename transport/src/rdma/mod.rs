//! The `rdma` backend (build feature `rdma`): verbs through `rdma-sys`, on InfiniBand
//! (addressed by LID) or RoCE v2 (addressed by the GID whose sysfs type is RoCE v2, or
//! the configured index).
//!
//! - An [`Endpoint`] opens the device and allocates one protection domain. Memory is
//!   registered with local write and memory-window binding only: the region's own rkey
//!   lets no peer in.
//! - A grant binds a type 2 memory window to the connection's queue pair (its rkey works
//!   on that queue pair only) and deallocates it when dropped, or when the region is
//!   deregistered. Devices without type 2 windows fall back to registering the slice
//!   itself (the key then works on every queue pair of the endpoint; a warning says so).
//!   Soft-RoCE (`rdma_rxe`, known by its vendor id) checks an access through a window
//!   against the registration under the window, not against the window's own bounds
//!   (seen on Linux 6.1: a WRITE one byte before a granted slice landed); there each
//!   window is bound over a registration of exactly its slice, so both checks hold.
//! - Each connection has a reliable-connected queue pair, its own completion queue and
//!   completion channel, whose fd tokio watches (no spinning unless `busy_poll_us`).
//! - Connection data (QPN, PSN, LID, GID, MTU, buffer sizes, credits) is exchanged
//!   over a TCP connection to the listen address, which then stays open: its closing
//!   tells at once that the peer process died. Layout and setup steps are in
//!   [`crate::rdma_common`], which is unit-tested without a device.

mod engine;
mod verbs;

pub(crate) use engine::RdmaWire;

use crate::config::{RdmaConfig, TransportConfig};
use crate::conn::{Closed, ConnCore, Connection, Handler, Wire};
use crate::endpoint::{ConnSet, Endpoint, Listener};
use crate::error::TransportError;
use crate::mr::{AlignedBuf, HwMr, MemoryRegion, MrInner};
use crate::rdma_common::conn_data::{ConnData, LinkLayer, Mtu, Refusal, CONN_DATA_LEN};
use crate::rdma_common::qp::LocalPort;
use crate::rdma_common::sysfs;
use parking_lot::Mutex;
use rdma_sys::ibv_access_flags as Acc;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};
use verbs::{Context, MrRaw, MwRaw, Pd};

/// Why the `rdma` backend cannot run with `config`, or `Ok`.
pub(crate) fn probe(config: &RdmaConfig) -> Result<(), String> {
    match verbs::device_names() {
        Err(e) => Err(format!("no RDMA device ({e})")),
        Ok(names) if names.is_empty() => Err("no RDMA device found".into()),
        Ok(_) => {
            let devices = sysfs::scan(Path::new(sysfs::SYSFS_ROOT));
            sysfs::pick(&devices, &config.device, config.port, config.gid_index).map(|_| ())
        }
    }
}

/// An open device with its protection domain and the port connections use.
pub(crate) struct Device {
    name: String,
    pd: Pd,
    ctx: Arc<Context>,
    local: LocalPort,
    gid: [u8; 16],
    max_rd_atomic: u8,
    /// How grants are keyed on this device.
    grants: GrantPath,
    mtu_cap: Mtu,
    busy_poll: Duration,
}

fn mtu_of(code: u32) -> Mtu {
    Mtu::from_code(code as u8).unwrap_or(Mtu::B1024)
}

impl Device {
    /// Opens the device `config.rdma` selects and checks its port is up.
    pub(crate) fn open(config: &TransportConfig) -> Result<Arc<Device>, TransportError> {
        let c = &config.rdma;
        let unsupported = |why: String| {
            TransportError::Unsupported(format!(
                "the rdma transport cannot run: {why}; use the tcp transport instead"
            ))
        };
        probe(c).map_err(unsupported)?;
        let devices = sysfs::scan(Path::new(sysfs::SYSFS_ROOT));
        let (dev, port, gid_index) =
            sysfs::pick(&devices, &c.device, c.port, c.gid_index).map_err(unsupported)?;
        let ctx = Arc::new(verbs::open(&dev.name)?);
        let attr = ctx.query_device()?;
        let pattr = ctx.query_port(port.num)?;
        if pattr.state != rdma_sys::ibv_port_state::IBV_PORT_ACTIVE {
            return Err(unsupported(format!(
                "{} port {} is not active",
                dev.name, port.num
            )));
        }
        let link = match pattr.link_layer {
            verbs::LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            _ => LinkLayer::InfiniBand,
        };
        let gid = match gid_index {
            Some(i) => ctx.query_gid(port.num, i)?,
            None => [0; 16],
        };
        let grants = GrantPath::of(attr.device_cap_flags, attr.vendor_id);
        if grants == GrantPath::Registration {
            warn!(device = %dev.name, "no type 2 memory windows: grants are keyed per endpoint");
        }
        let pd = verbs::alloc_pd(&ctx)?;
        info!(device = %dev.name, port = port.num, ?link, ?gid_index, "rdma device open");
        Ok(Arc::new(Device {
            name: dev.name.clone(),
            pd,
            ctx,
            local: LocalPort {
                port: port.num,
                link,
                lid: pattr.lid,
                gid_index,
                mtu: mtu_of(pattr.active_mtu),
            },
            gid,
            max_rd_atomic: attr.max_qp_rd_atom.clamp(1, 255) as u8,
            grants,
            mtu_cap: Mtu::from_bytes(c.max_mtu_bytes).unwrap_or(Mtu::B4096),
            busy_poll: Duration::from_micros(c.busy_poll_us),
        }))
    }

    /// The device, port and address in use, and how grants are keyed (which of the
    /// documented paths this device takes).
    pub(crate) fn describe(&self) -> String {
        let grants = match self.grants {
            GrantPath::Window => "type 2 memory windows bound per connection",
            GrantPath::WindowOnSlice => {
                "type 2 memory windows bound per connection, each over a registration \
                 of its slice (soft-RoCE does not check a window's own bounds)"
            }
            GrantPath::Registration => "a registration per grant (no type 2 memory windows)",
        };
        let addr = match (self.local.link, self.local.gid_index) {
            (LinkLayer::Ethernet, Some(i)) => format!("RoCE v2, GID index {i}"),
            (LinkLayer::Ethernet, None) => "RoCE, no GID".to_string(),
            (LinkLayer::InfiniBand, _) => format!("InfiniBand, LID {}", self.local.lid),
        };
        format!(
            "{} port {} ({addr}), active MTU {} bytes; grants: {grants}",
            self.name,
            self.local.port,
            self.local.mtu.bytes()
        )
    }

    /// Allocates `len` bytes and registers them for local access and window binding.
    pub(crate) fn register(self: &Arc<Self>, len: usize) -> Result<MemoryRegion, TransportError> {
        self.register_over(AlignedBuf::zeroed(len))
            .map_err(|(e, _)| e)
    }

    /// Registers `buf`'s bytes (allocated here, or lent by the caller) likewise; refused
    /// with the bytes given back.
    pub(crate) fn register_over(
        self: &Arc<Self>,
        buf: AlignedBuf,
    ) -> Result<MemoryRegion, (TransportError, AlignedBuf)> {
        let dev = self.clone();
        MemoryRegion::over(buf, move |buf| {
            if buf.is_empty() {
                return Ok(None); // verbs refuses empty registrations; nothing to reach
            }
            let mut access = Acc::IBV_ACCESS_LOCAL_WRITE;
            if dev.grants == GrantPath::Window {
                access |= Acc::IBV_ACCESS_MW_BIND;
            }
            let raw = verbs::reg_mr(&dev.pd, buf.as_mut_ptr(), buf.len(), access)?;
            Ok(Some(HwMr {
                lkey: raw.lkey(),
                handle: Box::new(RdmaMr {
                    grants: Mutex::new(Vec::new()),
                    raw,
                    dev,
                }),
            }))
        })
    }
}

/// Soft-RoCE's vendor id (`RXE_VENDOR_ID` in the kernel's `rdma_rxe`).
const RXE_VENDOR_ID: u32 = 0xff_ffff;

/// How a grant's key is made, chosen from the device's attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GrantPath {
    /// A type 2 window over the region's registration.
    Window,
    /// A type 2 window over a registration of exactly the granted slice, for devices
    /// that do not check a window's own bounds.
    WindowOnSlice,
    /// A registration of the slice with remote access (no type 2 windows).
    Registration,
}

impl GrantPath {
    fn of(cap_flags: u32, vendor_id: u32) -> GrantPath {
        let mw2 = rdma_sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0;
        match (cap_flags & mw2 != 0, vendor_id == RXE_VENDOR_ID) {
            (false, _) => GrantPath::Registration,
            (true, false) => GrantPath::Window,
            (true, true) => GrantPath::WindowOnSlice,
        }
    }
}

/// A region's registration; revokes every grant onto the region before deregistering.
pub(crate) struct RdmaMr {
    grants: Mutex<Vec<Weak<GrantKey>>>,
    raw: MrRaw,
    dev: Arc<Device>,
}

impl Drop for RdmaMr {
    fn drop(&mut self) {
        // A bound window keeps `ibv_dereg_mr` from succeeding and would let the NIC
        // reach freed memory: invalidate every one first.
        for g in self.grants.lock().drain(..) {
            if let Some(g) = g.upgrade() {
                g.revoke();
            }
        }
    }
}

/// The registration behind `mr`, if it was made by an `rdma` endpoint.
pub(crate) fn rdma_mr(mr: &MrInner) -> Result<&RdmaMr, TransportError> {
    mr.hw
        .as_ref()
        .and_then(|h| h.handle.downcast_ref::<RdmaMr>())
        .ok_or_else(|| {
            TransportError::InvalidArgument(
                "memory was not registered with an rdma endpoint".into(),
            )
        })
}

/// What a grant's key is: a memory window, or (without windows) a registration.
enum KeyRes {
    Mw(#[allow(dead_code)] MwRaw),
    /// The window goes first, then the registration under it (tuple fields drop in order).
    MwOnSlice(#[allow(dead_code)] MwRaw, #[allow(dead_code)] MrRaw),
    Mr(#[allow(dead_code)] MrRaw),
}

/// A grant's key; dropping what it holds makes the key stop working.
pub(crate) struct GrantKey(Mutex<Option<KeyRes>>);

impl GrantKey {
    fn revoke(&self) {
        self.0.lock().take();
    }
}

/// Held by a [`crate::Grant`]; revokes the key when the grant is dropped.
struct GrantHold(Arc<GrantKey>);

impl Drop for GrantHold {
    fn drop(&mut self) {
        self.0.revoke();
    }
}

/// Connects to an `rdma` listener at `addr` (its TCP side channel).
pub(crate) async fn connect(ep: &Endpoint, addr: &str) -> Result<Connection, TransportError> {
    let dev = ep.rdma_device().cloned().ok_or_else(|| {
        TransportError::InvalidArgument("an rdma endpoint without a device".into())
    })?;
    let ms = ep.config().connect_timeout_ms;
    let attempt = async {
        let mut s = TcpStream::connect(addr)
            .await
            .map_err(|source| TransportError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        let _ = s.set_nodelay(true);
        let hs = |why: String| TransportError::Handshake {
            peer: addr.to_string(),
            why,
        };
        let wire = RdmaWire::new(&dev, ep.config())?;
        let ours = wire.conn_data(ep.app_version(), 0);
        s.write_all(&ours.encode())
            .await
            .map_err(|e| TransportError::cut_in_handshake(addr, e))?;
        let mut b = [0u8; CONN_DATA_LEN];
        s.read_exact(&mut b)
            .await
            .map_err(|e| TransportError::cut_in_handshake(addr, e))?;
        let theirs = ConnData::decode(&b).map_err(hs)?;
        if theirs.status == Refusal::Version as u32 {
            return Err(TransportError::VersionMismatch {
                peer: addr.to_string(),
                their_transport: crate::frame::TRANSPORT_VERSION,
                their_app: theirs.app_version,
                our_transport: crate::frame::TRANSPORT_VERSION,
                our_app: ep.app_version(),
            });
        }
        if theirs.status == Refusal::Full as u32 {
            // As a full tcp listener that closes the connection: a server to try again
            // later, or the next address now.
            return Err(TransportError::Connect {
                addr: addr.to_string(),
                source: std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "the server has no room for another connection",
                ),
            });
        }
        if theirs.status != 0 {
            return Err(hs(format!("refused (status {})", theirs.status)));
        }
        wire.connect_qp(&theirs)?;
        s.write_all(&[1])
            .await
            .map_err(|e| TransportError::cut_in_handshake(addr, e))?;
        let core = start(wire, s, addr.to_string(), &theirs, ep.config_arc(), None);
        Ok(Connection::new(core, true))
    };
    match tokio::time::timeout(Duration::from_millis(ms), attempt).await {
        Ok(r) => r,
        Err(_) => Err(TransportError::TimedOut {
            op: crate::error::OP_CONNECT,
            peer: addr.to_string(),
            ms,
        }),
    }
}

fn start(
    wire: RdmaWire,
    side: TcpStream,
    peer: String,
    theirs: &ConnData,
    config: Arc<TransportConfig>,
    handler: Option<Arc<dyn Handler>>,
) -> Arc<ConnCore> {
    let max = theirs.max_msg_bytes as usize;
    let (side, side_tx) = side.into_split();
    wire.keep_side(side_tx);
    let core = Arc::new(ConnCore::new(peer, max, config, handler, Wire::Rdma(wire)));
    let poller = tokio::spawn(engine::poll_loop(Arc::downgrade(&core)));
    // The watcher owns the connection, as tcp's reader task does: an accepted one has
    // no other strong owner (the listener's set holds it weakly) and would otherwise be
    // dropped, queue pair and all, right after the handshake. It ends (letting go) when
    // the connection closes: `close` aborts it.
    let watcher = tokio::spawn(watch_side(core.clone(), side));
    core.tasks
        .lock()
        .extend([poller.abort_handle(), watcher.abort_handle()]);
    core
}

/// The side channel carries nothing after setup but [`engine::SIDE_ABANDON`] (the
/// peer gave the connection up: broken, as a network failure); its end means the peer
/// is gone.
async fn watch_side(core: Arc<ConnCore>, mut side: tokio::net::tcp::OwnedReadHalf) {
    let mut b = [0u8; 64];
    let (why, how) = loop {
        match side.read(&mut b).await {
            Ok(0) => break ("peer closed the connection".to_string(), Closed::ByPeer),
            Ok(n) if b[..n].contains(&engine::SIDE_ABANDON) => {
                break ("peer gave the connection up".to_string(), Closed::Broken)
            }
            Ok(_) => continue,
            Err(e) => break (format!("side channel failed: {e}"), Closed::Broken),
        }
    };
    core.shutdown_as(why, how);
}

/// Listens for `rdma` connections: their side channels arrive at `addr`.
pub(crate) async fn listen(
    ep: &Endpoint,
    addr: &str,
    handler: Arc<dyn Handler>,
) -> Result<Listener, TransportError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| TransportError::Listen {
            addr: addr.to_string(),
            source,
        })?;
    let local_addr = listener.local_addr()?;
    let conns = ConnSet::for_endpoint(ep);
    let task = tokio::spawn(accept_loop(ep.clone(), listener, handler, conns.clone()));
    info!(%local_addr, backend = "rdma", "listening");
    Ok(Listener::new(
        local_addr,
        Some(task.abort_handle()),
        conns,
        None,
    ))
}

async fn accept_loop(ep: Endpoint, l: TcpListener, handler: Arc<dyn Handler>, conns: ConnSet) {
    loop {
        let (s, peer) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (ep, handler, conns) = (ep.clone(), handler.clone(), conns.clone());
        tokio::spawn(async move {
            let peer = peer.to_string();
            let ms = ep.config().connect_timeout_ms;
            let setup = accept_one(&ep, s, &peer, handler, &conns);
            match tokio::time::timeout(Duration::from_millis(ms), setup).await {
                Ok(Ok(core)) => conns.insert(&core),
                Ok(Err(e)) => debug!(%peer, error = %e, "rdma connection refused"),
                Err(_) => debug!(%peer, "rdma connection setup timed out"),
            }
        });
    }
}

async fn accept_one(
    ep: &Endpoint,
    mut s: TcpStream,
    peer: &str,
    handler: Arc<dyn Handler>,
    conns: &ConnSet,
) -> Result<Arc<ConnCore>, TransportError> {
    let hs = |why: String| TransportError::Handshake {
        peer: peer.to_string(),
        why,
    };
    let dev = ep
        .rdma_device()
        .cloned()
        .ok_or_else(|| hs("no device".into()))?;
    let mut b = [0u8; CONN_DATA_LEN];
    s.read_exact(&mut b).await.map_err(|e| hs(e.to_string()))?;
    let theirs = ConnData::decode(&b).map_err(hs)?;
    let wire = RdmaWire::new(&dev, ep.config())?;
    let refusal = if theirs.app_version != ep.app_version() {
        Some(Refusal::Version)
    } else if theirs.link != dev.local.link {
        Some(Refusal::LinkLayer)
    } else if !conns.has_room(ep.config()) {
        Some(Refusal::Full)
    } else {
        None
    };
    let status = refusal.map_or(0, |r| r as u32);
    if status == 0 {
        wire.connect_qp(&theirs)?;
    }
    let ours = wire.conn_data(ep.app_version(), status);
    s.write_all(&ours.encode())
        .await
        .map_err(|e| hs(e.to_string()))?;
    if let Some(r) = refusal {
        return Err(hs(format!("refused: {r:?}")));
    }
    let mut ready = [0u8; 1];
    s.read_exact(&mut ready)
        .await
        .map_err(|e| hs(e.to_string()))?;
    let config = ep.config_arc();
    Ok(start(
        wire,
        s,
        peer.to_string(),
        &theirs,
        config,
        Some(handler),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grant_path_follows_the_device_attributes() {
        let mw2 = rdma_sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0;
        assert_eq!(GrantPath::of(mw2, 0x02c9), GrantPath::Window);
        assert_eq!(GrantPath::of(0, 0x02c9), GrantPath::Registration);
        assert_eq!(GrantPath::of(0, RXE_VENDOR_ID), GrantPath::Registration);
        // Guards soft-RoCE's unchecked window bounds: its windows sit on slice registrations.
        assert_eq!(GrantPath::of(mw2, RXE_VENDOR_ID), GrantPath::WindowOnSlice);
    }
}
