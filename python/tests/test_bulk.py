"""read_many, read_into and write_bytes with buffers of every kind."""

import hashlib

import numpy as np
import pytest

#: Files of the read_many test: the issue's number.
MANY_FILES = 1000


def _content(i: int) -> bytes:
    # Sizes from 0 to ~20 KiB, each file's bytes its own.
    return hashlib.sha256(str(i).encode()).digest() * (i % 640)


def test_read_many_of_a_thousand_files(fs, base):
    paths = [f"{base}/f{i:04}" for i in range(MANY_FILES)]
    for i, p in enumerate(paths):
        fs.write_bytes(p, _content(i))
    got = fs.read_many(paths)
    assert len(got) == MANY_FILES
    for i, data in enumerate(got):
        assert data == _content(i), paths[i]
    # Order is the order asked, repeats included.
    rev = list(reversed(paths[:50])) + paths[:3]
    assert fs.read_many(rev) == [_content(int(p[-4:])) for p in rev]
    assert fs.read_many([]) == []
    # Plain `bytes` (filled in place by Rust), also of files of several transfers.
    assert all(type(d) is bytes for d in got)
    big = bytes(range(256)) * (5 * 4096 + 7)
    fs.write_bytes(f"{base}/big", big)
    assert fs.read_many([f"{base}/big", paths[1]]) == [big, _content(1)]
    with pytest.raises(FileNotFoundError) as e:
        fs.read_many(paths[:10] + [f"{base}/none"] + paths[10:20])
    assert e.value.filename == f"{base}/none"


def test_read_many_into_buffers_the_caller_makes(fs, base):
    # More files than one window of opens (256), so that the windows are joined too.
    paths = [f"{base}/g{i:03}" for i in range(300)]
    for i, p in enumerate(paths):
        fs.write_bytes(p, _content(i))
    asked = []

    def alloc(n):  # one call per path, in order, with the file's length
        asked.append(n)
        return np.empty(n + 3, dtype=np.uint8)  # a larger buffer is fine

    got = fs.read_many_into(paths, alloc)
    assert asked == [len(_content(i)) for i in range(300)]
    for i, (arr, n) in enumerate(got):
        assert n == len(_content(i)) and arr[:n].tobytes() == _content(i), paths[i]
    big = bytes(range(256)) * (5 * 4096 + 7)  # several transfers, over 1 MiB
    fs.write_bytes(f"{base}/big", big)
    [(buf, n)] = fs.read_many_into([f"{base}/big"], bytearray)
    assert n == len(big) and buf == big
    assert fs.read_many_into([], bytearray) == []
    with pytest.raises(ValueError, match="returned a buffer of"):
        fs.read_many_into(paths[5:6], lambda n: bytearray(n - 1))
    with pytest.raises(TypeError):
        fs.read_many_into(paths[5:6], bytes)  # read-only
    shared = bytearray(1 << 20)  # one buffer for two files: they would be filled at once
    with pytest.raises(ValueError, match="overlap"):
        fs.read_many_into(paths[5:7], lambda n: shared)
    whole = memoryview(bytearray(1 << 20))
    with pytest.raises(ValueError, match="overlap"):
        fs.read_many_into(paths[5:7], lambda n, at=iter([0, 100]): whole[next(at):])
    halves = iter([whole[:1 << 19], whole[1 << 19:]])  # apart: accepted
    got = fs.read_many_into(paths[5:7], lambda n: next(halves))
    assert [n for _, n in got] == [len(_content(5)), len(_content(6))]
    assert bytes(whole[:len(_content(5))]) == _content(5)
    with pytest.raises(ZeroDivisionError):  # alloc's own error comes through as it is
        fs.read_many_into(paths[5:6], lambda n: 1 // 0)
    with pytest.raises(FileNotFoundError) as e:
        fs.read_many_into(paths[:3] + [f"{base}/none"], bytearray)
    assert e.value.filename == f"{base}/none"


def test_read_into_buffers(fs, base):
    data = np.arange(3 << 20, dtype=np.uint8) * 7  # 3 MiB, crosses segment boundaries
    fs.write_bytes(f"{base}/a", data)  # a numpy array as the source, no copy
    arr = np.zeros(1 << 20, dtype=np.uint8)
    assert fs.read_into(f"{base}/a", 1 << 20, arr) == 1 << 20
    assert np.array_equal(arr, data[1 << 20:2 << 20])
    floats = np.zeros(1000, dtype=np.float32)  # any dtype: bytes land as they are
    assert fs.read_into(f"{base}/a", 12, floats) == 4000
    assert floats.tobytes() == data[12:4012].tobytes()
    ba = bytearray(100)
    assert fs.read_into(f"{base}/a", len(data) - 40, ba) == 40  # short at the end
    assert bytes(ba[:40]) == data[-40:].tobytes() and ba[40:] == bytearray(60)
    mv = memoryview(bytearray(10))
    assert fs.read_into(f"{base}/a", 5, mv[2:8]) == 6
    assert bytes(mv[2:8]) == data[5:11].tobytes()
    assert fs.read_into(f"{base}/a", len(data) + 10, bytearray(5)) == 0
    with pytest.raises(TypeError):
        fs.read_into(f"{base}/a", 0, b"read-only bytes")
    with pytest.raises(BufferError):
        fs.read_into(f"{base}/a", 0, np.zeros((4, 4), dtype=np.uint8)[:, 1])
    with pytest.raises(IsADirectoryError):
        fs.read_into(base, 0, bytearray(4))


def test_file_readinto_numpy_and_write_memoryview(fs, base):
    src = np.random.default_rng(1).integers(0, 255, 5 << 20, dtype=np.uint8)
    with fs.open(f"{base}/b", "wb", buffering=0) as f:
        assert f.write(memoryview(src)[: 2 << 20]) == 2 << 20
        assert f.write(src[2 << 20:]) == 3 << 20
    dst = np.empty_like(src)
    with fs.open(f"{base}/b", "rb", buffering=0) as f:
        n = 0
        while n < len(dst):
            got = f.readinto(memoryview(dst)[n:])
            assert got > 0
            n += got
        assert f.readinto(bytearray(1)) == 0
    assert np.array_equal(src, dst)


def test_large_reads_land_in_the_callers_buffer(fs, base):
    # Reads of 4 MiB and more are lent to the transport (the data servers write into the
    # caller's buffer): across chunks (4 MiB), short at the end, into a view of part of
    # an array, and after writes of this client it has not sent yet.
    data = np.random.default_rng(2).integers(0, 255, 9 << 20, dtype=np.uint8)
    fs.write_bytes(f"{base}/big", data)
    arr = np.zeros(5 << 20, dtype=np.uint8)
    assert fs.read_into(f"{base}/big", (3 << 20) + 7, arr) == 5 << 20
    assert np.array_equal(arr, data[(3 << 20) + 7:(8 << 20) + 7])
    whole = bytearray(8 << 20)
    assert fs.read_into(f"{base}/big", 5 << 20, memoryview(whole)[1:]) == 4 << 20
    assert whole[1:(4 << 20) + 1] == data[5 << 20:].tobytes()
    assert whole[0] == 0 and not any(whole[(4 << 20) + 1:])
    with fs.open(f"{base}/big", "r+b", buffering=0) as f:
        f.seek(6 << 20)
        f.write(b"not yet sent")
        f.seek(6 << 20)
        got = np.zeros(6 << 20, dtype=np.uint8)
        assert f.readinto(got) == 3 << 20
        assert got[:12].tobytes() == b"not yet sent"
        assert np.array_equal(got[12:3 << 20], data[(6 << 20) + 12:])
        assert fs.read_into(f"{base}/big", 6 << 20, got) == 3 << 20
        assert got[:12].tobytes() == b"not yet sent"
    # A buffer far larger than what the file holds: only what the file fills is lent.
    data[6 << 20:(6 << 20) + 12] = np.frombuffer(b"not yet sent", dtype=np.uint8)  # sent now
    huge = np.full(64 << 20, 7, dtype=np.uint8)
    assert fs.read_into(f"{base}/big", 1 << 20, huge) == 8 << 20
    assert np.array_equal(huge[:8 << 20], data[1 << 20:]) and not (huge[8 << 20:] - 7).any()
    assert fs.read_into(f"{base}/big", (9 << 20) - 5, huge) == 5  # too little to lend
    assert huge[:5].tobytes() == data[-5:].tobytes()
    with pytest.raises(TypeError):
        fs.read_into(f"{base}/big", 0, bytes(4 << 20))  # read-only
    with pytest.raises(BufferError):
        fs.read_into(f"{base}/big", 0, np.zeros((4 << 20, 2), dtype=np.uint8)[:, 1])
