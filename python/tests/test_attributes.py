"""chmod, chown, utime, link, truncate and disk_usage of the client, each put beside the
same call of `os` (or `shutil`) on a local file; fsspec's `touch(truncate=False)`."""

import errno
import os
import shutil
import time

import pytest

from tessera.filesystem import TesseraFileSystem


def both(fs, base, tmp_path, data=b"0123456789"):
    """The same file, made locally and on the cluster: [(module-like, path), ...]."""
    local = str(tmp_path / "f")
    with open(local, "wb") as f:
        f.write(data)
    fs.write_bytes(f"{base}/f", data)
    return [(os, local), (fs, f"{base}/f")]


def test_chmod_and_chown(fs, base, tmp_path):
    for m, p in both(fs, base, tmp_path):
        m.chmod(p, 0o640)
        assert m.stat(p).st_mode & 0o7777 == 0o640
        m.chmod(p, 0o4755)
        assert m.stat(p).st_mode & 0o7777 == 0o4755
        if os.geteuid() == 0:
            m.chown(p, 1234, -1)  # as root, as this suite runs: a new owner
            st = m.stat(p)
            assert (st.st_uid, st.st_gid) == (1234, 0)
            # A chown clears the setuid bit, as on a local file system.
            assert st.st_mode & 0o7777 == 0o755
            m.chown(p, -1, 4321)
            assert (m.stat(p).st_uid, m.stat(p).st_gid) == (1234, 4321)
        with pytest.raises(FileNotFoundError):
            m.chmod(p + "-missing", 0o600)


def test_utime(fs, base, tmp_path):
    for m, p in both(fs, base, tmp_path):
        m.utime(p, (1.5, 2.25))
        st = m.stat(p)
        assert (st.st_atime_ns, st.st_mtime_ns) == (1_500_000_000, 2_250_000_000)
        m.utime(p, ns=(123_456_789_012, 987_654_321_098))
        st = m.stat(p)
        assert (st.st_atime_ns, st.st_mtime_ns) == (123_456_789_012, 987_654_321_098)
        m.utime(p, (-1, 7))  # before the epoch
        assert (m.stat(p).st_atime_ns, m.stat(p).st_mtime_ns) == (-10**9, 7 * 10**9)
        before = time.time_ns() - 2 * 10**9  # the server's clock, not quite ours
        m.utime(p)
        assert m.stat(p).st_mtime_ns >= before
        with pytest.raises(ValueError):
            m.utime(p, (1, 2), ns=(1, 2))
        with pytest.raises(FileNotFoundError):
            m.utime(p + "-missing")


def test_link(fs, base, tmp_path):
    for m, p in both(fs, base, tmp_path):
        m.link(p, p + "2")
        assert m.stat(p + "2").st_ino == m.stat(p).st_ino
        assert m.stat(p).st_nlink == 2
        with pytest.raises(FileExistsError):
            m.link(p, p + "2")
        with pytest.raises(FileNotFoundError):
            m.link(p + "-missing", p + "3")
        d = os.path.dirname(p) + "/d"
        m.mkdir(d)
        with pytest.raises(PermissionError):  # EPERM: no hard links to directories
            m.link(d, d + "2")


def test_truncate(fs, base, tmp_path):
    for m, p in both(fs, base, tmp_path):
        m.truncate(p, 4)
        assert m.stat(p).st_size == 4
        m.truncate(p, 6)
        read = (lambda q: open(q, "rb").read()) if m is os else fs.read_bytes
        assert read(p) == b"0123\0\0"
        with pytest.raises(OSError) as e:
            m.truncate(p, -1)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(FileNotFoundError):
            m.truncate(p + "-missing", 0)
        with pytest.raises(IsADirectoryError):
            m.truncate(os.path.dirname(p), 0)


def test_disk_usage(fs, base):
    u = fs.disk_usage(base)
    assert u.total > 0 and u.used + u.free == u.total
    assert type(u).__name__ == type(shutil.disk_usage("/")).__name__ == "usage"
    with pytest.raises(FileNotFoundError):
        fs.disk_usage(f"{base}/missing")


def test_fsspec_touch_without_truncate_sets_the_times(meta_addr, key_file, base, fs):
    tfs = TesseraFileSystem(addrs=meta_addr, key_file=key_file, skip_instance_cache=True)
    fs.write_bytes(f"{base}/t", b"kept")
    fs.utime(f"{base}/t", (1, 1))
    tfs.touch(f"{base}/t", truncate=False)
    assert fs.read_bytes(f"{base}/t") == b"kept"
    assert fs.stat(f"{base}/t").st_mtime > 1_000_000
    tfs.touch(f"{base}/new", truncate=False)  # missing: made empty
    assert fs.read_bytes(f"{base}/new") == b""
    tfs.touch(f"{base}/t")
    assert fs.read_bytes(f"{base}/t") == b""
