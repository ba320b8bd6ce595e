"""The data sets and the checkpoint writer without torch: prefetch, sharding, fork,
pickling, and atomic writes (also under kill -9)."""

import multiprocessing
import os
import pickle
import signal
import threading

import pytest
from conftest import kill_while_writing

from tessera.torch import _atomic_write, _IterDataset, _MapDataset, shard_of

#: Files of the data set tests: several prefetch windows.
FILES = 200
#: A forked or spawned child gets this long to answer before the test fails.
CHILD_TIMEOUT_S = 60
#: The parent's reads during the fork test: a bound, in case the child hangs.
BUSY_ROUNDS = 2000


def _make_files(fs, base, n=FILES):
    fs.makedirs(f"{base}/data/sub")
    paths = []
    for i in range(n):
        p = f"{base}/data/{'sub/' if i % 3 == 0 else ''}f{i:04}"
        fs.write_bytes(p, f"file {i} ".encode() * (i + 1))
        paths.append(p)
    return sorted(paths)


def test_map_dataset_reads_and_prefetches(fs, base):
    paths = _make_files(fs, base)
    ds = _MapDataset(f"{base}/data", decode=lambda b: b.decode(), fs=fs, prefetch=32)
    assert ds.files == paths and len(ds) == FILES
    assert ds[0] == fs.read_bytes(paths[0]).decode()
    # Asking for file 0 fetched the next ones in the background: remove one from the
    # cluster, and the data set still has it from the prefetch.
    pending = ds._prefetcher.pending
    assert set(range(1, 33)) <= set(pending)
    pending[5].result(timeout=CHILD_TIMEOUT_S)
    want5 = fs.read_bytes(paths[5]).decode()
    fs.remove(paths[5])
    assert ds[5] == want5
    for i in range(6, FILES):
        assert ds[i] == fs.read_bytes(paths[i]).decode(), i
    # A jump back starts no new window (random access would waste it).
    before = set(ds._prefetcher.pending)
    assert ds[50] == fs.read_bytes(paths[50]).decode()
    assert set(ds._prefetcher.pending) <= before
    # A batch, as a DataLoader worker asks for it: one read_many.
    batch = [7, 3, 190, -1]
    assert ds.__getitems__(batch) == [fs.read_bytes(paths[i]).decode() for i in batch]
    with pytest.raises(IndexError):
        ds.__getitems__([0, FILES])
    assert ds[-1] == ds[FILES - 1]
    with pytest.raises(IndexError):
        ds[FILES]
    # File 5 is gone now: asked again, its own error is raised, the others still read.
    with pytest.raises(FileNotFoundError):
        ds[5]
    assert ds[4] == fs.read_bytes(paths[4]).decode()


def test_sharding_covers_every_file_once(fs, base):
    files = [f"f{i}" for i in range(103)]
    # Divisible: every file exactly once.
    shards = [shard_of(files[:102], r, 2, w, 3) for r in range(2) for w in range(3)]
    seen = [f for s in shards for f in s]
    assert sorted(seen) == sorted(files[:102]) and len(seen) == 102
    # Not divisible: every rank the same count (DDP hangs otherwise), padded by
    # wrapping around, or cut with drop_last.
    for world in (2, 4, 7):
        per_rank = [sum((shard_of(files, r, world, w, 3) for w in range(3)), [])
                    for r in range(world)]
        assert len({len(p) for p in per_rank}) == 1, world
        seen = [f for p in per_rank for f in p]
        assert set(seen) == set(files) and len(seen) - len(files) < world
        cut = [sum((shard_of(files, r, world, w, 3, drop_last=True) for w in range(3)), [])
               for r in range(world)]
        assert len({len(p) for p in cut}) == 1
        assert len(set(f for p in cut for f in p)) == len(files) - len(files) % world
    with pytest.raises(ValueError):
        shard_of(files, 2, 2, 0, 1)
    paths = _make_files(fs, base, 40)
    got = []
    for rank in range(4):
        ds = _IterDataset(paths, decode=bytes.decode, fs=fs, rank=rank, world_size=4,
                          batch_files=3)
        part = list(ds)
        assert part == [fs.read_bytes(p).decode() for p in paths[rank::4]]
        got.extend(part)
    assert len(got) == 40
    shuffled = _IterDataset(paths, fs=fs, rank=0, world_size=1, shuffle=True, seed=1)
    first = shuffled.shard()
    shuffled.set_epoch(1)
    assert sorted(first) == sorted(shuffled.shard()) == paths
    assert first != shuffled.shard()


def _child_reads(conn, fs, ds, path):
    try:
        conn.send(("ok", fs.read_bytes(path), ds[3], os.getpid()))
    except BaseException as e:  # reported to the parent, which fails the test
        conn.send(("err", repr(e), None, os.getpid()))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_process_connects_again(fs, base, method):
    """A DataLoader worker's case: a connection and a data set made in the parent used
    in a forked child (the parent's threads are not there) and a spawned one."""
    paths = _make_files(fs, base, 10)
    ds = _MapDataset(paths, fs=fs, prefetch=4)
    assert ds[0] == fs.read_bytes(paths[0])  # the parent's prefetch thread runs
    # The parent keeps reading in another thread while it forks (as a training loop's
    # prefetch does while DataLoader workers start): locks and calls it holds at the
    # fork must not hang the child.
    stop = threading.Event()

    def busy():
        for _ in range(BUSY_ROUNDS):
            if stop.is_set():
                return
            fs.read_many(paths)

    reader = threading.Thread(target=busy)
    reader.start()
    ctx = multiprocessing.get_context(method)
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_child_reads, args=(child, fs, ds, paths[1]))
    try:
        p.start()
        assert parent.poll(CHILD_TIMEOUT_S), "the child did not answer"
        status, data, item, pid = parent.recv()
    finally:
        stop.set()
        reader.join()
        p.join(CHILD_TIMEOUT_S)
        if p.is_alive():
            p.kill()
    assert status == "ok", data
    assert pid != os.getpid()
    assert data == fs.read_bytes(paths[1]) and item == fs.read_bytes(paths[3])
    assert p.exitcode == 0
    # The parent's connection still works.
    assert ds[1] == data
    ds2 = pickle.loads(pickle.dumps(ds))
    assert ds2[2] == fs.read_bytes(paths[2])


def test_atomic_write_failure_leaves_the_old_file(fs, base):
    fs.write_bytes(f"{base}/ckpt", b"old checkpoint")

    def fails(f):
        f.write(b"x" * (3 << 20))
        raise RuntimeError("the writer failed")

    with pytest.raises(RuntimeError):
        _atomic_write(fs, f"{base}/ckpt", fails)
    assert fs.listdir(base) == ["ckpt"]  # the temporary file is gone
    assert fs.read_bytes(f"{base}/ckpt") == b"old checkpoint"
    _atomic_write(fs, f"{base}/ckpt", lambda f: f.write(b"new checkpoint"))
    assert fs.listdir(base) == ["ckpt"]
    assert fs.read_bytes(f"{base}/ckpt") == b"new checkpoint"


KILL_CHILD = r"""
import sys, tessera
from tessera.torch import _atomic_write
fs = tessera.connect(sys.argv[1], key_file=sys.argv[2])
block = b"n" * (1 << 20)
def slow(f):
    for i in range(10_000):  # 10 GiB at most; killed long before
        f.write(block)
        if i == 8:
            print("writing", flush=True)
_atomic_write(fs, sys.argv[3], slow)
print("done", flush=True)
"""


def test_kill_during_atomic_write_keeps_the_old_file(fs, base, meta_addr, key_file):
    old = os.urandom(1 << 20)
    fs.write_bytes(f"{base}/ckpt", old)
    status = kill_while_writing(KILL_CHILD, [meta_addr, key_file, f"{base}/ckpt"], "writing",
                                0.3, CHILD_TIMEOUT_S)
    assert status == -signal.SIGKILL
    assert fs.read_bytes(f"{base}/ckpt") == old
    # What the killed writer left is a temporary name beside it, never the final one.
    assert all(n == "ckpt" or n.startswith(".ckpt.tmp-") for n in fs.listdir(base))


def test_a_folder_data_set_leaves_out_hidden_names(fs, base):
    """The temporary file a killed `save` leaves (`.NAME.tmp-...`) and other names
    starting with '.' (files, and directories with what is under them) are not samples."""
    paths = _make_files(fs, base, n=6)
    fs.write_bytes(f"{base}/data/.model.pt.tmp-123-0000abcd", b"half a checkpoint")
    fs.makedirs(f"{base}/data/.cache/deeper")
    fs.write_bytes(f"{base}/data/.cache/deeper/x", b"not a sample")
    fs.write_bytes(f"{base}/data/sub/.DS_Store", b"not a sample")
    ds = _MapDataset(f"{base}/data", decode=bytes, fs=fs)
    assert ds.files == paths
    # A list of paths is taken as given, hidden or not.
    hidden = [f"{base}/data/.model.pt.tmp-123-0000abcd"]
    assert _MapDataset(hidden, decode=bytes, fs=fs).files == hidden
