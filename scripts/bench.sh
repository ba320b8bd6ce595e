#!/usr/bin/env bash
# Tessera beside the local disk, a FUSE passthrough of it (bindfs: the FUSE ceiling),
# MooseFS, GlusterFS and JuiceFS, on this machine, in one run (issue 5, item 7):
#
#   scripts/bench.sh [--quick] [--only SYSTEM[,SYSTEM...]] [--workloads a,b,c,d,e,f] [--base REV]
#
#   SYSTEM: local, bindfs, tessera, moosefs, glusterfs, juicefs (default: all, in this order);
#   tessera-base: Tessera built from git revision REV (--base), for an A/B in one run;
#   tessera-etcd, tessera-etcd-disk: Tessera with its metadata on a local 3-member etcd
#   (`tessera up --engine etcd`: a serving metadata server and a standby), etcd's data on
#   tmpfs or on this disk (asked for only; issue 24: what HA costs, best with -w e);
#   tessera-etcd-shared: the same on tmpfs with both metadata servers serving
#   (`--etcd-shared`); its (e) adds the own-folder rows with half the processes on a
#   second mount that talks to the other server
#   (a) data-set read: DATASET_FILES files of DATASET_MIN..MAX bytes, READERS readers
#   (b) sequential read of a SEQ_MIB file in 1 MiB blocks (its 1-writer write is shown too)
#   (c) checkpoint write: CKPT_JOBS writers x CKPT_MIB in 1 MiB blocks, fsync at the end;
#       then CKPT_JOBS writers into disjoint ranges of one file, fsync at the end
#   (d) 4 KiB random read, RAND_JOBS jobs, RAND_S seconds, on the file of (b): buffered
#       (the page cache may serve repeats), then O_DIRECT, then one O_DIRECT job's median
#       latency (issue 25)
#   (e) metadata: create, stat and remove META_FILES empty files from META_PROCS processes
#       in one folder, then from META_DIR_PROCS processes in a folder each; then
#       SMALL_FILES files of SMALL_BYTES written whole (create, write, close) by 1 process
#   (g) small writes: APPEND_RECORDS records of APPEND_BYTES, one write(2) each, to one
#       file: plain writes; the same with a gap as long as each write after it (pwrite(2),
#       every write a separate range); O_APPEND writes from one process; from two mounts
#       at once
#       (Tessera: a second mount of the cluster; the others: two processes on one mount)
#   (f) asked for only: the Python package against the mount and the disk, with torch
#       (scripts/bench-python.sh --torch, its own cluster and report; issue 29)
#
# It builds a release (target/release), installs what is missing (fio, bindfs, a Python
# venv with matplotlib; the peers install their own), then for each system: checks free
# disk space, starts it (`tessera up`; the peers by ../shared/peers/*.sh with COPIES
# copies), runs the workloads with caches dropped before every measured phase, stops it
# and deletes its data. Everything it started is stopped in a trap, also on failure, by
# recorded PID or by the peer scripts' `down`. Output: bench/results/DATE.md (table,
# ratios, machine, settings) and DATE.png (chart); raw fio/JSON output under bench/tmp/.
# Needs root (drop_caches, FUSE mounts, network namespaces of the peers).
set -euo pipefail

# ---------------------------------------------------------------- settings (full run)
# Copies of each chunk, the same for every system: Tessera's default is 3 (chain
# replication); BENCH_COPIES=1 compares single-copy setups.
COPIES=${BENCH_COPIES:-3}
TESSERA_DATA_SERVERS=3        # `tessera up --data-servers`
MOOSEFS_CHUNKSERVERS=3        # GlusterFS always has 3 bricks (its script)
DATASET_FILES=20000           # (a)
DATASET_MIN_BYTES=$((100 * 1024))
DATASET_MAX_BYTES=$((1024 * 1024))
READERS=4
DATASET_READ_MAX_S=900        # (a) stops reading after this (the table says so)
SEQ_MIB=4096                  # (b), (d)
CKPT_JOBS=4                   # (c)
CKPT_MIB=1024                 # per writer
RAND_JOBS=4                   # (d)
RAND_S=30
META_FILES=10000              # (e)
META_PROCS=2
META_DIR_PROCS=4              # (e), a folder each
SMALL_FILES=3000              # (e), written whole by one process
SMALL_BYTES=4096
APPEND_RECORDS=20000          # (g)
APPEND_BYTES=100
STEP_TIMEOUT_S=1800           # bound on any one step (fio, a Python phase)
BENCH_DIR=${BENCH_DIR:-/var/tmp/tessera-bench}   # scratch data, mounts, peer state, venv
ALL_SYSTEMS="local bindfs tessera moosefs glusterfs juicefs"
KNOWN_SYSTEMS="tessera-base tessera-etcd tessera-etcd-disk tessera-etcd-shared $ALL_SYSTEMS"
ALL_WORKLOADS="a b c d e g"

quick_settings() {            # --quick: a smoke run of every path in a few minutes
  DATASET_FILES=400; DATASET_READ_MAX_S=120; SEQ_MIB=256; CKPT_MIB=64; RAND_S=5
  META_FILES=1000; SMALL_FILES=500; APPEND_RECORDS=4000
}

# ---------------------------------------------------------------- options
usage() { sed -n '5,25p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
ARGS="$*"
QUICK=0; SYSTEMS=$ALL_SYSTEMS; WORKLOADS=$ALL_WORKLOADS; BASE_REV=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --only) [ $# -ge 2 ] || usage; SYSTEMS=${2//,/ }; shift 2 ;;
    --workloads) [ $# -ge 2 ] || usage; WORKLOADS=${2//,/ }; shift 2 ;;
    --base) [ $# -ge 2 ] || usage; BASE_REV=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown option: $1" >&2; usage ;;
  esac
done
for s in $SYSTEMS; do [[ " $KNOWN_SYSTEMS " == *" $s "* ]] || { echo "unknown system: $s" >&2; usage; }; done
for w in $WORKLOADS; do [[ " $ALL_WORKLOADS f " == *" $w "* ]] || { echo "unknown workload: $w" >&2; usage; }; done
# (f) runs apart, after the others: it starts its own cluster and writes its own report.
PYTHON_BENCH=0
if [[ " $WORKLOADS " == *" f "* ]]; then
  PYTHON_BENCH=1
  WORKLOADS=$(echo " $WORKLOADS " | sed 's/ f / /g' | xargs)
fi
[ "$QUICK" = 1 ] && quick_settings
if [[ " $SYSTEMS " == *" tessera-base "* ]] && [ -z "$BASE_REV" ]; then
  echo "tessera-base needs --base REV (the git revision to compare with)" >&2; usage
fi
[ "$(id -u)" = 0 ] || { echo "bench.sh needs root (drop_caches, mounts, peers)" >&2; exit 1; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS_DIR:-$ROOT/../shared/peers}
HELPER=$ROOT/scripts/bench/bench.py
VENV=$BENCH_DIR/venv
STAMP=$(date -u +%Y-%m-%d-%H%M)
SUFFIX=""; [ "$QUICK" = 1 ] && SUFFIX="-quick"
[ "$SYSTEMS" != "$ALL_SYSTEMS" ] || [ "$WORKLOADS" != "$ALL_WORKLOADS" ] && SUFFIX="$SUFFIX-partial"
RUN=$ROOT/bench/tmp/$STAMP$SUFFIX      # raw output (git-ignored)
OUT=$ROOT/bench/results/$STAMP$SUFFIX  # .md and .png
# The peers' state, network namespaces and Redis port are the benchmark's own, so that a
# peer someone else started by hand is neither measured nor stopped.
export PEERS_STATE=$BENCH_DIR/peers JFS_REDIS_PORT=${JFS_REDIS_PORT:-6399}
MFS_NS=tessera-bench-mfs; GL_NS=tessera-bench-gl
mkdir -p "$RUN" "$ROOT/bench/results" "$BENCH_DIR/mnt"
# The bench disk's device name in /proc/diskstats, for `settle`.
DISK_DEV=$(lsblk -no KNAME "$(findmnt -no SOURCE -T "$BENCH_DIR")" 2>/dev/null | head -1)
exec > >(tee -a "$RUN/bench.log") 2>&1

log() { echo "[$(date +%H:%M:%S)] $*"; }
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$RUN/results.tsv"; }
note() { log "NOTE $1: $2"; record "$1" note "$2"; }
jval() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
# settle: waits (at most SETTLE_MAX_S) until the machine is quiet for 2 s in a row: under
# 4 MiB/s written to the bench disk, the disk busy under 10% of the time, and under half
# a core busy. Background work a system left from the previous phase (deleting files,
# writing back) then counts in neither phase: each system gets the same wait, up to the
# same bound. The disk's busy time catches deletions, which write little but keep the
# disk (and every sync behind it) busy: without it, Tessera's creates ran while the data
# servers still deleted what the checkpoint phase had just removed, several times slower.
SETTLE_MAX_S=60
disk_sectors_written() { awk -v d="$DISK_DEV" '$3 == d { print $10 }' /proc/diskstats; }
disk_busy_ms() { awk -v d="$DISK_DEV" '$3 == d { print $13 }' /proc/diskstats; }
cpu_busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
settle() {
  [ -n "$DISK_DEV" ] || return 0
  local quiet=0 waited=0 w0 w1 c0 c1 b0 b1 hz
  hz=$(getconf CLK_TCK)
  w0=$(disk_sectors_written); c0=$(cpu_busy_ticks); b0=$(disk_busy_ms)
  while [ "$quiet" -lt 2 ] && [ "$waited" -lt "$SETTLE_MAX_S" ]; do
    sleep 1; waited=$((waited + 1))
    w1=$(disk_sectors_written); c1=$(cpu_busy_ticks); b1=$(disk_busy_ms)
    if [ $(((w1 - w0) * 512)) -lt $((4 << 20)) ] && [ $((c1 - c0)) -lt $((hz / 2)) ] &&
      [ $((b1 - b0)) -lt 100 ]; then
      quiet=$((quiet + 1))
    else
      quiet=0
    fi
    w0=$w1; c0=$c1; b0=$b1
  done
  [ "$quiet" -ge 2 ] || log "the machine did not settle within ${SETTLE_MAX_S} s; measuring anyway"
  [ "$waited" -le 2 ] || log "settled after ${waited} s"
}
drop_caches() {
  settle
  timeout 300 sync || log "sync did not finish in 300 s"
  echo 3 > /proc/sys/vm/drop_caches
}
wait_mounted() { for _ in $(seq 200); do mountpoint -q "$1" && return 0; sleep 0.1; done; return 1; }

# ---------------------------------------------------------------- installs and build
install_debs() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  log "installing: ${missing[*]}"
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    "${missing[@]}" >/dev/null
}

setup() {
  "$ROOT/scripts/deps.sh"
  install_debs fio bindfs
  if ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
    log "creating $VENV with matplotlib"
    python3 -m venv "$VENV" 2>/dev/null || { install_debs python3-venv; python3 -m venv "$VENV"; }
    "$VENV/bin/pip" install -q matplotlib
  fi
  # Every Tessera system but tessera-base runs this tree's release build.
  if [[ " $SYSTEMS " =~ \ tessera(-etcd[a-z-]*)?\  ]]; then
    log "cargo build --release --bins"
    (cd "$ROOT" && CARGO_TARGET_DIR="$ROOT/target" cargo build --release --bins)
  fi
  if [[ " $SYSTEMS " == *" tessera-base "* ]]; then build_base; fi
}

# The base revision's tree is exported (git archive: no worktree left registered) under
# BENCH_DIR and built into its own target directory, kept between runs so that a second
# A/B builds little. The files are extracted with the time of extraction (`tar -m`):
# with the commit's times, older than the last base's build, cargo would take the
# previous base's binaries as fresh and measure them under the new name.
BASE_SRC=$BENCH_DIR/base-src
BASE_BIN=$BENCH_DIR/base-target/release
build_base() {
  local rev
  rev=$(git -C "$ROOT" rev-parse --verify "$BASE_REV^{commit}") ||
    { echo "--base $BASE_REV: not a revision of $ROOT" >&2; return 1; }
  rm -rf "$BASE_SRC" && mkdir -p "$BASE_SRC"
  git -C "$ROOT" archive "$rev" | tar -x -m -C "$BASE_SRC"
  log "cargo build --release --bins at $(git -C "$ROOT" rev-parse --short "$rev") (tessera-base)"
  (cd "$BASE_SRC" && CARGO_TARGET_DIR="$BENCH_DIR/base-target" cargo build --release --bins) ||
    return 1
  local b
  for b in tessera tessera-meta tessera-data; do
    [ "$BASE_BIN/$b" -nt "$BASE_SRC/Cargo.toml" ] ||
      { echo "tessera-base: $BASE_BIN/$b was not rebuilt from $BASE_REV" >&2; return 1; }
  done
}

# ---------------------------------------------------------------- systems
# start_X sets MNT (where the workloads run); stop_X is safe to call twice.
BINDFS_PID=""
TESSERA_STATE=$BENCH_DIR/tessera-state

start_local() { MNT=$BENCH_DIR/local; mkdir -p "$MNT"; }
stop_local() { rm -rf "$BENCH_DIR/local"; }

start_bindfs() {
  MNT=$BENCH_DIR/mnt/bindfs; mkdir -p "$BENCH_DIR/bindfs-src" "$MNT" || return 1
  # Multithreaded: the best a FUSE passthrough does (single-threaded bindfs serializes).
  # O_DIRECT forwarded: bindfs clears it by default, and (d)'s O_DIRECT rows would then
  # read the page cache under bindfs.
  bindfs -f --multithreaded --forward-odirect=4096 "$BENCH_DIR/bindfs-src" "$MNT" \
    > "$RUN/bindfs.log" 2>&1 &
  BINDFS_PID=$!
  wait_mounted "$MNT" || { echo "bindfs did not mount" >&2; return 1; }
}
stop_bindfs() {
  local m=$BENCH_DIR/mnt/bindfs
  if mountpoint -q "$m"; then umount "$m" 2>/dev/null || umount -l "$m"; fi
  if [ -n "$BINDFS_PID" ]; then
    for _ in $(seq 100); do kill -0 "$BINDFS_PID" 2>/dev/null || break; sleep 0.1; done
    kill -TERM "$BINDFS_PID" 2>/dev/null || true
    BINDFS_PID=""
  fi
  rm -rf "$BENCH_DIR/bindfs-src"
}

# The start functions run as `if` conditions, where `set -e` does not act: each step
# says `|| return 1`.
start_tessera() {
  MNT=$BENCH_DIR/mnt/tessera
  "$ROOT/target/release/tessera" up "$MNT" --state-dir "$TESSERA_STATE" \
    --data-servers "$TESSERA_DATA_SERVERS" --replicas "$COPIES"
}
# A second mount of the cluster, in the foreground of a process of the benchmark's: for
# (g), and for tessera-etcd-shared's (e), where it lists the other metadata server first
# (`start_tessera_mount2 STATE META`; default: the plain cluster's).
TESSERA_MOUNT2_PID=""
start_tessera_mount2() {
  local state=${1:-$TESSERA_STATE} meta=${2:-}
  [ -n "$meta" ] || meta=$(cat "$TESSERA_STATE/meta.addr")
  MNT2=$BENCH_DIR/mnt/tessera-2; mkdir -p "$MNT2" || return 1
  "$ROOT/target/release/tessera" mount --meta "$meta" \
    --key-file "$state/keys/admin.key" "$MNT2" > "$RUN/tessera-mount2.log" 2>&1 &
  TESSERA_MOUNT2_PID=$!
  wait_mounted "$MNT2" || { echo "the second tessera mount did not mount" >&2; return 1; }
}
stop_tessera_mount2() {
  local m=$BENCH_DIR/mnt/tessera-2
  if mountpoint -q "$m"; then umount "$m" 2>/dev/null || umount -l "$m"; fi
  if [ -n "$TESSERA_MOUNT2_PID" ]; then
    for _ in $(seq 100); do kill -0 "$TESSERA_MOUNT2_PID" 2>/dev/null || break; sleep 0.1; done
    kill -TERM "$TESSERA_MOUNT2_PID" 2>/dev/null || true
    TESSERA_MOUNT2_PID=""
  fi
}
stop_tessera() {
  local m=$BENCH_DIR/mnt/tessera
  stop_tessera_mount2
  if [ -d "$TESSERA_STATE" ]; then
    # --forget: also the record `up --state-dir` left under /var/lib/tessera.
    "$ROOT/target/release/tessera" down --forget "$m" --state-dir "$TESSERA_STATE" || true
  fi
  rm -rf "$TESSERA_STATE"
}

# tessera-etcd(-disk): the same cluster shape, its namespace on 3 local etcd members
# (data on /dev/shm, or in BENCH_DIR on the disk), two metadata servers (one a standby).
TESSERA_ETCD_STATE=$BENCH_DIR/tessera-etcd-state
start_tessera_on_etcd() {
  MNT=$BENCH_DIR/mnt/tessera-etcd
  "$ROOT/target/release/tessera" up "$MNT" --state-dir "$TESSERA_ETCD_STATE" \
    --data-servers "$TESSERA_DATA_SERVERS" --replicas "$COPIES" --engine etcd "$@"
}
stop_tessera_on_etcd() {
  local m=$BENCH_DIR/mnt/tessera-etcd
  if [ -d "$TESSERA_ETCD_STATE" ]; then
    "$ROOT/target/release/tessera" down --forget "$m" --state-dir "$TESSERA_ETCD_STATE" || true
  fi
  rm -rf "$TESSERA_ETCD_STATE" "$BENCH_DIR/etcd-data"
}
start_tessera-etcd() { start_tessera_on_etcd; }
stop_tessera-etcd() { stop_tessera_on_etcd; }
start_tessera-etcd-disk() {
  mkdir -p "$BENCH_DIR/etcd-data" || return 1
  start_tessera_on_etcd --etcd-dir "$BENCH_DIR/etcd-data"
}
stop_tessera-etcd-disk() { stop_tessera_on_etcd; }
start_tessera-etcd-shared() { start_tessera_on_etcd --etcd-shared; }
stop_tessera-etcd-shared() { stop_tessera_mount2; stop_tessera_on_etcd; }

# tessera-base: the same cluster shape, from the base revision's binaries.
TESSERA_BASE_STATE=$BENCH_DIR/tessera-base-state
start_tessera-base() {
  MNT=$BENCH_DIR/mnt/tessera-base
  "$BASE_BIN/tessera" up "$MNT" --state-dir "$TESSERA_BASE_STATE" \
    --data-servers "$TESSERA_DATA_SERVERS" --replicas "$COPIES"
}
stop_tessera-base() {
  local m=$BENCH_DIR/mnt/tessera-base recorded
  if [ -d "$TESSERA_BASE_STATE" ]; then
    "$BASE_BIN/tessera" down "$m" --state-dir "$TESSERA_BASE_STATE" || true
  fi
  rm -rf "$TESSERA_BASE_STATE"
  # The base build may predate `down --forget`: its record is removed here.
  recorded="/var/lib/tessera/$(printf '%s' "${m#/}" | tr -c 'A-Za-z0-9._' '-')"
  rm -f "$recorded/redirect" && rmdir "$recorded" 2>/dev/null || true
}

start_moosefs() {
  MNT=$BENCH_DIR/mnt/moosefs
  COPIES=$COPIES NS=$MFS_NS "$PEERS/moosefs.sh" up "$MNT" "$MOOSEFS_CHUNKSERVERS" || return 1
  # Deleted files go to MooseFS's trash for a day by default: make deletes real, as on the
  # other systems (and give the space back during the run).
  nsenter --net="/run/netns/$MFS_NS" mfssettrashtime -r 0 "$MNT" >/dev/null
}
stop_moosefs() { NS=$MFS_NS "$PEERS/moosefs.sh" down "$BENCH_DIR/mnt/moosefs" || true; }

start_glusterfs() {
  MNT=$BENCH_DIR/mnt/glusterfs
  COPIES=$COPIES NS=$GL_NS "$PEERS/glusterfs.sh" up "$MNT"
}
stop_glusterfs() { NS=$GL_NS "$PEERS/glusterfs.sh" down "$BENCH_DIR/mnt/glusterfs" || true; }

start_juicefs() {
  MNT=$BENCH_DIR/mnt/juicefs
  [ "$COPIES" = 1 ] || log "JuiceFS keeps one copy (redundancy is its object store's job)"
  "$PEERS/juicefs.sh" up "$MNT" || return 1
  # Its trash keeps deleted files for a day by default: make deletes real, as elsewhere.
  "$PEERS_STATE/juicefs-venv/bin/juicefs" config "redis://127.0.0.1:$JFS_REDIS_PORT/1" \
    --trash-days 0 --yes >/dev/null 2>&1 || log "juicefs config --trash-days 0 failed"
}
stop_juicefs() { "$PEERS/juicefs.sh" down "$BENCH_DIR/mnt/juicefs" || true; }

CURRENT=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$CURRENT" ]; then log "stopping $CURRENT"; "stop_$CURRENT" || true; fi
  rmdir "$BENCH_DIR"/mnt/* "$BENCH_DIR/mnt" 2>/dev/null || true   # never rm -r a mount
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- workloads
FIO_COMMON=(--ioengine=psync --fallocate=none --group_reporting --output-format=json)

# fio_step SYSTEM NAME fio-args...: runs one fio job into $RUN/SYSTEM-NAME.json.
fio_step() {
  local sys=$1 name=$2; shift 2
  log "$sys: fio $name"
  timeout "$STEP_TIMEOUT_S" fio "${FIO_COMMON[@]}" --output="$RUN/$sys-$name.json" "$@"
}

# py_step SYSTEM NAME bench.py-args...: runs one helper phase into $RUN/SYSTEM-NAME.json.
py_step() {
  local sys=$1 name=$2; shift 2
  log "$sys: $name"
  timeout "$STEP_TIMEOUT_S" python3 "$HELPER" "$@" > "$RUN/$sys-$name.json"
}

fio_val() { python3 "$HELPER" fio-value "$RUN/$1-$2.json" "$3"; }

# The workloads run as `if` conditions or before `||`, where `set -e` does not act: each
# step that can fail says `|| return 1`, and a value is read before it is recorded.
workload_a() {
  local sys=$1 d=$2/dataset v
  drop_caches
  py_step "$sys" a-write dataset-create "$d" "$DATASET_FILES" "$DATASET_MIN_BYTES" \
    "$DATASET_MAX_BYTES" "$READERS" || return 1
  v=$(jval "$RUN/$sys-a-write.json" files_s) || return 1
  record "$sys" dataset_write_files_s "$v"
  drop_caches
  py_step "$sys" a-read dataset-read "$d" "$READERS" "$DATASET_READ_MAX_S" || return 1
  v=$(jval "$RUN/$sys-a-read.json" mibs) || return 1
  record "$sys" dataset_mibs "$v"
  record "$sys" dataset_files_s "$(jval "$RUN/$sys-a-read.json" files_s)"
  [ "$(jval "$RUN/$sys-a-read.json" complete)" = True ] ||
    note "$sys" "(a) stopped after ${DATASET_READ_MAX_S} s before reading every file"
  rm -rf "$d"
}

seq_file_write() {
  local sys=$1 f=$2/seq.bin v
  drop_caches
  fio_step "$sys" b-write --name=seq --filename="$f" --rw=write --bs=1m --size="${SEQ_MIB}m" \
    --end_fsync=1 || return 1
  v=$(fio_val "$sys" b-write write-mibs) || return 1
  record "$sys" seq_write_mibs "$v"
}

workload_b() {
  local sys=$1 f=$2/seq.bin v
  drop_caches
  fio_step "$sys" b-read --name=seq --filename="$f" --rw=read --bs=1m --size="${SEQ_MIB}m" \
    --readonly || return 1
  v=$(fio_val "$sys" b-read read-mibs) || return 1
  record "$sys" seq_read_mibs "$v"
}

workload_d() {
  local sys=$1 f=$2/seq.bin v
  local rand=(--filename="$f" --rw=randread --bs=4k --size="${SEQ_MIB}m" --time_based
    --runtime="$RAND_S" --randrepeat=0 --norandommap --readonly)
  drop_caches
  fio_step "$sys" d-randread --name=rand "${rand[@]}" --numjobs="$RAND_JOBS" || return 1
  v=$(fio_val "$sys" d-randread read-iops) || return 1
  record "$sys" rand_read_iops "$v"
  # The file system itself, every read sent to it (a FUSE file system opened with O_DIRECT
  # gets each read; the buffered row above can be served by the page cache on repeats).
  drop_caches
  fio_step "$sys" d-direct --name=rand "${rand[@]}" --numjobs="$RAND_JOBS" --direct=1 ||
    return 1
  v=$(fio_val "$sys" d-direct read-iops) || return 1
  record "$sys" rand_read_direct_iops "$v"
  drop_caches
  fio_step "$sys" d-latency --name=lat "${rand[@]}" --numjobs=1 --direct=1 || return 1
  v=$(fio_val "$sys" d-latency read-p50-us) || return 1
  record "$sys" rand_read_direct_p50_us "$v"
}

workload_c() {
  local sys=$1 d=$2 v
  mkdir -p "$d/ckpt" || return 1
  drop_caches
  fio_step "$sys" c-files --name=ckpt --directory="$d/ckpt" --rw=write --bs=1m \
    --size="${CKPT_MIB}m" --numjobs="$CKPT_JOBS" --end_fsync=1 || return 1
  v=$(fio_val "$sys" c-files write-mibs) || return 1
  record "$sys" ckpt_write_mibs "$v"
  rm -rf "$d/ckpt"
  drop_caches
  # Job i writes [i x CKPT_MIB, (i+1) x CKPT_MIB) of one file, as sharded savers do.
  fio_step "$sys" c-shared --name=shard --filename="$d/shard.bin" --rw=write --bs=1m \
    --filesize="$((CKPT_JOBS * CKPT_MIB))m" --io_size="${CKPT_MIB}m" \
    --offset_increment="${CKPT_MIB}m" --numjobs="$CKPT_JOBS" --end_fsync=1 || return 1
  v=$(fio_val "$sys" c-shared write-mibs) || return 1
  record "$sys" shard_write_mibs "$v"
  rm -f "$d/shard.bin"
}

workload_e() {
  local sys=$1 d=$2/meta phase v
  for phase in create stat remove; do
    drop_caches
    py_step "$sys" "e-$phase" meta "$d" "$META_FILES" "$META_PROCS" "$phase" || return 1
    v=$(jval "$RUN/$sys-e-$phase.json" ops_s) || return 1
    record "$sys" "${phase}s_s" "$v"
  done
  rmdir "$d"
  for phase in create stat remove; do
    drop_caches
    py_step "$sys" "e-$phase-dirs" meta "$d" "$META_FILES" "$META_DIR_PROCS" "$phase" dirs ||
      return 1
    v=$(jval "$RUN/$sys-e-$phase-dirs.json" ops_s) || return 1
    record "$sys" "${phase}s_dirs_s" "$v"
  done
  rmdir "$d"
  if [ "$sys" = tessera-etcd-shared ]; then
    # The same folders, every other process through a mount on the other server.
    local addrs other
    addrs=$(cat "$TESSERA_ETCD_STATE/meta.addrs") || return 1
    other="${addrs#*,},${addrs%%,*}"
    start_tessera_mount2 "$TESSERA_ETCD_STATE" "$other" || return 1
    for phase in create stat remove; do
      drop_caches
      py_step "$sys" "e-$phase-dirs2" meta "$d" "$META_FILES" "$META_DIR_PROCS" "$phase" dirs \
        "$MNT2/tessera-bench/meta" || return 1
      v=$(jval "$RUN/$sys-e-$phase-dirs2.json" ops_s) || return 1
      record "$sys" "${phase}s_dirs2_s" "$v"
    done
    stop_tessera_mount2
    rmdir "$d"
  fi
  drop_caches
  py_step "$sys" e-small small-files "$2/small" "$SMALL_FILES" "$SMALL_BYTES" || return 1
  v=$(jval "$RUN/$sys-e-small.json" files_s) || return 1
  record "$sys" small_files_s "$v"
  rm -rf "$2/small"
}

# (g): the second writer's directory is the same folder through a second mount where the
# system has one here (Tessera), else the same mount.
workload_g() {
  local sys=$1 d=$2/appends d2 mode v
  mkdir -p "$d" || return 1
  d2=$d
  if [ "$sys" = tessera ]; then
    start_tessera_mount2 || return 1
    d2=$MNT2/tessera-bench/appends
  fi
  for mode in plain strided append append2; do
    drop_caches
    py_step "$sys" "g-$mode" appends "$d" "$d2" "$APPEND_RECORDS" "$APPEND_BYTES" "$mode" ||
      return 1
    v=$(jval "$RUN/$sys-g-$mode.json" ops_s) || return 1
    record "$sys" "${mode}_writes_s" "$v"
  done
  [ "$sys" != tessera ] || stop_tessera_mount2
  rm -rf "$d"
}

has() { [[ " $WORKLOADS " == *" $1 "* ]]; }

run_workloads() {
  local sys=$1 d=$2
  mkdir -p "$d"
  if has a; then workload_a "$sys" "$d" || note "$sys" "(a) failed"; fi
  if has b || has d; then
    if seq_file_write "$sys" "$d"; then
      if has b; then workload_b "$sys" "$d" || note "$sys" "(b) failed"; fi
      if has d; then workload_d "$sys" "$d" || note "$sys" "(d) failed"; fi
    else
      note "$sys" "writing the file of (b) and (d) failed"
    fi
    rm -f "$d/seq.bin"
  fi
  if has c; then workload_c "$sys" "$d" || note "$sys" "(c) failed"; fi
  if has e; then workload_e "$sys" "$d" || note "$sys" "(e) failed"; fi
  if has g; then workload_g "$sys" "$d" || note "$sys" "(g) failed"; fi
  rm -rf "$d"
}

# Peak bytes one system holds: the largest data of the workloads asked for (each is
# deleted before the next) times COPIES (all copies land on this one disk), at least
# twice for JuiceFS's block cache, plus 5 GiB of slack (MooseFS keeps 1 GiB free).
need_bytes() {
  local ds=0 seq=0 ck=0 max=$((APPEND_RECORDS * APPEND_BYTES))
  if has a; then ds=$((DATASET_FILES * (DATASET_MIN_BYTES + DATASET_MAX_BYTES) / 2)); fi
  if has b || has d; then seq=$((SEQ_MIB << 20)); fi
  if has c; then ck=$((CKPT_JOBS * CKPT_MIB << 20)); fi
  [ $ds -gt $max ] && max=$ds; [ $seq -gt $max ] && max=$seq; [ $ck -gt $max ] && max=$ck
  local copies=$COPIES; [ "$copies" -lt 2 ] && copies=2
  echo $((copies * max + (5 << 30)))
}

run_system() {
  local sys=$1 t0 avail need
  need=$(need_bytes)
  avail=$(df -B1 --output=avail "$BENCH_DIR" | tail -1)
  if [ "$avail" -lt "$need" ]; then
    note "$sys" "skipped: $((avail >> 30)) GiB free in $BENCH_DIR, $((need >> 30)) GiB needed"
    return 0
  fi
  record "$sys" load_start "$(cut -d' ' -f1 /proc/loadavg)"
  log "== $sys (load $(cut -d' ' -f1-3 /proc/loadavg), $((avail >> 30)) GiB free)"
  t0=$(date +%s)
  CURRENT=$sys
  if "start_$sys"; then
    run_workloads "$sys" "$MNT/tessera-bench"
  else
    note "$sys" "did not start"
  fi
  "stop_$sys" || true
  CURRENT=""
  record "$sys" load_end "$(cut -d' ' -f1 /proc/loadavg)"
  record "$sys" seconds "$(($(date +%s) - t0))"
  log "== $sys done in $(($(date +%s) - t0)) s"
}

# ---------------------------------------------------------------- run
human() { if (($1 % 1048576 == 0)); then echo "$(($1 >> 20)) MiB"; else echo "$(($1 >> 10)) KiB"; fi; }

write_info() {
  local dev fs dirty=""
  [ -z "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ] ||
    dirty=" (with uncommitted changes)"
  dev=$(findmnt -no SOURCE -T "$BENCH_DIR"); fs=$(findmnt -no FSTYPE -T "$BENCH_DIR")
  local cpu cores ram
  cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
  cores=$(nproc); ram=$(awk '/MemTotal/{printf "%.0f", $2/1048576}' /proc/meminfo)
  local size="" rota=""
  if lsblk -dno SIZE,ROTA "$dev" >/dev/null 2>&1; then
    read -r size rota < <(lsblk -dno SIZE,ROTA "$dev")
  fi
  local settings="COPIES=$COPIES; Tessera: $TESSERA_DATA_SERVERS data servers, default config"
  settings+=" (4 MiB chunks, redb); MooseFS: $MOOSEFS_CHUNKSERVERS chunkservers, trash time 0"
  settings+="; GlusterFS: 3 bricks ($([ "$COPIES" = 1 ] && echo distribute || echo "replica $COPIES"))"
  settings+="; JuiceFS: Redis + local file store, trash days 0; bindfs --multithreaded"
  settings+=" --forward-odirect=4096"
  settings+="; (a) $DATASET_FILES files of $DATASET_MIN_BYTES-$DATASET_MAX_BYTES bytes (seeded)"
  settings+=", $READERS readers, 1 MiB reads, at most $DATASET_READ_MAX_S s; (b) $SEQ_MIB MiB"
  settings+=", bs 1 MiB; (c) $CKPT_JOBS x $CKPT_MIB MiB, bs 1 MiB, end_fsync; (d) bs 4 KiB,"
  settings+=" $RAND_JOBS jobs, $RAND_S s, norandommap, buffered then O_DIRECT; (e) $META_FILES"
  settings+=" files, $META_PROCS processes, one folder, then $META_DIR_PROCS processes, a folder"
  settings+=" each; $SMALL_FILES files of $SMALL_BYTES bytes written whole by 1 process"
  settings+="; (g) $APPEND_RECORDS x $APPEND_BYTES bytes; quick=$QUICK"
  {
    echo "DATE=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "COMMAND=scripts/bench.sh${ARGS:+ $ARGS}"
    echo "COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    [ -z "$BASE_REV" ] || echo "BASE=$(git -C "$ROOT" rev-parse --short "$BASE_REV")"
    echo "DIRTY=$dirty"
    echo "MACHINE=$cores cores ($cpu), $ram GiB RAM, kernel $(uname -r)"
    echo "MACHINE_SHORT=$cores cores, $ram GiB RAM"
    echo "DISK=$BENCH_DIR on $dev ($fs${size:+, $size}${rota:+, rotational=$rota}), shared by every system"
    echo "SETTINGS=$settings"
    echo "DATASET=$DATASET_FILES files of $(human "$DATASET_MIN_BYTES") to $(human "$DATASET_MAX_BYTES")"
    echo "READERS=$READERS"
    echo "SEQ=$SEQ_MIB MiB"
    echo "CKPT_JOBS=$CKPT_JOBS"
    echo "CKPT=$CKPT_MIB MiB"
    echo "RAND_JOBS=$RAND_JOBS"
    echo "RAND_S=$RAND_S"
    echo "META_PROCS=$META_PROCS"
    echo "META_DIR_PROCS=$META_DIR_PROCS"
    echo "SMALL=$(human "$SMALL_BYTES")"
    echo "APPENDS=$APPEND_RECORDS x $APPEND_BYTES B"
    echo "NOTE=other work ran on this machine during the run; the load average at each system's start is in the table"
  } > "$RUN/info.env"
}

write_versions() {
  local v jfs=""
  v=$(dpkg-query -W -f='${Package} ${Version}, ' fio bindfs moosefs-master glusterfs-server \
    redis-server 2>/dev/null || true)
  [ -x "$PEERS_STATE/juicefs-venv/bin/juicefs" ] &&
    jfs=$("$PEERS_STATE/juicefs-venv/bin/juicefs" version 2>/dev/null | head -1)
  echo "VERSIONS=${v}${jfs:-juicefs not installed}" >> "$RUN/info.env"
}

T_START=$(date +%s)
if [ -n "$WORKLOADS" ]; then
  log "bench: systems [$SYSTEMS], workloads [$WORKLOADS], quick=$QUICK, raw output in $RUN"
  setup
  write_info
  for s in $SYSTEMS; do run_system "$s"; done
  write_versions
  "$VENV/bin/python" "$HELPER" report "$RUN" "$OUT"
  log "done in $(($(date +%s) - T_START)) s: $OUT.md and $OUT.png"
fi
if [ "$PYTHON_BENCH" = 1 ]; then
  log "bench (f): scripts/bench-python.sh --torch$([ "$QUICK" = 1 ] && echo " --quick")"
  if [ "$QUICK" = 1 ]; then
    "$ROOT/scripts/bench-python.sh" --torch --quick
  else
    "$ROOT/scripts/bench-python.sh" --torch
  fi
fi
