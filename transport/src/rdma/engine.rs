//! One `rdma` connection: its queue pair, receive and send buffers, credit accounting,
//! and the task that drains its completion queue.
//!
//! Work requests carry a tag in the top byte of `wr_id` (receive, send, one-sided,
//! bind) and a slot or operation id below it. Every send-queue request is signaled and
//! holds one permit of `sq` until it completes, which bounds outstanding requests by the
//! queue's size.

use super::verbs::{self, check, Cq, MrRaw, MwRaw, QpRaw};
use super::{rdma_mr, Device, GrantHold, GrantKey, GrantPath, KeyRes};
use crate::config::TransportConfig;
use crate::conn::{Completion, ConnCore, Dest, Wire};
use crate::error::TransportError;
use crate::mr::{MemoryRegion, MrInner};
use crate::rdma_common::conn_data::{ConnData, MsgHeader, MsgKind, MAX_RECV_CREDITS};
use crate::rdma_common::conn_data::{MAX_QPN, MSG_HEADER_LEN};
use crate::rdma_common::credits::{CreditInfo, Credits};
use crate::rdma_common::qp::{AddressVector, QpAttrs, QpSetup};
use crate::window::{Access, Grant};
use bytes::Bytes;
use parking_lot::Mutex;
use proto::{ErrorCode, MrKey, RemoteBuf};
use rdma_sys::*;
use std::alloc::Layout;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::{Arc, Weak};
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, Semaphore};

/// How long a closing connection waits for its last answer to be sent and the peer to
/// close (see `RdmaWire::respond_then_shutdown`).
const CLOSING_REPLY: std::time::Duration = std::time::Duration::from_secs(1);

/// Receive buffers reserved for credit-only messages.
const UPDATE_SLOTS: u32 = 2;
/// Send-queue room kept for memory-window binds.
const BIND_DEPTH: u32 = 64;
/// Completions taken from the queue per poll.
const WC_BATCH: usize = 32;
const TAG_RECV: u64 = 1;
const TAG_SEND: u64 = 2;
const TAG_ONE_SIDED: u64 = 3;
const TAG_BIND: u64 = 4;
const TAG_SHIFT: u32 = 56;

/// Page-aligned zeroed memory that the NIC reads or writes through a registration.
struct RawBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: RawBuf owns its allocation alone (freed once, on drop), so moving it to another
// thread moves that ownership; nothing in it is tied to a thread.
unsafe impl Send for RawBuf {}
// SAFETY: &RawBuf hands out only raw pointers; every access through them is an unsafe
// block of its own, slot by slot, and slots are never shared between two owners at once.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    fn new(len: usize) -> RawBuf {
        let layout = Layout::from_size_align(len.max(1), 4096).expect("a valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        RawBuf { ptr, layout }
    }

    fn at(&self, off: usize) -> *mut u8 {
        // SAFETY: callers stay within the allocation.
        unsafe { self.ptr.as_ptr().add(off) }
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// The `rdma` half of a connection. Field order is drop order: the queue pair goes
/// before the registrations, which go before the memory they cover.
pub(crate) struct RdmaWire {
    qp: QpRaw,
    recv_mr: MrRaw,
    send_mr: MrRaw,
    recv_buf: RawBuf,
    send_buf: RawBuf,
    cq: Arc<Cq>,
    dev: Arc<Device>,
    slot_bytes: usize,
    /// Data receive buffers posted for the peer.
    window: u32,
    free_send: Mutex<Vec<u32>>,
    /// The local regions of one-sided requests posted and not yet completed by the NIC,
    /// by operation id: held until the work completion arrives, also when the caller
    /// gave up first (timed out), so that a pooled buffer the NIC may still read or
    /// write is not handed out again meanwhile (`BufferPool`).
    one_sided_regions: Mutex<std::collections::HashMap<u64, Arc<MrInner>>>,
    credits: Mutex<Credits>,
    credit_wait: Notify,
    sq: Arc<Semaphore>,
    setup: Mutex<QpSetup>,
    psn: u32,
    /// The side channel's sending half: after setup it carries only
    /// [`SIDE_ABANDON`], from [`RdmaWire::abandon`].
    side: Mutex<Option<tokio::net::tcp::OwnedWriteHalf>>,
}

/// The byte a side that gives a connection up (a call on it timed out) sends on the
/// side channel before closing it: the peer takes the connection for broken, as a
/// network failure, not closed by an ended process (tcp sends an `Abandon` frame).
pub(crate) const SIDE_ABANDON: u8 = b'A';

struct ChannelFd(RawFd);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

fn wire(core: &ConnCore) -> &RdmaWire {
    match &core.wire {
        Wire::Rdma(w) => w,
        _ => unreachable!("the rdma engine only runs rdma connections"),
    }
}

impl RdmaWire {
    /// A queue pair in INIT with every receive buffer posted.
    pub(crate) fn new(dev: &Arc<Device>, cfg: &TransportConfig) -> Result<Self, TransportError> {
        let window = (cfg.max_inflight_calls as u32).clamp(1, MAX_RECV_CREDITS);
        let slots = window + UPDATE_SLOTS;
        let slot_bytes = MSG_HEADER_LEN + cfg.max_msg_bytes;
        let sq_depth = slots + cfg.max_inflight_one_sided as u32 + BIND_DEPTH;
        let cq = Arc::new(verbs::create_cq(&dev.ctx, sq_depth + slots)?);
        let qp = verbs::create_qp(&dev.pd, &cq, sq_depth, slots)?;
        let bytes = slots as usize * slot_bytes;
        let (recv_buf, send_buf) = (RawBuf::new(bytes), RawBuf::new(bytes));
        let local = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        let recv_mr = verbs::reg_mr(&dev.pd, recv_buf.at(0), bytes, local)?;
        let send_mr = verbs::reg_mr(&dev.pd, send_buf.at(0), bytes, local)?;
        let mut setup = QpSetup::new(dev.local, dev.mtu_cap, dev.max_rd_atomic);
        let w = RdmaWire {
            qp,
            recv_mr,
            send_mr,
            recv_buf,
            send_buf,
            cq,
            dev: dev.clone(),
            slot_bytes,
            window,
            free_send: Mutex::new((0..slots).collect()),
            one_sided_regions: Mutex::new(std::collections::HashMap::new()),
            credits: Mutex::new(Credits::new(window, UPDATE_SLOTS)),
            credit_wait: Notify::new(),
            sq: Arc::new(Semaphore::new(sq_depth as usize)),
            psn: rand::random::<u32>() & MAX_QPN,
            setup: Mutex::new(QpSetup::new(dev.local, dev.mtu_cap, dev.max_rd_atomic)),
            side: Mutex::new(None),
        };
        let init = setup.to_init().map_err(TransportError::InvalidArgument)?;
        w.modify(init)?;
        *w.setup.lock() = setup;
        for slot in 0..slots {
            w.post_recv(slot)?;
        }
        Ok(w)
    }

    /// Keeps the side channel's sending half, for [`RdmaWire::abandon`].
    pub(crate) fn keep_side(&self, tx: tokio::net::tcp::OwnedWriteHalf) {
        *self.side.lock() = Some(tx);
    }

    /// Tells the peer this side gives the connection up ([`SIDE_ABANDON`]), before it
    /// closes. Best effort, without waiting: one byte on an idle socket.
    pub(crate) fn abandon(&self) {
        if let Some(tx) = self.side.lock().as_ref() {
            let _ = tx.try_write(&[SIDE_ABANDON]);
        }
    }

    /// What this side tells the peer.
    pub(crate) fn conn_data(&self, app_version: u16, status: u32) -> ConnData {
        ConnData {
            app_version,
            // SAFETY: the QP is alive.
            qpn: unsafe { (*self.qp.as_ptr()).qp_num },
            psn: self.psn,
            lid: self.dev.local.lid,
            link: self.dev.local.link,
            mtu: self.dev.local.mtu,
            gid: self.dev.gid,
            max_msg_bytes: (self.slot_bytes - MSG_HEADER_LEN) as u32,
            recv_credits: self.window,
            status,
        }
    }

    /// Moves the queue pair to RTR towards `theirs`, then to RTS; both sides then use the
    /// smaller of the two credit windows.
    pub(crate) fn connect_qp(&self, theirs: &ConnData) -> Result<(), TransportError> {
        let mut setup = self.setup.lock();
        let rtr = setup
            .to_rtr(theirs)
            .map_err(TransportError::InvalidArgument)?;
        self.modify(rtr)?;
        let rts = setup
            .to_rts(self.psn)
            .map_err(TransportError::InvalidArgument)?;
        self.modify(rts)?;
        let window = self.window.min(theirs.recv_credits);
        *self.credits.lock() = Credits::new(window, UPDATE_SLOTS);
        Ok(())
    }

    fn modify(&self, attrs: QpAttrs) -> Result<(), TransportError> {
        let (mut a, mask) = qp_attr(attrs);
        // SAFETY: the QP is alive and `a` outlives the call.
        let rc = unsafe { ibv_modify_qp(self.qp.as_ptr(), &mut a, mask.0 as i32) };
        check("ibv_modify_qp", rc).inspect_err(|_| self.setup.lock().fail())
    }

    fn post_recv(&self, slot: u32) -> Result<(), TransportError> {
        let mut sge = ibv_sge {
            addr: self.recv_buf.at(slot as usize * self.slot_bytes) as u64,
            length: self.slot_bytes as u32,
            lkey: self.recv_mr.lkey(),
        };
        let mut wr = ibv_recv_wr {
            wr_id: (TAG_RECV << TAG_SHIFT) | u64::from(slot),
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP, the SGE and the registered slot are alive.
        check("ibv_post_recv", unsafe {
            ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad)
        })
    }

    /// Posts one signaled send-queue request; the caller holds an `sq` permit.
    fn post_send(&self, wr: &mut ibv_send_wr) -> Result<(), TransportError> {
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP and everything `wr` points to are alive for the call.
        let rc = unsafe { ibv_post_send(self.qp.as_ptr(), wr, &mut bad) };
        if rc != 0 {
            self.sq.add_permits(1);
        }
        check("ibv_post_send", rc)
    }

    async fn permit(&self, core: &ConnCore) -> Result<(), TransportError> {
        let p = self.sq.acquire().await.map_err(|_| core.gone())?;
        p.forget(); // returned when the request completes
        Ok(())
    }

    /// Sends one message; data messages wait for a credit first.
    async fn send_msg(
        &self,
        core: &ConnCore,
        kind: MsgKind,
        status: u16,
        id: u64,
        payload: &[u8],
    ) -> Result<(), TransportError> {
        let info = loop {
            let notified = self.credit_wait.notified();
            if core.is_closed() {
                return Err(core.gone());
            }
            if let Some(i) = self.credits.lock().take() {
                break i;
            }
            notified.await;
        };
        self.post_msg(core, kind, status, id, info, payload).await
    }

    async fn post_msg(
        &self,
        core: &ConnCore,
        kind: MsgKind,
        status: u16,
        id: u64,
        info: CreditInfo,
        payload: &[u8],
    ) -> Result<(), TransportError> {
        self.permit(core).await?;
        // Credits bound the data messages in flight below the number of send slots.
        let Some(slot) = self.free_send.lock().pop() else {
            self.sq.add_permits(1);
            return Err(core.protocol_error("no free send buffer"));
        };
        let h = MsgHeader {
            kind,
            status,
            id,
            credits: info.credits,
            updates_seen: info.updates_seen,
        };
        self.post_slot(slot, h, payload)
    }

    fn post_slot(&self, slot: u32, h: MsgHeader, payload: &[u8]) -> Result<(), TransportError> {
        let len = MSG_HEADER_LEN + payload.len();
        if len > self.slot_bytes {
            self.free_send.lock().push(slot);
            self.sq.add_permits(1);
            return Err(TransportError::TooBig {
                what: "message",
                size: payload.len(),
                limit: self.slot_bytes - MSG_HEADER_LEN,
            });
        }
        let at = self.send_buf.at(slot as usize * self.slot_bytes);
        // SAFETY: the slot is ours until its send completes and `len` fits it.
        unsafe {
            std::ptr::copy_nonoverlapping(h.encode().as_ptr(), at, MSG_HEADER_LEN);
            std::ptr::copy_nonoverlapping(payload.as_ptr(), at.add(MSG_HEADER_LEN), payload.len());
        }
        let mut sge = ibv_sge {
            addr: at as u64,
            length: len as u32,
            lkey: self.send_mr.lkey(),
        };
        // SAFETY: a zeroed request, then its fields.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = (TAG_SEND << TAG_SHIFT) | u64::from(slot);
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        self.post_send(&mut wr)
    }

    /// Sends a call and waits for its reply.
    pub(crate) async fn call(
        &self,
        core: &Arc<ConnCore>,
        request: Bytes,
    ) -> Result<Completion, TransportError> {
        let ticket = core.begin(None)?;
        self.send_msg(core, MsgKind::Call, 0, ticket.id, &request)
            .await?;
        ticket.wait().await
    }

    /// Sends the answer to call `id`, in its own task (it may wait for a credit).
    pub(crate) fn respond(
        &self,
        core: &Arc<ConnCore>,
        id: u64,
        result: Result<Bytes, (ErrorCode, String)>,
    ) {
        let core = core.clone();
        tokio::spawn(async move {
            let _ = send_answer(&core, id, result).await;
        });
    }

    /// Sends the last answer of a connection that is closing (a refused handshake), and
    /// closes it once the peer has (it closes on reading the answer), or after
    /// [`CLOSING_REPLY`]. Closed at once, the send would find the connection gone; closed
    /// right after the send, the end of the side channel could reach the peer before
    /// its poller took the answer from its queue. Either way the peer would learn
    /// nothing of why, and a refused key would look like a server that is away.
    pub(crate) fn respond_then_shutdown(
        &self,
        core: &Arc<ConnCore>,
        id: u64,
        result: Result<Bytes, (ErrorCode, String)>,
        why: String,
    ) {
        let core = core.clone();
        tokio::spawn(async move {
            let answered = async {
                if send_answer(&core, id, result).await.is_err() {
                    return;
                }
                // Closing wakes the waiters for credits (`close`).
                loop {
                    let closed = wire(&core).credit_wait.notified();
                    if core.is_closed() {
                        return;
                    }
                    closed.await;
                }
            };
            let _ = tokio::time::timeout(CLOSING_REPLY, answered).await;
            core.shutdown(why);
        });
    }

    /// RDMA READ or WRITE between `local` and the peer's `remote`, done by the NICs.
    pub(crate) async fn one_sided(
        &self,
        core: &Arc<ConnCore>,
        op: Access,
        remote: RemoteBuf,
        local: Dest,
    ) -> Result<(), TransportError> {
        let lkey = self.own_mr(&local.mr)?.raw.lkey();
        let ticket = core.begin(None)?;
        self.permit(core).await?;
        self.one_sided_regions
            .lock()
            .insert(ticket.id, Arc::clone(&local.mr));
        if let Err(e) = self.post_one_sided(ticket.id, op, remote, &local, lkey) {
            self.one_sided_regions.lock().remove(&ticket.id);
            return Err(e);
        }
        drop(local);
        match ticket.wait().await? {
            Completion::Done => Ok(()),
            Completion::Reply(_) => Err(core.protocol_error("a one-sided operation got a reply")),
        }
    }

    /// The registration behind `mr`, if it was made by this connection's endpoint.
    fn own_mr<'a>(&self, mr: &'a MrInner) -> Result<&'a super::RdmaMr, TransportError> {
        let rmr = rdma_mr(mr)?;
        // Keys are valid in their protection domain only: memory of another endpoint
        // would fail on the NIC with a protection error and kill the queue pair.
        if !Arc::ptr_eq(&rmr.dev, &self.dev) {
            return Err(TransportError::InvalidArgument(
                "the memory was registered with another endpoint".into(),
            ));
        }
        Ok(rmr)
    }

    fn post_one_sided(
        &self,
        id: u64,
        op: Access,
        remote: RemoteBuf,
        local: &Dest,
        lkey: u32,
    ) -> Result<(), TransportError> {
        let mut sge = ibv_sge {
            addr: local.mr.addr + local.off as u64,
            length: local.len as u32,
            lkey,
        };
        // SAFETY: a zeroed request, then its fields.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = (TAG_ONE_SIDED << TAG_SHIFT) | id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = match op {
            Access::RemoteWrite => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            _ => ibv_wr_opcode::IBV_WR_RDMA_READ,
        };
        wr.wr.rdma = rdma_t {
            remote_addr: remote.addr,
            rkey: remote.key.0,
        };
        self.post_send(&mut wr)
    }

    /// Exposes `mr[offset..offset + len]` to this connection's peer under a new key.
    pub(crate) fn grant(
        &self,
        core: &Arc<ConnCore>,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Grant, TransportError> {
        if offset.checked_add(len).is_none_or(|e| e > mr.len()) {
            return Err(TransportError::InvalidArgument(format!(
                "grant of {len} bytes at {offset} outside a region of {} bytes",
                mr.len()
            )));
        }
        let rmr = self.own_mr(&mr.inner)?;
        let addr = mr.addr() + offset as u64;
        let flags = match access {
            Access::RemoteRead => ibv_access_flags::IBV_ACCESS_REMOTE_READ,
            Access::RemoteWrite => ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
            Access::RemoteReadWrite => {
                let read = ibv_access_flags::IBV_ACCESS_REMOTE_READ;
                read | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            }
        };
        let local = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        let (key, res) = match self.dev.grants {
            GrantPath::Window => {
                let (key, mw) = self.bind_window(core, &rmr.raw, addr, len, flags)?;
                (key, KeyRes::Mw(mw))
            }
            GrantPath::WindowOnSlice => {
                let bind = local | ibv_access_flags::IBV_ACCESS_MW_BIND;
                let slice = verbs::reg_mr(&self.dev.pd, addr as *mut u8, len, bind)?;
                let (key, mw) = self.bind_window(core, &slice, addr, len, flags)?;
                (key, KeyRes::MwOnSlice(mw, slice))
            }
            GrantPath::Registration => {
                let m = verbs::reg_mr(&self.dev.pd, addr as *mut u8, len, flags | local)?;
                (m.rkey(), KeyRes::Mr(m))
            }
        };
        let key_ref = Arc::new(GrantKey(Mutex::new(Some(res))));
        let mut grants = rmr.grants.lock();
        grants.retain(|g| g.strong_count() > 0);
        grants.push(Arc::downgrade(&key_ref));
        Ok(Grant {
            remote: RemoteBuf {
                addr,
                len: len as u64,
                key: MrKey(key),
            },
            core: Arc::downgrade(core),
            hw: Some(Box::new(GrantHold(key_ref))),
        })
    }

    /// Binds a new type 2 window over `addr..addr + len` of `mr` to this queue pair.
    /// The bind is posted before the message that carries the key, and the send queue
    /// runs in order.
    fn bind_window(
        &self,
        core: &ConnCore,
        mr: &MrRaw,
        addr: u64,
        len: usize,
        flags: ibv_access_flags,
    ) -> Result<(u32, MwRaw), TransportError> {
        let mw = verbs::alloc_mw(&self.dev.pd)?;
        // SAFETY: the window is alive; ibv_inc_rkey only computes.
        let rkey = unsafe { ibv_inc_rkey((*mw.as_ptr()).rkey) };
        if core.is_closed() {
            return Err(core.gone());
        }
        // Binds are posted from a synchronous call: with the send queue full, refuse
        // rather than wait (the caller may retry).
        let permit = self.sq.try_acquire().map_err(|_| TransportError::Refused {
            code: ErrorCode::Overloaded,
            message: "the send queue is full; no room to bind a memory window".into(),
        })?;
        permit.forget();
        // SAFETY: a zeroed request, then its fields.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = TAG_BIND << TAG_SHIFT;
        wr.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
        wr.bind_mw_tso_union.bind_mw = bind_mw_t {
            mw: mw.as_ptr(),
            rkey,
            bind_info: ibv_mw_bind_info {
                mr: mr.as_ptr(),
                addr,
                length: len as u64,
                mw_access_flags: flags.0,
            },
        };
        self.post_send(&mut wr)?;
        Ok((rkey, mw))
    }

    /// The connection closed: flush every request, wake whoever waits for credits.
    pub(crate) fn close(&self, core: &ConnCore, _why: &str) {
        // SAFETY: a zeroed attribute set with the state only.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE.0 as i32;
        // SAFETY: the QP is alive until the wire drops.
        let _ = unsafe { ibv_modify_qp(self.qp.as_ptr(), &mut a, mask) };
        self.setup.lock().fail();
        self.credit_wait.notify_waiters();
        for t in std::mem::take(&mut *core.tasks.lock()) {
            t.abort();
        }
        // The side channel's end is how the peer learns the connection is gone: its
        // sending half goes now, not when the last handle of the connection does (a
        // request still being handled keeps one).
        self.side.lock().take();
    }

    fn on_recv(&self, core: &Arc<ConnCore>, slot: u32, len: usize) -> Result<(), String> {
        let start = slot as usize * self.slot_bytes;
        // SAFETY: the NIC finished writing this slot (its completion is in hand) and it is
        // reposted only below, after the bytes are copied out.
        let msg = unsafe { std::slice::from_raw_parts(self.recv_buf.at(start), len) };
        let h = MsgHeader::decode(msg)?;
        let payload = Bytes::copy_from_slice(&msg[MSG_HEADER_LEN..]);
        let info = CreditInfo {
            credits: h.credits,
            updates_seen: h.updates_seen,
        };
        let credit_only = h.kind == MsgKind::Credit;
        self.credits
            .lock()
            .on_receive(info, credit_only)
            .map_err(|e| e.to_string())?;
        self.credit_wait.notify_waiters();
        self.post_recv(slot).map_err(|e| e.to_string())?;
        if !credit_only {
            self.credits.lock().reposted();
        }
        match h.kind {
            MsgKind::Call => core.serve_call(h.id, payload),
            MsgKind::Reply => core.complete(h.id, Ok(Completion::Reply(payload))),
            MsgKind::CallError => core.complete(
                h.id,
                Err(TransportError::Refused {
                    code: ErrorCode::from(h.status),
                    message: String::from_utf8_lossy(&payload).into_owned(),
                }),
            ),
            MsgKind::Credit => {}
        }
        if let Some(info) = self.credits.lock().take_update() {
            let core = core.clone();
            tokio::spawn(async move {
                let w = wire(&core);
                let _ = w.post_msg(&core, MsgKind::Credit, 0, 0, info, &[]).await;
            });
        }
        Ok(())
    }

    fn on_completion(&self, core: &Arc<ConnCore>, wc: &ibv_wc) {
        let tag = wc.wr_id >> TAG_SHIFT;
        let val = wc.wr_id & ((1 << TAG_SHIFT) - 1);
        if tag != TAG_RECV {
            self.sq.add_permits(1);
        }
        if tag == TAG_SEND {
            self.free_send.lock().push(val as u32);
        }
        if tag == TAG_ONE_SIDED {
            // The NIC is done with the region: let go of it before the waiter wakes.
            let region = self.one_sided_regions.lock().remove(&val);
            drop(region);
        }
        if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
            let status = verbs::wc_status(wc.status);
            if tag == TAG_ONE_SIDED {
                let e = match wc.status {
                    ibv_wc_status::IBV_WC_REM_ACCESS_ERR => TransportError::AccessViolation(
                        format!("{} refused the one-sided access ({status})", core.peer),
                    ),
                    _ => TransportError::Disconnected {
                        peer: core.peer.clone(),
                        why: status.clone(),
                    },
                };
                core.complete(val, Err(e));
            }
            // An RC queue pair is in the error state after any failed request.
            return core.shutdown(format!("work request failed: {status}"));
        }
        match tag {
            TAG_RECV => {
                if let Err(why) = self.on_recv(core, val as u32, wc.byte_len as usize) {
                    let _ = core.protocol_error(&why);
                }
            }
            TAG_ONE_SIDED => core.complete(val, Ok(Completion::Done)),
            _ => {}
        }
    }
}

/// The verbs attributes and mask of one setup step.
fn qp_attr(attrs: QpAttrs) -> (ibv_qp_attr, ibv_qp_attr_mask) {
    use ibv_access_flags as A;
    use ibv_qp_attr_mask as M;
    // SAFETY: a zeroed attribute set, then the fields the mask names.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    let mask = match attrs {
        QpAttrs::Init {
            port,
            pkey_index,
            remote_read_write,
        } => {
            a.qp_state = ibv_qp_state::IBV_QPS_INIT;
            a.port_num = port;
            a.pkey_index = pkey_index;
            let mut acc = A::IBV_ACCESS_LOCAL_WRITE;
            if remote_read_write {
                acc |= A::IBV_ACCESS_REMOTE_READ | A::IBV_ACCESS_REMOTE_WRITE;
            }
            a.qp_access_flags = acc.0;
            M::IBV_QP_STATE | M::IBV_QP_PORT | M::IBV_QP_PKEY_INDEX | M::IBV_QP_ACCESS_FLAGS
        }
        QpAttrs::Rtr {
            path_mtu,
            dest_qpn,
            rq_psn,
            max_dest_rd_atomic,
            min_rnr_timer,
            av,
        } => {
            a.qp_state = ibv_qp_state::IBV_QPS_RTR;
            a.path_mtu = path_mtu as u32;
            a.dest_qp_num = dest_qpn;
            a.rq_psn = rq_psn;
            a.max_dest_rd_atomic = max_dest_rd_atomic;
            a.min_rnr_timer = min_rnr_timer;
            set_av(&mut a.ah_attr, av);
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER
        }
        QpAttrs::Rts {
            sq_psn,
            timeout,
            retry_cnt,
            rnr_retry,
            max_rd_atomic,
        } => {
            a.qp_state = ibv_qp_state::IBV_QPS_RTS;
            a.sq_psn = sq_psn;
            a.timeout = timeout;
            a.retry_cnt = retry_cnt;
            a.rnr_retry = rnr_retry;
            a.max_rd_atomic = max_rd_atomic;
            M::IBV_QP_STATE
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_MAX_QP_RD_ATOMIC
        }
    };
    (a, mask)
}

fn set_av(ah: &mut ibv_ah_attr, av: AddressVector) {
    match av {
        AddressVector::Lid { dlid, port } => {
            ah.dlid = dlid;
            ah.port_num = port;
            ah.is_global = 0;
        }
        AddressVector::Global {
            dgid,
            sgid_index,
            hop_limit,
            port,
        } => {
            ah.port_num = port;
            ah.is_global = 1;
            ah.grh.dgid = ibv_gid { raw: dgid };
            ah.grh.sgid_index = sgid_index;
            ah.grh.hop_limit = hop_limit;
        }
    }
}

fn poll_batch(core: &Arc<ConnCore>, wcs: &mut [ibv_wc]) -> Result<usize, TransportError> {
    let w = wire(core);
    // SAFETY: the CQ is alive and `wcs` has room for the entries asked for.
    let n = unsafe { ibv_poll_cq(w.cq.raw.as_ptr(), wcs.len() as i32, wcs.as_mut_ptr()) };
    if n < 0 {
        return Err(verbs::fail("ibv_poll_cq"));
    }
    for wc in &wcs[..n as usize] {
        w.on_completion(core, wc);
    }
    Ok(n as usize)
}

/// Sends the answer to call `id`: a reply, or the error the call failed with.
async fn send_answer(
    core: &Arc<ConnCore>,
    id: u64,
    result: Result<Bytes, (ErrorCode, String)>,
) -> Result<(), TransportError> {
    let (kind, status, body) = match result {
        Ok(b) => (MsgKind::Reply, 0, b),
        Err((code, msg)) => (MsgKind::CallError, code.number(), Bytes::from(msg)),
    };
    wire(core).send_msg(core, kind, status, id, &body).await
}

/// Drains the completion queue, then sleeps on the completion channel until the NIC
/// signals more (optionally spinning `busy_poll` first). Holds only a weak reference
/// while asleep, so a dropped connection ends the task.
pub(crate) async fn poll_loop(core: Weak<ConnCore>) {
    let Some(c) = core.upgrade() else { return };
    let cq = wire(&c).cq.clone();
    let spin = wire(&c).dev.busy_poll;
    drop(c);
    // SAFETY: the channel's fd stays open while `cq` (dropped after `fd`) lives.
    let fd = match unsafe { AsyncFd::register(ChannelFd(cq.channel.fd())) } {
        Ok(fd) => fd,
        Err(e) => {
            if let Some(c) = core.upgrade() {
                c.shutdown(format!("cannot watch the completion channel: {e}"));
            }
            return;
        }
    };
    // SAFETY: ibv_wc is plain data; zero is a valid value.
    let mut wcs: Vec<ibv_wc> = (0..WC_BATCH)
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    loop {
        let Some(c) = core.upgrade() else { return };
        let drained = drain(&c, &mut wcs, spin).await;
        if let Err(e) = drained {
            return c.shutdown(e.to_string());
        }
        drop(c);
        let Ok(mut guard) = fd.readable().await else {
            return;
        };
        let mut cq_ptr = std::ptr::null_mut();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the channel is alive; with O_NONBLOCK this returns at once.
        let got = unsafe { ibv_get_cq_event(cq.channel.as_ptr(), &mut cq_ptr, &mut ctx) };
        if got == 0 {
            // SAFETY: one event of this CQ was taken.
            unsafe { ibv_ack_cq_events(cq.raw.as_ptr(), 1) };
        } else {
            guard.clear_ready();
        }
    }
}

/// Polls until the queue is empty and re-armed with nothing missed.
async fn drain(
    c: &Arc<ConnCore>,
    wcs: &mut [ibv_wc],
    spin: std::time::Duration,
) -> Result<(), TransportError> {
    let cq = wire(c).cq.clone();
    let deadline = std::time::Instant::now() + spin;
    loop {
        if poll_batch(c, wcs)? > 0 {
            tokio::task::yield_now().await;
            continue;
        }
        if std::time::Instant::now() < deadline {
            std::hint::spin_loop();
            continue;
        }
        // SAFETY: the CQ is alive.
        check("ibv_req_notify_cq", unsafe {
            ibv_req_notify_cq(cq.raw.as_ptr(), 0)
        })?;
        // A completion that arrived before arming raises no event: look once more.
        if poll_batch(c, wcs)? == 0 {
            return Ok(());
        }
    }
}
