//! Owned verbs objects: each wrapper frees its object on drop and keeps alive what it
//! was made from (a queue pair keeps its protection domain and completion queue). Every
//! failure names the verbs call and the errno it set.
//!
//! libibverbs objects may be used from several threads at once (providers lock what
//! they share), which is why the wrappers are `Send` and `Sync`.

use crate::error::TransportError;
use rdma_sys::*;
use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr::{null_mut, NonNull};
use std::sync::Arc;

/// `ibv_port_attr::link_layer` for Ethernet (RoCE); verbs.h defines it as a macro.
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;

/// The errno of the last failed call.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The error of `call`, which reported failure through errno.
pub(crate) fn fail(call: &'static str) -> TransportError {
    TransportError::Verbs {
        call,
        errno: errno(),
    }
}

/// Calls that return 0 or an errno value (`ibv_modify_qp`, `ibv_post_send`, ...).
pub(crate) fn check(call: &'static str, rc: c_int) -> Result<(), TransportError> {
    match rc {
        0 => Ok(()),
        rc if rc > 0 => Err(TransportError::Verbs { call, errno: rc }),
        _ => Err(fail(call)),
    }
}

macro_rules! owned {
    ($name:ident, $ty:ty, $free:ident) => {
        pub(crate) struct $name {
            pub(crate) ptr: NonNull<$ty>,
        }
        // SAFETY: libibverbs objects are not tied to the thread that made them, and the
        // wrapper owns the pointer alone (it is freed once, on drop); see the module comment.
        unsafe impl Send for $name {}
        // SAFETY: libibverbs providers lock what their objects share, so calls through the
        // same object from several threads at once are allowed (module comment).
        unsafe impl Sync for $name {}
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: the pointer came from the matching create call and is freed once.
                let rc = unsafe { $free(self.ptr.as_ptr()) };
                if rc != 0 {
                    tracing::warn!(call = stringify!($free), errno = errno(), "free failed");
                }
            }
        }
        impl $name {
            pub(crate) fn as_ptr(&self) -> *mut $ty {
                self.ptr.as_ptr()
            }
        }
    };
}

owned!(Context, ibv_context, ibv_close_device);
owned!(Pd, ibv_pd, ibv_dealloc_pd);
owned!(Channel, ibv_comp_channel, ibv_destroy_comp_channel);
owned!(CqRaw, ibv_cq, ibv_destroy_cq);
owned!(QpRaw, ibv_qp, ibv_destroy_qp);
owned!(MrRaw, ibv_mr, ibv_dereg_mr);

unsafe fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    // SAFETY: forwarded from the `owned!` drop.
    unsafe { ibv_dealloc_mw(mw) }
}
owned!(MwRaw, ibv_mw, dealloc_mw);

/// The names of the RDMA devices verbs can open.
pub(crate) fn device_names() -> Result<Vec<String>, TransportError> {
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer; the list is freed below.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(fail("ibv_get_device_list"));
    }
    let names = (0..n.max(0) as usize)
        .map(|i| {
            // SAFETY: i < n entries of a list verbs gave us.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(*list.add(i))) };
            name.to_string_lossy().into_owned()
        })
        .collect();
    // SAFETY: the list came from ibv_get_device_list.
    unsafe { ibv_free_device_list(list) };
    Ok(names)
}

/// Opens the device called `name`.
pub(crate) fn open(name: &str) -> Result<Context, TransportError> {
    let mut n: c_int = 0;
    // SAFETY: as in `device_names`.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(fail("ibv_get_device_list"));
    }
    let mut ctx = null_mut();
    for i in 0..n.max(0) as usize {
        // SAFETY: i < n.
        let dev = unsafe { *list.add(i) };
        // SAFETY: dev is an entry of the live list, and verbs returns its name as a
        // NUL-terminated string that lives as long as the list.
        let dev_name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) };
        if dev_name.to_string_lossy() == name {
            // SAFETY: dev is a device of the live list.
            ctx = unsafe { ibv_open_device(dev) };
            if ctx.is_null() {
                let e = fail("ibv_open_device");
                // SAFETY: the list came from ibv_get_device_list and is freed once, here,
                // on this early return; dev_name (borrowed from it) is no longer used.
                unsafe { ibv_free_device_list(list) };
                return Err(e);
            }
            break;
        }
    }
    // SAFETY: the list came from ibv_get_device_list and is freed once; an opened
    // context does not borrow from the list (verbs documents freeing it after open).
    unsafe { ibv_free_device_list(list) };
    NonNull::new(ctx)
        .map(|ptr| Context { ptr })
        .ok_or_else(|| TransportError::Unsupported(format!("no RDMA device named {name:?}")))
}

impl Context {
    pub(crate) fn query_device(&self) -> Result<ibv_device_attr, TransportError> {
        // SAFETY: a zeroed attr is a valid out-parameter.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open for as long as self lives, and attr is a valid,
        // writable out-parameter of the right type.
        check("ibv_query_device", unsafe {
            ibv_query_device(self.as_ptr(), &mut attr)
        })?;
        Ok(attr)
    }

    pub(crate) fn query_port(&self, port: u8) -> Result<ibv_port_attr, TransportError> {
        // SAFETY: as above.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open for as long as self lives, and attr is a valid,
        // writable out-parameter of the right type; a bad port number is an error return.
        check("ibv_query_port", unsafe {
            ___ibv_query_port(self.as_ptr(), port, &mut attr)
        })?;
        Ok(attr)
    }

    pub(crate) fn query_gid(&self, port: u8, index: u8) -> Result<[u8; 16], TransportError> {
        // SAFETY: as above.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open for as long as self lives, and gid is a valid,
        // writable out-parameter; a bad port or index is an error return.
        check("ibv_query_gid", unsafe {
            ibv_query_gid(self.as_ptr(), port, c_int::from(index), &mut gid)
        })?;
        // SAFETY: every bit pattern is a valid raw GID.
        Ok(unsafe { gid.raw })
    }
}

/// A protection domain on `ctx`.
pub(crate) fn alloc_pd(ctx: &Context) -> Result<Pd, TransportError> {
    // SAFETY: ctx is open.
    let pd = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
    NonNull::new(pd)
        .map(|ptr| Pd { ptr })
        .ok_or_else(|| fail("ibv_alloc_pd"))
}

/// A completion channel whose fd is non-blocking, so tokio can wait on it.
pub(crate) fn comp_channel(ctx: &Context) -> Result<Channel, TransportError> {
    // SAFETY: ctx is open.
    let ch = unsafe { ibv_create_comp_channel(ctx.as_ptr()) };
    let ch = NonNull::new(ch)
        .map(|ptr| Channel { ptr })
        .ok_or_else(|| fail("ibv_create_comp_channel"))?;
    let fd = ch.fd();
    // SAFETY: fd is the channel's open descriptor, owned by ch which outlives the call.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above; F_SETFL takes an int argument and changes only the fd's flags.
    let set = |flags: c_int| unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
    if flags < 0 || set(flags) < 0 {
        return Err(fail("fcntl(O_NONBLOCK) on the completion channel"));
    }
    Ok(ch)
}

impl Channel {
    pub(crate) fn fd(&self) -> c_int {
        // SAFETY: the channel is alive.
        unsafe { (*self.as_ptr()).fd }
    }
}

/// A completion queue of `entries` reporting to `ch`.
pub(crate) struct Cq {
    pub(crate) raw: CqRaw,
    pub(crate) channel: Channel,
    pub(crate) _ctx: Arc<Context>,
}

pub(crate) fn create_cq(ctx: &Arc<Context>, entries: u32) -> Result<Cq, TransportError> {
    let channel = comp_channel(ctx)?;
    // SAFETY: ctx and channel are alive; the CQ is destroyed before the channel (field
    // order of `Cq`).
    let cq = unsafe {
        ibv_create_cq(
            ctx.as_ptr(),
            entries as c_int,
            null_mut(),
            channel.as_ptr(),
            0,
        )
    };
    let raw = NonNull::new(cq)
        .map(|ptr| CqRaw { ptr })
        .ok_or_else(|| fail("ibv_create_cq"))?;
    Ok(Cq {
        raw,
        channel,
        _ctx: ctx.clone(),
    })
}

/// A reliable-connected queue pair with `send` and `recv` work requests at most.
pub(crate) fn create_qp(pd: &Pd, cq: &Cq, send: u32, recv: u32) -> Result<QpRaw, TransportError> {
    // SAFETY: zeroed init attrs, then the fields that matter.
    let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    init.send_cq = cq.raw.as_ptr();
    init.recv_cq = cq.raw.as_ptr();
    init.qp_type = ibv_qp_type::IBV_QPT_RC;
    init.cap.max_send_wr = send;
    init.cap.max_recv_wr = recv;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    // SAFETY: pd and cq are alive for the QP's life (the wire owns all three).
    let qp = unsafe { ibv_create_qp(pd.as_ptr(), &mut init) };
    NonNull::new(qp)
        .map(|ptr| QpRaw { ptr })
        .ok_or_else(|| fail("ibv_create_qp"))
}

/// Registers `len` bytes at `addr` with `access` flags.
pub(crate) fn reg_mr(
    pd: &Pd,
    addr: *mut u8,
    len: usize,
    access: ibv_access_flags,
) -> Result<MrRaw, TransportError> {
    // SAFETY: the caller keeps the memory alive and in place until the MR is dropped.
    let mr = unsafe { ibv_reg_mr(pd.as_ptr(), addr.cast(), len, access.0 as c_int) };
    NonNull::new(mr)
        .map(|ptr| MrRaw { ptr })
        .ok_or_else(|| fail("ibv_reg_mr"))
}

impl MrRaw {
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the MR is alive.
        unsafe { (*self.as_ptr()).lkey }
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: the MR is alive.
        unsafe { (*self.as_ptr()).rkey }
    }
}

/// A type 2 memory window on `pd` (bound to one queue pair by a BIND_MW request).
pub(crate) fn alloc_mw(pd: &Pd) -> Result<MwRaw, TransportError> {
    // SAFETY: pd is alive.
    match unsafe { ibv_alloc_mw(pd.as_ptr(), ibv_mw_type::IBV_MW_TYPE_2) } {
        Some(mw) if !mw.is_null() => Ok(MwRaw {
            ptr: NonNull::new(mw).expect("checked non-null"),
        }),
        _ => Err(fail("ibv_alloc_mw")),
    }
}

/// The text verbs gives a work completion status.
pub(crate) fn wc_status(status: ibv_wc_status::Type) -> String {
    // SAFETY: ibv_wc_status_str returns a static string for any value.
    unsafe { CStr::from_ptr(ibv_wc_status_str(status)) }
        .to_string_lossy()
        .into_owned()
}
