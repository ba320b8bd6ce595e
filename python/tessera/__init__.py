"""Tessera's native client for Python.

    import tessera
    fs = tessera.connect("127.0.0.1:7000")
    with fs.open("/data/x.bin", "wb") as f:
        f.write(b"...")
    fs.read_many(["/data/a", "/data/b"])

`connect` returns a `Tessera` with `os`-like calls (`open`, `stat`, `listdir`, `scandir`,
`makedirs`, `rename`, `remove`, ...), `read_into` a caller's buffer and `read_many`.
`tessera.filesystem.TesseraFileSystem` is the fsspec file system of `tessera://`
URLs; `tessera.torch` has PyTorch data sets, checkpoint `save`/`load` and
`load_safetensors`.
"""

from ._client import DirEntry, Tessera, connect
from ._file import TesseraFile

__all__ = ["connect", "Tessera", "TesseraFile", "DirEntry"]
