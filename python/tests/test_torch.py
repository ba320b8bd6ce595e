"""PyTorch: DataLoader workers over the data sets, save/load of a state dict, kill -9
during save. Skipped, saying so, where torch is not installed."""

import pytest
from conftest import kill_while_writing

import tessera.torch as tt

try:
    import torch
except ImportError:
    torch = None

# Each test is reported as skipped, with the reason, where torch cannot be imported.
pytestmark = pytest.mark.skipif(
    torch is None, reason="torch is not importable in this environment; "
                          "scripts/python-test.sh runs these again with Debian's python3-torch")

#: Files of the DataLoader tests.
FILES = 256
#: How long the killed saver gets before the test gives up on it.
CHILD_TIMEOUT_S = 120


def _decode(b: bytes):
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).to(torch.int64).sum()


def _files(fs, base):
    paths = []
    for i in range(FILES):
        p = f"{base}/d/f{i:04}"
        if i == 0:
            fs.makedirs(f"{base}/d")
        fs.write_bytes(p, bytes([i % 256]) * (1000 + i))
        paths.append(p)
    return paths


def test_dataloader_four_workers_map_style(fs, base):
    _files(fs, base)
    ds = tt.TesseraDataset(f"{base}/d", decode=_decode, fs=fs)
    assert isinstance(ds, torch.utils.data.Dataset)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=4)
    got = torch.cat(list(loader)).tolist()
    assert got == [(i % 256) * (1000 + i) for i in range(FILES)]


def test_dataloader_four_workers_iterable(fs, base):
    _files(fs, base)
    ds = tt.TesseraIterableDataset(f"{base}/d", decode=_decode, fs=fs, rank=0, world_size=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=4)
    got = sorted(int(x) for x in loader)
    assert got == sorted((i % 256) * (1000 + i) for i in range(FILES))


def test_dataloader_workers_give_tensors_in_shared_memory(fs, base):
    _files(fs, base)
    fs.write_bytes(f"{base}/d/zz-empty", b"")  # sorts last in the folder
    want = [bytes([i % 256]) * (1000 + i) for i in range(FILES)] + [b""]
    # In the main process: plain uint8 tensors with the file's bytes, also one by one
    # (no prefetch) and through the prefetcher.
    for prefetch in (0, 32):
        ds = tt.TesseraDataset(f"{base}/d", fs=fs, as_tensor=True, prefetch=prefetch)
        t = ds[7]
        assert t.dtype == torch.uint8 and bytes(t.tolist()) == want[7]
        assert bytes(ds[8].tolist()) == want[8]
    # In workers: each batch's tensors are made in shared memory, so the worker hands
    # them over by handle; what arrives is the files' bytes, in order.
    def decode(t):  # runs in the worker: a failed check there fails the loader here
        assert t.is_shared(), "a worker's tensor is not in shared memory"
        return t

    ds = tt.TesseraDataset(f"{base}/d", decode=decode, fs=fs, as_tensor=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=4,
                                         collate_fn=lambda b: b)
    batches = list(loader)
    assert [bytes(t.tolist()) for batch in batches for t in batch] == want
    # A batch's tensors are views of one segment (one file descriptor in this process
    # per segment, not one per file).
    storage = (lambda t: t.untyped_storage()) if hasattr(torch.Tensor, "untyped_storage") \
        else (lambda t: t.storage())
    for batch in batches:  # (the last batch holds only the empty file)
        assert len({storage(t).data_ptr() for t in batch if t.numel()}) <= 1
    it = tt.TesseraIterableDataset(f"{base}/d", decode=decode, fs=fs, as_tensor=True,
                                   rank=0, world_size=1)
    loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=4)
    assert sorted(bytes(t.tolist()) for t in loader) == sorted(want)


def test_save_load_state_dict(fs, base):
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    state = model.state_dict()
    tt.save(state, f"{base}/model.pt", fs=fs)
    assert fs.listdir(base) == ["model.pt"]
    loaded = tt.load(f"{base}/model.pt", fs=fs, weights_only=True)
    assert loaded.keys() == state.keys()
    for k in state:
        assert torch.equal(loaded[k], state[k]), k


def test_safetensors_as_torch(fs, base):
    from safetensors.torch import save

    tensors = {"w": torch.randn(64, 32), "h": torch.randn(7).to(torch.bfloat16)}
    fs.write_bytes(f"{base}/t.safetensors", save(tensors))
    got = tt.load_safetensors(f"{base}/t.safetensors", framework="pt", fs=fs)
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_safetensors_float8_needs_a_torch_that_has_it(fs, base):
    # Written by hand: the safetensors package of an old torch cannot make float8.
    import json
    import struct

    head = json.dumps({"f": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}})
    head = head.encode() + b" " * (-len(head) % 8)
    fs.write_bytes(f"{base}/f8.safetensors",
                   struct.pack("<Q", len(head)) + head + bytes([0x38, 0x40, 0xb8, 0]))
    if hasattr(torch, "float8_e4m3fn"):
        got = tt.load_safetensors(f"{base}/f8.safetensors", fs=fs)["f"]
        assert got.dtype == torch.float8_e4m3fn
        assert got.to(torch.float32).tolist() == [1.0, 2.0, -1.0, 0.0]
    else:
        with pytest.raises(ValueError, match="float8_e4m3fn"):
            tt.load_safetensors(f"{base}/f8.safetensors", fs=fs)


SAVER = r"""
import sys, torch, tessera, tessera.torch as tt
fs = tessera.connect(sys.argv[1], key_file=sys.argv[2])
big = {"w": torch.ones(256 << 20, dtype=torch.uint8)}  # 256 MiB
print("saving", flush=True)
for _ in range(100):
    tt.save(big, sys.argv[3], fs=fs)
"""


def test_kill_during_save_keeps_the_old_checkpoint(fs, base, meta_addr, key_file):
    old = {"w": torch.arange(1000)}
    tt.save(old, f"{base}/ckpt.pt", fs=fs)
    kill_while_writing(SAVER, [meta_addr, key_file, f"{base}/ckpt.pt"], "saving", 0.5,
                       CHILD_TIMEOUT_S)
    got = tt.load(f"{base}/ckpt.pt", fs=fs, weights_only=True)
    # Killed during the first save: the old checkpoint, whole. (Had a save finished,
    # the new one, whole: never a torn file.)
    if got["w"].dtype == torch.uint8:
        assert got["w"].numel() == 256 << 20
    else:
        assert torch.equal(got["w"], old["w"])
