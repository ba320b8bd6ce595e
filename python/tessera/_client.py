"""The `Tessera` connection: `os`-like calls on the cluster's namespace.

Paths are namespace paths: "/a/b" and "a/b" both name b in a under the root; "." and ".."
are resolved lexically by the native client.
"""

from __future__ import annotations

import collections
import errno
import math
import operator
import os
import re
import stat as statmod
import threading
import weakref
from typing import Callable, Iterable, Iterator

from . import _native

#: How many files `read_many` and the data sets fetch at once unless told otherwise
#: (the native client's `parallel` setting).
DEFAULT_PARALLEL = 16

# Objects holding a native handle, so that a forked child can drop its references to
# them without running their destructors (see `_after_fork_in_child`).
_HOLDERS: "weakref.WeakSet[object]" = weakref.WeakSet()
_HOLDERS_LOCK = threading.Lock()
# Native handles inherited through fork(). Their runtime's threads do not exist in the
# child, so dropping them could wait forever on threads that will never answer: they are
# kept here, unused, for the life of the process.
_FORKED: list = []


def _after_fork_in_child() -> None:
    # Only the forking thread exists in the child: a lock another thread held at the
    # fork stays held forever, so the child makes its locks anew instead of taking them.
    global _HOLDERS_LOCK
    _HOLDERS_LOCK = threading.Lock()
    for h in list(_HOLDERS):
        h._forget_native()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _register(holder: object) -> None:
    with _HOLDERS_LOCK:
        _HOLDERS.add(holder)


def _fspath(path) -> str:
    """`path` as text, refused as `os` refuses it: a NUL byte is a ValueError, the empty
    path names nothing (FileNotFoundError)."""
    p = os.fspath(path)
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if "\0" in p:
        raise ValueError("embedded null byte")
    if not p:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), p)
    return p


#: One metadata server's address in a URL: a host name, IPv4 address or [IPv6 address
#: with an optional %scope], and a port of at most five digits.
_ADDRESS = re.compile(r"(\[[0-9A-Fa-f:.]+(%[0-9A-Za-z_.-]+)?\]|[A-Za-z0-9_.-]+):[0-9]{1,5}")


def _is_address(netloc: str) -> bool:
    """Whether a URL's netloc is "HOST:PORT" (or a comma-separated list of them, empty
    parts left out as `connect` leaves them out)."""
    parts = [p.strip() for p in netloc.split(",") if p.strip()]
    return bool(parts) and all(_ADDRESS.fullmatch(p) and 0 < int(p.rsplit(":", 1)[1]) < 65536
                               for p in parts)


def _split_url(url: str) -> tuple[str | None, str]:
    """(the "HOST:PORT" of a `tessera://HOST:PORT/path` URL or None, the path).

    A netloc that names no address (no port) is the path's first name, with the
    cluster given otherwise (`addrs=`, fsspec's `FSSPEC_TESSERA_ADDRS`): tools built for
    object stores rebuild a URL as protocol + "://" + path and lose the address, and
    some then also drop the path's leading slash (Hugging Face `datasets` streaming
    turns `/pd/t.parquet` into `tessera://pd/t.parquet`). A first name that looks like
    HOST:PORT (`/ckpt:5/x`) is an address there: such a path needs `tessera:///` or the
    address in the URL."""
    if url.startswith("tessera://"):
        rest = url[len("tessera://"):]
        netloc, _slash, path = rest.partition("/")
        if netloc and not _is_address(netloc):
            return None, "/" + rest
        return (netloc or None), "/" + path
    if url.startswith("tessera::"):
        return None, url[len("tessera::"):]
    return None, url


def _addrs(addrs) -> list[str]:
    if isinstance(addrs, str):
        out = [a.strip() for a in addrs.split(",") if a.strip()]
    else:
        out = [str(a) for a in addrs]
    if not out:
        raise ValueError("connect needs at least one metadata server address (HOST:PORT)")
    return out


def _setting(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _stat_result(t) -> os.stat_result:
    mode, ino, nlink, uid, gid, size, blocks, atime, mtime, ctime, _kind = t
    seq = (mode, ino, 0, nlink, uid, gid, size, atime // 10**9, mtime // 10**9, ctime // 10**9)
    extra = {
        "st_atime": atime / 1e9,
        "st_mtime": mtime / 1e9,
        "st_ctime": ctime / 1e9,
        "st_atime_ns": atime,
        "st_mtime_ns": mtime,
        "st_ctime_ns": ctime,
        "st_blocks": blocks,
        "st_blksize": 4096,
        "st_rdev": 0,
    }
    return os.stat_result(seq, extra)


class DirEntry:
    """One entry of `Tessera.scandir`, like `os.DirEntry`."""

    __slots__ = ("name", "path", "inode_number", "_kind", "_fs", "_stat")

    def __init__(self, fs: "Tessera", parent: str, name: str, ino: int, kind: str):
        self.name = name
        self.path = parent.rstrip("/") + "/" + name if parent not in ("", "/") else "/" + name
        self.inode_number = ino
        self._kind = kind
        self._fs = fs
        self._stat = None

    def inode(self) -> int:
        return self.inode_number

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        if self._kind == "symlink" and follow_symlinks:
            return self._fs.isdir(self.path)
        return self._kind == "dir"

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        if self._kind == "symlink" and follow_symlinks:
            return self._fs.isfile(self.path)
        return self._kind == "file"

    def is_symlink(self) -> bool:
        return self._kind == "symlink"

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        if not follow_symlinks or self._kind != "symlink":
            if self._stat is None:
                self._stat = self._fs.stat(self.path, follow_symlinks=False)
            return self._stat
        return self._fs.stat(self.path)

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"<tessera.DirEntry {self.name!r}>"


class _ScandirIterator:
    """What `scandir` returns: an iterator that is also a context manager."""

    def __init__(self, entries: list[DirEntry]):
        self._it = iter(entries)

    def __iter__(self) -> "_ScandirIterator":
        return self

    def __next__(self) -> DirEntry:
        return next(self._it)

    def close(self) -> None:
        self._it = iter(())

    def __enter__(self) -> "_ScandirIterator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: `utime`'s `ns` not given (an explicit None is a TypeError, as for `os.utime`).
_NO_NS = object()


class Tessera:
    """A connection to one Tessera cluster (made by `tessera.connect`).

    Safe to use from many threads: every call releases the GIL while it waits. It
    survives `fork()`: a child process (a DataLoader worker) connects again on its first
    call, with the same addresses and options.
    """

    def __init__(self, addrs, options: dict | None = None):
        self.addrs = _addrs(addrs)
        self.options = dict(options or {})
        self._lock = threading.Lock()
        self._pid = None
        self._client = None
        _register(self)
        self._native()  # connect now, so a bad address fails here and not later

    def _native(self):
        client = self._client
        if client is not None and self._pid == os.getpid():
            return client
        with self._lock:
            if self._client is None or self._pid != os.getpid():
                settings = [(k, _setting(v)) for k, v in self.options.items()]
                self._client = _native.connect(self.addrs, settings)
                self._pid = os.getpid()
            return self._client

    def _forget_native(self) -> None:
        # In a forked child: keep the parent's handle alive and unused (see _FORKED).
        if self._client is not None:
            _FORKED.append(self._client)
        self._client = None
        self._lock = threading.Lock()

    def __reduce__(self):
        # Pickled into spawned DataLoader workers: the addresses and options travel, the
        # connection is made again on the other side.
        return (Tessera, (self.addrs, self.options))

    def __repr__(self) -> str:
        return f"tessera.Tessera({','.join(self.addrs)!r})"

    # Files

    def open(self, path, mode: str = "rb", buffering: int = -1, encoding=None,
             errors=None, newline=None, closefd: bool = True, opener=None):
        """Opens `path` like the built-in `open`: a `TesseraFile` (an `io.RawIOBase`)
        with `buffering=0`, else wrapped in `io.BufferedReader`/`Writer`/`Random`, and
        in `io.TextIOWrapper` in text mode."""
        from ._file import open_file

        return open_file(self, _fspath(path), mode, buffering, encoding, errors, newline,
                         closefd, opener, name=os.fspath(path))

    def read_bytes(self, path) -> bytes:
        """The whole of file `path`."""
        p = _fspath(path)
        return self._native().read(p)

    def write_bytes(self, path, data) -> int:
        """Creates or truncates `path` and writes `data` (any bytes-like object)."""
        p = _fspath(path)
        self._native().write(p, data)
        return memoryview(data).nbytes

    def read_into(self, path, offset: int, buffer) -> int:
        """Reads `path` from `offset` straight into `buffer` (a bytearray, memoryview,
        numpy array: anything writable with the buffer protocol, C-contiguous), with no
        copy on the Python side; returns the bytes read (fewer at the end of the file).
        A read of 4 MiB or more is lent to the transport (the data servers write into
        the buffer itself): the object may then be held past the call if a transfer
        into it outlived its read, so it must keep its memory alive by itself (a view
        made with `ctypes.from_address` must hold its owner)."""
        return self._native().read_into(_fspath(path), int(offset), buffer)

    def read_many(self, paths: Iterable) -> list[bytes]:
        """The whole of each of `paths`, fetched in parallel by the native client (at
        most its `parallel` setting at once) with the GIL released. The first failure,
        in the order of `paths`, is raised."""
        return self._native().read_many([_fspath(p) for p in paths])

    def read_many_into(self, paths: Iterable, alloc: Callable) -> list[tuple]:
        """Like `read_many`, but each file goes straight into the object `alloc(length)`
        returns for it (a bytearray, a numpy array, a memoryview of one: anything
        writable with the buffer protocol, C-contiguous, of at least `length` bytes, that
        owns its memory or keeps its owner alive), with no copy: the data servers write
        into it. The object may be held past the call if a transfer into it outlived
        its read, which is why it must keep its memory alive by itself.
        Returns `(object, bytes read)` per path, the count less than the length only if
        the file shrank meanwhile. A buffer that is too small raises ValueError, one that
        is read-only TypeError, and buffers whose filled parts overlap ValueError (the
        files are read at once)."""
        return self._native().read_many_into([_fspath(p) for p in paths], alloc)

    def symlink(self, target, path) -> None:
        """Makes `path` a symbolic link to `target`."""
        self._native().symlink(_fspath(target), _fspath(path))

    def readlink(self, path) -> str:
        """The target of symbolic link `path`."""
        return self._native().read_link(_fspath(path))

    # Attributes and directories

    def stat(self, path, *, follow_symlinks: bool = True) -> os.stat_result:
        """`os.stat` of `path`."""
        return _stat_result(self._native().stat(_fspath(path), follow_symlinks))

    def lstat(self, path) -> os.stat_result:
        """`os.lstat` of `path`."""
        return self.stat(path, follow_symlinks=False)

    def _stat_or_none(self, path, follow_symlinks: bool = True):
        """The attributes of `path`, or None where `os.path`'s tests answer False (a name
        that cannot be reached: missing, a file taken for a directory, a dangling link, a
        directory that may not be searched, a NUL)."""
        try:
            return self.stat(path, follow_symlinks=follow_symlinks)
        except (OSError, ValueError):
            return None

    def exists(self, path) -> bool:
        """As `os.path.exists`."""
        return self._stat_or_none(path) is not None

    def lexists(self, path) -> bool:
        """As `os.path.lexists`: a dangling link exists."""
        return self._stat_or_none(path, follow_symlinks=False) is not None

    def isdir(self, path) -> bool:
        st = self._stat_or_none(path)
        return st is not None and statmod.S_ISDIR(st.st_mode)

    def isfile(self, path) -> bool:
        st = self._stat_or_none(path)
        return st is not None and statmod.S_ISREG(st.st_mode)

    def listdir(self, path="/") -> list:
        """The names in directory `path`, without "." and ".." (`bytes` for a `bytes`
        path, as `os.listdir`)."""
        names = [name for name, _ino, _kind in self._native().read_dir(_fspath(path))]
        if isinstance(os.fspath(path), bytes):
            return [os.fsencode(n) for n in names]
        return names

    def scandir(self, path="/") -> _ScandirIterator:
        """The entries of directory `path` as `DirEntry` objects (name, path, is_dir(),
        is_file(), stat())."""
        p = _fspath(path)
        as_bytes = isinstance(os.fspath(path), bytes)
        entries = []
        # The attributes come with the listing: stat() of an entry (not following a
        # link) costs no call, as os.scandir's d_type answers is_dir() for free.
        for n, i, k, st in self._native().read_dir_plus(p):
            e = DirEntry(self, p, n, i, k)
            if st is not None:
                e._stat = _stat_result(st)
            if as_bytes:  # as os.scandir of a bytes path: bytes names and paths
                e.name, e.path = os.fsencode(e.name), os.fsencode(e.path)
            entries.append(e)
        return _ScandirIterator(entries)

    def walk(self, top="/", topdown=True, onerror=None,
             followlinks=False) -> Iterator[tuple]:
        """`os.walk` of `top`: (directory, its subdirectories, its other names) for each
        directory under it. As `os.walk`: a link to a directory is listed with the
        directories and entered only with `followlinks`; a directory that cannot be
        listed (`top` too) is passed to `onerror` if given and skipped; top-down, the
        caller may prune the subdirectories' list in place. A `bytes` top yields
        `bytes`, as `os.walk`."""
        try:
            as_bytes = isinstance(os.fspath(top), bytes)
        except TypeError:
            as_bytes = False  # _fspath below raises it as os.walk would
        if as_bytes:
            def bytes_error(e: OSError):
                # os.walk of bytes hands onerror errors naming bytes paths.
                if isinstance(e.filename, str):
                    e.filename = os.fsencode(e.filename)
                onerror(e)

            top_str = os.fsdecode(os.fspath(top))
            errors = None if onerror is None else bytes_error
            for d, dirs, files in self.walk(top_str, topdown, errors, followlinks):
                bdirs = [os.fsencode(n) for n in dirs]
                yield os.fsencode(d), bdirs, [os.fsencode(n) for n in files]
                dirs[:] = [os.fsdecode(n) for n in bdirs]  # the caller's pruning
            return
        try:
            stack = [_fspath(top)]
        except OSError as e:  # the empty path: os.walk("") yields nothing
            if onerror is not None:
                onerror(e)
            return
        while stack:
            d = stack.pop()
            if isinstance(d, tuple):  # bottom-up: its subdirectories are done
                yield d
                continue
            dirs, files, into = [], [], []
            try:
                entries = list(self.scandir(d))
            except OSError as e:
                if onerror is not None:
                    onerror(e)
                continue
            for e in entries:
                try:
                    is_dir = e.is_dir()
                except OSError:
                    is_dir = False
                (dirs if is_dir else files).append(e.name)
                if is_dir and not topdown and (followlinks or not e.is_symlink()):
                    into.append(e.path)
            base = d.rstrip("/")
            if topdown:
                yield d, dirs, files
                for name in reversed(dirs):
                    p = f"{base}/{name}"
                    # Gone, or a name the caller added (no attributes): entered, its
                    # listing fails and goes to `onerror`, as os.walk's does.
                    st = self._stat_or_none(p, follow_symlinks=False)
                    if followlinks or st is None or not statmod.S_ISLNK(st.st_mode):
                        stack.append(p)
            else:
                stack.append((d, dirs, files))
                stack.extend(reversed(into))

    def mkdir(self, path, mode: int = 0o777) -> None:
        """Makes directory `path` (FileExistsError if it exists)."""
        self._native().mkdir(_fspath(path), mode, False)

    def makedirs(self, path, mode: int = 0o777, exist_ok: bool = False) -> None:
        """Makes directory `path` and every missing one above it."""
        p = _fspath(path)
        if not exist_ok and self.exists(p):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), p)
        self._native().mkdir(p, mode, True)

    def rename(self, src, dst) -> None:
        """Renames `src` to `dst` atomically, replacing a file at `dst`."""
        self._native().rename(_fspath(src), _fspath(dst))

    replace = rename

    def remove(self, path) -> None:
        """Removes the file (or symlink) `path`."""
        self._native().remove_file(_fspath(path))

    unlink = remove

    def rmdir(self, path) -> None:
        """Removes the empty directory `path`."""
        self._native().remove_dir(_fspath(path))

    # Attributes, as `os` changes them (links followed).
    def chmod(self, path, mode: int) -> None:
        """Sets the permission bits of `path`, as `os.chmod`."""
        self._native().chmod(_fspath(path), operator.index(mode))

    def chown(self, path, uid: int, gid: int) -> None:
        """Sets the owner and group of `path`; -1 (or its unsigned 2**32 - 1) leaves one
        as it is (`os.chown`). A file's setuid bit goes, and its setgid bit when it is
        group-executable (or the caller is outside its group), as on Linux; but unlike
        Linux, `chown(path, -1, -1)` changes nothing."""
        def keep(i):
            i = operator.index(i)
            return None if i in (-1, 0xFFFF_FFFF) else i

        self._native().chown(_fspath(path), keep(uid), keep(gid))

    def utime(self, path, times=None, *, ns=_NO_NS) -> None:
        """Sets the access and modification times of `path`, as `os.utime`: `times` as
        (atime, mtime) in seconds, or `ns` in nanoseconds, or neither for now (which
        the owner or anyone who may write the file may do; explicit times only the
        owner)."""
        if times is not None and ns is not _NO_NS:
            raise ValueError("utime: you may specify either 'times' or 'ns' but not both")
        if times is not None:
            if type(times) is not tuple or len(times) != 2:
                raise TypeError("utime: 'times' must be either a tuple of two ints or None")
            ns = tuple(_seconds_to_ns(t) for t in times)
        if ns is _NO_NS:
            self._native().utime(_fspath(path))
            return
        if type(ns) is not tuple or len(ns) != 2:
            raise TypeError("utime: 'ns' must be a tuple of two ints")
        atime, mtime = operator.index(ns[0]), operator.index(ns[1])
        self._native().utime(_fspath(path), atime, mtime)

    def link(self, src, dst) -> None:
        """Makes `dst` a hard link to the file `src`, as `os.link`."""
        self._native().link(_fspath(src), _fspath(dst))

    def truncate(self, path, length: int) -> None:
        """Cuts or extends the file `path` to `length` bytes, as `os.truncate` (it needs
        write permission, as an open for writing)."""
        length = operator.index(length)
        p = _fspath(path)
        if length < 0:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), p)
        # Opened for writing only: os.truncate needs no read permission.
        f = self._native().open(p, False, True, False, False, False, False)
        try:
            f.set_len(length)
        finally:
            f.close()

    # Extended attributes, as `os` reaches them (`follow_symlinks=False`: the link's own).
    def getxattr(self, path, attribute, *, follow_symlinks=True) -> bytes:
        """The value of extended attribute `attribute` of `path` (OSError ENODATA when
        it has none), as `os.getxattr`."""
        return self._native().getxattr(_fspath(path), os.fsencode(attribute),
                                       follow_symlinks)

    def setxattr(self, path, attribute, value, flags=0, *, follow_symlinks=True) -> None:
        """Sets extended attribute `attribute` of `path` to the bytes-like `value`;
        `flags` 0, `os.XATTR_CREATE` or `os.XATTR_REPLACE`, as `os.setxattr`. Names are
        namespaced as on Linux (`user.` for users); `user.tessera.replicas` is the
        number of copies a file keeps (on a directory: its new files)."""
        # A bytes-like object, as os.setxattr takes (bytes(5) would be 5 zero bytes).
        data = memoryview(value).tobytes()
        self._native().setxattr(_fspath(path), os.fsencode(attribute), data,
                                operator.index(flags), follow_symlinks)

    def listxattr(self, path="/", *, follow_symlinks=True) -> list[str]:
        """The names of `path`'s extended attributes, as `os.listxattr` (None: the
        root, this client's only working directory)."""
        p = "/" if path is None else _fspath(path)
        return [os.fsdecode(n) for n in self._native().listxattr(p, follow_symlinks)]

    def removexattr(self, path, attribute, *, follow_symlinks=True) -> None:
        """Removes extended attribute `attribute` of `path`, as `os.removexattr`."""
        self._native().removexattr(_fspath(path), os.fsencode(attribute), follow_symlinks)

    def disk_usage(self, path="/") -> "_DiskUsage":
        """The cluster's (total, used, free) bytes over all data servers, as
        `shutil.disk_usage` (one namespace: `path` only has to exist)."""
        self.stat(path)
        total, free, _files = self._native().statfs()
        return _DiskUsage(total, max(0, total - free), free)


_DiskUsage = collections.namedtuple("usage", "total used free")


def _seconds_to_ns(t) -> int:
    """Seconds (an int or a float) as nanoseconds, as `os.utime` takes `times`
    (CPython's `_PyTime_DoubleToDenominator`: the fraction split off with `modf`,
    rounded down, and carried into the seconds when negative)."""
    if isinstance(t, float):
        if math.isnan(t):
            raise ValueError("Invalid value NaN (not a number)")
        frac, whole = math.modf(t)
        frac = math.floor(frac * 1e9)
        if frac < 0:
            frac, whole = frac + 1_000_000_000, whole - 1
        elif frac >= 1_000_000_000:
            frac, whole = frac - 1_000_000_000, whole + 1
        return int(whole) * 1_000_000_000 + int(frac)
    return operator.index(t) * 1_000_000_000


#: The client configuration file a mount reads when given none (`mount -t fuse.tessera`).
DEFAULT_CONFIG = "/etc/tessera/client.toml"


def _read_config(path) -> dict:
    """The settings of a client configuration file (TOML, as a mount's), its tables
    flattened to dotted names (`transport_limits.call_timeout_ms`) as settings are named.
    Settings are strings, numbers and booleans: anything else is refused here, naming
    the file (the native client would read it as text)."""
    import tomllib

    name = os.fsdecode(path)
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{name}: {e}") from None

    def flat(t: dict, prefix: str):
        for k, v in t.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            elif isinstance(v, (str, int, float, bool)):
                yield f"{prefix}{k}", v
            else:
                raise ValueError(f"{name}: setting {prefix}{k} = {v!r}: not a string, "
                                 "number or boolean")

    return dict(flat(table, ""))


class _NoAddress(ValueError):
    """No metadata server address was given anywhere."""


def _configured(addrs, config, options: dict) -> tuple:
    """The addresses and settings a connection uses: a configuration file's (`config`,
    else `$TESSERA_CONFIG` if set and not empty, else `DEFAULT_CONFIG` when it exists
    and no `addrs` are given) under `addrs` and `options`, which win. A relative
    `key_file` is made absolute here, once, as the mount helper makes it (a forked
    worker connects again later, maybe from another directory)."""
    path = config if config is not None else os.environ.get("TESSERA_CONFIG") or None
    if path is None and addrs is None and os.path.exists(DEFAULT_CONFIG):
        path = DEFAULT_CONFIG
    settings = _read_config(path) if path is not None else {}
    from_file = settings.pop("meta_addr", None)
    if addrs is None:
        addrs = from_file
    if addrs is None:
        read = f"{os.fsdecode(path)} has no meta_addr" if path is not None else \
            f"no configuration file (config=FILE, TESSERA_CONFIG, or {DEFAULT_CONFIG})"
        raise _NoAddress(f"connect needs the metadata server's HOST:PORT: give addrs "
                         f"({read})")
    settings.update(options)
    key = settings.get("key_file")
    if isinstance(key, (str, bytes, os.PathLike)) and os.fspath(key):
        settings["key_file"] = os.path.abspath(os.fsdecode(key))
    return addrs, settings


def connect(addrs=None, *, config=None, **options) -> Tessera:
    """Connects to the cluster whose metadata server listens at `addrs` ("HOST:PORT", a
    comma-separated list, or a list of them).

    `options` are the client's settings by name (those of the client configuration file,
    e.g. `io_buffers=64`, `readahead_max_bytes=...`), plus `threads` (the native runtime's
    threads) and `parallel` (files `read_many` fetches at once). A client configuration
    file (the mount's TOML: `config`, else `$TESSERA_CONFIG`, else
    `/etc/tessera/client.toml` when no `addrs` are given) sets the address (`meta_addr`)
    and settings (`key_file`, ...) that `addrs` and `options` do not.
    """
    addrs, options = _configured(addrs, config, options)
    return Tessera(addrs, options)

