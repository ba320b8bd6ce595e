"""Connecting from a client configuration file (the mount's TOML), as a mount does."""

import os

import fsspec
import pytest

import tessera
import tessera._client


@pytest.fixture(autouse=True)
def no_machine_config(monkeypatch, tmp_path):
    """No configuration of this machine's (TESSERA_CONFIG, /etc/tessera/client.toml) is
    read: the default file is one that does not exist, unless a test writes it."""
    monkeypatch.delenv("TESSERA_CONFIG", raising=False)
    default = tmp_path / "default-client.toml"
    monkeypatch.setattr(tessera._client, "DEFAULT_CONFIG", str(default))
    return default


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


def test_the_default_file_and_what_wins_over_it(meta_addr, key_file, base, tmp_path,
                                                no_machine_config, monkeypatch):
    # Read when no address is given, as the mount helper reads it.
    write_config(no_machine_config, meta_addr, key_file)
    fs = tessera.connect()
    fs.write_bytes(f"{base}/d", b"default")
    # Not read when one is: its bad key would fail the connect.
    no_machine_config.write_text(f'meta_addr = "{meta_addr}"\nkey_file = "/nonexistent"\n')
    assert tessera.connect(meta_addr, key_file=key_file).read_bytes(f"{base}/d") == b"default"
    # An address given wins over a named file's; an empty TESSERA_CONFIG names none.
    other = write_config(tmp_path / "other.toml", "127.0.0.1:1", key_file)
    assert tessera.connect(meta_addr, config=other).read_bytes(f"{base}/d") == b"default"
    monkeypatch.setenv("TESSERA_CONFIG", "")
    with pytest.raises(OSError):  # the default file again, with its bad key
        tessera.connect()
    # A relative key_file is made absolute once (a forked worker may run elsewhere).
    monkeypatch.chdir(os.path.dirname(key_file))
    rel = tmp_path / "rel.toml"
    rel.write_text(f'meta_addr = "{meta_addr}"\nkey_file = "{os.path.basename(key_file)}"\n')
    fs = tessera.connect(config=str(rel))
    assert fs.options["key_file"] == key_file


def test_configuration_errors(meta_addr, key_file, tmp_path):
    with pytest.raises(FileNotFoundError):
        tessera.connect(config=str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("meta_addr = \n")
    with pytest.raises(ValueError, match="bad.toml"):
        tessera.connect(config=str(bad))
    unknown = write_config(tmp_path / "unknown.toml", meta_addr, key_file, "no_such = 1\n")
    with pytest.raises(ValueError, match="no_such"):
        tessera.connect(config=unknown)
    listed = write_config(tmp_path / "list.toml", meta_addr, key_file, 'client_name = ["a"]\n')
    with pytest.raises(ValueError, match="client_name"):
        tessera.connect(config=listed)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'meta_addr = "\xe9"\n')
    with pytest.raises(ValueError, match="latin.toml"):
        tessera.connect(config=str(latin))
    noaddr = tmp_path / "noaddr.toml"
    noaddr.write_text(f'key_file = "{key_file}"\n')
    with pytest.raises(ValueError, match="noaddr.toml has no meta_addr"):
        tessera.connect(config=str(noaddr))
    with pytest.raises(ValueError, match="no configuration file"):
        tessera.connect()
    with pytest.raises(ValueError, match="TesseraFileSystem needs addrs"):
        fsspec.filesystem("tessera", skip_instance_cache=True)
    bad = tmp_path / "bad.toml"  # not a missing address: its own error
    bad.write_text("meta_addr = \n")
    with pytest.raises(ValueError, match="bad.toml"):
        fsspec.filesystem("tessera", config=str(bad), skip_instance_cache=True)
