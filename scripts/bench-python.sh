#!/usr/bin/env bash
# Issue 29's benchmark: the Python package against the mount and the local disk, in one
# run on this machine (bench/python_bench.py says what each phase does):
#   scripts/bench-python.sh [--quick] [--torch]
#   --quick  400 files and a 256 MiB checkpoint (a smoke run of every phase); BENCH_FILES
#            and BENCH_CKPT_MIB set other sizes
#   --torch  use a DataLoader, torch.save and torch.load: Debian's CPU build of PyTorch
#            (python3-torch, which scripts/deps.sh --tests installs) in the benchmark's own venv,
#            BENCH_DIR/py-venv-torch, made with Debian's python3 and its packages
# It builds a release (target/release and the package with maturin's release profile;
# BENCH_PROFILE=dev uses the optimized dev build instead, for a quick check of the script),
# starts a cluster (`tessera up`: 3 data servers, 3 copies) and runs the phases with
# caches dropped before each; everything it started is stopped in a trap, also on
# failure. Output: bench/results/DATE-python.md (table and ratios) and the raw JSON
# under BENCH_DIR. Needs root (drop_caches, the FUSE mount).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp/tessera-bench}
FILES=${BENCH_FILES:-20000}
MIN_BYTES=$((100 * 1024))
MAX_BYTES=$((1024 * 1024))
WORKERS=4
CKPT_MIB=${BENCH_CKPT_MIB:-4096}
COPIES=${BENCH_COPIES:-3}
PROFILE=${BENCH_PROFILE:-release}
case "$PROFILE" in
  release) BIN_DIR=release; MATURIN_ARGS="" ;;  # maturin builds wheels in release by default
  dev) BIN_DIR=debug; MATURIN_ARGS="--profile dev" ;;
  *) echo "BENCH_PROFILE must be release or dev" >&2; exit 2 ;;
esac
TORCH=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) FILES=400; CKPT_MIB=256; shift ;;
    --torch) TORCH=1; shift ;;
    *) sed -n '3,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "needs root (drop_caches, FUSE)" >&2; exit 1; }
log() { echo "[$(date +%H:%M:%S)] $*"; }

VENV=$BENCH_DIR/py-venv
MNT=$BENCH_DIR/mnt/tessera-py
STATE=$BENCH_DIR/tessera-py-state
LOCAL=$BENCH_DIR/local-py
RAW=$BENCH_DIR/python-bench.json
# The data set on the local disk and its copies on the cluster, removed before the
# checkpoints: one on the local disk, one through the mount and one through the
# package, the copies of each on the cluster. The data servers delete a removed file's
# chunks in the background: the checkpoints wait for the room (`wait_for_room`).
dataset=$(( FILES * (MIN_BYTES + MAX_BYTES) / 2 * (COPIES + 1) / 1048576 ))
ckpts=$(( CKPT_MIB * (2 * COPIES + 1) ))
need=$(( (dataset > ckpts ? dataset : ckpts) * 11 / 10 ))
mkdir -p "$BENCH_DIR"
free=$(df -m --output=avail "$BENCH_DIR" | tail -1)
[ "$free" -gt "$need" ] || { echo "need about $need MiB free under $BENCH_DIR, have $free" >&2; exit 1; }

cleanup() {
  if [ -d "$STATE" ]; then
    "$ROOT/target/$BIN_DIR/tessera" down --forget "$MNT" --state-dir "$STATE" >/dev/null 2>&1 || true
  fi
  mountpoint -q "$MNT" || rm -rf "$STATE" "$LOCAL"
}
trap cleanup EXIT

log "cargo build --profile $PROFILE --bins"
(cd "$ROOT" && cargo build --profile "$PROFILE" --bins)
if [ "$TORCH" = 1 ]; then
  # PyPI's torch needs CUDA's wheels (gigabytes); Debian's is CPU only and imports from
  # Debian's python3, with Debian's numpy 1.24 (torch 1.13 is built against numpy 1).
  "$ROOT/scripts/deps.sh" --tests
  VENV=$BENCH_DIR/py-venv-torch
  log "venv $VENV (Debian's python3 and torch): maturin, the package (release)"
  [ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check maturin==1.16.0
else
  log "venv $VENV: numpy, maturin, the package (release)"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check maturin==1.16.0 numpy==2.4.6
fi
PATH="$VENV/bin:$PATH" CARGO_TARGET_DIR="$ROOT/target" MATURIN_PEP517_ARGS="$MATURIN_ARGS" \
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation \
  --force-reinstall --no-deps "$ROOT/python"

log "tessera up $MNT ($COPIES copies)"
rm -rf "$STATE" "$LOCAL"
mkdir -p "$MNT" "$LOCAL"
up=$("$ROOT/target/$BIN_DIR/tessera" up "$MNT" --state-dir "$STATE" --data-servers 3 \
  --replicas "$COPIES")
echo "$up"
addr=$(echo "$up" | sed -n 's/^metadata server: //p' | head -1)
[ -n "$addr" ] || { echo "no metadata server address in tessera up's output" >&2; exit 1; }

log "phases (files $FILES, workers $WORKERS, checkpoint $CKPT_MIB MiB)"
TESSERA_KEY_FILE="$STATE/keys/admin.key" timeout 7200 "$VENV/bin/python" \
  "$ROOT/bench/python_bench.py" --addr "$addr" --mount "$MNT" --local "$LOCAL" \
  --files "$FILES" --min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" --workers "$WORKERS" \
  --ckpt-mib "$CKPT_MIB" --copies "$COPIES" --out "$RAW"

out="$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-python.md"
python3 - "$RAW" "$COPIES" "$(git -C "$ROOT" rev-parse --short HEAD)" > "$out" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1])); copies = int(sys.argv[2]); rev = sys.argv[3]
mib = lambda k: r[k][0] / r[k][1] / 2**20
print(f"# Python package benchmark ({rev}, {'torch' if r['torch'] else 'numpy, no torch'})\n")
settled = r.get("settled-s", [])
never = sum(1 for s in settled if s < 0)
calm = (f" after the machine settled (disk and CPUs quiet for 2 s; waits {sum(abs(s) for s in settled)} s in all, at most {max((abs(s) for s in settled), default=0)}"
        + (f"; {never} of them ended at 60 s unsettled" if never else "") + ")") if settled else " (the bench disk was not found in /proc/diskstats: no settling)"
print(f"{r['files']} files, {r['workers']} workers, checkpoint {r['ckpt_mib']} MiB, {copies} copies; caches dropped before each phase{calm}.\n")
print("| phase | MiB/s |\n| --- | --- |")
for k in ["dataset-write", "dataset-local", "dataset-loopback", "dataset-package-plain",
          "dataset-local-loader", "dataset-warm-loader", "dataset-mount", "dataset-package",
          "dataset-mount-tensor", "dataset-package-tensor", "ckpt-local",
          "ckpt-mount", "ckpt-package", "load-local", "load-mount", "load-package"]:
    if k not in r:
        continue  # the loader and tensor phases run with torch only
    print(f"| {k} | {mib(k):,.0f} |")
print("\n| target (issue 29) | ratio |\n| --- | --- |")
print(f"| data set: package / mount (>= 2) | {mib('dataset-package') / mib('dataset-mount'):.2f} |")
print(f"| data set: package / local cold read (>= 0.8), plain processes both | {mib('dataset-package-plain') / mib('dataset-local'):.2f} |")
print(f"| data set: the limit of a TCP-fed reader here (dataset-loopback) / local cold read | {mib('dataset-loopback') / mib('dataset-local'):.2f} |")
print(f"| data set: package / that limit | {mib('dataset-package-plain') / mib('dataset-loopback'):.2f} |")
if "dataset-local-loader" in r:
    print(f"| data set through a DataLoader: package / local | {mib('dataset-package') / mib('dataset-local-loader'):.2f} |")
if "dataset-warm-loader" in r:
    # What the DataLoader carries with every file in memory, over the mount's rate: a
    # package/mount ratio can reach this and no more.
    print(f"| data set through a DataLoader: its own ceiling here (dataset-warm-loader) / mount | {mib('dataset-warm-loader') / mib('dataset-mount'):.2f} |")
    print(f"| data set through a DataLoader: package / that ceiling | {mib('dataset-package') / mib('dataset-warm-loader'):.2f} |")
if r["torch"]:
    print(f"| data set as tensors: package / mount | {mib('dataset-package-tensor') / mib('dataset-mount-tensor'):.2f} |")
    print(f"| data set as tensors: package / local cold read | {mib('dataset-package-tensor') / mib('dataset-local'):.2f} |")
print(f"| save: package / (local write / copies) (>= 0.9) | {mib('ckpt-package') / (mib('ckpt-local') / copies):.2f} |")
print(f"| save: package / mount (> 1) | {mib('ckpt-package') / mib('ckpt-mount'):.2f} |")
print(f"| load: package / local cold read | {mib('load-package') / mib('load-local'):.2f} |")
print(f"| load: package / mount (> 1) | {mib('load-package') / mib('load-mount'):.2f} |")
print("\n| 4 KiB random read, one at a time, cold | median us | 99th percentile us |\n| --- | --- | --- |")
for k, what in [("latency-local", "local disk, O_DIRECT"), ("latency-mount", "the mount, O_DIRECT"),
                ("latency-package", "the package (client API, no FUSE)")]:
    print(f"| {what} | {r[k][0]:,.0f} | {r[k][1]:,.0f} |")
gap = r["latency-package"][0] - r["latency-local"][0]
print(f"\nThe package's median minus the local disk's: {gap:,.0f} us (issue 25: at most 100).")
EOF
cat "$out"
log "wrote $out"
