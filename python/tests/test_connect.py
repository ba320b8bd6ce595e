"""Connecting from a client configuration file (the mount's TOML), as a mount does."""

import os

import fsspec
import pytest

import tessera
from tessera._client import DEFAULT_CONFIG


def write_config(path, meta_addr, key_file, extra=""):
    path.write_text(f'meta_addr = "{meta_addr}"\nkey_file = "{key_file}"\n'
                    f'io_buffers = 16\n{extra}')
    return str(path)


def test_connect_from_a_configuration_file(meta_addr, key_file, base, tmp_path, monkeypatch):
    cfg = write_config(tmp_path / "client.toml", meta_addr, key_file,
                       "[transport_limits]\ncall_timeout_ms = 20000\n")
    fs = tessera.connect(config=cfg)
    assert fs.addrs == [meta_addr]
    assert fs.options["io_buffers"] == 16
    assert fs.options["transport_limits.call_timeout_ms"] == 20000  # tables as dotted names
    fs.write_bytes(f"{base}/c", b"configured")
    # Arguments win over the file.
    fs2 = tessera.connect(config=cfg, io_buffers=8)
    assert fs2.options["io_buffers"] == 8 and fs2.read_bytes(f"{base}/c") == b"configured"
    # The environment names the file, for a process that cannot pass it (a DataLoader
    # worker's code, a tool).
    monkeypatch.setenv("TESSERA_CONFIG", cfg)
    assert tessera.connect().read_bytes(f"{base}/c") == b"configured"
    ffs = fsspec.filesystem("tessera", skip_instance_cache=True)
    assert ffs.cat(f"{base}/c") == b"configured"
    monkeypatch.delenv("TESSERA_CONFIG")
    ffs = fsspec.filesystem("tessera", config=cfg, skip_instance_cache=True)
    assert ffs.cat(f"{base}/c") == b"configured"


def test_configuration_errors(meta_addr, key_file, tmp_path, monkeypatch):
    monkeypatch.delenv("TESSERA_CONFIG", raising=False)
    with pytest.raises(FileNotFoundError):
        tessera.connect(config=str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("meta_addr = \n")
    with pytest.raises(ValueError, match="bad.toml"):
        tessera.connect(config=str(bad))
    unknown = write_config(tmp_path / "unknown.toml", meta_addr, key_file, "no_such = 1\n")
    with pytest.raises(ValueError, match="no_such"):
        tessera.connect(config=unknown)
    noaddr = tmp_path / "noaddr.toml"
    noaddr.write_text(f'key_file = "{key_file}"\n')
    with pytest.raises(ValueError, match="meta_addr"):
        tessera.connect(config=str(noaddr))
    if not os.path.exists(DEFAULT_CONFIG):  # else it would be read
        with pytest.raises(ValueError, match="addrs"):
            tessera.connect()
