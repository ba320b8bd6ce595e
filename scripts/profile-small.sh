#!/usr/bin/env bash
# Where the time of a small file goes (issue 25): one process creates FILES files of 4 KiB
# through a mount (open O_CREAT|O_EXCL, one write, close), then, caches dropped, reads each
# back whole (open, read, close) and removes them (unlink); then it makes a 1 GiB file
# and, caches dropped, reads FILES blocks of 4 KiB at random offsets of it with O_DIRECT,
# one at a time (fio's 4 KiB O_DIRECT row in bench.sh). For each phase it prints:
#   - the wall time per file;
#   - per request type, the calls and their mean time as the mount saw them (the round
#     trip) and as the server that answered saw them (decode to reply), from the
#     processes' own /metrics, and the metadata log's syncs (count, mean);
#   - the requests the kernel sent to the mount, per file, by type, and each type's time
#     from the kernel's send to the mount's reply (the FUSE tracepoints), and how much of
#     the wall time per file no request covers (the program, the system call, the VFS);
#   - a flat CPU profile of the whole machine (perf, sampled): which process, and the
#     hottest functions, kernel included.
#
#   scripts/profile-small.sh [FILES]      (default 2000; needs root: perf, drop_caches)
#
# It builds a release, starts `tessera up` (3 data servers, 3 copies) in its own state
# directory and stops it in a trap, also on failure. Raw output: bench/tmp/profile-DATE/.
set -euo pipefail
FILES=${1:-2000}
[ "$(id -u)" = 0 ] || { echo "needs root (perf, drop_caches)" >&2; exit 1; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp/tessera-bench}
OUT=$ROOT/bench/tmp/profile-$(date -u +%Y%m%d-%H%M)
MNT=$BENCH_DIR/mnt/tessera-profile
STATE=$BENCH_DIR/tessera-profile-state
BIN=$ROOT/target/release/tessera
mkdir -p "$OUT" "$MNT"
command -v perf >/dev/null || { echo "perf is not installed (Debian: linux-perf)" >&2; exit 1; }

cleanup() {
  # --forget: also the record `up --state-dir` left under /var/lib/tessera.
  [ -d "$STATE" ] && "$BIN" down --forget "$MNT" --state-dir "$STATE" >/dev/null 2>&1 || true
  rm -rf "$STATE"
  rmdir "$MNT" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

(cd "$ROOT" && cargo build --release --bins)
rm -rf "$STATE"
"$BIN" up "$MNT" --state-dir "$STATE" --data-servers 3 --replicas 3 > "$OUT/up.log"

scrape() {  # scrape PHASE: every process's metrics into OUT/PHASE.ROLE.txt
  local f role
  for f in "$STATE"/*.metrics; do
    role=$(basename "$f" .metrics)
    curl -sf --max-time 10 "http://$(cat "$f")/metrics" > "$OUT/$1.$role.txt"
  done
}

# Sums of the request histograms: a delta between two scrapes, per role and request type.
report() {  # report BEFORE AFTER FILES
  python3 - "$OUT" "$1" "$2" "$3" <<'EOF'
import glob, os, re, sys
out, before, after, files = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
line = re.compile(r'^([a-z_]+)(?:\{([^}]*)\})? ([0-9.eE+-]+)$')
def load(path):
    vals = {}
    for l in open(path):
        m = line.match(l.strip())
        if m:
            labels = dict(kv.split("=", 1) for kv in (m.group(2) or "").split(",") if "=" in kv)
            labels = {k: v.strip('"') for k, v in labels.items()}
            what = labels.get("request") or labels.get("op", "")
            vals[(m.group(1), what, labels.get("server", ""))] = float(m.group(3))
    return vals
rows = []
for a in sorted(glob.glob(f"{out}/{after}.*.txt")):
    role = a.split(f"{after}.", 1)[1][:-4]
    b = f"{out}/{before}.{role}.txt"
    if not os.path.exists(b):
        continue
    va, vb = load(a), load(b)
    for (name, req, server), v in va.items():
        if not name.endswith("_request_duration_seconds_count"):
            continue
        n = v - vb.get((name, req, server), 0)
        if n <= 0:
            continue
        s = va[(name[:-6] + "_sum", req, server)] - vb.get((name[:-6] + "_sum", req, server), 0)
        side = "mount's call" if name.startswith("tessera_client") else "server's handling"
        rows.append((role, side, server, req, n, s / n * 1e6))
    for (name, req, server), v in va.items():
        if name == "tessera_data_one_sided_duration_seconds_count":
            n = v - vb.get((name, req, server), 0)
            s = va[(name[:-6] + "_sum", req, server)] - vb.get((name[:-6] + "_sum", req, server), 0)
            if n > 0:
                rows.append((role, "one-sided transfer", "", req, n, s / n * 1e6))
        if name == "tessera_data_store_duration_seconds_count":
            n = v - vb.get((name, req, server), 0)
            s = va[(name[:-6] + "_sum", req, server)] - vb.get((name[:-6] + "_sum", req, server), 0)
            if n > 0:
                rows.append((role, "chunk store", "", req, n, s / n * 1e6))
        if name == "tessera_meta_commit_duration_seconds_count":
            n = v - vb.get((name, req, server), 0)
            s = va[(name[:-6] + "_sum", req, server)] - vb.get((name[:-6] + "_sum", req, server), 0)
            if n > 0:
                rows.append((role, "log sync", "", "commit group (the log's sync)", n, s / n * 1e6))
print(f"| process | seen as | peer | request | per file | mean us |")
print("| --- | --- | --- | --- | --- | --- |")
for role, side, server, req, n, us in sorted(rows):
    print(f"| {role} | {side} | {server} | {req} | {n / files:.2f} | {us:,.0f} |")
EOF
}

profile() {  # profile PHASE COMMAND...: runs COMMAND under a machine-wide perf record
  local phase=$1; shift
  scrape "$phase-before"
  local t0 t1
  t0=$(date +%s%N)
  # The outer perf records every request the kernel sends to a FUSE daemon and its
  # reply (the tracepoints), the inner one samples the CPU.
  perf record -q -a -e fuse:fuse_request_send -e fuse:fuse_request_end \
    -o "$OUT/$phase.fuse.perf" -- \
    perf record -a -F 997 -o "$OUT/$phase.perf" -- "$@" 2> "$OUT/$phase.perf.log" > /dev/null
  t1=$(date +%s%N)
  scrape "$phase-after"
  echo
  echo "## $phase: $FILES files, $(( (t1 - t0) / FILES / 1000 )) us per file (wall, perf on)"
  echo
  report "$phase-before" "$phase-after" "$FILES"
  echo
  echo "Kernel requests to the mount, per file, send to reply (FUSE tracepoints):"
  { perf script -i "$OUT/$phase.fuse.perf" --ns -F time,event,trace 2>/dev/null || true; } \
    > "$OUT/$phase.fuse.txt"
  python3 "$ROOT/scripts/bench/fuse_latency.py" "$OUT/$phase.fuse.txt" "$FILES" \
    "$(mountpoint -d "$MNT" | cut -d: -f2)"
  echo
  echo "CPU by process (share of all samples of both cores; idle is the kernel's idle loop):"
  perf script -i "$OUT/$phase.perf" -F pid,comm 2>/dev/null > "$OUT/$phase.samples" || true
  python3 - "$STATE/pids" "$OUT/$phase.samples" <<'EOF'
import collections, sys
roles = {}
for line in open(sys.argv[1]):
    w = line.split()
    if len(w) >= 2:
        roles[w[1]] = w[0]
count = collections.Counter()
for line in open(sys.argv[2]):
    w = line.split()
    if len(w) < 2:
        continue
    comm, pid = " ".join(w[:-1]), w[-1]
    name = roles.get(pid) or ("idle" if pid == "0" else comm)
    count[name] += 1
total = sum(count.values()) or 1
for name, n in count.most_common(12):
    print(f"    {100 * n / total:5.1f}%  {name}")
EOF
  echo "Hottest functions (process name as the kernel knows it):"
  perf report -i "$OUT/$phase.perf" --stdio --no-children --sort comm,sym 2>/dev/null \
    > "$OUT/$phase.report" || true
  grep -E '^ +[0-9.]+%' "$OUT/$phase.report" | sed -n 1,30p || true
}

D=$MNT/profile
mkdir -p "$D"
profile create python3 -c '
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
data = os.urandom(4096)
for i in range(n):
    fd = os.open(f"{d}/f{i:06d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, data)
    os.close(fd)
' "$D" "$FILES" | tee "$OUT/create.md"

sync; echo 3 > /proc/sys/vm/drop_caches
profile read python3 -c '
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    fd = os.open(f"{d}/f{i:06d}", os.O_RDONLY)
    assert len(os.read(fd, 65536)) == 4096
    os.close(fd)
' "$D" "$FILES" | tee "$OUT/read.md"
profile remove python3 -c '
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    os.unlink(f"{d}/f{i:06d}")
' "$D" "$FILES" | tee "$OUT/remove.md"
dd if=/dev/urandom of="$D/big.bin" bs=1M count=1024 conv=fsync status=none
sync; echo 3 > /proc/sys/vm/drop_caches
profile direct-read python3 -c '
import mmap, os, random, sys
path, n = sys.argv[1], int(sys.argv[2])
buf = mmap.mmap(-1, 4096)
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
rng = random.Random(25)
blocks = os.fstat(fd).st_size // 4096
for _ in range(n):
    assert os.preadv(fd, [buf], rng.randrange(blocks) * 4096) == 4096
os.close(fd)
' "$D/big.bin" "$FILES" | tee "$OUT/direct-read.md"
echo
echo "raw output: $OUT"
