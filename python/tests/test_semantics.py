"""The package against what `os`, the built-in `open` and fsspec's own file systems do,
call by call (found by an audit that ran each against a local file or LocalFileSystem):
`makedirs` where the ancestors are not the caller's, listings past broken links,
`mv` into directories, `walk`'s arguments, the errors of odd paths, and the raw file
object's `seek`, `read` and `flush`."""

import errno
import os
import subprocess
import tracemalloc
import uuid

import pytest

import tessera


@pytest.fixture
def squashed(tessera_bin, meta_addr, key_file, tmp_path):
    """A connection with a client key that is not an administrator's: uid 0 is mapped
    to nobody (root squash), as for any user's key. Revoked at the end."""
    name = f"semantics-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "user.key"
    cluster_key = os.path.join(os.path.dirname(key_file), "cluster.key")
    subprocess.run([tessera_bin, "key", "create", name, "--meta", meta_addr, "--key-file",
                    key_file, "--cluster-key-file", cluster_key, "--out", str(out)],
                   check=True, capture_output=True, timeout=60)
    try:
        yield tessera.connect(meta_addr, key_file=str(out))
    finally:
        subprocess.run([tessera_bin, "key", "revoke", name, "--meta", meta_addr,
                        "--key-file", key_file], capture_output=True, timeout=60)


@pytest.fixture
def ffs(meta_addr, key_file):
    fsspec = pytest.importorskip("fsspec")
    return fsspec.filesystem("tessera", addrs=meta_addr, key_file=key_file)


def test_makedirs_exist_ok_needs_no_write_permission_on_existing_ancestors(
        squashed, fs, base, mount):
    # base (made by the administrator) is root's, 0755; userdir is open to everyone.
    fs.makedirs(f"{base}/userdir")
    os.chmod(os.path.join(mount, base.lstrip("/"), "userdir"), 0o777)
    squashed.write_bytes(f"{base}/userdir/direct", b"x")  # the user may create here
    # os.makedirs(exist_ok=True) only makes what is missing, and an existing directory
    # is fine whoever owns its parent.
    squashed.makedirs(f"{base}/userdir", exist_ok=True)
    squashed.makedirs(f"{base}/userdir/sub/deeper", exist_ok=True)
    assert fs.isdir(f"{base}/userdir/sub/deeper")


def test_mkdir_of_an_existing_name_is_eexist_even_without_write_permission(
        squashed, fs, base):
    fs.makedirs(f"{base}/d")
    # Linux: mkdir(2) of an existing name fails with EEXIST before any permission check.
    with pytest.raises(FileExistsError):
        squashed.mkdir(f"{base}/d")


def test_fsspec_write_in_a_writable_directory_with_a_user_key(
        squashed, fs, base, mount, meta_addr):
    fsspec = pytest.importorskip("fsspec")
    fs.makedirs(f"{base}/userdir")
    os.chmod(os.path.join(mount, base.lstrip("/"), "userdir"), 0o777)
    ufs = fsspec.filesystem("tessera", addrs=meta_addr, skip_instance_cache=True,
                            **squashed.options)
    with ufs.open(f"{base}/userdir/f", "wb") as f:  # auto_mkdir: makedirs(parent)
        f.write(b"x")
    ufs.pipe_file(f"{base}/userdir/g", b"y")
    assert fs.read_bytes(f"{base}/userdir/g") == b"y"


def test_fsspec_ls_detail_survives_any_broken_link(ffs, fs, base):
    fs.write_bytes(f"{base}/f", b"x")
    fs.makedirs(f"{base}/sub")
    fs.write_bytes(f"{base}/sub/g", b"y")
    fs.symlink(f"{base}/f/x", f"{base}/sub/through_a_file")  # ENOTDIR when followed
    fs.symlink(f"{base}/sub/loop", f"{base}/sub/loop")  # ELOOP when followed
    names = {d["name"] for d in ffs.ls(f"{base}/sub", detail=True)}
    assert names == {f"{base}/sub/g", f"{base}/sub/through_a_file", f"{base}/sub/loop"}


def test_fsspec_find_does_not_drop_a_directory_with_a_broken_link(ffs, fs, base):
    fs.write_bytes(f"{base}/f", b"x")
    fs.makedirs(f"{base}/sub")
    fs.write_bytes(f"{base}/sub/g", b"y")
    fs.symlink(f"{base}/f/x", f"{base}/sub/through_a_file")
    assert f"{base}/sub/g" in ffs.find(base)
    assert ffs.glob(f"{base}/**/g") == [f"{base}/sub/g"]


def test_fsspec_mv_into_an_existing_directory(ffs, base):
    ffs.pipe_file(f"{base}/x/a.txt", b"a")
    ffs.makedirs(f"{base}/dir/sub")
    ffs.mv(f"{base}/x/a.txt", f"{base}/dir")  # LocalFileSystem and MemoryFileSystem
    assert ffs.cat(f"{base}/dir/a.txt") == b"a"


def test_fsspec_mv_directory_onto_an_existing_empty_directory_goes_inside(ffs, base):
    ffs.pipe_file(f"{base}/x/a.txt", b"a")
    ffs.makedirs(f"{base}/empty")
    ffs.mv(f"{base}/x", f"{base}/empty", recursive=True)
    assert ffs.find(base) == [f"{base}/empty/x/a.txt"]


def test_fsspec_mv_makes_missing_parents(ffs, base):
    ffs.pipe_file(f"{base}/x/a.txt", b"a")
    ffs.mv(f"{base}/x/a.txt", f"{base}/new/parent/a.txt")  # auto_mkdir, as for writes
    assert ffs.cat(f"{base}/new/parent/a.txt") == b"a"


def test_fsspec_mv_list_and_glob(ffs, base):
    ffs.pipe({f"{base}/x/a.txt": b"a", f"{base}/x/b.txt": b"b", f"{base}/x/c.bin": b"c"})
    ffs.makedirs(f"{base}/d1")
    ffs.makedirs(f"{base}/d2")
    ffs.mv([f"{base}/x/a.txt"], f"{base}/d1/")  # AbstractFileSystem.mv takes lists
    ffs.mv(f"{base}/x/*.txt", f"{base}/d2/")  # and globs
    assert ffs.find(base) == [f"{base}/d1/a.txt", f"{base}/d2/b.txt", f"{base}/x/c.bin"]


def test_fsspec_read_block(ffs, base):
    ffs.pipe_file(f"{base}/a.txt", b"alpha\nbeta\n")
    assert ffs.read_block(f"{base}/a.txt", 1, 2) == b"lp"
    assert ffs.read_block(f"{base}/a.txt", 0, 3, delimiter=b"\n") == b"alpha\n"


def test_fsspec_mkdir_of_an_existing_directory_raises(ffs, base):
    ffs.makedirs(f"{base}/d")
    with pytest.raises(FileExistsError):  # LocalFileSystem and MemoryFileSystem
        ffs.mkdir(f"{base}/d")


def test_fsspec_exists_is_false_on_any_error(ffs, fs, base):
    fs.symlink(f"{base}/loop", f"{base}/loop")
    assert ffs.exists(f"{base}/loop") is False  # AbstractFileSystem.exists


def test_exists_isdir_isfile_are_false_on_errors(fs, base):
    fs.symlink(f"{base}/loop", f"{base}/loop")
    assert fs.exists(f"{base}/loop") is False  # os.path.exists: ELOOP
    assert fs.isdir(f"{base}/loop") is False
    assert fs.isfile(f"{base}/loop") is False
    assert fs.exists(f"{base}/a\0b") is False  # os.path.exists: ValueError


def test_exists_is_false_without_search_permission(squashed, fs, base, mount):
    fs.makedirs(f"{base}/closed")
    os.chmod(os.path.join(mount, base.lstrip("/"), "closed"), 0o700)
    assert squashed.exists(f"{base}/closed/x") is False  # os.path.exists: EACCES


def test_walk_lists_a_link_to_a_directory_in_dirs_without_descending(fs, base, tmp_path):
    for mk, wr, ln, root in ((os.makedirs, lambda p, d: open(p, "wb").write(d), os.symlink,
                              str(tmp_path)),
                             (fs.makedirs, fs.write_bytes, fs.symlink, base)):
        mk(f"{root}/d")
        wr(f"{root}/d/f", b"x")
        ln(f"{root}/d", f"{root}/link")
    want = [(p[len(str(tmp_path)):], sorted(d), sorted(f)) for p, d, f in os.walk(tmp_path)]
    got = [(p[len(base):], sorted(d), sorted(f)) for p, d, f in fs.walk(base)]
    assert got == want  # [("", ["d", "link"], []), ("/d", [], ["f"])]


def test_walk_of_a_missing_directory_yields_nothing(fs, base):
    assert list(fs.walk(f"{base}/missing")) == []  # os.walk ignores errors by default
    fs.write_bytes(f"{base}/f", b"x")
    assert list(fs.walk(f"{base}/f")) == []


def test_walk_takes_os_walks_arguments(fs, base):
    fs.makedirs(f"{base}/a/b")
    assert [p for p, _, _ in fs.walk(base, topdown=False)] == [f"{base}/a/b", f"{base}/a",
                                                                base]


def test_walk_of_a_bytes_path_answers_bytes_and_prunes(fs, base, tmp_path):
    for mk, root in ((os.makedirs, str(tmp_path)), (fs.makedirs, base)):
        for d in ("a/x", "b/y", "c"):
            mk(f"{root}/{d}")

    def walk(w, root):
        out = []
        for p, dirs, files in w(os.fsencode(root)):
            assert all(isinstance(n, bytes) for n in [p, *dirs, *files])
            out.append((p[len(os.fsencode(root)):], sorted(dirs)))
            dirs[:] = [n for n in dirs if n != b"b"]  # pruned: b/y is not entered
        return sorted(out)

    want = walk(os.walk, str(tmp_path))
    assert want == [(b"", [b"a", b"b", b"c"]), (b"/a", [b"x"]), (b"/a/x", []), (b"/c", [])]
    assert walk(fs.walk, base) == want
    # Errors name bytes paths too.
    for w, root in ((os.walk, str(tmp_path)), (fs.walk, base)):
        errors = []
        assert list(w(os.fsencode(f"{root}/missing"), onerror=errors.append)) == []
        assert [e.filename for e in errors] == [os.fsencode(f"{root}/missing")]


def test_makedirs_errors(fs, base):
    fs.write_bytes(f"{base}/f", b"x")
    with pytest.raises(NotADirectoryError):  # os.makedirs: mkdir("f/x") is ENOTDIR
        fs.makedirs(f"{base}/f/x", exist_ok=True)
    fs.symlink(f"{base}/nowhere", f"{base}/dangling")
    with pytest.raises(FileExistsError):  # the name exists (a link)
        fs.makedirs(f"{base}/dangling")


def test_rename_with_a_trailing_slash_on_a_file(fs, base):
    fs.write_bytes(f"{base}/f", b"x")
    with pytest.raises(NotADirectoryError):
        fs.rename(f"{base}/f", f"{base}/g/")
    with pytest.raises(NotADirectoryError):
        fs.rename(f"{base}/f/", f"{base}/g")
    assert fs.listdir(base) == ["f"]


def test_empty_path_is_not_found(fs):
    with pytest.raises(FileNotFoundError):
        fs.stat("")
    with pytest.raises(FileNotFoundError):
        fs.listdir("")
    with pytest.raises(FileNotFoundError):
        fs.open("", "rb")
    assert fs.exists("") is False


def test_nul_in_a_path_is_a_value_error(fs, base):
    with pytest.raises(ValueError):  # os: "embedded null byte"
        fs.stat(f"{base}/a\0b")


def test_raw_flush_of_a_closed_file_raises(fs, base):
    f = fs.open(f"{base}/f", "wb", buffering=0)
    f.close()
    with pytest.raises(ValueError):  # IOBase.flush / FileIO.flush
        f.flush()


def test_raw_seek_takes_integers_only(fs, base):
    fs.write_bytes(f"{base}/f", b"hello")
    with fs.open(f"{base}/f", "rb", buffering=0) as f:
        with pytest.raises(TypeError):
            f.seek(1.5)
        assert f.tell() == 0 and f.read(1) == b"h"


@pytest.mark.parametrize("buffering", [0, -1], ids=["raw", "buffered"])
def test_seek_past_off_t_is_refused_and_leaves_the_position(fs, base, buffering):
    fs.write_bytes(f"{base}/f", b"hello")
    with fs.open(f"{base}/f", "r+b", buffering=buffering) as f:
        f.seek(2)
        # FileIO: OverflowError; the buffered objects: ValueError ("cannot fit 'int'
        # into an offset-sized integer"), as for a local file.
        with pytest.raises((OverflowError, ValueError)):
            f.seek(2**63)
        assert f.tell() == 2
        assert f.read() == b"llo"


def test_raw_read_does_not_commit_the_size_asked_for(fs, base):
    fs.write_bytes(f"{base}/f", b"12345")
    with fs.open(f"{base}/f", "rb", buffering=0) as f:
        tracemalloc.start()
        try:
            assert f.read(256 << 20) == b"12345"
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 1 << 20  # FileIO.read(256 MiB) of 5 bytes allocates no such buffer

def test_listdir_and_scandir_of_bytes_give_bytes(fs, base):
    fs.write_bytes(f"{base}/f", b"x")
    assert fs.listdir(base.encode()) == [b"f"]
    (e,) = list(fs.scandir(base.encode()))
    assert e.name == b"f" and e.path == base.encode() + b"/f"
    assert e.is_file() and e.stat().st_size == 1


def test_stat_of_a_name_longer_than_255_bytes_is_enametoolong(fs, base):
    with pytest.raises(OSError) as e:  # Linux: lookup of a 300-byte name
        fs.stat(f"{base}/" + "a" * 300)
    assert e.value.errno == errno.ENAMETOOLONG


def test_open_takes_any_negative_buffering_and_the_other_keywords(fs, base):
    fs.write_bytes(f"{base}/f", b"hello")
    with fs.open(f"{base}/f", "rb", buffering=-2) as f:  # built-in open: default size
        assert f.read() == b"hello"
    with fs.open(f"{base}/f", "rb", closefd=True, opener=None) as f:
        assert f.read() == b"hello"
    with pytest.raises(ValueError):  # built-in open of a name with closefd=False
        fs.open(f"{base}/f", "rb", closefd=False)


def test_mode_and_name_attributes(fs, base, tmp_path):
    for mode in ("w+b", "r+b", "a+b", "wb", "ab"):
        with open(tmp_path / "f", mode) as local, fs.open(f"{base}/f", mode) as remote:
            assert remote.mode == local.mode, mode  # FileIO: "rb+" for "w+b"
    with fs.open(f"{base}/f".encode(), "rb") as f:
        assert f.name == f"{base}/f".encode()  # open(bytes).name is the bytes


def test_binary_line_buffering_warns(fs, base):
    with pytest.warns(RuntimeWarning):
        fs.open(f"{base}/f", "wb", buffering=1).close()


def test_fsspec_mv_of_a_glob_keeps_the_paths_below_what_the_matches_share(ffs, base):
    ffs.pipe({f"{base}/x/a/f.txt": b"1", f"{base}/x/b/f.txt": b"2"})
    ffs.mv(f"{base}/x/*/f.txt", f"{base}/d/")  # AbstractFileSystem.mv: no flattening
    assert ffs.cat(f"{base}/d/a/f.txt") == b"1" and ffs.cat(f"{base}/d/b/f.txt") == b"2"


def test_fsspec_mv_takes_an_existing_name_that_looks_like_a_glob_as_itself(ffs, base):
    ffs.pipe_file(f"{base}/run[1].csv", b"r")
    ffs.pipe_file(f"{base}/run1.csv", b"other")
    ffs.mv(f"{base}/run[1].csv", f"{base}/new.csv")
    assert ffs.cat(f"{base}/new.csv") == b"r" and ffs.cat(f"{base}/run1.csv") == b"other"


def test_fsspec_mv_onto_itself_or_under_a_new_directory(ffs, base):
    ffs.pipe_file(f"{base}/d/f", b"x")
    ffs.mv(f"{base}/d", f"{base}/d")  # the same path: nothing moves
    ffs.mv(f"{base}/d/f", f"{base}/missing/")  # a trailing "/": into it, made
    assert ffs.cat(f"{base}/missing/f") == b"x"


def test_fsspec_pipe_file_create_never_truncates(ffs, base):
    ffs.pipe_file(f"{base}/f", b"kept")
    with pytest.raises(FileExistsError):
        ffs.pipe_file(f"{base}/f", b"new", mode="create")
    assert ffs.cat(f"{base}/f") == b"kept"


def test_walk_reports_what_it_cannot_list(fs, base):
    assert list(fs.walk("")) == []  # os.walk("") yields nothing
    fs.makedirs(f"{base}/a")
    seen = []
    for d, dirs, _ in fs.walk(base, onerror=seen.append):
        if d == base:
            dirs.append("added")  # os.walk lists it, fails, tells onerror
    assert [type(e) for e in seen] == [FileNotFoundError]


def test_a_data_set_folder_that_cannot_be_listed_is_an_error(fs, base):
    from tessera.torch import _list_files  # importable without torch

    with pytest.raises(FileNotFoundError):
        _list_files(fs, f"{base}/no-such-folder")
    fs.makedirs(f"{base}/shards/one")
    fs.write_bytes(f"{base}/shards/one/s0", b"x")
    fs.makedirs(f"{base}/elsewhere")
    fs.write_bytes(f"{base}/elsewhere/s1", b"y")
    fs.symlink(f"{base}/elsewhere", f"{base}/shards/two")  # followed, as ImageFolder does
    assert _list_files(fs, f"{base}/shards") == [f"{base}/shards/one/s0",
                                                 f"{base}/shards/two/s1"]


def test_rename_of_a_path_ending_in_a_dot_is_ebusy(fs, base, tmp_path):
    for mk, root, ren in ((os.makedirs, str(tmp_path), os.rename),
                          (fs.makedirs, base, fs.rename)):
        mk(f"{root}/a")
        got = []
        for src, dst in (("a/.", "b"), ("a/..", "b"), ("a", "."), ("missing/.", "b")):
            try:
                ren(f"{root}/{src}", f"{root}/{dst}")
                got.append(None)
            except OSError as e:
                got.append(e.errno)
        assert got == [errno.EBUSY, errno.EBUSY, errno.EBUSY, errno.ENOENT], root
    assert fs.isdir(f"{base}/a") and not fs.exists(f"{base}/b")
