#!/usr/bin/env bash
# Every check and test, on a fresh machine: installs what is missing, then formatting,
# clippy with -D warnings, the docs (cargo doc, no broken link), a build of every
# binary (the FUSE and process tests run them), every test of the workspace, the Python package's tests (scripts/python-test.sh),
# CPython's own file-system tests on a mount beside the local disk (scripts/stdlib-test.sh), a
# short run of every fuzz target (scripts/fuzz.sh), the same with the `rdma` transport
# feature (build, clippy and its device-free tests), the rdma conformance cases and a
# whole cluster over rdma on soft-RoCE inside a QEMU guest (scripts/rdma-vm.sh), the
# public POSIX suite pjdfstest on a fresh mount, and the Debian package installed into
# a fresh Debian 12 root and mounted from there.
# FUSE tests need root and /dev/fuse, as CI has.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's heading carries the minutes and seconds since the start, so a log shows
# where the time went (README "Tests" keeps the slowest parts' times).
step() { printf '== [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
# The target directory as cargo resolves it (CARGO_TARGET_DIR, or `build.target-dir` in
# a cargo config, or ./target), exported so that every script below uses the same one.
target_dir() {
  cargo metadata --no-deps --format-version 1 \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}
# The build of the binaries the tests run has no libibverbs (the rdma feature's build,
# later in the same target directory, does; the default build is uplifted again after it).
# `links_verbs BIN`: whether BIN names libibverbs among its libraries. A readelf that
# fails (BIN missing) ends the run: in a condition, `set -e` would not, nor would a
# pipe into `grep -q`.
links_verbs() {
  local d
  d="$(readelf -d "$1")" || { echo "readelf -d $1 failed" >&2; exit 1; }
  grep -q 'NEEDED.*libibverbs' <<<"$d"
}
default_bins_without_verbs() {
  cargo build --workspace --bins
  for bin in tessera tessera-meta tessera-data; do
    if links_verbs "$target/debug/$bin"; then
      echo "$bin links libibverbs in the default build" >&2; exit 1
    fi
  done
}
step "scripts/deps.sh --tests"
scripts/deps.sh --tests
target="$(target_dir)"
export CARGO_TARGET_DIR="$target"
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
step "cargo doc (the library docs build without a broken link)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
step "cargo build (binaries used by the tests; they do not link libibverbs)"
default_bins_without_verbs
step "systemd units (systemd-analyze verify; README: Operating a cluster)"
scripts/check-units.sh
step "cargo test"
cargo test --workspace -- --test-threads="${TEST_THREADS:-2}"
step "python package: pytest against a local cluster and mount (scripts/python-test.sh)"
scripts/python-test.sh
step "CPython's file-system tests on a mount beside the local disk (scripts/stdlib-test.sh)"
scripts/stdlib-test.sh
step "fuzz targets: every decoder, a short bounded run (scripts/fuzz.sh; README: Fuzzing)"
scripts/fuzz.sh "${FUZZ_SECONDS:-15}"
step "rdma feature: clippy, build, device-free unit tests, conformance (skipped: no device)"
# Should a step below fail, the default binaries go back all the same: a later
# scripts/pjdfstest.sh or `tessera up` from target/debug would run the rdma build.
trap 'cargo build --workspace --bins >/dev/null 2>&1 || true' EXIT
# In the same target directory: the feature changes only rdma-sys and the workspace's
# crates, so every other dependency's build is shared (a directory of its own compiled
# them all again, minutes on a fresh machine). The binaries it uplifts link libibverbs
# until default_bins_without_verbs below puts the default ones back.
cargo clippy --workspace --all-targets --features transport/rdma -- -D warnings
cargo build --workspace --features transport/rdma
cargo test -p transport --features rdma -- --test-threads="${TEST_THREADS:-2}"
links_verbs "$target/debug/tessera" \
  || { echo "the rdma build of tessera does not link libibverbs" >&2; exit 1; }
step "rdma conformance cases on soft-RoCE in a QEMU guest (skipped only where QEMU cannot boot)"
RDMA_VM_PROFILE=dev RDMA_TARGET_DIR="$target" scripts/rdma-vm-suite.sh
step "a whole cluster over rdma in the soft-RoCE VM"
RDMA_VM_PROFILE=dev RDMA_TARGET_DIR="$target" scripts/rdma-vm-cluster.sh
step "the default binaries back (pjdfstest and the package use them)"
default_bins_without_verbs
trap - EXIT
step "pjdfstest (public POSIX suite) on a fresh mount"
scripts/pjdfstest.sh
step "pjdfstest on a mount whose namespace is on etcd"
STORE=etcd scripts/pjdfstest.sh
step "pjdfstest on a mount whose namespace two metadata servers serve at once on etcd"
STORE=etcd-shared scripts/pjdfstest.sh
step "Debian package: built, installed into a fresh Debian 12 root, a mount from it"
scripts/package-test.sh
step "all checks passed"
