#!/usr/bin/env bash
# ckpt-ab.sh BIN_DIR LABEL [CKPT_MIB]: one checkpoint-write run as bench.sh's (c) makes
# it (4 writers x CKPT_MIB in 1 MiB blocks, fsync at the end) on a fresh `tessera up`
# cluster (3 data servers, 3 copies) from BIN_DIR; prints wall MiB/s and CPU seconds per GiB of
# the cluster's processes and of fio. Run it alternately for two builds (their
# release binaries copied to two directories) for an A/B of many short runs: CPU seconds
# per GiB are steadier than throughput on a shared machine. Root; uses /var/tmp/tessera-ab.
set -euo pipefail
BIN=$1; LABEL=$2; MIB=${3:-1024}
B=/var/tmp/tessera-ab; STATE=$B/state-$LABEL; MNT=$B/mnt-$LABEL
mkdir -p "$B" "$MNT"
cleanup() { "$BIN/tessera" down --forget "$MNT" --state-dir "$STATE" >/dev/null 2>&1 || true; rm -rf "$STATE"; }
trap cleanup EXIT
"$BIN/tessera" up "$MNT" --state-dir "$STATE" --data-servers 3 --replicas 3 >/dev/null 2>&1
pids() { for p in /proc/[0-9]*; do e=$(readlink "$p/exe" 2>/dev/null) || continue; case $e in "$BIN"/tessera*) echo "${p#/proc/}";; esac; done; }
cpu() { local t=0; for p in $(pids); do read -r -a f < "/proc/$p/stat" || continue; t=$((t + f[13] + f[14])); done; echo $t; }
mkdir -p "$MNT/ckpt"; sync; echo 3 > /proc/sys/vm/drop_caches
c0=$(cpu); t0=$(date +%s.%N)
fio --name=ckpt --directory="$MNT/ckpt" --rw=write --bs=1m --size="${MIB}m" --numjobs=4 \
  --end_fsync=1 --output-format=json > "$B/fio-$LABEL.json"
t1=$(date +%s.%N); c1=$(cpu)
python3 - "$B/fio-$LABEL.json" "$LABEL" "$MIB" "$t0" "$t1" "$c0" "$c1" <<'PY'
import json, sys, os
j = json.load(open(sys.argv[1])); label = sys.argv[2]; mib = int(sys.argv[3])
t0, t1, c0, c1 = map(float, sys.argv[4:8]); hz = os.sysconf('SC_CLK_TCK')
gib = 4 * mib / 1024
bw = sum(x['write']['bw_bytes'] for x in j['jobs']) / 2**20
fio_cpu = sum(x['usr_cpu'] + x['sys_cpu'] for x in j['jobs']) / 100 * (t1 - t0)
print(f"{label}: {bw:.0f} MiB/s (fio), wall {t1-t0:.1f} s = {4*mib/(t1-t0):.0f} MiB/s, "
      f"cluster cpu {(c1-c0)/hz/gib:.2f} s/GiB, fio cpu ~{fio_cpu/gib:.2f} s/GiB, "
      f"load {os.getloadavg()[0]:.1f}")
PY
