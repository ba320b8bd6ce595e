#!/usr/bin/env bash
# Every check and test, on a fresh machine: installs what is missing, then formatting,
# clippy with -D warnings, the docs (cargo doc, no broken link), a build of every
# binary (the FUSE and process tests run them), every test of the workspace, the Python package's tests (scripts/python-test.sh), a
# short run of every fuzz target (scripts/fuzz.sh), the same with the `rdma` transport
# feature (build, clippy and its device-free tests), the rdma conformance cases and a
# whole cluster over rdma on soft-RoCE inside a QEMU guest (scripts/rdma-vm.sh), the
# public POSIX suite pjdfstest on a fresh mount, and the Debian package installed into
# a fresh Debian 12 root and mounted from there.
# FUSE tests need root and /dev/fuse, as CI has.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --tests
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo doc (the library docs build without a broken link)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
echo "== cargo build (binaries used by the tests)"
cargo build --workspace --bins
echo "== the default binaries do not link libibverbs"
for bin in tessera tessera-meta tessera-data; do
  if readelf -d "${CARGO_TARGET_DIR:-target}/debug/$bin" | grep -q 'NEEDED.*libibverbs'; then
    echo "$bin links libibverbs in the default build" >&2; exit 1
  fi
done
echo "== systemd units (systemd-analyze verify; README: Operating a cluster)"
scripts/check-units.sh
echo "== cargo test"
cargo test --workspace -- --test-threads="${TEST_THREADS:-2}"
echo "== python package: pytest against a local cluster and mount (scripts/python-test.sh)"
scripts/python-test.sh
echo "== fuzz targets: every decoder, a short bounded run (scripts/fuzz.sh; README: Fuzzing)"
scripts/fuzz.sh "${FUZZ_SECONDS:-15}"
echo "== rdma feature: clippy, build, device-free unit tests, conformance (skipped: no device)"
# A separate target directory keeps the default binaries above as they were built.
rdma_target="${CARGO_TARGET_DIR:-target}/rdma"
cargo clippy --workspace --all-targets --features transport/rdma --target-dir "$rdma_target" \
  -- -D warnings
cargo build --workspace --features transport/rdma --target-dir "$rdma_target"
cargo test -p transport --features rdma --target-dir "$rdma_target" \
  -- --test-threads="${TEST_THREADS:-2}"
readelf -d "$rdma_target/debug/tessera" | grep -q 'NEEDED.*libibverbs' \
  || { echo "the rdma build of tessera does not link libibverbs" >&2; exit 1; }
echo "== rdma conformance cases on soft-RoCE in a QEMU guest (skipped only where QEMU cannot boot)"
RDMA_VM_PROFILE=dev scripts/rdma-vm-suite.sh
echo "== a whole cluster over rdma in the soft-RoCE VM"
RDMA_VM_PROFILE=dev scripts/rdma-vm-cluster.sh
echo "== pjdfstest (public POSIX suite) on a fresh mount"
scripts/pjdfstest.sh
echo "== pjdfstest on a mount whose namespace is on etcd"
STORE=etcd scripts/pjdfstest.sh
echo "== Debian package: built, installed into a fresh Debian 12 root, a mount from it"
scripts/package-test.sh
echo "== all checks passed"
