#!/usr/bin/env bash
# The transport's numbers beside their floors, in one run on loopback:
#   1. iperf3 (one TCP stream, 5 s): the bandwidth one-sided 1 MiB reads are held to;
#   2. transport-bench on the chosen backend (default tcp): call latency 64 B..64 KiB,
#      with a plain TCP ping-pong of 64 B beside it, and one-sided read/write bandwidth
#      4 KiB..16 MiB with N in flight; once with tokio's multi-threaded runtime (one worker
#      per core, as the binaries run) and once single-threaded.
# Usage: scripts/transport-bench.sh [tcp|mem|rdma|auto] [inflight] [seconds per row]
# Stops everything it started (the iperf3 server, the bench's server child) on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
backend="${1:-tcp}"
inflight="${2:-8}"
secs="${3:-1}"
command -v iperf3 >/dev/null || {
  echo "installing iperf3"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null
}
cargo build --release -q -p transport --bin transport-bench
target="${CARGO_TARGET_DIR:-target}"
port=$((20000 + RANDOM % 20000))
iperf3 -s -p "$port" -1 >/dev/null 2>&1 &
iperf_pid=$!
trap 'kill "$iperf_pid" 2>/dev/null || true' EXIT
sleep 0.5
echo "== iperf3, loopback, one stream, 5 s"
iperf3 -c 127.0.0.1 -p "$port" -t 5 -f m | grep -E 'sender|receiver'
echo
for threads in 0 1; do
  echo "== transport-bench --backend $backend --inflight $inflight --secs $secs --threads $threads"
  "$target/release/transport-bench" --backend "$backend" --inflight "$inflight" \
    --secs "$secs" --threads "$threads"
  echo
done
