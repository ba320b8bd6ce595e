"""The libraries issue 29 names as fsspec users, on `tessera://` URLs: pandas (CSV,
Parquet through pyarrow, a partitioned data set) and Hugging Face `datasets` (loading
Parquet and CSV, streamed and not, `save_to_disk`/`load_from_disk`). Skipped where they
are not installed (scripts/python-test.sh pins them)."""

import os

import numpy as np
import pytest

from tessera.filesystem import TesseraFileSystem

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")


@pytest.fixture
def frame():
    n = 20_000
    return pd.DataFrame({"i": np.arange(n), "x": np.linspace(0.0, 1.0, n),
                         "s": [f"row {i}" for i in range(n)]})


def test_pandas_csv_and_parquet(meta_addr, key_file, base, fs, frame):
    so = {"key_file": key_file}
    url = f"tessera://{meta_addr}{base}"
    frame.to_csv(f"{url}/t.csv", index=False, storage_options=so)
    assert pd.read_csv(f"{url}/t.csv", storage_options=so).equals(frame)
    frame.to_csv(f"{url}/t.csv.gz", index=False, storage_options=so)
    assert fs.read_bytes(f"{base}/t.csv.gz")[:2] == b"\x1f\x8b"
    assert pd.read_csv(f"{url}/t.csv.gz", storage_options=so).equals(frame)
    frame.to_parquet(f"{url}/t.parquet", storage_options=so)
    assert pd.read_parquet(f"{url}/t.parquet", storage_options=so).equals(frame)
    # One column: pyarrow seeks to the footer and reads that column's pages only.
    got = pd.read_parquet(f"{url}/t.parquet", columns=["x"], storage_options=so)
    assert got["x"].equals(frame["x"])
    frame.assign(p=frame.i % 3).to_parquet(f"{url}/parts", partition_cols=["p"],
                                           storage_options=so)
    assert sorted(fs.listdir(f"{base}/parts")) == ["p=0", "p=1", "p=2"]
    back = pd.read_parquet(f"{url}/parts", storage_options=so).sort_values("i")
    assert back["i"].tolist() == frame["i"].tolist()


def test_url_without_the_address_takes_it_from_the_options(meta_addr, key_file, base, fs,
                                                           monkeypatch, tmp_path):
    import tessera._client

    # No configuration of this machine's gives an address.
    monkeypatch.delenv("TESSERA_CONFIG", raising=False)
    monkeypatch.setattr(tessera._client, "DEFAULT_CONFIG", str(tmp_path / "none.toml"))
    # What tools made for object stores pass on after rebuilding a URL from a path.
    fs.write_bytes(f"{base}/a.txt", b"alpha")
    tfs = TesseraFileSystem(addrs=meta_addr, key_file=key_file, skip_instance_cache=True)
    for url in (f"tessera://{base}/a.txt", f"tessera://{base.lstrip('/')}/a.txt"):
        assert TesseraFileSystem._strip_protocol(url) == f"{base}/a.txt"
        assert TesseraFileSystem._get_kwargs_from_urls(url) == {}
        assert tfs.cat(url) == b"alpha"
    url = f"tessera://{meta_addr}{base}/a.txt"
    assert TesseraFileSystem._get_kwargs_from_urls(url) == {"addrs": meta_addr}
    two = f"{meta_addr},[::1]:7600"
    assert TesseraFileSystem._get_kwargs_from_urls(f"tessera://{two}/x") == {"addrs": two}
    # Addresses as `connect` takes them; anything else is the path's first name.
    for netloc, is_address in (("h:1", True), ("[fe80::1%2]:7600", True),
                               ("10.0.0.1:7600,", True), ("h:0", False),
                               ("h:65536", False), ("h:1x", False), ("data", False),
                               ("a b:1", False), (",", False)):
        kw = TesseraFileSystem._get_kwargs_from_urls(f"tessera://{netloc}/x")
        assert bool(kw) == is_address, netloc
    # Another protocol's options, as fsspec hands them on, are not client settings.
    TesseraFileSystem(addrs=meta_addr, key_file=key_file, hf={"token": None},
                      skip_instance_cache=True)
    with pytest.raises(ValueError, match="unknown"):
        TesseraFileSystem(addrs=meta_addr, key_file=key_file, no_such_setting=1,
                          skip_instance_cache=True)
    with pytest.raises(ValueError, match="FSSPEC_TESSERA_ADDRS"):
        TesseraFileSystem(key_file=key_file, skip_instance_cache=True)


def test_hugging_face_datasets(meta_addr, key_file, base, frame, tmp_path):
    datasets = pytest.importorskip("datasets")
    url = f"tessera://{meta_addr}{base}"
    so = {"key_file": key_file}
    frame.to_parquet(f"{url}/train.parquet", storage_options=so)
    frame.head(500).to_csv(f"{url}/small.csv", index=False, storage_options=so)
    # datasets rebuilds each file's URL from its path without the address: the
    # address goes in the storage options.
    so = {"addrs": meta_addr, "key_file": key_file}
    cache = str(tmp_path / "hf-cache")
    ds = datasets.load_dataset("parquet", data_files=f"{url}/*.parquet", storage_options=so,
                               split="train", cache_dir=cache)
    assert ds.num_rows == len(frame) and ds[123]["s"] == "row 123"
    ds = datasets.load_dataset("csv", data_files=f"{url}/small.csv", storage_options=so,
                               split="train", cache_dir=cache)
    assert ds.num_rows == 500
    streamed = datasets.load_dataset("parquet", data_files=f"{url}/train.parquet",
                                     storage_options=so, split="train", streaming=True)
    assert sum(1 for _ in streamed) == len(frame)
    small = datasets.Dataset.from_pandas(frame.head(1000))
    small.save_to_disk(f"{url}/saved", storage_options=so)
    again = datasets.load_from_disk(f"{url}/saved", storage_options=so)
    assert again.num_rows == 1000 and again[999]["i"] == 999


def test_address_from_fsspecs_environment(meta_addr, key_file, base, fs, tmp_path):
    # fsspec reads FSSPEC_<PROTOCOL>_<ARGUMENT> at import: a child process with them.
    import subprocess
    import sys

    fs.write_bytes(f"{base}/env.txt", b"from the environment")
    env = dict(os.environ, FSSPEC_TESSERA_ADDRS=meta_addr, FSSPEC_TESSERA_KEY_FILE=key_file)
    code = ("import fsspec, sys; f = fsspec.filesystem('tessera'); "
            "sys.stdout.buffer.write(f.cat(sys.argv[1])); "
            "sys.stdout.buffer.write(fsspec.open(sys.argv[2]).open().read())")
    out = subprocess.run([sys.executable, "-c", code, f"{base}/env.txt",
                          f"tessera://{base.lstrip('/')}/env.txt"],
                         env=env, capture_output=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout == b"from the environment" * 2
