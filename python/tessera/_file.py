"""`TesseraFile`: an open Tessera file as a Python binary file object (`io.RawIOBase`).

The native file does positioned reads and writes; this class keeps the position and
the mode, as the kernel does for a descriptor, so that `pickle`, `numpy.save`/`load`,
`torch.save`/`load` and `io.Buffered*` use it like a local file.
"""

from __future__ import annotations

import errno
import io
import operator
import os
import threading
import warnings

from . import _client

#: The buffer of `io.BufferedReader`/`Writer` around a Tessera file when `open` is not
#: told a size. Python's default (8 KiB) would make each native call, which releases and
#: takes the GIL and may wait on the network, carry very little; 1 MiB amortizes that
#: while staying small next to the native client's own segment buffers.
DEFAULT_BUFFER_SIZE = 1 << 20

#: The largest position a file has (`off_t`'s largest value, as for a local file).
MAX_OFFSET = (1 << 63) - 1


def parse_mode(mode: str) -> dict:
    """The open flags and the Python-side mode of `mode` ("rb", "w+", "xb", "ab", ...),
    refused with ValueError as the built-in `open` refuses it."""
    chars = set(mode)
    if len(chars) != len(mode) or not chars <= set("rwxab+t"):
        raise ValueError(f"invalid mode: {mode!r}")
    kinds = chars & set("rwxa")
    if len(kinds) != 1:
        raise ValueError("must have exactly one of create/read/write/append mode")
    if "b" in chars and "t" in chars:
        raise ValueError("can't have text and binary mode at once")
    kind = kinds.pop()
    plus = "+" in chars
    return {
        "read": kind == "r" or plus,
        "write": kind != "r" or plus,
        "append": kind == "a",
        "create": kind in "wa",
        "create_new": kind == "x",
        "truncate": kind == "w",
        "binary": "b" in chars,
        # As FileIO names its modes: a file open for reading and writing that is
        # neither created new nor appended to is "rb+" ("w+b" included).
        "raw_mode": ({"r": "rb", "w": "rb", "x": "xb", "a": "ab"}[kind] + "+") if plus
        else {"r": "rb", "w": "wb", "x": "xb", "a": "ab"}[kind],
    }


class TesseraFile(io.RawIOBase):
    """An open Tessera file (unbuffered, binary). Made by `Tessera.open`.

    `close()` raises a write that failed in the background (as `close(2)` reports it);
    `sync()` is `fsync`. There is no descriptor: `fileno()` raises
    `io.UnsupportedOperation`.
    """

    def __init__(self, fs: "_client.Tessera", native, name: str, flags: dict):
        super().__init__()
        self._fs = fs
        self._native = native
        self._pid = os.getpid()
        self.name = name
        self.mode = flags["raw_mode"]
        self._readable = flags["read"]
        self._writable = flags["write"]
        self._append = flags["append"]
        # Append mode starts at the end, as FileIO's does (tell() says where writes go).
        self._pos = native.len() if flags["append"] else 0
        # The position is shared state of the file object, as a descriptor's offset is:
        # a read or write and the move of the position happen as one.
        self._lock = threading.Lock()
        _client._register(self)

    # Fork safety: see _client._after_fork_in_child.
    def _forget_native(self) -> None:
        if self._native is not None:
            _client._FORKED.append(self._native)
        self._native = None
        self._lock = threading.Lock()  # another thread may have held it at the fork

    def _file(self):
        if self._native is None:
            if self.closed:
                raise ValueError("I/O operation on closed file")
            raise OSError(errno.EBADF, "a Tessera file does not survive fork(): open it again "
                          "in the child", self.name)
        return self._native

    # What the file allows.

    def readable(self) -> bool:
        self._checkClosed()
        return self._readable

    def writable(self) -> bool:
        self._checkClosed()
        return self._writable

    def seekable(self) -> bool:
        self._checkClosed()
        return True

    # Reads.

    def readinto(self, b) -> int:
        """Reads into `b` from the position; a read of 4 MiB or more is lent to the
        transport, as `Tessera.read_into` says (`b` must keep its memory alive)."""
        self._checkClosed()
        if not self._readable:
            raise io.UnsupportedOperation("File not open for reading")
        with self._lock:
            n = self._file().read_at(b, self._pos)
            self._pos += n
            return n

    def readall(self) -> bytes:
        self._checkClosed()
        if not self._readable:
            raise io.UnsupportedOperation("File not open for reading")
        with self._lock:
            f = self._file()
            parts = []
            while True:
                want = max(f.len() - self._pos, 0)
                buf = bytearray(want if want else DEFAULT_BUFFER_SIZE)
                n = f.read_at(buf, self._pos)
                if n == 0:
                    break
                self._pos += n
                del buf[n:]
                parts.append(buf)
            return b"".join(parts)

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        self._checkClosed()
        if not self._readable:
            raise io.UnsupportedOperation("File not open for reading")
        # No more memory than the file has past the position (a large `size` on a small
        # file would otherwise allocate and zero all of it); a file another client grew
        # meanwhile gives its new bytes at the next read.
        with self._lock:
            left = max(self._file().len() - self._pos, 0)
        buf = bytearray(min(size, left))
        n = self.readinto(buf)
        del buf[n:]
        return bytes(buf)

    # Writes.

    def write(self, b) -> int:
        self._checkClosed()
        if not self._writable:
            raise io.UnsupportedOperation("File not open for writing")
        with self._lock:
            f = self._file()
            if self._append:
                # O_APPEND: every write goes to the end, wherever the position was.
                n = memoryview(b).nbytes
                at = f.append(b)
                self._pos = at + n
                return n
            n = f.write_at(b, self._pos)
            self._pos += n
            return n

    def truncate(self, size: int | None = None) -> int:
        self._checkClosed()
        if not self._writable:
            raise io.UnsupportedOperation("File not open for writing")
        with self._lock:
            size = self._pos if size is None else size
            if size < 0:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), self.name)
            self._file().set_len(size)
            return size

    # The position.

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        # As FileIO: an integer (TypeError otherwise, nothing moved).
        offset = operator.index(offset)
        self._checkClosed()
        with self._lock:
            if whence == io.SEEK_SET:
                base = 0
            elif whence == io.SEEK_CUR:
                base = self._pos
            elif whence == io.SEEK_END:
                base = self._file().len()
            else:
                raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
            pos = base + offset
            if pos < 0:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), self.name)
            if pos > MAX_OFFSET:
                # As FileIO, whose `off_t` cannot hold it; the position stays.
                raise OverflowError(f"seek to {pos}: past the largest file offset")
            self._pos = pos
            return pos

    def tell(self) -> int:
        self._checkClosed()
        return self._pos

    # Durability and close.

    def flush(self) -> None:
        """Sends buffered writes and commits the length: other clients and mounts see
        the bytes written so far after this."""
        self._checkClosed()
        if self._native is None or self._native.closed:
            return
        if self._writable:
            self._native.flush()

    def sync(self) -> None:
        """`fsync`: every byte written is durable on every copy when this returns."""
        self._checkClosed()
        self._file().sync_all()

    def stat(self) -> os.stat_result:
        """`os.fstat` of the open file."""
        self._checkClosed()
        return _client._stat_result(self._file().stat())

    def close(self) -> None:
        """Closes the file; raises OSError if a write failed in the background."""
        if self.closed:
            return
        try:
            if self._native is not None:
                self._native.close()
        finally:
            super().close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"mode={self.mode!r}"
        return f"<tessera.TesseraFile name={self.name!r} {state}>"


class _FlushingWriter(io.BufferedWriter):
    """A BufferedWriter whose flush() also flushes the raw file (CPython's does not):
    after it, other clients and mounts see the bytes, as the raw file's flush promises."""

    def flush(self) -> None:
        super().flush()
        if not self.raw.closed:
            self.raw.flush()


class _FlushingRandom(io.BufferedRandom):
    """The same for read-write files."""

    def flush(self) -> None:
        super().flush()
        if not self.raw.closed:
            self.raw.flush()


def open_file(fs, path: str, mode: str, buffering: int, encoding, errors, newline,
              closefd: bool = True, opener=None, name=None):
    """`Tessera.open`: the file object the built-in `open` would return for `mode`.
    `name`: what the file object's `name` says (the path as given, `bytes` too)."""
    flags = parse_mode(mode)
    binary = flags["binary"]
    if not closefd:
        raise ValueError("Cannot use closefd=False with file name")
    if opener is not None:
        raise ValueError("a Tessera file has no descriptor for an opener to make")
    if buffering < 0:
        buffering = -1
    if buffering == 1 and binary:
        warnings.warn("line buffering (buffering=1) isn't supported in binary mode, the "
                      "default buffer size will be used", RuntimeWarning, stacklevel=3)
    if binary and (encoding is not None or errors is not None or newline is not None):
        raise ValueError("binary mode doesn't take an encoding, errors or newline argument")
    if buffering == 0 and not binary:
        raise ValueError("can't have unbuffered text I/O")
    native = fs._native().open(
        path,
        read=flags["read"],
        write=flags["write"],
        append=flags["append"],
        create=flags["create"],
        create_new=flags["create_new"],
        truncate=flags["truncate"],
    )
    raw = TesseraFile(fs, native, path if name is None else name, flags)
    if buffering == 0:
        return raw
    size = DEFAULT_BUFFER_SIZE if buffering in (-1, 1) else buffering
    try:
        if flags["read"] and flags["write"]:
            buffered = _FlushingRandom(raw, size)
        elif flags["write"]:
            buffered = _FlushingWriter(raw, size)
        else:
            buffered = io.BufferedReader(raw, size)
        if binary:
            return buffered
        text = io.TextIOWrapper(buffered, encoding, errors, newline,
                                line_buffering=buffering == 1)
        text.mode = mode
        return text
    except BaseException:
        raw.close()
        raise
