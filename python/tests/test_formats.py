"""numpy, pickle and safetensors through the package."""

import pickle

import numpy as np
import pytest

from tessera.torch import load_safetensors, parse_safetensors_header


def test_numpy_save_load(fs, base):
    rng = np.random.default_rng(7)
    arrays = {"a": rng.standard_normal((300, 700)), "b": np.arange(10, dtype=np.int16)}
    with fs.open(f"{base}/x.npz", "wb") as f:
        np.savez(f, **arrays)
    with fs.open(f"{base}/x.npz", "rb") as f:
        loaded = np.load(f)
        for k, v in arrays.items():
            assert np.array_equal(loaded[k], v)
    with fs.open(f"{base}/y.npy", "wb") as f:
        np.save(f, arrays["a"])
    with fs.open(f"{base}/y.npy", "rb") as f:
        assert np.array_equal(np.load(f), arrays["a"])


def test_pickle(fs, base):
    obj = {"list": list(range(1000)), "bytes": b"\0" * 100000, "nested": {"t": (1, 2.5, "x")}}
    with fs.open(f"{base}/o.pkl", "wb") as f:
        pickle.dump(obj, f, protocol=5)
    with fs.open(f"{base}/o.pkl", "rb") as f:
        assert pickle.load(f) == obj


def test_safetensors_written_by_the_package_read_back(fs, base, mount):
    from safetensors.numpy import save, save_file

    rng = np.random.default_rng(3)
    tensors = {
        "embed": rng.standard_normal((1024, 768)).astype(np.float32),  # 3 MiB
        "bias": rng.standard_normal(768).astype(np.float16),
        "ids": np.arange(5000, dtype=np.int64).reshape(50, 100),
        "mask": rng.integers(0, 2, 333).astype(bool),
        "scalar": np.array(3.5, dtype=np.float64),
        "empty": np.zeros((0, 4), dtype=np.int32),
        "big": rng.integers(0, 255, (5 << 20,), dtype=np.uint8),  # crosses chunks
        # Read in pieces (SAFETENSORS_PIECE_BYTES), the last one short.
        "huge": rng.standard_normal((5, 1 << 20)).astype(np.float32),  # 20 MiB
    }
    # Once through the mount by safetensors itself, once as bytes through the package.
    save_file(tensors, f"{mount}{base}/m.safetensors", metadata={"format": "np"})
    fs.write_bytes(f"{base}/p.safetensors", save(tensors))
    for name in ("m", "p"):
        got = load_safetensors(f"{base}/{name}.safetensors", framework="np", fs=fs)
        assert set(got) == set(tensors)
        for k, v in tensors.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert np.array_equal(got[k], v), k


def test_safetensors_damaged_headers_are_refused(fs, base):
    import json
    import struct

    good = json.dumps({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    blob = struct.pack("<Q", len(good)) + good + b"\0" * 8
    assert parse_safetensors_header(blob, len(blob))[1]["t"] == ("F32", [2], 0, 8)
    with pytest.raises(ValueError):
        parse_safetensors_header(blob, len(blob) - 1)  # data past the end
    bad = json.dumps({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}).encode()
    with pytest.raises(ValueError):
        parse_safetensors_header(struct.pack("<Q", len(bad)) + bad + b"\0" * 8, 100)
    with pytest.raises(ValueError):
        parse_safetensors_header(struct.pack("<Q", 1 << 40), 1 << 41)
    fs.write_bytes(f"{base}/bad.safetensors", struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ValueError):
        load_safetensors(f"{base}/bad.safetensors", framework="np", fs=fs)
