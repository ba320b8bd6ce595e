"""Issue 29's benchmark: a data set and a checkpoint through the Python package and
through the mount, beside the local disk's own rates, in one run (scripts/bench-python.sh
starts the cluster, drops the caches and calls this).

Phases, each timed alone, caches dropped before every read:
  dataset-write   the data set written through the package (the setup; timed for the table)
  dataset-local   the same files read cold from the local disk by WORKERS processes: the limit
  dataset-loopback the same files read cold from the local disk by a server process per
                  reader and sent to it over loopback TCP (`loopback_part`): the limit of
                  this machine for any reader fed by a TCP server that reads the bytes
                  (three copies, twice the processes)
  dataset-package-plain read cold through the package by WORKERS processes (read_many
                  batches of 64), as dataset-local reads: no DataLoader
  dataset-mount   read cold through the mount by WORKERS processes, whole files
  dataset-package the same as dataset-package-plain (without torch; with torch: below)
  ckpt-local      a CKPT_MIB checkpoint written to the local disk, fsync: local rate / copies
                  is what the disk allows with the copies written
  ckpt-mount      the checkpoint saved through the mount (write, fsync, rename)
  ckpt-package    the checkpoint saved through the package (the same steps)
  load-local, load-mount, load-package: the checkpoint read back cold
  latency-local, latency-mount, latency-package: LATENCY_READS reads of 4 KiB at random
                  aligned offsets of the checkpoint file, one at a time, caches dropped
                  first: with O_DIRECT on the local disk and the mount, through a package
                  file object (no FUSE) on the cluster; the median and 99th percentile of
                  each read's time (issue 25: the package within 100 us of the local disk)

With torch importable, the data set is read by a torch DataLoader with WORKERS workers
(TesseraDataset through the package, a plain file Dataset through the mount) and the
checkpoint is a state dict saved with torch.save / tessera.torch.save; without it, the
same bytes move through multiprocessing workers and numpy.save, and the table says so.
With torch, dataset-local-loader is the same DataLoader over the local disk's files (the
DataLoader's own cost on this machine, beside the mount's and the package's), and
dataset-warm-loader the same again at once, the files still in the page cache: the rate
the DataLoader itself carries here when no read waits for a disk, the ceiling of any
reader behind it.
With torch the data set is also read as uint8 tensors (what a data loader hands on):
  dataset-mount-tensor    each file read with readinto straight into a tensor in shared
                          memory (the best a mount's reader can do: no pipe copy)
  dataset-package-tensor  TesseraDataset(as_tensor=True): the same, filled by the native
                          client
A worker's `bytes` cross to the main process through a pipe (pickled, two copies); a
tensor in shared memory crosses as a handle.

Before every timed phase the machine is let settle as scripts/bench.sh does (`settle`):
the data servers delete a removed data set's chunks in the background, and a phase run
meanwhile (the local checkpoint first) would share the disk with that deletion.
"""

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import time

MIB = 1 << 20


# `settle`: at most this long, until SETTLE_QUIET_S seconds in a row each had under
# 4 MiB written to the bench disk, the disk busy under 10% of the time and under half a
# core busy (scripts/bench.sh's rule).
SETTLE_MAX_S = 60
SETTLE_QUIET_S = 2
# The bench disk's (major, minor), set by `main` from --local; None: no settling.
BENCH_DISK = None
# Seconds each settle waited, in phase order, for the results.
SETTLED = []


def disk_counts():
    """(sectors written, ms busy) of the bench disk from /proc/diskstats; None if it has
    no line there (a file system on no block device of its own: btrfs, overlayfs)."""
    with open("/proc/diskstats") as f:
        for line in f:
            v = line.split()
            if (int(v[0]), int(v[1])) == BENCH_DISK:
                return int(v[9]), int(v[12])
    return None


def cpu_busy_ticks():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6]


def settle():
    """Waits until the machine is quiet (see SETTLE_MAX_S); returns the seconds waited."""
    if BENCH_DISK is None:  # `main` found no diskstats line for it
        return 0
    hz = os.sysconf("SC_CLK_TCK")
    quiet = waited = 0
    w0, b0 = disk_counts()
    c0 = cpu_busy_ticks()
    while quiet < SETTLE_QUIET_S and waited < SETTLE_MAX_S:
        time.sleep(1)
        waited += 1
        w1, b1 = disk_counts()
        c1 = cpu_busy_ticks()
        calm = (w1 - w0) * 512 < 4 * MIB and b1 - b0 < 100 and c1 - c0 < hz // 2
        quiet = quiet + 1 if calm else 0
        w0, b0, c0 = w1, b1, c1
    if quiet < SETTLE_QUIET_S:
        print(f"the machine did not settle within {SETTLE_MAX_S} s; measuring anyway",
              file=sys.stderr, flush=True)
        waited = -waited  # the results say which phases never settled
    SETTLED.append(waited)
    return waited


def drop_caches():
    settle()
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def sizes(n, lo, hi, seed=29):
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(n)]


def names(n):
    # 100 files per directory, as data sets shard their samples.
    return [f"d{i // 100:04d}/{i:06d}.bin" for i in range(n)]


KEY_FILE = os.environ.get("TESSERA_KEY_FILE", "")


def connect(addr):
    import tessera

    return tessera.connect([addr], key_file=KEY_FILE) if KEY_FILE else tessera.connect([addr])


# ------------------------------------------------------------------ data set
def write_dataset(addr, local_dir, files, lo, hi):
    fs = connect(addr)
    payload = os.urandom(hi)
    total = 0
    spent = 0.0
    made = set()
    for name, size in zip(names(files), sizes(files, lo, hi)):
        d = os.path.dirname(name)
        t0 = time.monotonic()
        if d not in made:
            fs.makedirs("/ds/" + d, exist_ok=True)
        fs.write_bytes("/ds/" + name, payload[:size])
        spent += time.monotonic() - t0
        if d not in made:
            os.makedirs(os.path.join(local_dir, d), exist_ok=True)
            made.add(d)
        with open(os.path.join(local_dir, name), "wb") as f:
            f.write(payload[:size])
        total += size
    # The package's own time: one writer, one file at a time.
    return total, spent


def read_local_part(args):
    root, part = args
    n = 0
    for name in part:
        with open(os.path.join(root, name), "rb") as f:
            n += len(f.read())
    return n


def read_package_part(args):
    addr, part, batch = args
    fs = connect(addr)
    n = 0
    for i in range(0, len(part), batch):
        for data in fs.read_many(["/ds/" + p for p in part[i : i + batch]]):
            n += len(data)
    return n


def loopback_part(args):
    """The files of `part` read by a server process of this worker's own (a child:
    read each file whole, send its length and bytes) and received over a loopback TCP
    connection into a fresh buffer each: the three copies every TCP file server makes
    that checks its bytes in user space (page cache to the server, into the socket,
    out of it), and the two processes per reader. Bytes received."""
    import socket
    import struct

    root, part = args
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            lst.close()
            with socket.create_connection(("127.0.0.1", port)) as c:
                for name in part:
                    with open(os.path.join(root, name), "rb") as f:
                        data = f.read()
                    c.sendall(struct.pack("<Q", len(data)))
                    c.sendall(data)
            code = 0
        finally:
            os._exit(code)
    n = 0
    try:
        conn, _ = lst.accept()
        with conn:
            head = bytearray(8)
            for _ in part:
                got = 0
                while got < 8:
                    k = conn.recv_into(memoryview(head)[got:])
                    if not k:
                        raise SystemExit("the loopback server closed early")
                    got += k
                (size,) = struct.unpack("<Q", head)
                buf = bytearray(size)
                view = memoryview(buf)
                got = 0
                while got < size:
                    k = conn.recv_into(view[got:])
                    if not k:
                        raise SystemExit("the loopback server closed early")
                    got += k
                n += size
    finally:
        lst.close()
        _, status = os.waitpid(pid, 0)
    if status != 0:
        raise SystemExit(f"the loopback server exited with status {status}")
    return n


def split(items, k):
    return [items[i::k] for i in range(k)]


def timed_pool(fn, parts):
    ctx = mp.get_context("spawn")
    with ctx.Pool(len(parts)) as pool:
        t0 = time.monotonic()
        got = sum(pool.map(fn, parts))
        return got, time.monotonic() - t0


def torch_loader(dataset, workers):
    import torch.utils.data as tud

    loader = tud.DataLoader(dataset, batch_size=16, num_workers=workers, collate_fn=lambda b: b)
    t0 = time.monotonic()
    n = sum(len(x) for batch in loader for x in batch)
    return n, time.monotonic() - t0


def dataset_reads(addr, mnt, local_dir, files, workers, use_torch):
    all_names = names(files)
    out = {}
    drop_caches()
    out["dataset-local"] = timed_pool(read_local_part, [(local_dir, p) for p in split(all_names, workers)])
    # This machine's limit for a reader fed by a TCP server (see `loopback_part`), and
    # the package read the same way as the local disk (plain processes, no DataLoader).
    drop_caches()
    out["dataset-loopback"] = timed_pool(loopback_part, [(local_dir, p) for p in split(all_names, workers)])
    drop_caches()
    out["dataset-package-plain"] = timed_pool(
        read_package_part, [(addr, p, 64) for p in split(all_names, workers)]
    )
    if use_torch:
        import torch.utils.data as tud
        import tessera.torch as tt

        class Plain(tud.Dataset):
            def __init__(self, root):
                self.root = root

            def __len__(self):
                return len(all_names)

            def __getitem__(self, i):
                with open(os.path.join(self.root, all_names[i]), "rb") as f:
                    return f.read()

        class PlainTensor(tud.Dataset):
            def __len__(self):
                return len(all_names)

            def __getitem__(self, i):
                import ctypes

                import torch

                with open(os.path.join(mnt, "ds", all_names[i]), "rb", buffering=0) as f:
                    n = os.fstat(f.fileno()).st_size
                    t = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(n))
                    view = memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B")
                    got = 0
                    while got < n:
                        k = f.readinto(view[got:])
                        if not k:
                            break
                        got += k
                    return t[:got]

        drop_caches()
        out["dataset-local-loader"] = torch_loader(Plain(local_dir), workers)
        # Again with the files still in the page cache (as far as memory holds them):
        # no reader waits for a disk, so this is what the DataLoader itself carries here.
        out["dataset-warm-loader"] = torch_loader(Plain(local_dir), workers)
        drop_caches()
        out["dataset-mount"] = torch_loader(Plain(os.path.join(mnt, "ds")), workers)
        drop_caches()
        ds = tt.TesseraDataset(["/ds/" + n for n in all_names], fs=connect(addr))
        out["dataset-package"] = torch_loader(ds, workers)
        drop_caches()
        out["dataset-mount-tensor"] = torch_loader(PlainTensor(), workers)
        drop_caches()
        ds = tt.TesseraDataset(["/ds/" + n for n in all_names], fs=connect(addr), as_tensor=True)
        out["dataset-package-tensor"] = torch_loader(ds, workers)
    else:
        drop_caches()
        mount_parts = [(os.path.join(mnt, "ds"), p) for p in split(all_names, workers)]
        out["dataset-mount"] = timed_pool(read_local_part, mount_parts)
        out["dataset-package"] = out["dataset-package-plain"]
    return out


# ------------------------------------------------------------------ checkpoint
def state(ckpt_mib, use_torch):
    """A state dict of 16 tensors (float32) adding up to ckpt_mib."""
    import numpy as np

    per = ckpt_mib * MIB // 16 // 4
    rng = np.random.default_rng(29)
    arrays = {f"layer{i}.weight": rng.standard_normal(per, dtype=np.float32) for i in range(16)}
    if use_torch:
        import torch

        return {k: torch.from_numpy(v) for k, v in arrays.items()}
    return arrays


def save_to(f, obj, use_torch):
    if use_torch:
        import torch

        torch.save(obj, f)
    else:
        import numpy as np

        np.savez(f, **obj)


def load_from(f, use_torch):
    if use_torch:
        import torch

        return torch.load(f)
    import numpy as np

    with np.load(f) as z:
        return {k: z[k] for k in z.files}


def ckpt_local_or_mount(root, obj, use_torch):
    final = os.path.join(root, "ckpt-posix.bin")
    tmp = final + ".tmp"
    t0 = time.monotonic()
    with open(tmp, "wb") as f:
        save_to(f, obj, use_torch)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, final)
    return os.path.getsize(final), time.monotonic() - t0


def ckpt_package(addr, obj, use_torch):
    fs = connect(addr)
    t0 = time.monotonic()
    if use_torch:
        import tessera.torch as tt

        tt.save(obj, "/ckpt-package.bin", fs=fs)
    else:
        # The steps tessera.torch.save takes, with numpy in place of torch.
        with fs.open("/ckpt-package.bin.tmp", "wb") as f:
            save_to(f, obj, use_torch)
            f.flush()
            f.raw.sync() if hasattr(f, "raw") else f.sync()
        fs.rename("/ckpt-package.bin.tmp", "/ckpt-package.bin")
    return fs.stat("/ckpt-package.bin").st_size, time.monotonic() - t0


def load_local_or_mount(root, use_torch):
    path = os.path.join(root, "ckpt-posix.bin")
    t0 = time.monotonic()
    with open(path, "rb") as f:
        obj = load_from(f, use_torch)
    return os.path.getsize(path), time.monotonic() - t0, len(obj)


def load_package(addr, use_torch):
    fs = connect(addr)
    t0 = time.monotonic()
    if use_torch:
        import tessera.torch as tt

        obj = tt.load("/ckpt-package.bin", fs=fs)
    else:
        with fs.open("/ckpt-package.bin", "rb") as f:
            obj = load_from(f, use_torch)
    return fs.stat("/ckpt-package.bin").st_size, time.monotonic() - t0, len(obj)


LATENCY_READS = 2000


def latencies(read_at, size, seed=25):
    """Times LATENCY_READS reads of 4 KiB at random aligned offsets below `size`: the
    median and the 99th percentile, in microseconds."""
    rng = random.Random(seed)
    took = []
    for _ in range(LATENCY_READS):
        off = rng.randrange(size // 4096) * 4096
        t = time.perf_counter_ns()
        n = read_at(off)
        took.append(time.perf_counter_ns() - t)
        if n != 4096:
            raise SystemExit(f"a 4 KiB read at {off} returned {n} bytes")
    took.sort()
    return took[len(took) // 2] / 1000, took[len(took) * 99 // 100] / 1000


def latency_posix(root):
    import mmap

    path = os.path.join(root, "ckpt-posix.bin")
    buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        return latencies(lambda off: os.preadv(fd, [buf], off), os.fstat(fd).st_size)
    finally:
        os.close(fd)


def latency_package(addr):
    fs = connect(addr)
    buf = bytearray(4096)
    with fs.open("/ckpt-package.bin", "rb", buffering=0) as f:
        def read_at(off):
            f.seek(off)
            return f.readinto(buf)

        return latencies(read_at, fs.stat("/ckpt-package.bin").st_size)


#: How long the checkpoints wait for the removed data set's room.
ROOM_WAIT_S = 600


def wait_for_room(path, need):
    """Waits until the disk holding `path` has `need` bytes free: the data servers delete
    the chunks of removed files in the background, so the data set's room on the
    cluster comes back some time after its removal returned. Exits with a clear message
    if it does not within ROOM_WAIT_S, rather than let a checkpoint fail half-written."""
    t0 = time.monotonic()
    while True:
        free = shutil.disk_usage(path).free
        if free >= need:
            return
        if time.monotonic() - t0 > ROOM_WAIT_S:
            raise SystemExit(
                f"the checkpoints need {need // MIB:,} MiB free under {path}; "
                f"{free // MIB:,} MiB are, {ROOM_WAIT_S} s after the data set was removed"
            )
        time.sleep(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--addr", required=True)
    p.add_argument("--mount", required=True)
    p.add_argument("--local", required=True)
    p.add_argument("--files", type=int, default=20000)
    p.add_argument("--min-bytes", type=int, default=100 * 1024)
    p.add_argument("--max-bytes", type=int, default=MIB)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--ckpt-mib", type=int, default=4096)
    p.add_argument("--copies", type=int, default=3)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    global BENCH_DISK
    os.makedirs(a.local, exist_ok=True)
    dev = os.stat(a.local).st_dev
    BENCH_DISK = (os.major(dev), os.minor(dev))
    if disk_counts() is None:
        print(f"{a.local} is on no disk of /proc/diskstats: phases start without settling",
              file=sys.stderr, flush=True)
        BENCH_DISK = None
    try:
        import torch  # noqa: F401

        use_torch = True
    except ImportError:
        use_torch = False
    res = {"torch": use_torch, "files": a.files, "workers": a.workers, "ckpt_mib": a.ckpt_mib}
    n, s = write_dataset(a.addr, a.local, a.files, a.min_bytes, a.max_bytes)
    res["dataset-write"] = (n, s)
    res.update(dataset_reads(a.addr, a.mount, a.local, a.files, a.workers, use_torch))
    # The data set's room (its copies and the local one) is the checkpoints' next.
    for d in sorted({n.split("/")[0] for n in names(a.files)}):
        shutil.rmtree(os.path.join(a.local, d))
    shutil.rmtree(os.path.join(a.mount, "ds"))
    # Three checkpoints at once at the most (the package's is written beside the
    # mount's and the local one), each with its copies on the cluster.
    wait_for_room(a.local, a.ckpt_mib * MIB * (2 * a.copies + 1) * 21 // 20)
    obj = state(a.ckpt_mib, use_torch)
    drop_caches()
    res["ckpt-local"] = ckpt_local_or_mount(a.local, obj, use_torch)
    drop_caches()
    res["ckpt-mount"] = ckpt_local_or_mount(a.mount, obj, use_torch)
    drop_caches()
    res["ckpt-package"] = ckpt_package(a.addr, obj, use_torch)
    del obj
    for name, fn in (
        ("load-local", lambda: load_local_or_mount(a.local, use_torch)),
        ("load-mount", lambda: load_local_or_mount(a.mount, use_torch)),
        ("load-package", lambda: load_package(a.addr, use_torch)),
    ):
        drop_caches()
        res[name] = fn()[:2]
    for name, fn in (
        ("latency-local", lambda: latency_posix(a.local)),
        ("latency-mount", lambda: latency_posix(a.mount)),
        ("latency-package", lambda: latency_package(a.addr)),
    ):
        drop_caches()
        res[name] = fn()
    res["settled-s"] = SETTLED
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
