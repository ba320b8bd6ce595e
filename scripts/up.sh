#!/usr/bin/env bash
# Sets up, builds and mounts a local Tessera cluster on a fresh machine:
#   scripts/up.sh MOUNTPOINT [tessera up options...]
# One metadata server and three data servers on 127.0.0.1 (tcp transport), mounted at
# MOUNTPOINT. Stop it with scripts/down.sh MOUNTPOINT (or target/release/tessera down).
# Run again on a running cluster, it brings back the members that died, on their old
# addresses.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 MOUNTPOINT [--state-dir DIR] [--data-servers N]" >&2; exit 2; }
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo build --release --bins
exec target/release/tessera up "$@"
