"""chmod, chown, utime, link, truncate, extended attributes and disk_usage of the client,
each put beside the same call of `os` (or `shutil`) on a local file; fsspec's
`touch(truncate=False)`."""

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


def test_chmod(fs, base, tmp_path):
    for m, p in both(fs, base, tmp_path):
        m.chmod(p, 0o640)
        assert m.stat(p).st_mode & 0o7777 == 0o640
        m.chmod(p, 0o4755)
        assert m.stat(p).st_mode & 0o7777 == 0o4755
        with pytest.raises(FileNotFoundError):
            m.chmod(p + "-missing", 0o600)


# A file capability (vfs_cap_data revision 2: CAP_NET_BIND_SERVICE permitted), as
# `setcap cap_net_bind_service=p` writes it.
CAPABILITY = (0x02000000).to_bytes(4, "little") + (1 << 10).to_bytes(4, "little") + bytes(12)


@pytest.mark.skipif(os.geteuid() != 0, reason="a new owner needs root")
def test_chown_drops_setuid_and_capabilities(fs, base, tmp_path):
    for m, p in both(fs, base, tmp_path):
        m.chmod(p, 0o6755)
        m.setxattr(p, "security.capability", CAPABILITY)
        m.chown(p, 1234, -1)
        st = m.stat(p)
        assert (st.st_uid, st.st_gid) == (1234, 0)
        # Setuid, group-executable setgid and the capabilities go, even for root.
        assert st.st_mode & 0o7777 == 0o755
        with pytest.raises(OSError) as e:
            m.getxattr(p, "security.capability")
        assert e.value.errno == errno.ENODATA
        m.chown(p, -1, 4321)
        assert (m.stat(p).st_uid, m.stat(p).st_gid) == (1234, 4321)
        m.chown(p, 0xFFFF_FFFF, 0xFFFF_FFFF)  # (uid_t)-1 keeps, as -1
        assert (m.stat(p).st_uid, m.stat(p).st_gid) == (1234, 4321)
        m.chmod(p, 0o2644)  # setgid without group-exec: root keeps it
        m.chown(p, 0, 0)
        assert m.stat(p).st_mode & 0o7777 == 0o2644
        d = os.path.dirname(p) + "/d"
        m.mkdir(d)
        m.chmod(d, 0o6755)  # a directory keeps both
        m.chown(d, 1234, 1234)
        assert m.stat(d).st_mode & 0o7777 == 0o6755


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
        with pytest.raises(TypeError):
            m.utime(p, ns=None)
        with pytest.raises(TypeError):
            m.utime(p, [1, 2])
        with pytest.raises(FileNotFoundError):
            m.utime(p + "-missing")
    # Floats rounded as CPython rounds them, beside the epoch too.
    got = []
    for m, p in both(fs, base, tmp_path):
        row = []
        for t in (-1e-17, -0.5, -1.25, 0.1, 1.9999999999, 1_700_000_000.123456789):
            m.utime(p, (t, t))
            row.append(m.stat(p).st_mtime_ns)
        got.append(row)
    assert got[0] == got[1]
    with pytest.raises(OverflowError):
        fs.utime(f"{base}/f", ns=(10**40, 0))


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


def test_extended_attributes(fs, base, tmp_path):
    for m, p in both(fs, base, tmp_path):
        m.setxattr(p, "user.a", b"alpha")
        m.setxattr(p, b"user.b", bytearray(b"beta"))
        assert m.getxattr(p, "user.a") == b"alpha"
        assert sorted(m.listxattr(p)) == ["user.a", "user.b"]
        with pytest.raises(FileExistsError):
            m.setxattr(p, "user.a", b"again", os.XATTR_CREATE)
        with pytest.raises(OSError) as e:
            m.setxattr(p, "user.c", b"x", os.XATTR_REPLACE)
        assert e.value.errno == errno.ENODATA
        both_flags = os.XATTR_CREATE | os.XATTR_REPLACE
        with pytest.raises(FileExistsError):
            m.setxattr(p, "user.a", b"x", both_flags)
        with pytest.raises(OSError) as e:
            m.setxattr(p, "user.c", b"x", both_flags)
        assert e.value.errno == errno.ENODATA
        m.setxattr(p, "user.a", b"", os.XATTR_REPLACE)
        assert m.getxattr(p, "user.a") == b""
        m.removexattr(p, "user.a")
        with pytest.raises(OSError) as e:
            m.getxattr(p, "user.a")
        assert e.value.errno == errno.ENODATA
        with pytest.raises(OSError) as e:
            m.removexattr(p, "user.a")
        assert e.value.errno == errno.ENODATA
        with pytest.raises(OSError) as e:  # no such namespace
            m.setxattr(p, "nonsense.a", b"x")
        assert e.value.errno == errno.EOPNOTSUPP
        with pytest.raises(FileNotFoundError):
            m.getxattr(p + "-missing", "user.a")
        with pytest.raises(TypeError):  # a bytes-like value only
            m.setxattr(p, "user.n", 5)
        # A link's own: Linux keeps user.* off symlinks (EPERM), and reads through it.
        m.symlink(p, p + "-link")
        assert m.getxattr(p + "-link", "user.b") == b"beta"
        with pytest.raises(PermissionError):
            m.setxattr(p + "-link", "user.x", b"x", follow_symlinks=False)
        assert m.listxattr(p + "-link", follow_symlinks=False) == []


NO_ID = 0xFFFFFFFF
USER_OBJ, USER, GROUP_OBJ, MASK, OTHER = 0x01, 0x02, 0x04, 0x10, 0x20


def _acl(*entries):
    """A POSIX ACL's bytes as the kernel exchanges them: (tag, perm, id) entries."""
    out = (2).to_bytes(4, "little")
    for tag, perm, ident in entries:
        out += tag.to_bytes(2, "little") + perm.to_bytes(2, "little")
        out += ident.to_bytes(4, "little")
    return out


def test_posix_acls(fs, base, tmp_path):
    named = _acl(
        (USER_OBJ, 7, NO_ID),
        (USER, 7, 4242),
        (GROUP_OBJ, 5, NO_ID),
        (MASK, 5, NO_ID),
        (OTHER, 0, NO_ID),
    )
    for m, p in both(fs, base, tmp_path):
        m.chmod(p, 0o644)
        m.setxattr(p, "system.posix_acl_access", named)
        assert m.stat(p).st_mode & 0o777 == 0o750, "the ACL sets the mode"
        assert m.getxattr(p, "system.posix_acl_access") == named
        m.chmod(p, 0o700)
        after_chmod = _acl(
            (USER_OBJ, 7, NO_ID),
            (USER, 7, 4242),
            (GROUP_OBJ, 5, NO_ID),
            (MASK, 0, NO_ID),
            (OTHER, 0, NO_ID),
        )
        assert m.getxattr(p, "system.posix_acl_access") == after_chmod
        # One that says no more than a mode is not kept.
        m.setxattr(p, "system.posix_acl_access", _acl((1, 6, NO_ID), (4, 4, NO_ID), (32, 0, NO_ID)))
        assert m.stat(p).st_mode & 0o777 == 0o640
        with pytest.raises(OSError) as e:
            m.getxattr(p, "system.posix_acl_access")
        assert e.value.errno == errno.ENODATA
        with pytest.raises(OSError) as e:
            m.setxattr(p, "system.posix_acl_access", named[:-3])
        assert e.value.errno == errno.EINVAL
        # A directory's default is given to what is made in it, in place of the umask.
        d = p + "-dir"
        m.mkdir(d)
        m.setxattr(d, "system.posix_acl_default", named)
        m.mkdir(d + "/sub", 0o777)
        assert m.stat(d + "/sub").st_mode & 0o777 == 0o750
        assert m.getxattr(d + "/sub", "system.posix_acl_default") == named
        assert m.getxattr(d + "/sub", "system.posix_acl_access") == named
        with pytest.raises(PermissionError):  # only a directory has a default
            m.setxattr(p, "system.posix_acl_default", named)


def test_replicas_by_extended_attribute(fs, base):
    # A folder's layout settings, as `setfattr` sets them on a mount.
    fs.mkdir(f"{base}/scratch")
    fs.setxattr(f"{base}/scratch", "user.tessera.replicas", b"1")
    assert "user.tessera.replicas" in fs.listxattr(f"{base}/scratch")
    fs.mkdir(f"{base}/scratch/sub")  # a new subdirectory copies it
    assert fs.getxattr(f"{base}/scratch/sub", "user.tessera.replicas") == b"1"
    with pytest.raises(OSError) as e:
        fs.setxattr(f"{base}/scratch", "user.tessera.replicas", b"9")
    assert e.value.errno == errno.EINVAL
