#!/usr/bin/env bash
# Builds the Debian package with cargo-deb (installed with `cargo install --locked` when
# missing): release builds of tessera, tessera-meta and tessera-data, the mount helper
# link (made by the package's postinst), the systemd units, example configurations under
# /etc/tessera. The package's contents are in fs-client/Cargo.toml
# ([package.metadata.deb]). Prints the path of the .deb on its last line.
# PROFILE=dev packages the test build's binaries instead (scripts/package-test.sh in
# scripts/test.sh: what is tested is the packaging; a second, release build of every
# crate would add minutes to CI for nothing it checks).
set -euo pipefail
cd "$(dirname "$0")/.."
# The cargo-deb release this script was written against (pinned: CI installs it fresh).
CARGO_DEB_VERSION="${CARGO_DEB_VERSION:-3.8.0}"
if ! cargo deb --version >/dev/null 2>&1; then
  # In cargo's own temporary directory, not the project's (test.sh exports it).
  env -u CARGO_TARGET_DIR cargo install cargo-deb --locked --version "=$CARGO_DEB_VERSION" >&2
fi
profile="${PROFILE:-release}"
# A release package builds only the three packaged binaries' crates (the test crate's
# features, such as meta-server's `local-etcd`, stay out of it). The test build's
# package (PROFILE=dev) takes every binary of the workspace, as scripts/test.sh built
# them: cargo enables the dependencies' features for the packages a build selects, so
# `-p` of three compiled most dependencies a second time there (2 minutes, cold).
if [ "$profile" = dev ]; then
  cargo build --profile dev --workspace --bins >&2
else
  cargo build --profile "$profile" --bins -p fs-client -p meta-server -p data-server >&2
fi
out="${CARGO_TARGET_DIR:-target}/debian"
mkdir -p "$out"
# --no-build: the build above made the three binaries (cargo-deb builds only fs-client's).
cargo deb -p fs-client --profile "$profile" --no-build --output "$out" >&2
ls -t "$out"/tessera_*.deb | head -1
