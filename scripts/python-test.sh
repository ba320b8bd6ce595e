#!/usr/bin/env bash
# The Python package's tests (issue 29; README "From Python"): builds and installs the
# package (`pip install ./python`, maturin with the dev profile into the workspace's
# target directory) into a virtual environment under target/py-venv with pytest, numpy,
# safetensors and fsspec at pinned versions, starts a local cluster with a mount
# (`tessera up`), runs python/tests against it, and stops the cluster (`tessera down`,
# by the PIDs `up` recorded) also on failure. torch is not in that environment (its
# tests report skipped there); where Debian's python3-torch is installed (scripts/deps.sh
# and .ci/run install it: CPU only, 186 MB, where PyPI's wheel needs CUDA's), the torch
# tests run again in a second environment, target/py-venv-torch, made with Debian's
# python3 and its packages (numpy 1.24 among them: torch 1.13 is built against numpy 1).
#   scripts/python-test.sh [pytest arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
# Absolute: the script changes directory before it is done with it.
target=$(realpath -m "${CARGO_TARGET_DIR:-$repo/target}")
venv="$target/py-venv"
# The versions this was last run with; numpy 2.4 is the last line for Python 3.11.
pins=(maturin==1.16.0 pytest==9.2.0 numpy==2.4.6 safetensors==0.8.0 fsspec==2026.9.0
  pandas==3.1.1 pyarrow==26.0.1 datasets==5.2.0)

echo "== python: virtual environment $venv"
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}"

# `pip install ./python` into venv $1 (maturin, dev profile). maturin is the venv's;
# --no-build-isolation uses it instead of fetching another copy for every build. The
# workspace's target directory keeps the build incremental.
install_package() {
  echo "== python: pip install ./python into $1 (maturin, dev profile, target $target)"
  (cd "$repo" && PATH="$1/bin:$PATH" CARGO_TARGET_DIR="$target" MATURIN_PEP517_ARGS="--profile dev" \
    "$1/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation \
    --force-reinstall --no-deps ./python)
}
# pytest with venv $1's python on python/tests, arguments after it, against the cluster.
# Run from python/tests with the installed package first on the path (not the source
# tree, which has no native module).
run_pytest() {
  local py="$1/bin/python"
  shift
  (cd "$repo/python/tests" &&
    TESSERA_TEST_META=$(cat "$state/meta.addr") \
    TESSERA_TEST_KEY="$state/keys/admin.key" \
    TESSERA_TEST_MOUNT="$mnt" \
    TESSERA_TEST_BIN="$target/debug/tessera" \
      "$py" -m pytest -q -rs -p no:cacheprovider "$@")
}
install_package "$venv"

echo "== python: the tessera binary and a local cluster"
# The same build as scripts/test.sh's (so nothing is built twice with other features).
cargo build -q --workspace --bins
work=$(mktemp -d /tmp/tessera-python.XXXXXX)
mnt="$work/mnt"
state="$work/state"
mkdir -p "$mnt"
cleanup() {
  "$target/debug/tessera" down --forget --state-dir "$state" "$mnt" >/dev/null || true
  # Never remove files under a mount point still mounted.
  if ! mountpoint -q "$mnt"; then rm -rf "$work"; fi
}
trap cleanup EXIT
"$target/debug/tessera" up --state-dir "$state" "$mnt" >/dev/null

echo "== python: pytest python/tests"
run_pytest "$venv" "$@" .

# Debian's torch, importable only by Debian's own python3 (its dist-packages).
system_python=/usr/bin/python3
if [ $# -eq 0 ] && "$system_python" -c "import torch" 2>/dev/null; then
  tvenv="$target/py-venv-torch"
  echo "== python: the torch tests with Debian's torch ($tvenv)"
  [ -x "$tvenv/bin/python" ] || "$system_python" -m venv --system-site-packages "$tvenv"
  # Not numpy: the system's 1.24, which torch 1.13 was built against, must stay first.
  "$tvenv/bin/python" -m pip install -q --disable-pip-version-check \
    maturin==1.16.0 pytest==9.2.0 safetensors==0.8.0
  install_package "$tvenv"
  run_pytest "$tvenv" test_torch.py
elif [ $# -eq 0 ]; then
  echo "== python: torch tests skipped: $system_python cannot import torch (Debian: python3-torch)"
fi
