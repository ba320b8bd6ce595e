"""`TesseraFileSystem`: the fsspec file system of `tessera://HOST:PORT/path` URLs.

Registered for the protocol `tessera` by the package's entry point (`fsspec.specs`), so
`fsspec.filesystem("tessera", addrs="HOST:PORT", key_file=...)`,
`fsspec.open("tessera://HOST:PORT/data/x.parquet", key_file=...)` and the libraries on
top of fsspec (pandas, Hugging Face `datasets`, Ray, ...) reach the cluster directly.
"""

from __future__ import annotations

import errno
import glob
import os
import posixpath
import stat as statmod

from fsspec.spec import AbstractFileSystem

from ._client import Tessera, _configured, _NoAddress, _split_url


def _other_layers(name: str, value) -> bool:
    """Whether a keyword argument is the options of another protocol: fsspec passes
    storage options nested by protocol name (`{"hf": {...}}`) on to the outermost file
    system of a URL, and Hugging Face `datasets` adds its own for every URL. A client
    setting is never a dict."""
    from fsspec.registry import available_protocols

    return isinstance(value, dict) and name in available_protocols()


class TesseraFileSystem(AbstractFileSystem):
    """fsspec's view of one Tessera cluster.

    `addrs`: the metadata server's "HOST:PORT" (or several, comma-separated); a URL's
    HOST:PORT gives it too, and so does a client configuration file (`config`, as for
    `tessera.connect`). Other keyword arguments are client settings, as for
    `tessera.connect` (`key_file` for a cluster with keys). fsspec caches instances by
    their arguments: one made from `$TESSERA_CONFIG` is reused after the variable
    changes (`skip_instance_cache=True` makes a new one).
    """

    protocol = "tessera"
    root_marker = "/"

    # What fsspec itself may pass to a file system: not client settings.
    _FSSPEC_ARGS = ("use_listings_cache", "listings_expiry_time", "max_paths",
                    "asynchronous", "loop")

    def __init__(self, addrs=None, host=None, port=None, auto_mkdir=True, config=None,
                 **options):
        super().__init__(addrs=addrs, host=host, port=port, auto_mkdir=auto_mkdir,
                         config=config, **options)
        # Writing a file makes its missing parent directories, as object stores and
        # fsspec's memory file system behave (and LocalFileSystem(auto_mkdir=True)).
        self.auto_mkdir = auto_mkdir
        if addrs is None and host is not None:
            addrs = f"{host}:{port}" if port is not None else host
        settings = {k: v for k, v in options.items()
                    if k not in self._FSSPEC_ARGS and not _other_layers(k, v)}
        try:
            addrs, settings = _configured(addrs, config, settings)
        except _NoAddress:
            raise ValueError("TesseraFileSystem needs addrs='HOST:PORT' (in storage_options, "
                             "FSSPEC_TESSERA_ADDRS in the environment, a "
                             "tessera://HOST:PORT/ URL, or meta_addr in a client "
                             "configuration file: config=FILE, TESSERA_CONFIG, or "
                             "/etc/tessera/client.toml)") from None
        self.client = Tessera(addrs, settings)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        from fsspec.utils import stringify_path

        _netloc, p = _split_url(stringify_path(path))
        p = "/" + p.strip("/")
        return p

    @staticmethod
    def _get_kwargs_from_urls(path):
        netloc, _p = _split_url(str(path))
        return {"addrs": netloc} if netloc else {}

    def unstrip_protocol(self, name: str) -> str:
        if name.startswith("tessera://"):
            return name
        return f"tessera://{self.client.addrs[0]}{self._strip_protocol(name)}"

    # Listing and attributes.

    def _info_of(self, path: str, st) -> dict:
        if statmod.S_ISDIR(st.st_mode):
            kind = "directory"
        elif statmod.S_ISREG(st.st_mode):
            kind = "file"
        else:
            kind = "other"
        return {
            "name": path,
            "size": st.st_size,
            "type": kind,
            "mode": st.st_mode,
            "ino": st.st_ino,
            "nlink": st.st_nlink,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "mtime": st.st_mtime,
            "created": st.st_ctime,
        }

    def _followed(self, path: str, lst):
        """A link's target's attributes (as fsspec's local file system describes a link),
        or the link's own when it dangles: one broken link must not fail a listing."""
        if not statmod.S_ISLNK(lst.st_mode):
            return lst
        try:
            return self.client.stat(path)
        except OSError:  # dangling, a loop (ELOOP), through a file (ENOTDIR), ...
            return lst

    def info(self, path, **kwargs):
        p = self._strip_protocol(path)
        lst = self.client.lstat(p)
        info = self._info_of(p, self._followed(p, lst))
        info["islink"] = statmod.S_ISLNK(lst.st_mode)
        return info

    def ls(self, path, detail=True, **kwargs):
        p = self._strip_protocol(path)
        st = self.client.stat(p)
        if not statmod.S_ISDIR(st.st_mode):
            entries = [self.info(p)]
        else:
            entries = []
            for e in self.client.scandir(p):
                if detail:
                    lst = e.stat(follow_symlinks=False)
                    info = self._info_of(e.path, self._followed(e.path, lst))
                    info["islink"] = e.is_symlink()
                    entries.append(info)
                else:
                    entries.append({"name": e.path})
        if detail:
            return entries
        return sorted(e["name"] for e in entries)

    def exists(self, path, **kwargs):
        return self.client.exists(self._strip_protocol(path))

    def created(self, path):
        import datetime

        return datetime.datetime.fromtimestamp(self.info(path)["created"], datetime.timezone.utc)

    def modified(self, path):
        import datetime

        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], datetime.timezone.utc)

    def touch(self, path, truncate=True, **kwargs):
        """An empty file at `path` (emptied, with `truncate`), or, without `truncate`,
        an existing file's times set to now (as `touch` does; fsspec's default raises)."""
        p = self._strip_protocol(path)
        if truncate or not self.client.exists(p):
            with self.open(p, "wb", **kwargs):
                pass
        else:
            self.client.utime(p)

    # Contents.

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None,
              **kwargs):
        if not autocommit:
            raise NotImplementedError("tessera:// writes are committed as they are written")
        p = self._strip_protocol(path)
        if self.auto_mkdir and "r" not in mode:
            self.client.makedirs(self._parent(p), exist_ok=True)
        buffering = -1 if block_size in (None, "default") else block_size
        f = self.client.open(p, mode, buffering=buffering)
        if "r" in mode and "+" not in mode:
            # fsspec's file objects carry their length (`read_block` and dask read it):
            # the open file's own, whatever the name leads to meanwhile.
            try:
                f.size = getattr(f, "raw", f).stat().st_size
            except BaseException:
                f.close()
                raise
        return f

    def cat_file(self, path, start=None, end=None, **kwargs):
        p = self._strip_protocol(path)
        if start is None and end is None:
            return self.client.read_bytes(p)
        size = self.client.stat(p).st_size
        start = 0 if start is None else (start + size if start < 0 else start)
        end = size if end is None else (end + size if end < 0 else end)
        start, end = max(0, min(start, size)), max(0, min(end, size))
        if end <= start:
            return b""
        buf = bytearray(end - start)
        n = self.client.read_into(p, start, buf)
        del buf[n:]
        return bytes(buf)

    def cat(self, path, recursive=False, on_error="raise", **kwargs):
        # Several whole files are fetched in parallel by the native client (read_many);
        # one file, a range or per-path errors go the generic way.
        paths = self.expand_path(path, recursive=recursive)
        many = len(paths) > 1 or isinstance(path, list) or paths[0] != self._strip_protocol(path)
        if not many or on_error != "raise" or kwargs:
            return super().cat(path, recursive=recursive, on_error=on_error, **kwargs)
        files = [p for p in paths if not self.isdir(p)]
        return dict(zip(files, self.client.read_many(files)))

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        p = self._strip_protocol(path)
        if self.auto_mkdir:
            self.client.makedirs(self._parent(p), exist_ok=True)
        if mode == "create":
            # An exclusive create: an existing file is never truncated, whatever a
            # look beforehand would have said.
            with self.client.open(p, "xb") as f:
                f.write(value)
            return
        self.client.write_bytes(p, value)

    # Namespace changes.

    def mkdir(self, path, create_parents=True, **kwargs):
        p = self._strip_protocol(path)
        if create_parents:
            # As fsspec's local and memory file systems: an existing name is an error.
            if self.client.exists(p):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), p)
            self.client.makedirs(p, exist_ok=True)
        else:
            self.client.mkdir(p)

    def makedirs(self, path, exist_ok=False):
        self.client.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def rmdir(self, path):
        self.client.rmdir(self._strip_protocol(path))

    def rm_file(self, path):
        self.client.remove(self._strip_protocol(path))

    def _rm(self, path):
        # A link is removed as a name, never followed (to a directory or not).
        p = self._strip_protocol(path)
        if statmod.S_ISDIR(self.client.lstat(p).st_mode):
            self.client.rmdir(p)
        else:
            self.client.remove(p)

    def _rm_tree(self, p: str, depth, maxdepth) -> None:
        """Removes `p` and, if it is a directory (not a link to one), what is under it,
        as shutil.rmtree does: a link inside is removed, its target left alone."""
        if statmod.S_ISDIR(self.client.lstat(p).st_mode):
            if maxdepth is not None and depth >= maxdepth:
                raise OSError(errno.ENOTEMPTY, "deeper than maxdepth", p)
            for e in self.client.scandir(p):
                if e.is_dir(follow_symlinks=False):
                    self._rm_tree(e.path, depth + 1, maxdepth)
                else:
                    self.client.remove(e.path)
            self.client.rmdir(p)
        else:
            self.client.remove(p)

    def rm(self, path, recursive=False, maxdepth=None):
        # Globs are expanded without recursing: the walk below never follows a link,
        # where fsspec's (which lists a link by its target's type) would.
        for p in self.expand_path(path, recursive=False):
            p = self._strip_protocol(p)
            if recursive:
                self._rm_tree(p, 0, maxdepth)
            else:
                self._rm(p)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """Atomic renames (each of a file or a whole directory), not a copy and delete,
        to where fsspec's `AbstractFileSystem.mv` would put them: one source into
        `path2` when that is an existing directory (or ends with "/"), else as
        `path2`; a glob's matches under `path2` by their paths below what they share, a
        list's by their last names. Missing parents are made with `auto_mkdir`; a
        name that exists and looks like a glob (`run[1].csv`) is taken as itself."""
        if path1 == path2:
            return
        dest = self._strip_protocol(path2)
        dest_dir = isinstance(path2, str) and path2.endswith("/")
        # `glob.has_magic`: what fsspec's own `copy` and `expand_path` take for a glob.
        literal = isinstance(path1, str) and (
            not glob.has_magic(path1) or self.client.lexists(self._strip_protocol(path1)))
        if literal:
            src = self._strip_protocol(path1)
            if src == dest:
                return
            if dest_dir or self.client.isdir(dest):
                dest = posixpath.join(dest, posixpath.basename(src))
            pairs = [(src, dest)]
        else:
            from fsspec.utils import other_paths

            sources = [self._strip_protocol(p) for p in self.expand_path(path1)]
            pattern = isinstance(path1, str)
            # As AbstractFileSystem.copy: a glob with one match lands inside `path2`.
            targets = other_paths(sources, dest, exists=pattern and len(sources) == 1,
                                  flatten=not pattern)
            if len(set(targets)) < len(targets):
                raise ValueError(f"mv: two of {sources} would land on the same name under "
                                 f"{dest}")
            pairs = list(zip(sources, targets))
        for src, target in pairs:
            if self.auto_mkdir:
                self.client.makedirs(self._parent(target), exist_ok=True)
            self.client.rename(src, target)

    def cp_file(self, path1, path2, **kwargs):
        p1, p2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.client.isdir(p1):
            self.client.makedirs(p2, exist_ok=True)
            return
        if self.auto_mkdir:
            self.client.makedirs(self._parent(p2), exist_ok=True)
        with self.client.open(p1, "rb") as src, self.client.open(p2, "wb") as dst:
            while chunk := src.read(16 << 20):
                dst.write(chunk)
