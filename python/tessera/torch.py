"""PyTorch helpers: data sets over Tessera files, checkpoint `save`/`load`, and
`load_safetensors`.

Importing this module needs no torch: torch is imported when a torch class or function
is used. `TesseraDataset` and `TesseraIterableDataset` are made on first use as
subclasses of torch's `Dataset` and `IterableDataset`; `load_safetensors(...,
framework="np")` needs only numpy.

Every helper takes the file's cluster as `fs=` (a `tessera.Tessera`, or its address
"HOST:PORT" with client settings as keyword arguments) or from a `tessera://HOST:PORT/`
URL. The data sets keep the addresses and options, not threads: a DataLoader worker
(forked or spawned) connects on its first read.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from ._client import Tessera, _fspath, _split_url, _stat_result

#: Files `TesseraDataset` fetches ahead of the one asked for, in one `read_many`.
DEFAULT_PREFETCH = 32
#: Files `TesseraIterableDataset` fetches per `read_many`, the next batch being fetched
#: while the current one is consumed.
DEFAULT_BATCH_FILES = 32
#: The buffer of the writer `save` gives `torch.save`: tensors go out in writes this
#: large, which the native client sends as whole-segment writes to every chain at once.
SAVE_BUFFER_BYTES = 64 << 20
#: The buffer of the reader `load` gives `torch.load`: small records (the zip's headers,
#: small tensors) come many to a native call, while a large storage is read straight
#: into its tensor. `io.BufferedReader` reads the tail of a large read that is not a
#: whole number of buffers by filling its buffer and copying, so a large buffer costs a
#: copy of up to its size per storage, and the next storage's head comes from it too.
LOAD_BUFFER_BYTES = 256 << 10
#: The largest safetensors header read: the format's own reference implementation
#: refuses headers over 100 MB, so a larger length is a damaged or hostile file.
MAX_SAFETENSORS_HEADER_BYTES = 100_000_000
#: Reads `load_safetensors` has in flight at once (each releases the GIL).
SAFETENSORS_PARALLEL = 16
#: Tensors larger than this are read in pieces of this size, so that one large tensor
#: is fetched by all SAFETENSORS_PARALLEL reads at once (from every chain) instead of
#: one. Small enough that a few hundred MiB make many pieces, large enough that each
#: piece is whole segments.
SAFETENSORS_PIECE_BYTES = 8 << 20

_connections: dict = {}
_connections_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A lock held by another thread at the fork would stay held in the child.
    global _connections_lock
    _connections_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _resolve(path, fs, options: dict) -> tuple[Tessera, str]:
    """The connection and namespace path for `path` (a path with `fs`, or a URL)."""
    netloc, p = _split_url(_fspath(path))
    if fs is None:
        fs = netloc
    if fs is None:
        raise ValueError(f"{p!r}: give the cluster as fs=... or use a tessera://HOST:PORT/ URL")
    if isinstance(fs, Tessera):
        return fs, p
    key = (str(fs), tuple(sorted((k, str(v)) for k, v in options.items())))
    with _connections_lock:
        conn = _connections.get(key)
        if conn is None:
            conn = _connections[key] = Tessera(fs, options)
    return conn, p


def _import_torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - the message is the point
        raise ImportError("tessera.torch needs PyTorch for this (pip install torch); "
                          "load_safetensors(..., framework='np') works without it") from e
    return torch


def _list_files(fs: Tessera, source) -> list[str]:
    """The files of `source`: a list of paths as given, or every file under a folder
    (links to folders followed; a folder that cannot be listed raises), sorted (so
    every worker and rank sees the same order). In a folder, names that
    start with '.' are left out, files and directories alike: the temporary file of a
    `save` that was killed (`.NAME.tmp-...`), editors' and tools' own files, and a
    folder's metadata directories are not samples."""
    if isinstance(source, (str, os.PathLike)):
        top = _fspath(source)
        files = []

        def fail(e: OSError):
            # A folder that cannot be listed (a typo, EIO, no permission) is an error,
            # not a data set without its files.
            raise e

        # Links to folders are followed, as torchvision's ImageFolder walks.
        for d, dirs, names in fs.walk(top, onerror=fail, followlinks=True):
            dirs[:] = [n for n in dirs if not n.startswith(".")]
            base = d.rstrip("/")
            files.extend(f"{base}/{n}" for n in names if not n.startswith("."))
        return sorted(files)
    return [_fspath(p) for p in source]


class _Prefetcher:
    """Whole files fetched ahead in a background thread, `window` at a time, kept until
    asked for. Made again in a forked child (threads do not survive fork). It holds the
    connection and the file list, not the data set (which holds it)."""

    def __init__(self, fs: Tessera, files: Sequence[str], as_tensor: bool, window: int):
        self.fs = fs
        self.files = files
        self.as_tensor = as_tensor
        self.window = window
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tessera-prefetch")
        # index -> the future of the batch that holds it
        self.pending: dict = {}
        # The index asked for last.
        self.last = None

    def _fetch(self, indices: list[int]) -> dict:
        try:
            data = _read_files(self.fs, [self.files[i] for i in indices], self.as_tensor)
        except OSError:
            return {}  # each file is read again alone, so its own error is raised
        return dict(zip(indices, data))

    def get(self, index: int):
        with self.lock:
            fut = self.pending.pop(index, None)
            # Fetch ahead only while the reads go in order (the first read counts as
            # such): after a jump, a window of files nobody asks for would be wasted.
            in_order = self.last is None or index == self.last + 1
            self.last = index
            ahead = [i for i in range(index + 1, min(index + 1 + self.window, len(self.files)))
                     if i not in self.pending] if in_order else []
            # Start the next batch only once most of the window is used up, so reads go
            # out in batches and not one file at a time.
            if len(ahead) >= self.window // 2 and ahead:
                batch = self.pool.submit(self._fetch, ahead)
                for i in ahead:
                    self.pending[i] = batch
            if len(self.pending) > 4 * self.window:
                # Random access left stale entries: forget the oldest.
                for k in list(self.pending)[: len(self.pending) - 2 * self.window]:
                    del self.pending[k]
        if fut is not None:
            data = fut.result().get(index)
            if data is not None:
                return data
        return _read_one(self.fs, self.files[index], self.as_tensor)


#: The shared memory that one read of a DataLoader worker's files carves their tensors
#: from (a larger file gets a segment of its own). Pages are allocated only when
#: written, so the unused rest costs no memory; a segment lives while any of its
#: tensors does.
SHARED_SEGMENT_BYTES = 64 << 20


class _Tensors:
    """uint8 tensors for whole files to be read into. In a DataLoader worker they are
    views of segments of shared memory, as torch's own collate makes a worker's batch:
    a tensor then reaches the main process as a handle to its segment, with no copy
    (torch would first copy a tensor in private memory into shared memory; `bytes` are
    pickled through a pipe). One segment for many files, not one each: the main process
    keeps an open file descriptor per segment it holds (torch's default sharing
    strategy), and a segment per file, at 128 files a batch, 4 workers and 2 batches
    each in flight, reaches the usual limit of 1,024."""

    def __init__(self):
        self.torch = _import_torch()
        self.shared = self.torch.utils.data.get_worker_info() is not None
        self.segment = None
        self.used = 0
        self.made = []

    def take(self, length: int):
        """A writable buffer over a new tensor of `length` bytes (torch tensors export
        none of their own, and `numpy()` needs numpy); the tensor goes to `made`."""
        torch = self.torch
        if not self.shared:
            t = torch.empty(length, dtype=torch.uint8)
        else:
            if self.segment is None or self.used + length > self.segment.numel():
                storage = torch.UntypedStorage._new_shared(max(length, SHARED_SEGMENT_BYTES))
                self.segment = torch.empty(0, dtype=torch.uint8).set_(storage)
                self.used = 0
            t = self.segment[self.used:self.used + length]
            self.used += length
        self.made.append(t)
        # The native client holds the view's export for as long as a transfer may
        # write into it, which can outlast the call if a transfer outlived its read:
        # the array keeps the tensor (and so its memory) alive as long.
        view = (ctypes.c_ubyte * length).from_address(t.data_ptr())
        view._owner = t
        return memoryview(view).cast("B")


def _read_files(fs: Tessera, paths: list, as_tensor: bool) -> list:
    """The whole files: `bytes`, or with `as_tensor` uint8 tensors that the native
    client reads straight into (see `_Tensors`)."""
    if not as_tensor:
        return fs.read_many(paths)
    tensors = _Tensors()
    got = fs.read_many_into(paths, tensors.take)
    return [t if n == t.numel() else t[:n] for t, (_, n) in zip(tensors.made, got)]


def _read_one(fs: Tessera, path: str, as_tensor: bool):
    """One whole file as `_read_files` gives it; `bytes` in one call (`read_bytes`
    takes the GIL once, `read_many` twice)."""
    return _read_files(fs, [path], True)[0] if as_tensor else fs.read_bytes(path)


class _FileSource:
    """What both data sets keep: the connection (by address, for workers) and files."""

    def __init__(self, source, decode, fs, options, as_tensor: bool = False):
        if fs is None:
            raise ValueError("give the cluster as fs=tessera.connect(...) or fs='HOST:PORT'")
        self.fs, _ = _resolve("/", fs, options)
        self.files = _list_files(self.fs, source)
        self.decode = decode
        self.as_tensor = as_tensor

    def _read_many(self, paths: list) -> list:
        return _read_files(self.fs, paths, self.as_tensor)

    def _decode(self, data, path: str):
        return data if self.decode is None else self.decode(data)


class _MapDataset(_FileSource):
    """The torch-free part of `TesseraDataset`."""

    def __init__(self, source, decode: Callable | None = None, *, fs=None,
                 prefetch: int = DEFAULT_PREFETCH, as_tensor: bool = False, **options):
        super().__init__(source, decode, fs, options, as_tensor)
        self.prefetch = prefetch
        self._prefetcher = None

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        if index < 0:
            index += len(self.files)
        if not 0 <= index < len(self.files):
            raise IndexError(index)
        if self.prefetch <= 0:
            data = _read_one(self.fs, self.files[index], self.as_tensor)
        else:
            pf = self._prefetcher
            if pf is None or pf.pid != os.getpid():
                pf = self._prefetcher = _Prefetcher(self.fs, self.files, self.as_tensor,
                                                    self.prefetch)
            data = pf.get(index)
        return self._decode(data, self.files[index])

    def __getitems__(self, indices: list) -> list:
        # What a DataLoader worker asks for a whole batch (torch 2.0 and later): one
        # parallel read_many of exactly those files.
        idx = [i + len(self.files) if i < 0 else i for i in indices]
        for i in idx:
            if not 0 <= i < len(self.files):
                raise IndexError(i)
        data = self._read_many([self.files[i] for i in idx])
        return [self._decode(d, self.files[i]) for i, d in zip(idx, data)]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_prefetcher"] = None
        return state


def shard_of(files: Sequence[str], rank: int, world_size: int, worker: int,
             workers: int, drop_last: bool = False) -> list[str]:
    """The files one DataLoader worker of one rank reads. Every rank gets the same number
    of files, as DistributedSampler gives (a rank with fewer batches would leave the loop
    while the others wait in their next collective): the list is padded by wrapping
    around to a multiple of `world_size` (or, with `drop_last`, cut to one), then dealt
    out every `world_size`-th file; a rank's files are dealt out to its workers the same
    way. Without padding the shards are disjoint and together every file."""
    if not (0 <= rank < world_size and 0 <= worker < workers):
        raise ValueError(f"rank {rank}/{world_size}, worker {worker}/{workers}")
    files = list(files)
    if drop_last:
        files = files[: len(files) - len(files) % world_size]
    elif files and len(files) % world_size:
        want = -(-len(files) // world_size) * world_size
        files = (files * (want // len(files) + 1))[:want]
    return files[rank::world_size][worker::workers]


def _rank_and_world(rank, world_size) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class _IterDataset(_FileSource):
    """The torch-free part of `TesseraIterableDataset`."""

    def __init__(self, source, decode: Callable | None = None, *, fs=None, rank=None,
                 world_size=None, shuffle: bool = False, seed: int = 0,
                 batch_files: int = DEFAULT_BATCH_FILES, drop_last: bool = False,
                 as_tensor: bool = False, **options):
        super().__init__(source, decode, fs, options, as_tensor)
        self.rank, self.world_size = rank, world_size
        self.drop_last = drop_last
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.batch_files = max(1, batch_files)

    def set_epoch(self, epoch: int) -> None:
        """Shuffles differently in each epoch (with `shuffle=True`)."""
        self.epoch = epoch

    def _worker(self) -> tuple[int, int]:
        try:
            from torch.utils.data import get_worker_info
        except ImportError:
            return 0, 1
        info = get_worker_info()
        return (0, 1) if info is None else (info.id, info.num_workers)

    def shard(self) -> list[str]:
        """The files this process reads, in the order it reads them."""
        files = list(self.files)
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(files)
        rank, world = _rank_and_world(self.rank, self.world_size)
        worker, workers = self._worker()
        return shard_of(files, rank, world, worker, workers, self.drop_last)

    def __iter__(self):
        files = self.shard()
        batches = [files[i:i + self.batch_files] for i in range(0, len(files), self.batch_files)]
        if not batches:
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tessera-batch") as pool:
            nxt = pool.submit(self._read_many, batches[0])
            for i, batch in enumerate(batches):
                data = nxt.result()
                if i + 1 < len(batches):
                    nxt = pool.submit(self._read_many, batches[i + 1])
                for path, d in zip(batch, data):
                    yield self._decode(d, path)


_torch_classes: dict = {}


def __getattr__(name: str):
    # TesseraDataset and TesseraIterableDataset subclass torch's classes (DataLoader tells
    # an iterable data set by its class), so they are made when first asked for.
    if name not in ("TesseraDataset", "TesseraIterableDataset"):
        raise AttributeError(f"module 'tessera.torch' has no attribute {name!r}")
    cls = _torch_classes.get(name)
    if cls is None:
        data = _import_torch().utils.data
        if name == "TesseraDataset":
            bases, doc = (_MapDataset, data.Dataset), _MAP_DOC
        else:
            bases, doc = (_IterDataset, data.IterableDataset), _ITER_DOC
        cls = type(name, bases, {"__module__": __name__, "__doc__": doc})
        cls.__qualname__ = name
        _torch_classes[name] = cls
    return cls


_MAP_DOC = """A map-style data set over files: `ds[i]` is `decode(bytes of file i)`.

`TesseraDataset(source, decode=None, *, fs, prefetch=32, as_tensor=False, **options)`:
`source` is a list of paths or a folder (every file under it, sorted). While files are
asked for in order, asking for file i starts fetching files i+1 .. i+prefetch in one
parallel `read_many` in a background thread. A DataLoader worker asks for a whole batch at once
(`__getitems__`): its files are fetched by one `read_many`, and the DataLoader's own
`prefetch_factor` keeps the next batches coming.

With `as_tensor=True` a file's bytes come as a uint8 tensor (what `decode` gets, and
the item without one) that the native client reads into directly. In a DataLoader
worker the tensors of one read are views of one segment of shared memory, so they
reach the main process as a handle to it, with no copy of their bytes (`bytes` are
pickled through a pipe; a tensor in private memory is first copied into shared
memory). A segment lives while any of its tensors does.
"""

_ITER_DOC = """An iterable data set over files, sharded by rank and DataLoader worker.

`TesseraIterableDataset(source, decode=None, *, fs, rank=None, world_size=None,
shuffle=False, seed=0, batch_files=32, as_tensor=False, **options)`: each worker of each
rank reads every (world_size * workers)-th file from its own offset (rank and world size from
torch.distributed when it is initialized, else RANK and WORLD_SIZE, else 0 and 1), in
batches fetched by `read_many`, the next batch while the current one is consumed.
`as_tensor=True` gives each file as a uint8 tensor, as `TesseraDataset`'s does.
"""


def save(obj, path, fs=None, **options) -> None:
    """`torch.save(obj)` to `path` so that a crash never leaves a torn file there: the
    bytes go to a temporary name in the same directory in large writes, are fsynced,
    and the temporary file is renamed over `path` (atomic). On failure the temporary
    file is removed and `path` is as it was."""
    torch = _import_torch()
    conn, p = _resolve(path, fs, options)
    _atomic_write(conn, p, lambda f: torch.save(obj, f))


def _atomic_write(conn: Tessera, path: str, write: Callable) -> None:
    parent, _, name = path.rstrip("/").rpartition("/")
    tmp = f"{parent}/.{name}.tmp-{os.getpid()}-{random.getrandbits(32):08x}"
    f = conn.open(tmp, "xb", buffering=SAVE_BUFFER_BYTES)
    try:
        try:
            write(f)
            f.flush()
            f.raw.sync()
        finally:
            f.close()
        conn.rename(tmp, path)
    except BaseException:
        try:
            conn.remove(tmp)
        except OSError:
            pass
        raise


def load(path, fs=None, options: dict | None = None, **kw):
    """`torch.load` of `path` (read through a large buffer); `kw` go to `torch.load`
    (map_location, weights_only, ...), client settings in `options`."""
    torch = _import_torch()
    conn, p = _resolve(path, fs, options or {})
    with conn.open(p, "rb", buffering=LOAD_BUFFER_BYTES) as f:
        return torch.load(f, **kw)


# safetensors dtypes as numpy type strings (little-endian, as the format stores them).
_NP_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
# Types numpy lacks: read as raw integers of their width, viewed as torch's type. Signed
# 16-bit for bfloat16: torch before 2.3 cannot take a numpy uint16 array.
_TORCH_ONLY = {"BF16": ("<i2", "bfloat16"), "F8_E4M3": ("u1", "float8_e4m3fn"),
               "F8_E5M2": ("u1", "float8_e5m2")}


def parse_safetensors_header(head: bytes, file_size: int) -> tuple[int, dict]:
    """(where the data starts, the header's tensors) of a safetensors file whose first
    bytes are `head`; every tensor checked to lie inside the file with the size its
    dtype and shape say. Raises ValueError on a damaged header."""
    if len(head) < 8:
        raise ValueError("not a safetensors file: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", head[:8])
    if n > MAX_SAFETENSORS_HEADER_BYTES or 8 + n > file_size:
        raise ValueError(f"safetensors header of {n} bytes does not fit the file")
    if len(head) < 8 + n:
        raise ValueError("incomplete safetensors header")
    header = json.loads(bytes(head[8:8 + n]))
    if not isinstance(header, dict):
        raise ValueError("safetensors header is not a JSON object")
    start = 8 + n
    tensors = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = t["dtype"], t["shape"], t["data_offsets"]
        width = _width(dtype)
        count = 1
        for d in shape:
            count *= d
        if not (0 <= begin <= end and start + end <= file_size and end - begin == count * width):
            raise ValueError(f"tensor {name!r}: offsets {begin}..{end} do not fit its "
                             f"{dtype}{shape} or the file")
        tensors[name] = (dtype, list(shape), begin, end)
    return start, tensors


def _width(dtype: str) -> int:
    import numpy as np

    if dtype in _NP_DTYPES:
        return np.dtype(_NP_DTYPES[dtype]).itemsize
    if dtype in _TORCH_ONLY:
        return np.dtype(_TORCH_ONLY[dtype][0]).itemsize
    raise ValueError(f"unknown safetensors dtype {dtype!r}")


def load_safetensors(path, framework: str = "pt", fs=None, **options) -> dict:
    """The tensors of safetensors file `path` as a dict: numpy arrays
    (`framework="np"`, no torch needed) or CPU torch tensors (`"pt"`, made with
    `torch.from_numpy`, no copy). Each tensor is read straight into its preallocated
    array, many at once (no mmap, no intermediate bytes)."""
    import numpy as np

    if framework not in ("pt", "np"):
        raise ValueError(f"framework must be 'pt' or 'np', not {framework!r}")
    torch = _import_torch() if framework == "pt" else None
    conn, p = _resolve(path, fs, options)
    # One open for the header and every piece: a save renamed over `path` meanwhile
    # cannot mix two files' bytes (the open keeps the file it found).
    with conn.open(p, "rb", buffering=0) as f:
        return _load_safetensors_from(f._file(), p, np, torch)


def _load_safetensors_from(native, p: str, np, torch) -> dict:
    """`load_safetensors` of the open native file `native` (`p` names it in errors)."""

    def read_at(buf, offset: int) -> int:
        return native.read_at(buf, offset)

    size = _stat_result(native.stat()).st_size
    head = bytearray(min(size, 8 + 64 * 1024))
    read_at(head, 0)
    if len(head) >= 8:
        (n,) = struct.unpack("<Q", head[:8])
        if 8 + n > len(head) and n <= MAX_SAFETENSORS_HEADER_BYTES and 8 + n <= size:
            head = bytearray(8 + n)
            read_at(head, 0)
    start, tensors = parse_safetensors_header(head, size)

    arrays = {}
    for name, (dtype, shape, begin, end) in tensors.items():
        if dtype in _NP_DTYPES:
            arrays[name] = np.empty(shape, dtype=_NP_DTYPES[dtype])
        elif torch is not None:
            # Checked before any read: float8 came in torch 2.1.
            if not hasattr(torch, _TORCH_ONLY[dtype][1]):
                raise ValueError(f"tensor {name!r}: torch {torch.__version__} has no "
                                 f"{_TORCH_ONLY[dtype][1]} for {dtype}")
            arrays[name] = np.empty(shape, dtype=_TORCH_ONLY[dtype][0])
        else:
            raise ValueError(f"tensor {name!r}: numpy has no {dtype}; use framework='pt'")

    # (tensor, first byte, bytes) of every read: whole tensors, large ones in pieces.
    pieces = []
    for name, (_dtype, _shape, begin, end) in tensors.items():
        for off in range(0, end - begin, SAFETENSORS_PIECE_BYTES):
            pieces.append((name, off, min(SAFETENSORS_PIECE_BYTES, end - begin - off)))

    def fill(piece):
        name, off, n = piece
        dst = arrays[name].reshape(-1).view(np.uint8)[off:off + n]
        got = read_at(dst, start + tensors[name][2] + off)
        if got != n:
            raise OSError(f"{p}: tensor {name!r} read {got} of {n} bytes at {off}")

    with ThreadPoolExecutor(max_workers=SAFETENSORS_PARALLEL) as pool:
        list(pool.map(fill, pieces))
    if torch is None:
        return arrays
    out = {}
    for name, arr in arrays.items():
        dtype = tensors[name][0]
        t = torch.from_numpy(arr)
        if dtype in _TORCH_ONLY:
            t = t.view(getattr(torch, _TORCH_ONLY[dtype][1]))
        out[name] = t
    return out
