"""The file object against `io` semantics: the same random operations on a local file
and on a Tessera file give the same results and the same bytes."""

import errno
import io
import os
import random

import pytest

from tessera._file import DEFAULT_BUFFER_SIZE

MIB = 1 << 20
#: Operations per differential run: enough to cross every path (holes, truncation
#: below and past the end, reads across segment boundaries) several times.
OPS = 300
#: The largest file the runs make, past the 4 MiB chunk size so chunk and segment
#: boundaries are crossed.
MAX_SIZE = 6 * MIB


def _seed() -> int:
    seed = int(os.environ.get("TESSERA_PY_SEED", random.randrange(1 << 32)))
    print(f"TESSERA_PY_SEED={seed}")
    return seed


def _outcome(fn):
    """What a call did: ("ok", value) or ("err", exception type, errno)."""
    try:
        v = fn()
    except (OSError, ValueError) as e:
        return ("err", type(e).__name__, getattr(e, "errno", None))
    if isinstance(v, (bytearray, memoryview)):
        v = bytes(v)
    return ("ok", v)


def _size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.4:
        return rng.randint(0, 100)
    if r < 0.8:
        return rng.randint(4096, 256 * 1024)
    return rng.randint(256 * 1024, 2 * MIB)


def _run(rng, local, remote, length_of) -> list:
    """Runs OPS random operations on both files; returns the log of differences."""
    diffs = []
    for step in range(OPS):
        op = rng.choice(["read", "readinto", "write", "write", "seek", "tell", "truncate",
                         "flush", "readall"])
        if op == "read":
            n = _size(rng)
            calls = (lambda f: f.read(n)), f"read({n})"
        elif op == "readinto":
            n = _size(rng)

            def readinto(f, n=n):
                b = bytearray(n)
                got = f.readinto(b)
                return (got, bytes(b[:got]))

            calls = readinto, f"readinto({n})"
        elif op == "write":
            data = rng.randbytes(_size(rng))
            if length_of() + len(data) > MAX_SIZE:
                calls = (lambda f: f.seek(0)), "seek(0) (file full)"
            else:
                calls = (lambda f, d=data: f.write(d)), f"write({len(data)})"
        elif op == "seek":
            whence = rng.choice([io.SEEK_SET, io.SEEK_CUR, io.SEEK_END])
            if whence == io.SEEK_SET:
                off = rng.randint(0, min(length_of() + MIB, MAX_SIZE - 3 * MIB))
            elif whence == io.SEEK_CUR:
                off = rng.randint(-MIB, MIB // 2)
            else:
                off = rng.randint(-2 * MIB, 64 * 1024)
            calls = (lambda f, o=off, w=whence: f.seek(o, w)), f"seek({off}, {whence})"
        elif op == "tell":
            calls = (lambda f: f.tell()), "tell()"
        elif op == "truncate":
            if rng.random() < 0.3:
                calls = (lambda f: f.truncate()), "truncate()"
            else:
                size = rng.randint(0, min(length_of() + MIB, MAX_SIZE))
                calls = (lambda f, s=size: f.truncate(s)), f"truncate({size})"
        elif op == "flush":
            calls = (lambda f: f.flush()), "flush()"
        else:
            calls = (lambda f: f.read()), "read()"
        fn, name = calls
        a, b = _outcome(lambda: fn(local)), _outcome(lambda: fn(remote))
        if a != b:
            short = lambda o: o if o[0] == "err" or not isinstance(o[1], (bytes, tuple)) \
                else ("ok", repr(o[1])[:60])
            diffs.append(f"step {step}: {name}: local {short(a)} tessera {short(b)}")
            break
    return diffs


@pytest.mark.parametrize("buffering", [0, -1], ids=["raw", "buffered"])
def test_random_operations_match_a_local_file(fs, base, tmp_path, buffering):
    rng = random.Random(_seed() + buffering)
    initial = rng.randbytes(rng.randint(0, 3 * MIB))
    local_path = tmp_path / "f"
    local_path.write_bytes(initial)
    fs.write_bytes(f"{base}/f", initial)
    # The same buffer size on both sides: io.BufferedRandom's own position keeping
    # differs with it (after a failed seek), and what is compared is the raw file.
    local_buffering = DEFAULT_BUFFER_SIZE if buffering else 0
    with open(local_path, "r+b", buffering=local_buffering) as local, \
            fs.open(f"{base}/f", "r+b", buffering=buffering) as remote:
        diffs = _run(rng, local, remote, lambda: os.fstat(local.fileno()).st_size)
    assert diffs == []
    want = local_path.read_bytes()
    got = fs.read_bytes(f"{base}/f")
    assert len(got) == len(want)
    assert got == want


def test_modes(fs, base):
    p = f"{base}/m"
    with fs.open(p, "wb") as f:
        assert f.write(b"hello") == 5
        assert f.writable() and not f.readable() and f.seekable()
        with pytest.raises(io.UnsupportedOperation):
            f.read()
    with fs.open(p, "ab") as f:
        assert f.tell() == 5
        f.write(b" world")
        f.seek(0)
        f.write(b"!")  # O_APPEND: to the end wherever the position is
    assert fs.read_bytes(p) == b"hello world!"
    with fs.open(p, "rb") as f:
        assert f.read(5) == b"hello"
        with pytest.raises(io.UnsupportedOperation):
            f.write(b"x")
    with pytest.raises(FileExistsError) as e:
        fs.open(p, "xb")
    assert e.value.errno == errno.EEXIST and e.value.filename == p
    with fs.open(f"{base}/new", "xb") as f:
        f.write(b"x")
    with fs.open(p, "w+b") as f:  # truncates
        assert f.read() == b""
        f.write(b"abc")
        f.seek(1)
        assert f.read() == b"bc"
    with fs.open(p, "w", encoding="utf-8") as f:
        f.write("héllo\nwörld\n")
    with fs.open(p, "r", encoding="utf-8") as f:
        assert f.readlines() == ["héllo\n", "wörld\n"]
    for bad in ("rw", "bt", "z", "rr", ""):
        with pytest.raises(ValueError):
            fs.open(p, bad)
    with pytest.raises(ValueError):
        fs.open(p, "r", buffering=0)


def test_closed_file_refuses_io(fs, base):
    f = fs.open(f"{base}/c", "wb", buffering=0)
    f.write(b"abc")
    f.close()
    f.close()  # a second close does nothing, as io's
    assert f.closed
    with pytest.raises(ValueError):
        f.write(b"x")
    with pytest.raises(ValueError):
        f.tell()
    assert fs.read_bytes(f"{base}/c") == b"abc"


def test_sync_flush_and_stat(fs, base):
    p = f"{base}/s"
    with fs.open(p, "wb", buffering=0) as f:
        f.write(b"x" * 5000)
        f.flush()
        assert fs.stat(p).st_size == 5000  # the length is committed by flush
        f.write(b"y" * 100)
        f.sync()
        assert f.stat().st_size == 5100
    with fs.open(p, "rb") as f, pytest.raises(io.UnsupportedOperation):
        f.fileno()
    # Buffered (the default) and text files: flush() reaches the raw file too, so
    # another connection sees the bytes without a close.
    for mode, data in (("wb", b"z" * 3000), ("w", "t" * 3000)):
        with fs.open(p, mode) as f:
            f.write(data)
            f.flush()
            assert fs.stat(p).st_size == 3000, mode
