"""Directory calls and the exceptions `os` would raise, with errno and filename."""

import errno
import os
import stat

import pytest


def test_stat_listdir_scandir(fs, base):
    fs.makedirs(f"{base}/d/e")
    fs.write_bytes(f"{base}/d/f", b"12345")
    st = fs.stat(f"{base}/d/f")
    assert stat.S_ISREG(st.st_mode) and st.st_size == 5 and st.st_nlink == 1
    assert st.st_mtime_ns > 0 and abs(st.st_mtime - st.st_mtime_ns / 1e9) < 1e-3
    assert stat.S_ISDIR(fs.stat(f"{base}/d").st_mode)
    assert sorted(fs.listdir(f"{base}/d")) == ["e", "f"]
    entries = {e.name: e for e in fs.scandir(f"{base}/d")}
    assert entries["e"].is_dir() and not entries["e"].is_file()
    assert entries["f"].is_file() and entries["f"].path == f"{base}/d/f"
    assert entries["f"].stat().st_size == 5
    assert os.fspath(entries["f"]) == f"{base}/d/f"
    # The attributes came with the listing (read_dir_plus), and are lstat's.
    fs.symlink("f", f"{base}/d/l")
    entries = {e.name: e for e in fs.scandir(f"{base}/d")}
    for name in ("e", "f", "l"):
        assert entries[name]._stat is not None, name
        got, want = entries[name].stat(follow_symlinks=False), fs.lstat(f"{base}/d/{name}")
        assert (got.st_ino, got.st_mode, got.st_size) == (want.st_ino, want.st_mode,
                                                          want.st_size), name
    assert stat.S_ISLNK(entries["l"].stat(follow_symlinks=False).st_mode)
    assert entries["l"].stat().st_size == 5 and entries["l"].is_file()
    fs.remove(f"{base}/d/l")
    assert fs.exists(f"{base}/d/f") and not fs.exists(f"{base}/d/g")
    assert fs.isdir(f"{base}/d") and fs.isfile(f"{base}/d/f") and not fs.isdir(f"{base}/d/f")
    walked = {d: (sorted(ds), sorted(fl)) for d, ds, fl in fs.walk(f"{base}/d")}
    assert walked == {f"{base}/d": (["e"], ["f"]), f"{base}/d/e": ([], [])}
    # Relative paths are from the root; "." and ".." resolve lexically.
    assert fs.stat(f"{base}/d/./e/../f".lstrip("/")).st_ino == st.st_ino


def test_makedirs_mkdir_rename_remove(fs, base):
    fs.makedirs(f"{base}/a/b/c")
    fs.makedirs(f"{base}/a/b/c", exist_ok=True)
    with pytest.raises(FileExistsError):
        fs.makedirs(f"{base}/a/b/c")
    fs.write_bytes(f"{base}/a/x", b"old")
    fs.write_bytes(f"{base}/a/y", b"new")
    fs.replace(f"{base}/a/y", f"{base}/a/x")  # over an existing file
    assert fs.read_bytes(f"{base}/a/x") == b"new" and not fs.exists(f"{base}/a/y")
    fs.rename(f"{base}/a/b", f"{base}/b2")  # a whole directory
    assert fs.listdir(f"{base}/b2") == ["c"]
    fs.rmdir(f"{base}/b2/c")
    fs.rmdir(f"{base}/b2")
    fs.unlink(f"{base}/a/x")
    assert fs.listdir(f"{base}/a") == []
    fs.symlink(f"{base}/a", f"{base}/link")
    assert fs.readlink(f"{base}/link") == f"{base}/a"
    assert stat.S_ISLNK(fs.lstat(f"{base}/link").st_mode)
    assert stat.S_ISDIR(fs.stat(f"{base}/link").st_mode)


def _raises(exc, fn, path, code, path2=None):
    with pytest.raises(exc) as e:
        fn()
    assert e.value.errno == code, e.value
    assert e.value.filename == path
    if path2 is not None:
        assert e.value.filename2 == path2
    return e.value


def test_errors_are_the_os_exceptions(fs, base):
    fs.makedirs(f"{base}/dir/sub")
    fs.write_bytes(f"{base}/file", b"x")
    missing = f"{base}/missing"
    _raises(FileNotFoundError, lambda: fs.open(missing), missing, errno.ENOENT)
    _raises(FileNotFoundError, lambda: fs.stat(missing), missing, errno.ENOENT)
    _raises(FileNotFoundError, lambda: fs.listdir(missing), missing, errno.ENOENT)
    _raises(FileNotFoundError, lambda: fs.read_bytes(missing), missing, errno.ENOENT)
    _raises(FileNotFoundError, lambda: fs.remove(missing), missing, errno.ENOENT)
    _raises(FileNotFoundError, lambda: fs.open(f"{missing}/x", "wb"), f"{missing}/x",
            errno.ENOENT)
    _raises(FileNotFoundError, lambda: fs.rename(missing, f"{base}/z"), missing,
            errno.ENOENT, f"{base}/z")
    _raises(FileExistsError, lambda: fs.open(f"{base}/file", "xb"), f"{base}/file",
            errno.EEXIST)
    _raises(FileExistsError, lambda: fs.mkdir(f"{base}/dir"), f"{base}/dir", errno.EEXIST)
    _raises(IsADirectoryError, lambda: fs.open(f"{base}/dir", "wb"), f"{base}/dir",
            errno.EISDIR)
    _raises(IsADirectoryError, lambda: fs.remove(f"{base}/dir"), f"{base}/dir",
            errno.EISDIR)
    _raises(NotADirectoryError, lambda: fs.listdir(f"{base}/file"), f"{base}/file",
            errno.ENOTDIR)
    _raises(NotADirectoryError, lambda: fs.stat(f"{base}/file/x"), f"{base}/file/x",
            errno.ENOTDIR)
    _raises(NotADirectoryError, lambda: fs.rmdir(f"{base}/file"), f"{base}/file",
            errno.ENOTDIR)
    e = _raises(OSError, lambda: fs.rmdir(f"{base}/dir"), f"{base}/dir", errno.ENOTEMPTY)
    assert "not empty" in str(e).lower()
    # A local directory raises the same classes for the same calls.
    assert issubclass(FileNotFoundError, OSError)


def test_connect_refuses_bad_settings(meta_addr, key_file):
    import tessera

    with pytest.raises(ValueError):
        tessera.connect(meta_addr, key_file=key_file, no_such_setting=1)
    with pytest.raises(ValueError):
        tessera.connect(meta_addr, key_file=key_file, parallel=0)
    with pytest.raises(ValueError):
        tessera.connect([])
    fs = tessera.connect(meta_addr, key_file=key_file, parallel=4, threads=2)
    assert fs.listdir("/") is not None
