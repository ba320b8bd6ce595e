"""fsspec's own test suites for file system implementations (`fsspec.tests.abstract`:
copy, get, put, open, pipe), run against `TesseraFileSystem` as fsspec runs them
against its local and in-memory file systems. The suites and their expectations are
fsspec's; only the fixtures below are ours."""

import pytest

import fsspec.tests.abstract as abstract
from tessera.filesystem import TesseraFileSystem


class TesseraFixtures(abstract.AbstractFixtures):
    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, meta_addr, key_file):
        # fsspec caches instances by their arguments: skip it, so that no other test's
        # instance (or its listings cache) is shared with these.
        return TesseraFileSystem(addrs=meta_addr, key_file=key_file, skip_instance_cache=True)

    @pytest.fixture
    def fs_join(self):
        return lambda *parts: "/".join(p.rstrip("/") for p in parts[:-1]) + "/" + parts[-1]

    @pytest.fixture
    def fs_path(self, base):
        return base


class TestTesseraCopy(abstract.AbstractCopyTests, TesseraFixtures):
    pass


class TestTesseraGet(abstract.AbstractGetTests, TesseraFixtures):
    pass


class TestTesseraPut(abstract.AbstractPutTests, TesseraFixtures):
    pass



class TestTesseraOpen(abstract.AbstractOpenTests, TesseraFixtures):
    pass


class TestTesseraPipe(abstract.AbstractPipeTests, TesseraFixtures):
    pass
