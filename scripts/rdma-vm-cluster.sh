#!/usr/bin/env bash
# A whole cluster on soft-RoCE: builds the workspace's binaries (tessera-meta,
# tessera-data and cluster-check are the ones it runs) with the `rdma` feature (release;
# RDMA_VM_PROFILE=dev: debug) and runs, inside a QEMU
# guest on rxe0 (scripts/rdma-vm.sh), the metadata server, three data servers and a
# client over `--transport rdma`: it writes a file (256 MiB by default), reads it back,
# reads it again while one data server is killed with SIGKILL, and compares sha256
# (tests/src/cluster_check.rs). Fails unless the guest's cluster-check printed PASS.
# Prints "skipped: <reason>" and exits 0 only when QEMU itself refuses to start a guest.
# Usage: scripts/rdma-vm-cluster.sh [cluster-check options, e.g. --size-mib 64]
#        [-- extra rdma-vm.sh options]
# The build uses ${CARGO_TARGET_DIR:-target}/rdma (beside the conformance suite's), or
# RDMA_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
check_args=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do check_args+=("$1"); shift; done
[ $# -gt 0 ] && shift
scripts/deps.sh
target="${RDMA_TARGET_DIR:-${CARGO_TARGET_DIR:-target}/rdma}"
# RDMA_VM_PROFILE=dev reuses scripts/test.sh's debug build of the rdma feature instead
# of a release build of its own (minutes of compiling on a 2-core machine).
profile="${RDMA_VM_PROFILE:-release}"
echo "== build the binaries (tessera-meta, tessera-data, cluster-check among them) with the rdma feature ($profile)"
# The whole workspace's binaries, as scripts/test.sh's rdma build selects: cargo enables
# the dependencies' features for the packages a build selects, and a build of three of
# them compiled most dependencies again (4 minutes there).
cargo build --profile "$profile" --features transport/rdma --target-dir "$target" \
  --workspace --bins
rel="$target/$([ "$profile" = dev ] && echo debug || echo "$profile")"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
echo "== the cluster in a QEMU guest over rdma on soft-RoCE (rxe0)"
# The servers listen on the guest's eth0 address, the one rxe0 carries RoCE v2 on. rxe0's
# counters afterwards show that the bytes went through verbs (packets sent and received)
# and how many retransmissions and errors the run cost.
counters=/sys/class/infiniband/rxe0/ports/1/hw_counters
rc=0
scripts/rdma-vm.sh --bin "$rel/tessera-meta" --bin "$rel/tessera-data" \
  --bin "$rel/cluster-check" --timeout "${RDMA_VM_CLUSTER_TIMEOUT_S:-1800}" "$@" -- \
  "cluster-check --transport rdma --host 10.0.2.15 --bin-dir /opt/bin ${check_args[*]-};" \
  "rc=\$?; echo \"rxe0 counters: \$(cd $counters && grep . * | tr '\n' ' ')\"; exit \$rc" \
  | tee "$out" || rc=$?
# 77 means "QEMU cannot boot here" only if the guest never booted.
if [ "$rc" = 77 ] && ! grep -q '^RDMA-VM: booted' "$out"; then
  exit 0 # rdma-vm.sh printed "skipped: <reason>"
fi
[ "$rc" = 0 ] || { echo "rdma-vm-cluster: FAILED (status $rc)" >&2; exit 1; }
grep -q '^PASS' "$out" || { echo "rdma-vm-cluster: FAILED: no PASS line" >&2; exit 1; }
echo "rdma-vm-cluster: the cluster passed over rdma on rxe0"
