#!/usr/bin/env python3
"""Helpers of scripts/bench.sh (standard library only, except `report`, which needs
matplotlib for the chart).

  bench.py dataset-create DIR FILES MIN_BYTES MAX_BYTES READERS
      FILES files of uniformly random sizes (seeded), spread over READERS folders
      DIR/r0 .. DIR/rN-1, written by READERS processes in parallel.
  bench.py dataset-read DIR READERS MAX_SECONDS
      READERS processes each open, read whole (1 MiB reads) and close every file of its
      folder, in a seeded shuffled order, as a data loader does. Prints JSON.
  bench.py meta DIR FILES PROCS PHASE [dirs]   PHASE: create | stat | remove
      PROCS processes create (O_CREAT|O_EXCL, then close), stat or remove FILES empty
      files in total in one shared folder, or with `dirs` each in a folder of its own
      (DIR/p0 .. DIR/pN-1: the kernel's lock of a directory then serializes nothing, and
      what is left is the file system's own rate). Prints JSON.
  bench.py small-files DIR FILES BYTES
      One process writes FILES files of BYTES whole: open (O_CREAT|O_EXCL), one write,
      close, as a data set's samples or `tar x` are written. Prints JSON.
  bench.py appends DIR DIR2 RECORDS BYTES MODE   MODE: plain | strided | append | append2
      RECORDS records of BYTES, one os.write each, to DIR/MODE.log, then close: plain
      writes, O_APPEND writes, or O_APPEND writes from two processes at once, the second
      through DIR2 (the same folder through another mount, or DIR), RECORDS / 2 each.
      Checks the file's length. Prints JSON.
  bench.py fio-value FILE.json KIND         KIND: read-mibs | write-mibs | read-iops |
                                            read-p50-us (the median completion latency)
  bench.py report RUN_DIR OUT_BASE          Markdown table OUT_BASE.md, chart OUT_BASE.png
"""

import json
import multiprocessing as mp
import os
import random
import sys
import time

MIB = 1 << 20
SEED = 20240605


# ---------------------------------------------------------------- data set (a)

def dataset_sizes(files, lo, hi):
    rng = random.Random(SEED)
    return [rng.randint(lo, hi) for _ in range(files)]


def _create_part(args):
    d, names_sizes = args
    os.makedirs(d, exist_ok=True)
    block = os.urandom(MIB)
    for name, size in names_sizes:
        fd = os.open(os.path.join(d, name), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            done = 0
            while done < size:
                done += os.write(fd, block[: min(MIB, size - done)])
        finally:
            os.close(fd)
    return len(names_sizes)


def dataset_create(d, files, lo, hi, readers):
    sizes = dataset_sizes(files, lo, hi)
    parts = [[] for _ in range(readers)]
    for i, s in enumerate(sizes):
        parts[i % readers].append((f"f{i:06d}.bin", s))
    t = time.monotonic()
    with mp.Pool(readers) as pool:
        n = sum(pool.map(_create_part, [(os.path.join(d, f"r{r}"), p) for r, p in enumerate(parts)]))
    secs = time.monotonic() - t
    print(json.dumps({"files": n, "bytes": sum(sizes), "seconds": secs, "files_s": n / secs,
                      "mibs": sum(sizes) / MIB / secs}))


def _read_part(args):
    d, index, deadline, barrier = args
    names = sorted(os.listdir(d))
    random.Random(SEED + index).shuffle(names)
    buf = bytearray(MIB)
    view = memoryview(buf)
    nbytes = nfiles = 0
    barrier.wait()
    for name in names:
        if time.monotonic() > deadline:
            break
        fd = os.open(os.path.join(d, name), os.O_RDONLY)
        try:
            while True:
                n = os.readv(fd, [view])
                if n == 0:
                    break
                nbytes += n
        finally:
            os.close(fd)
        nfiles += 1
    return nbytes, nfiles, len(names), time.monotonic()


def dataset_read(d, readers, max_seconds):
    with mp.Manager() as m:
        barrier = m.Barrier(readers + 1)
        deadline = time.monotonic() + max_seconds
        args = [(os.path.join(d, f"r{r}"), r, deadline, barrier) for r in range(readers)]
        with mp.Pool(readers) as pool:
            res = pool.map_async(_read_part, args)
            barrier.wait()
            t = time.monotonic()
            out = res.get(max_seconds + 600)
    secs = max(o[3] for o in out) - t
    nbytes = sum(o[0] for o in out)
    nfiles = sum(o[1] for o in out)
    print(json.dumps({"files": nfiles, "bytes": nbytes, "seconds": secs,
                      "mibs": nbytes / MIB / secs, "files_s": nfiles / secs,
                      "complete": nfiles == sum(o[2] for o in out)}))


# ---------------------------------------------------------------- metadata (e)

def _meta_part(args):
    d, proc, count, phase, barrier = args
    names = [os.path.join(d, f"p{proc}.{i:06d}") for i in range(count)]
    os.makedirs(d, exist_ok=True)
    barrier.wait()
    if phase == "create":
        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
        for p in names:
            os.close(os.open(p, flags, 0o644))
    elif phase == "stat":
        for p in names:
            os.stat(p)
    else:
        for p in names:
            os.unlink(p)
    return time.monotonic()


def meta(d, files, procs, phase, own_dirs=False, second=None):
    # `second`: the same folder through another mount; every other process works there.
    os.makedirs(d, exist_ok=True)
    per = files // procs
    base = [second if second and p % 2 else d for p in range(procs)]
    where = [os.path.join(base[p], f"p{p}") if own_dirs else base[p] for p in range(procs)]
    with mp.Manager() as m:
        barrier = m.Barrier(procs + 1)
        with mp.Pool(procs) as pool:
            res = pool.map_async(_meta_part,
                                 [(where[p], p, per, phase, barrier) for p in range(procs)])
            barrier.wait()
            t = time.monotonic()
            ends = res.get(3600)
    secs = max(ends) - t
    if own_dirs and phase == "remove":
        for w in where:
            os.rmdir(w)
    print(json.dumps({"phase": phase, "ops": per * procs, "seconds": secs,
                      "ops_s": per * procs / secs, "own_dirs": own_dirs}))


def small_files(d, files, nbytes):
    os.makedirs(d, exist_ok=True)
    data = os.urandom(nbytes)
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    t = time.monotonic()
    for i in range(files):
        fd = os.open(os.path.join(d, f"s{i:06d}.bin"), flags, 0o644)
        try:
            if os.write(fd, data) != nbytes:
                raise SystemExit("short write")
        finally:
            os.close(fd)
    secs = time.monotonic() - t
    if os.stat(os.path.join(d, f"s{files - 1:06d}.bin")).st_size != nbytes:
        raise SystemExit("the last file's length differs from what was written")
    print(json.dumps({"files": files, "bytes": nbytes, "seconds": secs, "files_s": files / secs}))


# ---------------------------------------------------------------- small writes (g)

def _append_part(args):
    path, count, nbytes, flags, stride, barrier = args
    rec = (b"r" * (nbytes - 1)) + b"\n"
    barrier.wait()
    fd = os.open(path, flags, 0o644)
    if stride:
        for i in range(count):
            os.pwrite(fd, rec, i * stride)
    else:
        for _ in range(count):
            os.write(fd, rec)
    os.close(fd)
    return time.monotonic()


def appends(d, d2, records, nbytes, mode):
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{mode}.log")
    os.close(os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644))
    want = records * nbytes
    if mode == "plain":
        parts = [(path, records, nbytes, os.O_WRONLY, 0)]
    elif mode == "strided":
        # Each write leaves a gap as long as itself: every write a separate range.
        parts = [(path, records, nbytes, os.O_WRONLY, 2 * nbytes)]
        want = (2 * records - 1) * nbytes
    elif mode == "append":
        parts = [(path, records, nbytes, os.O_WRONLY | os.O_APPEND, 0)]
    else:
        half = records // 2
        flags = os.O_WRONLY | os.O_APPEND
        parts = [(path, half, nbytes, flags, 0),
                 (os.path.join(d2, f"{mode}.log"), half, nbytes, flags, 0)]
    with mp.Manager() as m:
        barrier = m.Barrier(len(parts) + 1)
        with mp.Pool(len(parts)) as pool:
            res = pool.map_async(_append_part, [p + (barrier,) for p in parts])
            barrier.wait()
            t = time.monotonic()
            ends = res.get(3600)
    secs = max(ends) - t
    total = sum(p[1] for p in parts)
    # Another mount's appends reach this mount's view of the length once its cached
    # attributes expire (a second at most).
    for _ in range(50):
        size = os.stat(path).st_size
        if size == want:
            break
        time.sleep(0.1)
    if size != want:
        raise SystemExit(f"{path}: {size} bytes, {want} expected")
    print(json.dumps({"mode": mode, "writes": total, "seconds": secs, "ops_s": total / secs}))


# ---------------------------------------------------------------- fio

def fio_value(path, kind):
    with open(path) as f:
        text = f.read()
    # fio may print notes before the JSON document.
    j = json.loads(text[text.index("{"):])
    read = sum(job["read"]["bw_bytes"] for job in j["jobs"])
    write = sum(job["write"]["bw_bytes"] for job in j["jobs"])
    iops = sum(job["read"]["iops"] for job in j["jobs"])
    errors = sum(job.get("error", 0) for job in j["jobs"])
    if errors:
        raise SystemExit(f"{path}: fio reported errors")
    if kind == "read-p50-us":
        if len(j["jobs"]) != 1:
            raise SystemExit(f"{path}: a median latency needs one job (group_reporting)")
        pct = j["jobs"][0]["read"]["clat_ns"]["percentile"]
        print(f"{pct['50.000000'] / 1000:.1f}")
        return
    value = {"read-mibs": read / MIB, "write-mibs": write / MIB, "read-iops": iops}[kind]
    print(f"{value:.1f}")


# ---------------------------------------------------------------- report

SYSTEMS = [
    ("local", "local disk"),
    ("bindfs", "bindfs (FUSE passthrough)"),
    ("tessera-base", "Tessera at the base revision"),
    ("tessera", "Tessera"),
    ("tessera-etcd", "Tessera on etcd (tmpfs)"),
    ("tessera-etcd-disk", "Tessera on etcd (disk)"),
    ("tessera-etcd-shared", "Tessera on etcd, both servers serving (tmpfs)"),
    ("moosefs", "MooseFS"),
    ("glusterfs", "GlusterFS"),
    ("juicefs", "JuiceFS"),
]

# (key, table label, chart label, unit)
METRICS = [
    ("dataset_mibs", "(a) data-set read, {DATASET}, {READERS} readers", "(a) data-set read", "MiB/s"),
    ("dataset_files_s", "(a) data-set read, files/s", "(a) data-set files/s", "files/s"),
    ("dataset_write_files_s", "(a) writing the data set (create, write, close), {READERS} writers",
     "(a) data-set write", "files/s"),
    ("seq_read_mibs", "(b) sequential read of {SEQ} in 1 MiB", "(b) seq read", "MiB/s"),
    ("seq_write_mibs", "(b) writing that file: 1 writer, 1 MiB, + fsync", "(b) seq write, 1 writer",
     "MiB/s"),
    ("ckpt_write_mibs", "(c) checkpoint write, {CKPT_JOBS} x {CKPT} + fsync", "(c) checkpoint write",
     "MiB/s"),
    ("shard_write_mibs", "(c) {CKPT_JOBS} writers, disjoint ranges of one file, + fsync",
     "(c) one shared file", "MiB/s"),
    ("rand_read_iops", "(d) 4 KiB random read, {RAND_JOBS} jobs, {RAND_S} s, buffered (page cache "
     "allowed)", "(d) 4 KiB rand read, cached", "IOPS"),
    ("rand_read_direct_iops", "(d) 4 KiB random read with O_DIRECT, {RAND_JOBS} jobs (the file system, "
     "not the page cache)",
     "(d) 4 KiB rand read, O_DIRECT", "IOPS"),
    ("rand_read_direct_p50_us", "(d) one O_DIRECT 4 KiB random read, 1 job: median latency "
     "(lower is better)", "(d) O_DIRECT read latency, lower is better", "us"),
    ("creates_s", "(e) create empty files, {META_PROCS} processes", "(e) creates", "ops/s"),
    ("stats_s", "(e) stat", "(e) stats", "ops/s"),
    ("removes_s", "(e) remove", "(e) removes", "ops/s"),
    ("creates_dirs_s", "(e) create empty files, {META_DIR_PROCS} processes, a folder each",
     "(e) creates, own folders", "ops/s"),
    ("stats_dirs_s", "(e) stat, a folder each", "(e) stats, own folders", "ops/s"),
    ("removes_dirs_s", "(e) remove, a folder each", "(e) removes, own folders", "ops/s"),
    ("creates_dirs2_s", "(e) create, {META_DIR_PROCS} processes a folder each, half through a "
     "second mount on the other metadata server (tessera-etcd-shared only)",
     "(e) creates, own folders, 2 servers", "ops/s"),
    ("stats_dirs2_s", "(e) stat, the same over 2 servers", "(e) stats, own folders, 2 servers",
     "ops/s"),
    ("removes_dirs2_s", "(e) remove, the same over 2 servers",
     "(e) removes, own folders, 2 servers", "ops/s"),
    ("small_files_s", "(e) small files written whole (create, write {SMALL}, close), 1 process",
     "(e) small files written whole", "files/s"),
    ("plain_writes_s", "(g) small writes to one file, {APPENDS}, + close", "(g) small writes",
     "writes/s"),
    ("strided_writes_s", "(g) the same with a gap as long as each write after it (separate ranges)",
     "(g) small writes, separate", "writes/s"),
    ("append_writes_s", "(g) the same with O_APPEND, 1 process", "(g) O_APPEND, 1 writer",
     "writes/s"),
    ("append2_writes_s", "(g) O_APPEND from 2 mounts at once (peers: 2 processes)",
     "(g) O_APPEND, 2 mounts", "writes/s"),
]

# (metric, peer, target) from issue 5.
TARGETS = [
    ("seq_read_mibs", "moosefs", 3.0, "sequential read"),
    ("seq_read_mibs", "glusterfs", 3.0, "sequential read"),
    ("ckpt_write_mibs", "moosefs", 3.0, "checkpoint write"),
    ("ckpt_write_mibs", "glusterfs", 3.0, "checkpoint write"),
    ("dataset_mibs", "moosefs", 3.0, "data-set read"),
    ("creates_s", "moosefs", 10.0, "creates"),
    ("rand_read_iops", "moosefs", 2.0, "4 KiB random read"),
    ("seq_read_mibs", "bindfs", 0.6, "sequential read"),
]

# (metric, target against bindfs, target against MooseFS or None) from issue 25: small
# files and metadata against the FUSE passthrough of the same disk.
TARGETS_25 = [
    ("dataset_mibs", 0.9, 2.0),
    ("dataset_write_files_s", 0.9, None),
    ("creates_s", 0.9, None),
    ("stats_s", 0.9, None),
    ("removes_s", 0.9, None),
    ("creates_dirs_s", 1.0, None),
    ("removes_dirs_s", 1.0, None),
    ("rand_read_direct_iops", 0.5, None),
    ("small_files_s", 0.9, None),
]


def read_kv(path):
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if "=" in line:
                    k, v = line.rstrip("\n").split("=", 1)
                    out[k] = v
    return out


def read_results(run):
    res = {}
    path = os.path.join(run, "results.tsv")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                s, k, v = line.rstrip("\n").split("\t")
                res.setdefault(s, {})[k] = v
    return res


def fmt(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return v if v else "-"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}"


def ratio(res, metric, a, b):
    try:
        return float(res[a][metric]) / float(res[b][metric])
    except (KeyError, ValueError, ZeroDivisionError):
        return None


class Missing(dict):
    """Settings for a label; one an older run did not record shows as `?`."""

    def __missing__(self, key):
        return "?"


def issue_25_table(res, info):
    """Issue 25's rows: Tessera against bindfs (the target) and MooseFS, where measured."""
    if "tessera" not in res or "bindfs" not in res:
        return []
    labels = {k: label.format_map(Missing(info)) for k, label, _, _ in METRICS}
    out = ["", "## Ratios named by issue 25's targets (Tessera / bindfs, Tessera / MooseFS)", "",
           "| workload | Tessera | bindfs | MooseFS | Tessera / bindfs | target | met "
           "| Tessera / MooseFS | target |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, vs_bindfs, vs_moosefs in TARGETS_25:
        rb = ratio(res, key, "tessera", "bindfs")
        rm = ratio(res, key, "tessera", "moosefs")
        cells = [fmt(res.get(s, {}).get(key)) for s in ("tessera", "bindfs", "moosefs")]
        met = "-" if rb is None else ("yes" if rb >= vs_bindfs else "no")
        if vs_moosefs is not None and rm is not None:
            met += " / " + ("yes" if rm >= vs_moosefs else "no")
        out.append(f"| {labels[key]} | " + " | ".join(cells) +
                   f" | {'-' if rb is None else f'{rb:.2f}x'} | >= {vs_bindfs:g}x | {met}"
                   f" | {'-' if rm is None else f'{rm:.2f}x'}"
                   f" | {'-' if vs_moosefs is None else f'>= {vs_moosefs:g}x'} |")
    lat = [(s, res.get(s, {}).get("rand_read_direct_p50_us")) for s in ("local", "tessera")]
    if all(v for _, v in lat):
        out += ["", f"O_DIRECT 4 KiB read, median: local disk {fmt(lat[0][1])} us, Tessera "
                f"through FUSE {fmt(lat[1][1])} us (issue 25 asks for the client API's own "
                "median within 100 us of the local disk's: scripts/bench-python.sh measures "
                "that one)."]
    return out


def report(run, out_base):
    info = read_kv(os.path.join(run, "info.env"))
    res = read_results(run)
    systems = [(k, n) for k, n in SYSTEMS if k in res]
    lines = [f"# Tessera beside local disk, FUSE passthrough and peers: {info.get('DATE', '?')}", ""]
    lines += [
        f"- command: `{info.get('COMMAND', '')}`",
        f"- commit: `{info.get('COMMIT', '?')}`{info.get('DIRTY', '')}"
        + (f"; tessera-base: `{info['BASE']}`" if info.get("BASE") else ""),
        f"- machine: {info.get('MACHINE', '?')}",
        f"- disk: {info.get('DISK', '?')}",
        f"- settings: {info.get('SETTINGS', '?')}",
        f"- versions: {info.get('VERSIONS', '?')}",
        "- method: each system is started, measured and stopped in turn, on the same disk; "
        "before every measured phase the machine is let settle (at most 60 s, until 2 s in a "
        "row with under 4 MiB/s written to the disk, the disk busy under 10% of the time "
        "and under half a core busy: background work left by the previous phase, such as "
        "deleting its files, is then in neither) and caches are dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`), so reads are "
        "cold in the kernel (JuiceFS keeps its own block cache on "
        "disk and MooseFS's client its own read cache: neither is dropped). (a), (e) and (g) are "
        "`scripts/bench/bench.py` (a data loader's open/read whole/close; create, stat, remove "
        "with `os` calls; small `os.write`s, plain and `O_APPEND`), (b)-(d) are fio with the `psync` engine, buffered, and (d) "
        "again with `O_DIRECT` (bindfs forwards it: `--forward-odirect`).",
        f"- note: {info.get('NOTE', '')}",
        "",
        "## Results",
        "",
    ]
    head = "| workload | unit | " + " | ".join(n for _, n in systems) + " |"
    lines += [head, "| --- | --- |" + " --- |" * len(systems)]
    for key, label, _, unit in METRICS:
        label = label.format_map(Missing(info)) if "{" in label else label
        cells = [fmt(res[s].get(key)) for s, _ in systems]
        lines.append(f"| {label} | {unit} | " + " | ".join(cells) + " |")
    lines.append("| load average (1 min) at start | | " +
                 " | ".join(res[s].get("load_start", "-") for s, _ in systems) + " |")
    lines.append("| load average (1 min) at end | | " +
                 " | ".join(res[s].get("load_end", "-") for s, _ in systems) + " |")
    lines.append("| time taken, start to stop | s | " +
                 " | ".join(fmt(res[s].get("seconds")) for s, _ in systems) + " |")
    notes = [(s, res[s]["note"]) for s, _ in systems if res[s].get("note")]
    if notes:
        lines += [""] + [f"- {dict(SYSTEMS)[s]}: {n}" for s, n in notes]
    lines += ["", "## Ratios named by issue 5's targets", "",
              "| ratio | target | measured | met |", "| --- | --- | --- | --- |"]
    for metric, peer, target, what in TARGETS:
        r = ratio(res, metric, "tessera", peer)
        peer_name = dict(SYSTEMS)[peer].split(" (")[0]
        if r is None:
            shown = "-"
        else:
            shown = f"{r:.2f}x" if target >= 1 else f"{r * 100:.0f}%"
        met = "-" if r is None else ("yes" if r >= target else "no")
        tgt = f">= {target:g}x" if target >= 1 else f">= {target * 100:.0f}%"
        lines.append(f"| {what}, Tessera / {peer_name} | {tgt} | {shown} | {met} |")
    lines += issue_25_table(res, info)
    refs = []
    for key, _, short, _ in METRICS:
        if key in ("dataset_files_s", "dataset_write_files_s"):
            continue
        r = ratio(res, key, "tessera", "juicefs")
        if r is not None:
            refs.append(f"{short}: {r:.2f}x")
    if refs:
        lines += ["", "Tessera / JuiceFS, for reference (no target): " + "; ".join(refs) + "."]
    ab = []
    for key, label, _, _ in METRICS:
        r = ratio(res, key, "tessera", "tessera-base")
        if r is not None:
            ab.append(f"| {label.format_map(Missing(info))} | {r:.2f}x |")
    if ab:
        lines += ["", f"## Tessera / Tessera at the base revision (`{info.get('BASE', '?')}`)", "",
                  "| workload | ratio |", "| --- | --- |"] + ab
    ha = []
    for key in ("creates_s", "stats_s", "removes_s"):
        for s in ("tessera-etcd", "tessera-etcd-disk", "tessera-etcd-shared"):
            r = ratio(res, key, s, "tessera")
            if r is not None:
                ha.append(f"| {key.removesuffix('_s')} | {dict(SYSTEMS)[s]} | {r:.2f}x |")
    if ha:
        lines += ["", "## What the namespace on etcd costs: Tessera on etcd / on its embedded store",
                  "", "| metadata operation | system | ratio |", "| --- | --- | --- |"] + ha
    lines.append("")
    with open(out_base + ".md", "w") as f:
        f.write("\n".join(lines))
    chart(res, systems, info, out_base + ".png")


def chart(res, systems, info, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in METRICS if m[0] not in ("dataset_files_s", "dataset_write_files_s")]
    colors = {"local": "#9e9e9e", "bindfs": "#616161", "tessera": "#d84315",
              "tessera-base": "#ff8a65", "tessera-etcd": "#ffb74d",
              "tessera-etcd-disk": "#a1887f", "tessera-etcd-shared": "#fdd835",
              "moosefs": "#1565c0", "glusterfs": "#2e7d32", "juicefs": "#6a1b9a"}
    rows = (len(metrics) + 2) // 3
    fig, axes = plt.subplots(rows, 3, figsize=(16, 4.25 * rows))
    for ax in axes.flat[len(metrics):]:
        ax.set_visible(False)
    for ax, (key, _, title, unit) in zip(axes.flat, metrics):
        names, vals, cols = [], [], []
        for s, n in systems:
            try:
                v = float(res[s].get(key))
            except (TypeError, ValueError):
                continue
            names.append(n.split(" (")[0].replace("local disk", "local"))
            vals.append(v)
            cols.append(colors[s])
        bars = ax.bar(range(len(vals)), vals, color=cols)
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=10)
        ax.set_title(f"{title} ({unit})", fontsize=12)
        ax.tick_params(axis="y", labelsize=9)
        top = max(vals) if vals else 1
        ax.set_ylim(0, top * 1.18)
        for b, v in zip(bars, vals):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height() + top * 0.01, fmt(v),
                    ha="center", va="bottom", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Tessera benchmark {info.get('DATE', '')}, commit {info.get('COMMIT', '?')}"
                 f"{info.get('DIRTY', '')}: {info.get('MACHINE_SHORT', '')}; higher is better "
                 "unless a title says otherwise", fontsize=13)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=90)


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    cmd, a = argv[1], argv[2:]
    if cmd == "dataset-create":
        dataset_create(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]))
    elif cmd == "dataset-read":
        dataset_read(a[0], int(a[1]), float(a[2]))
    elif cmd == "meta":
        if len(a) > 4 and a[4] != "dirs":
            raise SystemExit(__doc__)
        meta(a[0], int(a[1]), int(a[2]), a[3], len(a) > 4, a[5] if len(a) > 5 else None)
    elif cmd == "small-files":
        small_files(a[0], int(a[1]), int(a[2]))
    elif cmd == "appends":
        appends(a[0], a[1], int(a[2]), int(a[3]), a[4])
    elif cmd == "fio-value":
        fio_value(a[0], a[1])
    elif cmd == "report":
        report(a[0], a[1])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
