#!/usr/bin/env bash
# One very large directory on a real mount (issue 4, point 7):
#   scripts/bigdir.sh [N]            (default N = 1000000)
# Starts a local cluster, creates N empty files in one directory from JOBS processes
# (default 8), lists it with `ls -f` and `ls -l`, removes every entry and the directory,
# and prints the time of each phase and the peak memory (VmHWM) of the FUSE client and of
# the metadata server during each listing. The peak is reset before each listing
# (/proc/PID/clear_refs), so a number that does not grow with N shows bounded memory.
# Everything it starts is stopped on exit, also on failure.
set -euo pipefail
N=${1:-1000000}
JOBS=${JOBS:-8}
case $N in '' | *[!0-9]*) echo "usage: $0 [N]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo build --release --bins
TESSERA=$PWD/target/release/tessera

WORK=$(mktemp -d /var/tmp/tessera-bigdir.XXXXXX)
MNT=$WORK/mnt
mkdir -p "$MNT"
cleanup() {
  "$TESSERA" down --forget "$MNT" >/dev/null 2>&1 || umount -l "$MNT" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
"$TESSERA" up "$MNT" --state-dir "$WORK/state"

pid_of() { awk -v r="$1" '$1 == r { print $2 }' "$WORK/state/pids"; }
META=$(pid_of meta)
CLIENT=$(pid_of mount)
kib() { awk '/^VmHWM/ { print $2 }' "/proc/$1/status"; }
rss() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }
reset_peaks() { echo 5 > "/proc/$META/clear_refs"; echo 5 > "/proc/$CLIENT/clear_refs"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

D=$MNT/big
mkdir "$D"
# Each process creates every JOBS-th name: os.mknod is one LOOKUP and one MKNOD.
parallel_py() {
  python3 - "$D" "$N" "$JOBS" "$1" <<'EOF'
import os, stat, sys
from multiprocessing import Pool
d, n, jobs, what = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def work(k):
    for i in range(k, n, jobs):
        p = os.path.join(d, "f%07d" % i)
        if what == "create":
            os.mknod(p, 0o644 | stat.S_IFREG)
        else:
            os.unlink(p)
    return k
with Pool(jobs) as pool:
    list(pool.imap_unordered(work, range(jobs)))
EOF
}

t0=$(now)
parallel_py create
t1=$(now)
echo "create: $N files from $JOBS processes in $(secs "$t0" "$t1") s;" \
  "RSS after: client $(rss "$CLIENT") KiB, metadata server $(rss "$META") KiB"

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
drop
reset_peaks
t0=$(now)
listed=$(ls -f "$D" | wc -l)
t1=$(now)
[ "$listed" -eq $((N + 2)) ] || { echo "ls -f listed $listed names, expected $((N + 2))" >&2; exit 1; }
echo "ls -f: $listed names in $(secs "$t0" "$t1") s;" \
  "peak RSS while listing: client $(kib "$CLIENT") KiB, metadata server $(kib "$META") KiB"

drop
reset_peaks
t0=$(now)
long=$(ls -l "$D" | grep -c '^-rw-r--r--')
t1=$(now)
[ "$long" -eq "$N" ] || { echo "ls -l showed $long files, expected $N" >&2; exit 1; }
echo "ls -l: $long files in $(secs "$t0" "$t1") s;" \
  "peak RSS while listing: client $(kib "$CLIENT") KiB, metadata server $(kib "$META") KiB"

t0=$(now)
parallel_py remove
rmdir "$D"
t1=$(now)
echo "remove: $N files and the directory in $(secs "$t0" "$t1") s"
[ ! -e "$D" ] || { echo "the directory is still there" >&2; exit 1; }
echo "bigdir: OK"
