#!/usr/bin/env bash
# Unmounts a cluster started by scripts/up.sh and stops its processes:
#   scripts/down.sh MOUNTPOINT [--state-dir DIR]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 MOUNTPOINT [--state-dir DIR]" >&2; exit 2; }
cd "$(dirname "$0")/.."
exec target/release/tessera down "$@"
