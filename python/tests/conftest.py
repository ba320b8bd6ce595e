"""Fixtures of the Python package's tests: a cluster started by scripts/python-test.sh
(`tessera up`), named by the environment it sets, and a fresh directory per test."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

import tessera


def kill_while_writing(script: str, args: list, ready: str, after_s: float,
                       timeout_s: float) -> int:
    """Runs `script` in a Python child with `args`, waits for it to print `ready`, lets
    it go on for `after_s`, kills it with SIGKILL and returns its exit status."""
    child = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == ready
        time.sleep(after_s)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout_s)
    return child.returncode


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: run these tests with scripts/python-test.sh, "
                           "which starts a cluster and sets it")
    return value


@pytest.fixture(scope="session")
def meta_addr() -> str:
    """The metadata server's HOST:PORT."""
    return _env("TESSERA_TEST_META")


@pytest.fixture(scope="session")
def key_file() -> str:
    """The administrator's key of the test cluster."""
    return _env("TESSERA_TEST_KEY")


@pytest.fixture(scope="session")
def mount() -> str:
    """Where `tessera up` mounted the same cluster."""
    return _env("TESSERA_TEST_MOUNT")


@pytest.fixture(scope="session")
def tessera_bin() -> str:
    """The `tessera` binary of the test cluster (for `tessera key` and the like)."""
    return _env("TESSERA_TEST_BIN")


@pytest.fixture(scope="session")
def fs(meta_addr, key_file) -> tessera.Tessera:
    return tessera.connect(meta_addr, key_file=key_file)


@pytest.fixture
def base(fs, request) -> str:
    """A new, empty directory of the namespace for this test."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)
    path = f"/pytest/{name}"
    fs.makedirs(path, exist_ok=True)
    assert fs.listdir(path) == [], f"{path} is left over from an earlier run"
    return path
