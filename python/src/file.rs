//! An open Tessera file (`fs_client::api::File`) for Python: positioned reads and writes
//! into and from caller buffers. The Python class `tessera.TesseraFile` (an
//! `io.RawIOBase`) keeps the position and the mode on top of it.

use crate::buffers::{LentExport, ReadableBuffer, WritableBuffer};
use crate::errors::at;
use crate::stat_tuple;
use crate::StatTuple;
use fs_client::api;
use parking_lot::RwLock;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// An open file. Reads and writes of several threads run at once (the read lock);
/// `close` takes the write lock, so it waits for them and later calls see it closed.
#[pyclass(frozen, module = "tessera._native")]
pub struct NativeFile {
    file: RwLock<Option<api::File>>,
    path: String,
    /// Set when `close` begins: `closed` answers from it without the lock, which a
    /// waiting `close` would hold against it while a long read runs (with the GIL held).
    closing: AtomicBool,
}

impl NativeFile {
    /// Wraps `file`, opened as `path` (named in errors).
    pub fn new(file: api::File, path: &str) -> NativeFile {
        NativeFile {
            file: RwLock::new(Some(file)),
            path: path.to_string(),
            closing: AtomicBool::new(false),
        }
    }

    /// Runs `f` on the open file with the GIL released.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&api::File) -> fs_client::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let guard = self.file.read();
            match guard.as_ref() {
                Some(file) => f(file).map_err(at(&self.path)),
                None => Err(PyValueError::new_err("I/O operation on closed file")),
            }
        })
    }
}

#[pymethods]
impl NativeFile {
    /// Reads at `offset` into `buffer` (any writable buffer), in place; returns the bytes
    /// read, 0 at the end of the file. A read of `LEND_MIN_BYTES` or more lends the
    /// buffer to the transport, which may hold it past this call if a transfer into it
    /// outlived the read: the object must keep its memory alive by itself.
    fn read_at(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, offset: u64) -> PyResult<usize> {
        let mut buf = WritableBuffer::get(buffer)?;
        if buf.len() >= crate::LEND_MIN_BYTES {
            let lent = LentExport::new(buffer.clone().unbind(), buf, usize::MAX);
            // The export is released here, with the GIL held.
            let (_lent, n) = self.with(py, move |f| crate::read_lending(f, lent, offset))?;
            return Ok(n);
        }
        let mut raw = buf.slice_mut();
        self.with(py, move |f| f.read_at(raw.as_mut_slice(), offset))
    }

    /// Writes `data` (any bytes-like object) at `offset`; returns the bytes written.
    fn write_at(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: u64) -> PyResult<usize> {
        let buf = ReadableBuffer::get(data)?;
        let raw = buf.slice();
        self.with(py, move |f| f.write_at(raw.as_slice(), offset))
    }

    /// Writes `data` at the end of the file (O_APPEND); returns the offset it went to.
    fn append(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<u64> {
        let buf = ReadableBuffer::get(data)?;
        let raw = buf.slice();
        self.with(py, move |f| f.append(raw.as_slice()))
    }

    /// The file's length as this client sees it, its own writes included.
    fn len(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |f| Ok(f.len()))
    }

    /// The file's attributes (see `Client.stat`).
    fn stat(&self, py: Python<'_>) -> PyResult<StatTuple> {
        self.with(py, |f| f.metadata()).map(|m| stat_tuple(&m))
    }

    /// Cuts or extends the file to `size` bytes.
    fn set_len(&self, py: Python<'_>, size: u64) -> PyResult<()> {
        self.with(py, |f| f.set_len(size))
    }

    /// Sends buffered writes and commits the length (others see it after this).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |f| f.flush())
    }

    /// Makes every byte written durable on every copy (fsync).
    fn sync_all(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |f| f.sync_all())
    }

    /// Closes the file, raising a write that failed in the background; closing again
    /// does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.closing.store(true, Ordering::Release);
        py.detach(|| {
            let taken = self.file.write().take();
            match taken {
                Some(file) => file.close().map_err(at(&self.path)),
                None => Ok(()),
            }
        })
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }
}
