#!/usr/bin/env bash
# Every check and test, on a fresh machine: installs what is missing, then formatting,
# clippy with -D warnings, a build of every binary (the FUSE and process tests run them),
# every test of the workspace, and the public POSIX suite pjdfstest on a fresh mount.
# FUSE tests need root and /dev/fuse, as CI has.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo build (binaries used by the tests)"
cargo build --workspace --bins
echo "== cargo test"
cargo test --workspace -- --test-threads="${TEST_THREADS:-2}"
echo "== pjdfstest (public POSIX suite) on a fresh mount"
scripts/pjdfstest.sh
echo "== all checks passed"
