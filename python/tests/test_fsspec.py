"""The fsspec file system: by protocol name (the package's entry point) and by URL."""

import fsspec
import pytest

from tessera.filesystem import TesseraFileSystem


def test_filesystem_by_name(meta_addr, key_file, base):
    fs = fsspec.filesystem("tessera", addrs=meta_addr, key_file=key_file)
    assert isinstance(fs, TesseraFileSystem)
    fs.pipe(f"{base}/x/a.txt", b"alpha")  # parents made, as object stores do
    fs.pipe({f"{base}/x/b.txt": b"beta", f"{base}/x/c.bin": b"\0" * 1000})
    assert fs.ls(f"{base}/x", detail=False) == [f"{base}/x/a.txt", f"{base}/x/b.txt",
                                                f"{base}/x/c.bin"]
    info = fs.info(f"{base}/x/c.bin")
    assert info["type"] == "file" and info["size"] == 1000 and info["name"] == f"{base}/x/c.bin"
    assert fs.info(f"{base}/x")["type"] == "directory"
    detail = {d["name"]: d for d in fs.ls(f"{base}/x")}
    assert detail[f"{base}/x/a.txt"]["size"] == 5
    assert fs.cat(f"{base}/x/a.txt") == b"alpha"
    assert fs.cat_file(f"{base}/x/a.txt", start=1, end=3) == b"lp"
    assert fs.cat_file(f"{base}/x/a.txt", start=-2) == b"ha"
    assert fs.cat([f"{base}/x/a.txt", f"{base}/x/b.txt"]) == {
        f"{base}/x/a.txt": b"alpha", f"{base}/x/b.txt": b"beta"}
    with fs.open(f"{base}/x/d.txt", "wb") as f:
        f.write(b"delta")
    with fs.open(f"{base}/x/d.txt", "rb") as f:
        assert f.read() == b"delta"
    fs.mv(f"{base}/x/d.txt", f"{base}/x/e.txt")
    assert not fs.exists(f"{base}/x/d.txt") and fs.cat(f"{base}/x/e.txt") == b"delta"
    fs.mv(f"{base}/x", f"{base}/y")  # a directory, atomically
    assert sorted(fs.find(f"{base}/y")) == [f"{base}/y/{n}" for n in
                                            ("a.txt", "b.txt", "c.bin", "e.txt")]
    fs.rm(f"{base}/y/a.txt")
    assert not fs.exists(f"{base}/y/a.txt")
    fs.mkdir(f"{base}/z/deep")
    fs.rm(f"{base}/y", recursive=True)
    assert fs.ls(base, detail=False) == [f"{base}/z"]
    with pytest.raises(FileNotFoundError):
        fs.info(f"{base}/nothing")
    with pytest.raises(FileNotFoundError):
        fs.cat(f"{base}/nothing")


def test_url(meta_addr, key_file, base, fs):
    url = f"tessera://{meta_addr}{base}/u.txt"
    with fsspec.open(url, "wt", key_file=key_file) as f:
        f.write("via a URL\n")
    assert fs.read_bytes(f"{base}/u.txt") == b"via a URL\n"
    with fsspec.open(url, "rb", key_file=key_file) as f:
        assert f.read() == b"via a URL\n"
    ufs, path = fsspec.core.url_to_fs(url, key_file=key_file)
    assert isinstance(ufs, TesseraFileSystem) and path == f"{base}/u.txt"
    assert ufs.info(path)["size"] == 10
    assert TesseraFileSystem._strip_protocol(url) == f"{base}/u.txt"
    assert ufs.unstrip_protocol(path) == url


def test_rm_never_follows_a_link_and_a_dangling_link_lists(meta_addr, key_file, base, fs):
    ffs = fsspec.filesystem("tessera", addrs=meta_addr, key_file=key_file)
    fs.makedirs(f"{base}/important")
    fs.write_bytes(f"{base}/important/keep", b"keep")
    fs.makedirs(f"{base}/scratch/sub")
    fs.write_bytes(f"{base}/scratch/sub/f", b"f")
    fs.symlink(f"{base}/important", f"{base}/scratch/link")
    fs.symlink(f"{base}/nowhere", f"{base}/scratch/dangling")
    listed = {d["name"]: d for d in ffs.ls(f"{base}/scratch")}
    assert listed[f"{base}/scratch/link"]["islink"]
    assert listed[f"{base}/scratch/link"]["type"] == "directory"  # its target's, as local
    assert listed[f"{base}/scratch/dangling"]["type"] == "other"
    assert ffs.info(f"{base}/scratch/dangling")["islink"]
    ffs.rm(f"{base}/scratch", recursive=True)
    assert not fs.exists(f"{base}/scratch")
    assert fs.read_bytes(f"{base}/important/keep") == b"keep"  # the link's target stays
