//! The `mem` backend: peers inside one process, for tests, with fault injection at the
//! transport seam.
//!
//! Listeners get addresses of the form `ip:port` in a process-wide table (port 0 picks a
//! free virtual port; no socket is opened), so code that passes `local_addr()` around
//! works unchanged. A call runs the peer's handler; a one-sided operation copies
//! between the caller's registered memory and the peer's granted slice *in the caller's
//! task*, checking the peer's grant table: neither the peer's application nor any task
//! of the peer takes part, as with an RDMA NIC.
//!
//! Faults: every operation (connect, call, reply, read, write) is shown to the installed
//! [`Filter`]s, which may let it pass, drop it (its initiator times out), delay it, or
//! kill the connection (both ends fail at once with `Disconnected`). Filters see the
//! addresses of both ends: a listening endpoint's connections carry its listen address,
//! so tests of other crates can partition or kill one server by its address.

use crate::conn::{Closed, Completion, ConnCore, Connection, Dest, Handler, Wire};
use crate::endpoint::{ConnSet, Endpoint, Listener};
use crate::error::TransportError;
use crate::mr::MrInner;
use crate::window::Access;
use crate::TransportConfig;
use bytes::Bytes;
use parking_lot::Mutex;
use proto::{ErrorCode, RemoteBuf};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock, Weak};
use std::time::Duration;
use tracing::{debug, info};

/// Lowest virtual port handed out for port 0.
const FIRST_PORT: u16 = 10_000;

/// What kind of operation a [`Filter`] is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// A connection being made (`from` connects to `to`).
    Connect,
    /// A two-sided request.
    Call,
    /// The answer to a request (`from` is the server).
    Reply,
    /// A one-sided read by `from` of memory granted by `to`.
    Read,
    /// A one-sided write by `from` into memory granted by `to`.
    Write,
}

/// One operation crossing the seam.
#[derive(Clone, Copy, Debug)]
pub struct Packet<'a> {
    /// Address of the end that starts it (a listen address, or `mem-client-N`).
    pub from: &'a str,
    /// Address of the other end.
    pub to: &'a str,
    /// What it is.
    pub kind: OpKind,
    /// Payload bytes (the transfer size for one-sided operations).
    pub bytes: usize,
}

/// What happens to an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Let it through.
    Deliver,
    /// Lose it: the initiator waits until its timeout.
    Drop,
    /// Let it through after this long.
    Delay(Duration),
    /// Close the connection it travels on, both ends at once.
    Kill,
}

/// A fault-injection rule. Any closure `Fn(&Packet) -> Verdict` is one.
pub trait Filter: Send + Sync + 'static {
    /// Decides the fate of one operation.
    fn check(&self, p: &Packet<'_>) -> Verdict;
}

impl<F: Fn(&Packet<'_>) -> Verdict + Send + Sync + 'static> Filter for F {
    fn check(&self, p: &Packet<'_>) -> Verdict {
        self(p)
    }
}

/// An installed filter; dropping it removes the filter (heals what it broke).
#[must_use = "the filter is removed when the guard is dropped"]
pub struct FilterGuard(u64);

impl Drop for FilterGuard {
    fn drop(&mut self) {
        FABRIC.filters.lock().retain(|(id, _)| *id != self.0);
    }
}

/// Installs `filter` for every `mem` operation in this process until the guard drops.
pub fn add_filter(filter: impl Filter) -> FilterGuard {
    let id = FABRIC.next_filter.fetch_add(1, Ordering::Relaxed);
    FABRIC.filters.lock().push((id, Arc::new(filter)));
    FilterGuard(id)
}

/// Cuts every operation between an address in `a` and one in `b`, both ways: they are
/// dropped, as on a network partition, so their initiators time out.
pub fn partition(a: &[&str], b: &[&str]) -> FilterGuard {
    let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
    let b: Vec<String> = b.iter().map(|s| s.to_string()).collect();
    add_filter(move |p: &Packet<'_>| {
        let across = |x: &[String], y: &[String]| {
            x.iter().any(|s| s == p.from) && y.iter().any(|s| s == p.to)
        };
        if across(&a, &b) || across(&b, &a) {
            Verdict::Drop
        } else {
            Verdict::Deliver
        }
    })
}

/// Delays every operation to or from `addr` by `delay`.
pub fn delay(addr: &str, delay: Duration) -> FilterGuard {
    let addr = addr.to_string();
    add_filter(move |p: &Packet<'_>| match p.from == addr || p.to == addr {
        true => Verdict::Delay(delay),
        false => Verdict::Deliver,
    })
}

/// Drops every operation to or from `addr` (the process at `addr` hangs).
pub fn drop_all(addr: &str) -> FilterGuard {
    let addr = addr.to_string();
    add_filter(move |p: &Packet<'_>| match p.from == addr || p.to == addr {
        true => Verdict::Drop,
        false => Verdict::Deliver,
    })
}

/// Closes every live connection with an end at `addr` (the process at `addr` died);
/// returns how many were closed. Its listener stays, so it can be reached again.
pub fn kill(addr: &str) -> usize {
    let victims = live_conns(|c, local| local == addr || c.peer == addr);
    shut(&victims, &format!("killed by fault injection ({addr})"))
}

/// The open connections of the fabric for which `pick(conn, its local address)` holds.
fn live_conns(pick: impl Fn(&ConnCore, &str) -> bool) -> Vec<Arc<ConnCore>> {
    let mut conns = FABRIC.conns.lock();
    conns.retain(|w| w.strong_count() > 0);
    conns
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|c| !c.is_closed() && pick(c, mem_wire(c).local.as_str()))
        .collect()
}

/// Shuts `victims` down in order; returns how many were still open (closing one end
/// closes the other: each connection counts once).
fn shut<'a>(victims: impl IntoIterator<Item = &'a Arc<ConnCore>>, why: &str) -> usize {
    let mut killed = 0;
    for c in victims {
        if !c.is_closed() {
            c.shutdown(why.to_string());
            killed += 1;
        }
    }
    killed
}

/// Breaks every live connection between `a` and `b` (either end at either address), as
/// a reset on the path between two processes that both live on would; returns how many
/// were broken. The accepting end is closed first, so that it sees the connection
/// broken (not closed in order by its peer) and may wait for the peer to come back.
pub fn kill_between(a: &str, b: &str) -> usize {
    let victims = live_conns(|c, local| (local == a && c.peer == b) || (local == b && c.peer == a));
    let (accepting, connecting): (Vec<_>, Vec<_>) =
        victims.into_iter().partition(|c| c.serves_calls());
    shut(
        accepting.iter().chain(&connecting),
        &format!("killed by fault injection ({a} <-> {b})"),
    )
}

struct ListenerEntry {
    handler: Arc<dyn Handler>,
    config: Arc<TransportConfig>,
    app_version: u16,
    conns: ConnSet,
}

#[derive(Default)]
struct Fabric {
    listeners: Mutex<HashMap<String, Arc<ListenerEntry>>>,
    next_port: Mutex<u16>,
    filters: Mutex<Vec<(u64, Arc<dyn Filter>)>>,
    next_filter: AtomicU64,
    conns: Mutex<Vec<Weak<ConnCore>>>,
}

static FABRIC: LazyLock<Fabric> = LazyLock::new(Fabric::default);

/// The `mem` half of a connection.
pub(crate) struct MemWire {
    /// This end's address.
    local: String,
    peer: OnceLock<PeerRef>,
}

/// The connecting side holds the accepting side; the reverse link is weak, so the pair
/// is freed when the connecting side's owner lets go.
enum PeerRef {
    Strong(Arc<ConnCore>),
    Weak(Weak<ConnCore>),
}

impl MemWire {
    fn peer(&self) -> Option<Arc<ConnCore>> {
        match self.peer.get()? {
            PeerRef::Strong(c) => Some(c.clone()),
            PeerRef::Weak(w) => w.upgrade(),
        }
    }

    /// This end closed: the other end closes too (its peer is gone).
    pub(crate) fn close(&self, why: &str) {
        if let Some(p) = self.peer() {
            p.shutdown_as(
                format!("peer closed the connection ({why})"),
                Closed::ByPeer,
            );
        }
    }

    /// The peer sees the connection broken, not closed in order (`Connection::abandon`).
    pub(crate) fn abandon(&self) {
        if let Some(p) = self.peer() {
            p.shutdown_as("the peer gave the connection up".into(), Closed::Broken);
        }
    }
}

fn mem_wire(core: &ConnCore) -> &MemWire {
    match &core.wire {
        Wire::Mem(w) => w,
        _ => unreachable!("the mem backend only runs mem connections"),
    }
}

fn verdict(from: &str, to: &str, kind: OpKind, bytes: usize) -> Verdict {
    let p = Packet {
        from,
        to,
        kind,
        bytes,
    };
    let filters: Vec<_> = FABRIC
        .filters
        .lock()
        .iter()
        .map(|(_, f)| f.clone())
        .collect();
    let mut out = Verdict::Deliver;
    for f in filters {
        out = match (out, f.check(&p)) {
            (Verdict::Kill, _) | (_, Verdict::Kill) => Verdict::Kill,
            (Verdict::Drop, _) | (_, Verdict::Drop) => Verdict::Drop,
            (Verdict::Delay(a), Verdict::Delay(b)) => Verdict::Delay(a.max(b)),
            (Verdict::Delay(a), _) | (_, Verdict::Delay(a)) => Verdict::Delay(a),
            _ => Verdict::Deliver,
        };
    }
    out
}

/// Passes one operation of `core` through the filters and runs `action` on the peer.
fn deliver(
    core: &Arc<ConnCore>,
    kind: OpKind,
    bytes: usize,
    action: impl FnOnce(Arc<ConnCore>) + Send + 'static,
) {
    let w = mem_wire(core);
    match verdict(&w.local, &core.peer, kind, bytes) {
        Verdict::Deliver => match w.peer() {
            Some(p) => action(p),
            None => core.shutdown("peer is gone".into()),
        },
        Verdict::Drop => debug!(from = %w.local, to = %core.peer, ?kind, "dropped by a filter"),
        Verdict::Delay(d) => {
            let me = Arc::downgrade(core);
            tokio::spawn(async move {
                tokio::time::sleep(d).await;
                let peer = me.upgrade().and_then(|c| mem_wire(&c).peer());
                match peer {
                    Some(p) if !p.is_closed() => action(p),
                    _ => {}
                }
            });
        }
        Verdict::Kill => core.shutdown("killed by fault injection".into()),
    }
}

/// Sends a call to the peer's handler and waits for its reply.
pub(crate) async fn call(
    core: &Arc<ConnCore>,
    request: Bytes,
) -> Result<Completion, TransportError> {
    let ticket = core.begin(None)?;
    let id = ticket.id;
    deliver(core, OpKind::Call, request.len(), move |peer| {
        peer.serve_call(id, request)
    });
    ticket.wait().await
}

/// Sends the answer to call `id` back to the caller.
pub(crate) fn respond(core: &Arc<ConnCore>, id: u64, result: Result<Bytes, (ErrorCode, String)>) {
    let bytes = result.as_ref().map_or(0, |b| b.len());
    deliver(core, OpKind::Reply, bytes, move |peer| {
        let r = match result {
            Ok(b) => Ok(Completion::Reply(b)),
            Err((code, message)) => Err(TransportError::Refused { code, message }),
        };
        peer.complete(id, r)
    });
}

/// Does a one-sided operation against the peer's grants, in this task.
pub(crate) async fn one_sided(
    core: &Arc<ConnCore>,
    op: Access,
    remote: RemoteBuf,
    local: Dest,
) -> Result<(), TransportError> {
    let ticket = core.begin(None)?;
    let id = ticket.id;
    let kind = match op {
        Access::RemoteWrite => OpKind::Write,
        _ => OpKind::Read,
    };
    let me = Arc::downgrade(core);
    deliver(core, kind, local.len, move |peer| {
        let r = transfer(&peer, op, remote, &local).map(|()| Completion::Done);
        if let Some(me) = me.upgrade() {
            me.complete(id, r);
        }
    });
    match ticket.wait().await? {
        Completion::Done => Ok(()),
        Completion::Reply(_) => Err(core.protocol_error("a one-sided operation got a reply")),
    }
}

fn transfer(
    peer: &ConnCore,
    op: Access,
    remote: RemoteBuf,
    local: &Dest,
) -> Result<(), TransportError> {
    let found = peer
        .windows
        .resolve(remote.key.0, remote.addr, remote.len, op);
    let Some((mr, off)) = found else {
        return Err(TransportError::AccessViolation(format!(
            "{} refused the one-sided access (bad key, bounds or access)",
            mem_wire(peer).local
        )));
    };
    match op {
        Access::RemoteWrite => copy(&local.mr, local.off, &mr, off, local.len),
        _ => copy(&mr, off, &local.mr, local.off, local.len),
    }
    Ok(())
}

/// Copies between two regions, locking them in address order so two transfers in
/// opposite directions cannot deadlock.
fn copy(src: &MrInner, src_off: usize, dst: &MrInner, dst_off: usize, len: usize) {
    if std::ptr::eq(src, dst) {
        src.buf.lock().copy_within(src_off..src_off + len, dst_off);
        return;
    }
    let (s, mut d) = if (src as *const MrInner) < (dst as *const MrInner) {
        let s = src.buf.lock();
        (s, dst.buf.lock())
    } else {
        let d = dst.buf.lock();
        (src.buf.lock(), d)
    };
    d[dst_off..dst_off + len].copy_from_slice(&s[src_off..src_off + len]);
}

fn parse_addr(addr: &str) -> Result<SocketAddr, TransportError> {
    addr.parse().map_err(|_| TransportError::Connect {
        addr: addr.to_string(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "mem addresses are ip:port",
        ),
    })
}

/// Connects to a `mem` listener in this process.
pub(crate) async fn connect(ep: &Endpoint, addr: &str) -> Result<Connection, TransportError> {
    let to = parse_addr(addr)?.to_string();
    let from = ep.local_name();
    let refused = |kind: std::io::ErrorKind, why: &str| TransportError::Connect {
        addr: to.clone(),
        source: std::io::Error::new(kind, why.to_string()),
    };
    match verdict(&from, &to, OpKind::Connect, 0) {
        Verdict::Deliver => {}
        Verdict::Delay(d) => tokio::time::sleep(d).await,
        Verdict::Drop => {
            let ms = ep.config().connect_timeout_ms;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let peer = to.clone();
            return Err(TransportError::TimedOut {
                op: crate::error::OP_CONNECT,
                peer,
                ms,
            });
        }
        Verdict::Kill => return Err(refused(std::io::ErrorKind::ConnectionReset, "killed")),
    }
    let entry = FABRIC.listeners.lock().get(&to).cloned();
    let entry =
        entry.ok_or_else(|| refused(std::io::ErrorKind::ConnectionRefused, "no listener"))?;
    if entry.app_version != ep.app_version() {
        return Err(TransportError::VersionMismatch {
            peer: to,
            their_transport: crate::frame::TRANSPORT_VERSION,
            their_app: entry.app_version,
            our_transport: crate::frame::TRANSPORT_VERSION,
            our_app: ep.app_version(),
        });
    }
    if !entry.conns.has_room(&entry.config) {
        return Err(refused(
            std::io::ErrorKind::ConnectionRefused,
            "too many connections",
        ));
    }
    let server = Arc::new(ConnCore::new(
        from.clone(),
        ep.config().max_msg_bytes,
        entry.config.clone(),
        Some(entry.handler.clone()),
        Wire::Mem(MemWire {
            local: to.clone(),
            peer: OnceLock::new(),
        }),
    ));
    let client = Arc::new(ConnCore::new(
        to,
        entry.config.max_msg_bytes,
        ep.config_arc(),
        None,
        Wire::Mem(MemWire {
            local: from,
            peer: OnceLock::new(),
        }),
    ));
    let _ = mem_wire(&client).peer.set(PeerRef::Strong(server.clone()));
    let _ = mem_wire(&server)
        .peer
        .set(PeerRef::Weak(Arc::downgrade(&client)));
    entry.conns.insert(&server);
    let mut all = FABRIC.conns.lock();
    all.retain(|w| w.strong_count() > 0);
    all.extend([Arc::downgrade(&server), Arc::downgrade(&client)]);
    Ok(Connection::new(client, true))
}

/// Listens on a virtual `ip:port` (port 0 picks a free one) in this process.
pub(crate) fn listen(
    ep: &Endpoint,
    addr: &str,
    handler: Arc<dyn Handler>,
) -> Result<Listener, TransportError> {
    let want = parse_addr(addr)?;
    let mut listeners = FABRIC.listeners.lock();
    let port = match want.port() {
        0 => free_port(&listeners, want)?,
        p if listeners.contains_key(&want.to_string()) => {
            return Err(TransportError::Listen {
                addr: format!("{}:{p}", want.ip()),
                source: std::io::ErrorKind::AddrInUse.into(),
            })
        }
        p => p,
    };
    let local = SocketAddr::new(want.ip(), port);
    let key = local.to_string();
    let conns = ConnSet::for_endpoint(ep);
    let entry = ListenerEntry {
        handler,
        config: ep.config_arc(),
        app_version: ep.app_version(),
        conns: conns.clone(),
    };
    listeners.insert(key.clone(), Arc::new(entry));
    drop(listeners);
    ep.set_local_name(&key);
    info!(%local, backend = "mem", "listening");
    let unregister = Box::new(move || {
        FABRIC.listeners.lock().remove(&key);
    });
    Ok(Listener::new(local, None, conns, Some(unregister)))
}

fn free_port(
    listeners: &HashMap<String, Arc<ListenerEntry>>,
    want: SocketAddr,
) -> Result<u16, TransportError> {
    let mut next = FABRIC.next_port.lock();
    for _ in FIRST_PORT..=u16::MAX {
        let p = (*next).max(FIRST_PORT);
        *next = if p == u16::MAX { FIRST_PORT } else { p + 1 };
        if !listeners.contains_key(&SocketAddr::new(want.ip(), p).to_string()) {
            return Ok(p);
        }
    }
    Err(TransportError::Listen {
        addr: want.to_string(),
        source: std::io::ErrorKind::AddrInUse.into(),
    })
}
