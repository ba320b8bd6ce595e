//! Python buffers (the buffer protocol) lent to Rust while the GIL is released.
//!
//! A buffer export pins the object's memory: a `bytearray` cannot be resized and a numpy
//! array cannot be reallocated while it is exported, so the pointer stays valid until the
//! `PyUntypedBuffer` is released. A borrowed export is released after the GIL is taken
//! back; one lent to the transport (`LentExport`) travels with the memory and is
//! released when the transport lets go of it, on whatever thread that is (pyo3 takes the
//! GIL for it).

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// A writable, C-contiguous buffer exported by a Python object.
pub struct WritableBuffer {
    buf: PyUntypedBuffer,
}

/// A readable, C-contiguous buffer exported by a Python object.
pub struct ReadableBuffer {
    buf: PyUntypedBuffer,
}

fn export(obj: &Bound<'_, PyAny>) -> PyResult<PyUntypedBuffer> {
    let buf = PyUntypedBuffer::get(obj)
        .map_err(|_| PyTypeError::new_err("a bytes-like object (buffer protocol) is required"))?;
    if !buf.is_c_contiguous() {
        return Err(PyBufferError::new_err("the buffer is not C-contiguous"));
    }
    Ok(buf)
}

impl WritableBuffer {
    /// Exports `obj`'s buffer; refused when it is read-only or not contiguous.
    pub fn get(obj: &Bound<'_, PyAny>) -> PyResult<WritableBuffer> {
        let buf = export(obj)?;
        if buf.readonly() {
            return Err(PyTypeError::new_err(
                "a writable buffer is required (bytearray, memoryview, numpy array)",
            ));
        }
        Ok(WritableBuffer { buf })
    }

    /// The buffer's length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len_bytes()
    }

    /// The bytes, to be filled with the GIL released.
    pub fn slice_mut(&mut self) -> RawSliceMut {
        RawSliceMut {
            ptr: self.buf.buf_ptr().cast::<u8>(),
            len: self.buf.len_bytes(),
        }
    }
}

impl ReadableBuffer {
    /// Exports `obj`'s buffer (any bytes-like object).
    pub fn get(obj: &Bound<'_, PyAny>) -> PyResult<ReadableBuffer> {
        Ok(ReadableBuffer { buf: export(obj)? })
    }

    /// The bytes, to be read with the GIL released.
    pub fn slice(&self) -> RawSlice {
        RawSlice {
            ptr: self.buf.buf_ptr().cast::<u8>(),
            len: self.buf.len_bytes(),
        }
    }
}

/// A readable buffer's memory as a pointer and a length, which can cross into
/// `Python::detach`.
pub struct RawSlice {
    ptr: *const u8,
    len: usize,
}

/// A writable buffer's memory as a pointer and a length, likewise.
pub struct RawSliceMut {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory belongs to a buffer export that outlives every use of the pointer:
// a borrowed one (`WritableBuffer`/`ReadableBuffer` dropped after the GIL is taken back)
// outlives the detached call, and the pointer is not kept past it; a `LentExport` keeps
// the pointer only together with the export it came from, dropped with it.
unsafe impl Send for RawSlice {}
// SAFETY: as for `RawSlice`.
unsafe impl Send for RawSliceMut {}

impl RawSlice {
    /// The bytes as a slice.
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` points at `len` bytes of a live, contiguous buffer export (see the
        // `Send` impl); a zero length is answered above, as the pointer may then dangle.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl RawSliceMut {
    /// The bytes as a slice.
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: as `as_mut_slice`, shared.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The first `len` bytes only (all of them if there are fewer).
    pub fn prefix(self, len: usize) -> RawSliceMut {
        RawSliceMut {
            ptr: self.ptr,
            len: self.len.min(len),
        }
    }

    /// Where the bytes are: their start address and length.
    pub fn span(&self) -> (usize, usize) {
        (self.ptr as usize, self.len)
    }

    /// The bytes as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as `RawSlice::as_slice`; the export was checked writable by
        // `WritableBuffer::get`. Python code in another thread may touch the same memory
        // meanwhile, as with any C extension filling a buffer without the GIL: that is a
        // race on the bytes of the caller's own making, and nothing here reads them back.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// A new `bytes` object that Rust fills, with the GIL released, before Python code can
/// see it: a whole file read straight into the object `read_many` returns, with no
/// buffer of Rust's own between the transfer and it (one copy, not two, and no fresh
/// pages of a Rust allocation to fault in for every file). Made under the GIL, its
/// bytes zeroed by the first borrow, without the GIL (by the read's task, or on a
/// blocking thread for a file of 1 MiB or more: `read_whole_into`).
pub struct FreshBytes {
    obj: Py<PyBytes>,
    ptr: *mut u8,
    len: usize,
    /// Whether the bytes were set: none may be read, nor lent, before.
    zeroed: std::cell::Cell<bool>,
}

// SAFETY: the object is referenced by this value only until `into_bytes` hands it to
// Python, so no Python code reads or frees its memory while another thread fills it
// (of zero bytes CPython hands out one shared object, whose memory is never touched
// here); a `Py` may be sent between threads (pyo3 defers a reference dropped without
// the GIL).
unsafe impl Send for FreshBytes {}

impl FreshBytes {
    /// A `bytes` object of `len` bytes, not yet set.
    pub fn new(py: Python<'_>, len: usize) -> PyResult<FreshBytes> {
        let size = isize::try_from(len)
            .map_err(|_| pyo3::exceptions::PyMemoryError::new_err("too large for bytes"))?;
        // SAFETY: a NULL source asks CPython for an object of `size` bytes whose contents
        // are left to the caller (stable ABI); a NULL result is the error set, taken here.
        let obj = unsafe {
            Bound::from_owned_ptr_or_err(
                py,
                pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), size),
            )?
            .cast_into_unchecked::<PyBytes>()
        };
        // SAFETY: `obj` is a bytes object; its buffer of `len` bytes (and a trailing NUL)
        // lives as long as the object.
        let ptr = unsafe { pyo3::ffi::PyBytes_AsString(obj.as_ptr()) }.cast::<u8>();
        if ptr.is_null() {
            return Err(PyErr::fetch(py));
        }
        Ok(FreshBytes {
            obj: obj.unbind(),
            ptr,
            len,
            zeroed: std::cell::Cell::new(false),
        })
    }

    /// Sets every byte to zero, once, before any slice of them is made.
    fn zero(&self) {
        if !self.zeroed.get() {
            // SAFETY: `ptr` points at `len` writable bytes of an object only this value
            // references (see the `Send` impl); a raw write reads none of them, and no
            // slice of them exists yet (every slice is made after this, see `as_ref`,
            // and `zeroed` is not shared between threads: `Cell` is not `Sync`).
            unsafe { std::ptr::write_bytes(self.ptr, 0, self.len) };
            self.zeroed.set(true);
        }
    }

    /// The object, holding the first `n` bytes filled (a file that shrank while it was
    /// read: a new object of those bytes).
    pub fn into_bytes(mut self, py: Python<'_>, n: usize) -> Bound<'_, PyBytes> {
        self.zero();
        if n >= self.len {
            return self.obj.into_bound(py);
        }
        let prefix = &self.as_mut()[..n];
        PyBytes::new(py, prefix)
    }
}

impl AsRef<[u8]> for FreshBytes {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        self.zero();
        // SAFETY: `len` bytes, set above, of an object only this value references (see
        // the `Send` impl), borrowed shared through `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

// SAFETY: a `bytes` object's bytes are part of the object and never move while it
// lives; this value holds a reference to it until `into_bytes`, and `as_ref`/`as_mut`
// always give those same bytes.
unsafe impl fs_client::api::StableBytes for FreshBytes {}

impl AsMut<[u8]> for FreshBytes {
    fn as_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        self.zero();
        // SAFETY: `len` bytes, set above, of an object only this value references (see
        // the `Send` impl), borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl AsMut<[u8]> for RawSliceMut {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

/// A caller's buffer lent to the transport for a read (`Tessera::read_whole_lent`,
/// `File::read_lent_at`): the object and its export travel with the memory, so
/// the memory stays pinned, and alive, for as long as the transport holds it (past a
/// read that gave up, if a transfer into it outlived the read), and the file's bytes
/// land in the caller's object with no copy. Its bytes are the caller's, already set:
/// nothing is zeroed.
pub struct LentExport {
    /// Keeps the object alive while the transport holds its memory (a `Py`, dropped
    /// without the GIL, is let go of later by pyo3).
    _obj: Py<PyAny>,
    /// The export pins the memory; released when this value is dropped (pyo3 takes the
    /// GIL for it).
    _export: WritableBuffer,
    raw: RawSliceMut,
}

impl LentExport {
    /// The first `len` bytes of `obj`'s export.
    pub fn new(obj: Py<PyAny>, mut export: WritableBuffer, len: usize) -> LentExport {
        let raw = export.slice_mut().prefix(len);
        LentExport {
            _obj: obj,
            _export: export,
            raw,
        }
    }

    /// Where the bytes are: their start address and length.
    pub fn span(&self) -> (usize, usize) {
        self.raw.span()
    }

    /// The same, holding only its first `len` bytes (all if there are fewer).
    pub fn prefix(self, len: usize) -> LentExport {
        LentExport {
            raw: self.raw.prefix(len),
            ..self
        }
    }
}

impl AsRef<[u8]> for LentExport {
    fn as_ref(&self) -> &[u8] {
        self.raw.as_slice()
    }
}

impl AsMut<[u8]> for LentExport {
    fn as_mut(&mut self) -> &mut [u8] {
        self.raw.as_mut_slice()
    }
}

// SAFETY: the bytes belong to a buffer export this value holds (with its object), which
// keeps them where they are until this value is dropped; `as_ref` and `as_mut` always
// give those same bytes.
unsafe impl fs_client::api::StableBytes for LentExport {}
