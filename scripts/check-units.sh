#!/usr/bin/env bash
# `systemd-analyze verify` of every unit in packaging/systemd (a template through an
# example instance), with the built binaries standing in for /usr/bin (verify checks
# that each ExecStart program exists). Any warning fails, not only errors: verify exits
# 0 on an unknown key or a misspelt value. Usage: scripts/check-units.sh [BIN_DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-${CARGO_TARGET_DIR:-$root/target}/debug}"
bin="$(cd "$bin" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
units=()
for f in "$root"/packaging/systemd/*.service; do
  name="$(basename "$f")"
  sed "s|/usr/bin/|$bin/|g" "$f" > "$tmp/$name"
  case "$name" in
    *@.service) units+=("${name%@.service}@example.service") ;;
    *) units+=("$name") ;;
  esac
done
cd "$tmp"
if ! out="$(systemd-analyze verify "${units[@]}" 2>&1)"; then
  echo "$out" >&2; echo "systemd-analyze verify failed" >&2; exit 1
fi
if [ -n "$out" ]; then
  echo "$out" >&2; echo "systemd-analyze verify warned (treated as a failure)" >&2; exit 1
fi
echo "units verified: ${units[*]}"
