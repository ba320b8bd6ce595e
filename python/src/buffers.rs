//! Python buffers (the buffer protocol) lent to Rust while the GIL is released.
//!
//! A buffer export pins the object's memory: a `bytearray` cannot be resized and a numpy
//! array cannot be reallocated while it is exported, so the pointer stays valid until the
//! `PyUntypedBuffer` is released, which happens after the GIL is taken back.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;

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

// SAFETY: the memory belongs to a buffer export that outlives the detached call (the
// `WritableBuffer`/`ReadableBuffer` it came from is only dropped after the GIL is taken
// back), and nothing in this module keeps the pointer past that call.
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
