//! `tessera._native`: Tessera's Rust client API (`fs_client::api`) as a Python extension
//! module. The Python package `tessera` (python/tessera) builds the user-facing API on
//! it: file objects, `os`-like calls, fsspec and PyTorch helpers.
//!
//! Every call that may wait on the network releases the GIL (`Python::detach`), so
//! Python threads (a data loader's prefetch, a training step) run meanwhile.

mod buffers;
mod errors;
mod file;

use buffers::{FreshBytes, LentExport, ReadableBuffer, WritableBuffer};
use errors::{at, os_error};
use fs_client::api::{self, DirEntry, FileType, Metadata, OpenOptions};
use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A connection to one Tessera cluster (`fs_client::api::Tessera`).
#[pyclass(frozen, module = "tessera._native")]
struct Client {
    inner: api::Tessera,
}

/// What `stat` returns: `(st_mode, st_ino, st_nlink, st_uid, st_gid, st_size, st_blocks,
/// atime_ns, mtime_ns, ctime_ns, kind)`, `kind` one of "file", "dir", "symlink", "other".
pub(crate) type StatTuple = (
    u32,
    u64,
    u32,
    u32,
    u32,
    u64,
    u64,
    i64,
    i64,
    i64,
    &'static str,
);

fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::File => "file",
        FileType::Dir => "dir",
        FileType::Symlink => "symlink",
        FileType::Other => "other",
    }
}

/// Nanoseconds since the epoch (negative before it), saturating at i64's range (the
/// year 2262), which is what `os.stat_result.st_mtime_ns` holds.
fn nanos(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

/// The time `ns` nanoseconds from the epoch (before it when negative); `None` past what
/// `SystemTime` holds.
fn system_time(ns: i128) -> Option<SystemTime> {
    let (secs, nanos) = (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000));
    let whole = Duration::from_secs(u64::try_from(secs.unsigned_abs()).ok()?);
    let at = if secs < 0 {
        UNIX_EPOCH.checked_sub(whole)?
    } else {
        UNIX_EPOCH.checked_add(whole)?
    };
    // `nanos` is in 0..1e9 whichever the sign: the fraction always counts forward.
    at.checked_add(Duration::from_nanos(u64::try_from(nanos).ok()?))
}

pub(crate) fn stat_tuple(m: &Metadata) -> StatTuple {
    (
        m.mode,
        m.ino,
        m.nlink,
        m.uid,
        m.gid,
        m.size,
        m.blocks,
        nanos(m.atime),
        nanos(m.mtime),
        nanos(m.ctime),
        kind_name(m.kind),
    )
}

#[pymethods]
impl Client {
    /// Opens `path`; the flags are those of `fs_client::api::OpenOptions`.
    #[pyo3(signature = (path, read, write, append, create, create_new, truncate, mode=0o666))]
    #[allow(clippy::too_many_arguments)] // one keyword per open flag, as Python passes them
    fn open(
        &self,
        py: Python<'_>,
        path: &str,
        read: bool,
        write: bool,
        append: bool,
        create: bool,
        create_new: bool,
        truncate: bool,
        mode: u32,
    ) -> PyResult<file::NativeFile> {
        let mut how = OpenOptions::new();
        how.read = read;
        how.write = write;
        how.append = append;
        how.create = create;
        how.create_new = create_new;
        how.truncate = truncate;
        how.mode = mode;
        let f = py
            .detach(|| self.inner.open(path, &how))
            .map_err(at(path))?;
        Ok(file::NativeFile::new(f, path))
    }

    /// The attributes of `path`, following a final symlink (`follow`) or not.
    #[pyo3(signature = (path, follow=true))]
    fn stat(&self, py: Python<'_>, path: &str, follow: bool) -> PyResult<StatTuple> {
        let m = py
            .detach(|| {
                if follow {
                    self.inner.metadata(path)
                } else {
                    self.inner.symlink_metadata(path)
                }
            })
            .map_err(at(path))?;
        Ok(stat_tuple(&m))
    }

    /// The entries of directory `path` as `(name, ino, kind)`, without "." and "..".
    fn read_dir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<(String, u64, &'static str)>> {
        let entries: Vec<DirEntry> = py.detach(|| self.inner.read_dir(path)).map_err(at(path))?;
        Ok(entries
            .into_iter()
            .map(|e| (e.name, e.ino, kind_name(e.kind)))
            .collect())
    }

    /// [`read_dir`] with each entry's attributes (not following a link), from the
    /// listing's own calls: `scandir` needs no call per entry.
    #[allow(clippy::type_complexity)]
    fn read_dir_plus(
        &self,
        py: Python<'_>,
        path: &str,
    ) -> PyResult<Vec<(String, u64, &'static str, Option<StatTuple>)>> {
        let entries: Vec<DirEntry> = py
            .detach(|| self.inner.read_dir_plus(path))
            .map_err(at(path))?;
        Ok(entries
            .into_iter()
            .map(|e| {
                let stat = e.metadata.as_ref().map(stat_tuple);
                (e.name, e.ino, kind_name(e.kind), stat)
            })
            .collect())
    }

    /// Makes directory `path` (`parents`: and every missing one above it).
    #[pyo3(signature = (path, mode=0o777, parents=false))]
    fn mkdir(&self, py: Python<'_>, path: &str, mode: u32, parents: bool) -> PyResult<()> {
        py.detach(|| {
            if parents {
                self.inner.create_dir_all(path, mode)
            } else {
                self.inner.create_dir(path, mode)
            }
        })
        .map_err(at(path))
    }

    /// Removes the file (or symlink) `path`.
    fn remove_file(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        py.detach(|| self.inner.remove_file(path)).map_err(at(path))
    }

    /// Removes the empty directory `path`.
    fn remove_dir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        py.detach(|| self.inner.remove_dir(path)).map_err(at(path))
    }

    /// Renames `src` to `dst` atomically, replacing `dst`.
    fn rename(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        py.detach(|| self.inner.rename(src, dst))
            .map_err(|e| os_error(&e, src, Some(dst)))
    }

    /// Makes `path` a symlink to `target`.
    fn symlink(&self, py: Python<'_>, target: &str, path: &str) -> PyResult<()> {
        py.detach(|| self.inner.symlink(target, path))
            .map_err(at(path))
    }

    /// The target of symlink `path`.
    fn read_link(&self, py: Python<'_>, path: &str) -> PyResult<String> {
        py.detach(|| self.inner.read_link(path)).map_err(at(path))
    }

    /// Sets the permission bits of `path` (links followed), as `os.chmod`.
    fn chmod(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        py.detach(|| self.inner.set_permissions(path, mode))
            .map_err(at(path))
    }

    /// Sets the owner and group of `path` (`None` keeps one), as `os.chown`.
    #[pyo3(signature = (path, uid=None, gid=None))]
    fn chown(
        &self,
        py: Python<'_>,
        path: &str,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> PyResult<()> {
        py.detach(|| self.inner.set_owner(path, uid, gid))
            .map_err(at(path))
    }

    /// Sets the access and modification times of `path` to these nanoseconds since the
    /// epoch, or both to the server's clock with neither (as `os.utime`).
    #[pyo3(signature = (path, atime_ns=None, mtime_ns=None))]
    fn utime(
        &self,
        py: Python<'_>,
        path: &str,
        atime_ns: Option<i128>,
        mtime_ns: Option<i128>,
    ) -> PyResult<()> {
        let time = |ns: Option<i128>| match ns {
            None => Ok(None),
            Some(ns) => system_time(ns)
                .map(Some)
                .ok_or_else(|| PyOverflowError::new_err("timestamp out of range for the platform")),
        };
        let (a, m) = (time(atime_ns)?, time(mtime_ns)?);
        py.detach(|| match (a, m) {
            (None, None) => self.inner.set_times_now(path),
            (a, m) => self.inner.set_times(path, a, m),
        })
        .map_err(at(path))
    }

    /// Makes `dst` a hard link to `src`, as `os.link`.
    fn link(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        py.detach(|| self.inner.hard_link(src, dst))
            .map_err(|e| os_error(&e, src, Some(dst)))
    }

    /// The value of extended attribute `name` of `path` (the link's own unless
    /// `follow`).
    #[pyo3(signature = (path, name, follow=true))]
    fn getxattr<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        name: &[u8],
        follow: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let v = py
            .detach(|| self.inner.get_xattr(path, name, follow))
            .map_err(at(path))?;
        Ok(PyBytes::new(py, &v))
    }

    /// Sets extended attribute `name` of `path`; `flags` as `os.setxattr`'s (0,
    /// `XATTR_CREATE`, `XATTR_REPLACE`).
    #[pyo3(signature = (path, name, value, flags=0, follow=true))]
    fn setxattr(
        &self,
        py: Python<'_>,
        path: &str,
        name: &[u8],
        value: &[u8],
        flags: i32,
        follow: bool,
    ) -> PyResult<()> {
        let Some(mode) = api::XattrMode::from_flags(flags) else {
            let e = fs_client::ClientError::Invalid(format!("setxattr flags {flags}"));
            return Err(os_error(&e, path, None));
        };
        py.detach(|| self.inner.set_xattr(path, name, value, mode, follow))
            .map_err(at(path))
    }

    /// The names of `path`'s extended attributes.
    #[pyo3(signature = (path, follow=true))]
    fn listxattr<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        follow: bool,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let names = py
            .detach(|| self.inner.list_xattr(path, follow))
            .map_err(at(path))?;
        Ok(names.iter().map(|n| PyBytes::new(py, n)).collect())
    }

    /// Removes extended attribute `name` of `path`.
    #[pyo3(signature = (path, name, follow=true))]
    fn removexattr(&self, py: Python<'_>, path: &str, name: &[u8], follow: bool) -> PyResult<()> {
        py.detach(|| self.inner.remove_xattr(path, name, follow))
            .map_err(at(path))
    }

    /// The file system's capacity and free bytes over all data servers, and its
    /// inodes in use: `(total, free, files)`.
    fn statfs(&self, py: Python<'_>) -> PyResult<(u64, u64, u64)> {
        let s = py.detach(|| self.inner.statfs()).map_err(at("/"))?;
        Ok((s.total_bytes, s.free_bytes, s.files))
    }

    /// The whole of file `path`. One call with the GIL released and a copy into the
    /// `bytes` after it: `read_many`'s two steps (see `FreshBytes`) spare the copy but
    /// take the GIL once more in between, which a single small file pays for (and, with
    /// another Python thread busy, waits for).
    fn read<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyBytes>> {
        let data = py.detach(|| self.inner.read(path)).map_err(at(path))?;
        Ok(PyBytes::new(py, &data))
    }

    /// Reads `path` from `offset` into `buffer` (any writable buffer: bytearray,
    /// memoryview, numpy array), in place; returns the bytes read (fewer at the end). A
    /// read of `LEND_MIN_BYTES` or more lends the buffer to the transport (see
    /// `NativeFile::read_at`).
    fn read_into(
        &self,
        py: Python<'_>,
        path: &str,
        offset: u64,
        buffer: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let mut buf = WritableBuffer::get(buffer)?;
        if buf.len() < LEND_MIN_BYTES {
            let mut raw = buf.slice_mut();
            return py
                .detach(move || self.inner.read_into(path, offset, raw.as_mut_slice()))
                .map_err(at(path));
        }
        let lent = LentExport::new(buffer.clone().unbind(), buf, usize::MAX);
        let read = py.detach(|| {
            let file = self.inner.open(path, &OpenOptions::new())?;
            let read = read_lending(&file, lent, offset);
            let closed = file.close();
            let read = read?;
            closed.map(|()| read)
        });
        // The export is released here, with the GIL held.
        let (_lent, n) = read.map_err(at(path))?;
        Ok(n)
    }

    /// The whole of each file of `paths`, fetched in parallel; the first failure (in
    /// the order of `paths`) is raised.
    fn read_many<'py>(
        &self,
        py: Python<'py>,
        paths: Vec<String>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        self.read_whole(py, paths)
    }

    /// The whole of each file of `paths`, fetched in parallel, each read straight into
    /// the object `alloc(length)` returns for it (anything with a writable, C-contiguous
    /// buffer of at least `length` bytes that owns its memory or keeps its owner alive: a
    /// bytearray, a numpy array); returns `(object, bytes read)` per path. The parts of
    /// the buffers the files fill may not overlap (one buffer given for two files is
    /// refused: the reads fill them at once). A window of `api::OPEN_WINDOW` files at a
    /// time: an error is raised for the first path of a window that failed to open or to
    /// get its buffer, else for the first that failed to read.
    fn read_many_into<'py>(
        &self,
        py: Python<'py>,
        paths: Vec<String>,
        alloc: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<(Bound<'py, PyAny>, usize)>> {
        let make = |p: &str, len: usize| {
            let obj = alloc.call1((len,))?;
            let export = WritableBuffer::get(&obj)?;
            if export.len() < len {
                return Err(PyValueError::new_err(format!(
                    "alloc({len}) for {p:?} returned a buffer of {} bytes",
                    export.len()
                )));
            }
            Ok((LentExport::new(obj.clone().unbind(), export, len), obj))
        };
        let check = |window: &[String], bufs: &[&LentExport]| {
            let spans: Vec<(usize, usize)> = bufs.iter().map(|b| b.span()).collect();
            match overlapping(&spans) {
                Some((a, b)) => Err(PyValueError::new_err(format!(
                    "alloc gave {:?} and {:?} buffers that overlap",
                    window[a], window[b]
                ))),
                None => Ok(()),
            }
        };
        // Lent to the transport: the file's bytes land in the caller's object itself.
        let read = |fs: &api::Tessera, jobs| fs.read_whole_lent(jobs);
        let read = self.read_windows(py, &paths, make, check, read)?;
        Ok(read.into_iter().map(|(_, obj, n)| (obj, n)).collect())
    }

    /// Creates or truncates `path` and writes `data` (any bytes-like object) into it.
    fn write(&self, py: Python<'_>, path: &str, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let buf = ReadableBuffer::get(data)?;
        let raw = buf.slice();
        py.detach(move || self.inner.write(path, raw.as_slice()))
            .map_err(at(path))
    }
}

impl Client {
    /// Whole files, each read straight into the `bytes` returned for it (see
    /// [`Client::read_windows`]).
    fn read_whole<'py>(
        &self,
        py: Python<'py>,
        paths: Vec<String>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let make = |_: &str, len: usize| Ok((FreshBytes::new(py, len)?, ()));
        // Lent to the transport: the file's bytes land in the object itself.
        let read = |fs: &api::Tessera, jobs| fs.read_whole_lent(jobs);
        let read = self.read_windows(py, &paths, make, |_, _| Ok(()), read)?;
        Ok(read
            .into_iter()
            .map(|(fresh, (), n)| fresh.into_bytes(py, n))
            .collect())
    }

    /// Whole files, each read into the buffer `make(path, length)` gives (with what must
    /// live until the read is done), a window of `api::OPEN_WINDOW` at a time: opened
    /// with the GIL released, their buffers made under it (taken once per window) and
    /// passed to `check`, filled with it released again. An error is raised for the
    /// first path of a window that failed to open or to get its buffer, else for the
    /// first that failed to read. Returns each buffer, what was kept with it, and the
    /// bytes read. `read` reads a window's files into their buffers.
    fn read_windows<B, K>(
        &self,
        py: Python<'_>,
        paths: &[String],
        mut make: impl FnMut(&str, usize) -> PyResult<(B, K)>,
        check: impl Fn(&[String], &[&B]) -> PyResult<()>,
        read: impl Fn(&api::Tessera, Vec<(api::File, B)>) -> Vec<fs_client::Result<(B, usize)>> + Sync,
    ) -> PyResult<Vec<(B, K, usize)>>
    where
        B: Send + 'static,
    {
        let mut out = Vec::with_capacity(paths.len());
        for window in paths.chunks(api::OPEN_WINDOW) {
            let opened = py.detach(|| self.inner.open_many(window));
            let (mut jobs, mut kept) = (Vec::new(), Vec::new());
            for (p, r) in window.iter().zip(opened) {
                let file = r.map_err(|e| os_error(&e, p, None))?;
                let len = usize::try_from(file.len())
                    .map_err(|_| pyo3::exceptions::PyMemoryError::new_err("file too large"))?;
                let (buf, keep) = make(p, len)?;
                jobs.push((file, buf));
                kept.push(keep);
            }
            check(window, &jobs.iter().map(|(_, b)| b).collect::<Vec<_>>())?;
            let read = py.detach(|| read(&self.inner, jobs));
            for ((p, r), keep) in window.iter().zip(read).zip(kept) {
                let (buf, n) = r.map_err(|e| os_error(&e, p, None))?;
                out.push((buf, keep, n));
            }
        }
        Ok(out)
    }
}

/// Buffers at least this long are lent to the transport by `read_into` and a file's
/// `read_at` (the data servers write into them, no copy); shorter reads take the file's
/// readahead and cache, which serve a run of small reads better than one read at a time.
pub(crate) const LEND_MIN_BYTES: usize = 4 << 20;

/// Reads `file` at `offset` into `buf` (a buffer of `LEND_MIN_BYTES` or more), with the
/// GIL released: the part the file can fill is lent to the transport when that is
/// `LEND_MIN_BYTES` or more (only that part is pinned, and a buffer far larger than the
/// file is not lent), and read through the file's readahead and cache otherwise.
/// Returns the buffer, to be dropped with the GIL held, and the bytes read.
pub(crate) fn read_lending(
    file: &api::File,
    mut buf: LentExport,
    offset: u64,
) -> fs_client::Result<(LentExport, usize)> {
    let len = buf.span().1;
    let fill = usize::try_from(file.len().saturating_sub(offset)).map_or(len, |n| n.min(len));
    if fill >= LEND_MIN_BYTES {
        return file.read_lent_at(buf.prefix(fill), offset);
    }
    let n = file.read_at(buf.as_mut(), offset)?;
    Ok((buf, n))
}

/// Connects to the cluster whose metadata server listens on one of `addrs`, with client
/// settings by name (`ClientConfig`'s fields, plus `threads` and `parallel`).
#[pyfunction]
#[pyo3(signature = (addrs, settings=Vec::new()))]
fn connect(
    py: Python<'_>,
    addrs: Vec<String>,
    settings: Vec<(String, String)>,
) -> PyResult<Client> {
    if addrs.is_empty() {
        return Err(PyValueError::new_err(
            "connect needs at least one metadata server address",
        ));
    }
    let mut threads = None;
    let mut parallel = None;
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for (k, v) in &settings {
        match k.as_str() {
            "threads" => threads = Some(count(k, v)?),
            "parallel" => parallel = Some(count(k, v)?),
            _ => pairs.push((k.as_str(), v.as_str())),
        }
    }
    let mut options =
        api::Options::with_settings(&pairs).map_err(|e| PyValueError::new_err(e.to_string()))?;
    options.threads = threads.unwrap_or(options.threads);
    options.parallel = parallel.unwrap_or(options.parallel);
    let inner = py
        .detach(|| api::Tessera::connect(&addrs, options))
        .map_err(|e| os_error(&e, &addrs.join(","), None))?;
    Ok(Client { inner })
}

/// Two of `spans` (start address, length) that share a byte, by index; empty spans share
/// none.
fn overlapping(spans: &[(usize, usize)]) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..spans.len()).filter(|&i| spans[i].1 > 0).collect();
    order.sort_by_key(|&i| spans[i].0);
    order.windows(2).find_map(|w| {
        let ((a, a_len), (b, _)) = (spans[w[0]], spans[w[1]]);
        (b < a + a_len).then(|| (w[0].min(w[1]), w[0].max(w[1])))
    })
}

/// The value of setting `name` that counts threads or files: at least 1.
fn count(name: &str, value: &str) -> PyResult<usize> {
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(PyValueError::new_err(format!(
            "{name} must be a whole number of at least 1, not {value:?}"
        ))),
    }
}

/// The module `tessera._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<file::NativeFile>()?;
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    Ok(())
}
