#!/usr/bin/env bash
# The transport conformance suite's `rdma` cases on soft-RoCE: builds the suite with the
# `rdma` feature (release; RDMA_VM_PROFILE=dev: debug), runs its rdma:: cases inside a
# QEMU guest on rxe0 (scripts/rdma-vm.sh), and fails when any case fails, is ignored
# (no usable device in the guest would make them "skipped") or did not run. Prints
# "skipped: <reason>" and exits 0 only when QEMU itself refuses to start a guest here.
# Usage: scripts/rdma-vm-suite.sh [case filter, default rdma::] [-- extra rdma-vm.sh options]
# The build uses ${CARGO_TARGET_DIR:-target}/rdma, or RDMA_TARGET_DIR (scripts/test.sh gives its
# own target directory, where the rdma feature's build shares every dependency's).
set -euo pipefail
cd "$(dirname "$0")/.."
filter="${1:-rdma::}"
scripts/deps.sh
target="${RDMA_TARGET_DIR:-${CARGO_TARGET_DIR:-target}/rdma}"
# RDMA_VM_PROFILE=dev reuses scripts/test.sh's debug build of the rdma feature.
profile="${RDMA_VM_PROFILE:-release}"
echo "== build the conformance suite with the rdma feature ($profile)"
bin="$(cargo test -p transport --features rdma --profile "$profile" --target-dir "$target" \
  --test conformance --no-run --message-format=json \
  | grep -o '"executable":"[^"]*conformance[^"]*"' | tail -1 | cut -d'"' -f4 || true)"
[ -x "$bin" ] || { echo "rdma-vm-suite: no conformance binary was built" >&2; exit 1; }
name="$(basename "$bin")"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
echo "== $filter cases in a QEMU guest on soft-RoCE (rxe0)"
rc=0
scripts/rdma-vm.sh --bin "$bin" --timeout "${RDMA_VM_SUITE_TIMEOUT_S:-1500}" "${@:2}" -- \
  "$name --test-threads 1 --color never $filter" | tee "$out" || rc=$?
# 77 means "QEMU cannot boot here" only if the guest never booted.
if [ "$rc" = 77 ] && ! grep -q '^RDMA-VM: booted' "$out"; then
  exit 0 # rdma-vm.sh printed "skipped: <reason>"
fi
[ "$rc" = 0 ] || { echo "rdma-vm-suite: FAILED (status $rc)" >&2; exit 1; }
# A run that skipped its cases (no device in the guest) or ran none is a failure here.
if ! grep -q '^rdma cases: rdma on rxe0 ' "$out" \
  || ! grep -Eq '^test result: ok\. [1-9][0-9]* passed; 0 failed; 0 ignored' "$out"; then
  echo "rdma-vm-suite: FAILED: the rdma cases did not all run and pass on rxe0" >&2
  exit 1
fi
echo "rdma-vm-suite: every $filter case passed on rxe0"
