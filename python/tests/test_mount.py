"""The package and a FUSE mount of the same cluster see each other's files."""

import os
import time

import numpy as np

#: How long a rename by one client may stay unseen by another: the names a client
#: caches live for entry_ttl_ms (1 s by default, the kernel's and the package's alike),
#: plus a margin for a loaded machine.
SEEN_WITHIN_S = 3.0


def eventually(check) -> bool:
    """Whether `check()` holds within SEEN_WITHIN_S (polled every 50 ms)."""
    deadline = time.monotonic() + SEEN_WITHIN_S
    while True:
        if check():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_package_writes_mount_reads(fs, base, mount):
    data = os.urandom(3 << 20)
    with fs.open(f"{base}/from_pkg", "wb") as f:
        f.write(data)
    with open(f"{mount}{base}/from_pkg", "rb") as f:
        assert f.read() == data
    assert os.stat(f"{mount}{base}/from_pkg").st_size == len(data)


def test_mount_writes_package_reads(fs, base, mount):
    data = os.urandom((2 << 20) + 12345)
    with open(f"{mount}{base}/from_mount", "wb") as f:
        f.write(data)
    assert fs.read_bytes(f"{base}/from_mount") == data
    assert fs.stat(f"{base}/from_mount").st_size == len(data)
    os.mkdir(f"{mount}{base}/dir")
    assert "dir" in fs.listdir(base)


def test_renames_are_seen_both_ways(fs, base, mount):
    fs.write_bytes(f"{base}/a", b"first")
    assert open(f"{mount}{base}/a", "rb").read() == b"first"
    fs.rename(f"{base}/a", f"{base}/b")
    # The mount looked `a` up above: it may answer from the kernel's cache for a while.
    assert eventually(lambda: not os.path.exists(f"{mount}{base}/a"))
    assert open(f"{mount}{base}/b", "rb").read() == b"first"
    assert fs.exists(f"{base}/b")
    os.rename(f"{mount}{base}/b", f"{mount}{base}/c")
    assert eventually(lambda: not fs.exists(f"{base}/b"))
    assert fs.read_bytes(f"{base}/c") == b"first"
    # A replacing rename by the mount, read by the package: the new content.
    with open(f"{mount}{base}/tmp", "wb") as f:
        f.write(b"second")
    os.replace(f"{mount}{base}/tmp", f"{mount}{base}/c")
    assert fs.read_bytes(f"{base}/c") == b"second"


def test_numpy_file_through_the_mount(fs, base, mount):
    arr = np.arange(100000, dtype=np.int64)
    with fs.open(f"{base}/arr.npy", "wb") as f:
        np.save(f, arr)
    assert np.array_equal(np.load(f"{mount}{base}/arr.npy"), arr)
