#!/usr/bin/env bash
# CPython's own file-system tests (`python3 -m test`, the standard library's suite) with
# their working files on a fresh Tessera mount, beside the same tests on the local disk:
# a module that passes on the disk must pass on the mount. Public tests written for local
# file systems, by others, with two test processes at once on one mount (-j2): they
# found a kept attribute that read rewritten files back empty (CHANGELOG: "a file
# rewritten and read back read empty").
#   scripts/stdlib-test.sh [MODULE...]   uses the debug binaries of ${CARGO_TARGET_DIR:-target}
#   BIN_DIR=target/release scripts/stdlib-test.sh
# Needs root (FUSE) and a python3 with its `test` package: $PYTHON, else python3 (pyenv's
# builds have it), else Debian's /usr/bin/python3, given libpython3.X-testsuite here when
# it lacks it too.
# Exits non-zero if a module fails on the mount and not on the local disk.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN_DIR=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/debug}
# Modules that work with files, directories, links, modes, times, locks, mmap, archives
# and databases in the test's temporary directory. Not test_compileall: two of its cases
# fail on a local disk too with pyenv's builds (hard-link dedup of .pyc files).
MODULES=(test_os test_shutil test_tempfile test_pathlib test_fileio test_glob test_posix
  test_tarfile test_zipfile test_filecmp test_stat test_genericpath test_posixpath
  test_mmap test_fcntl test_sqlite3 test_dbm_dumb test_mailbox test_shelve test_fileinput
  test_gzip test_zipimport test_logging test_import test_importlib test_runpy test_zipapp
  test_linecache)
[ $# -eq 0 ] || MODULES=("$@")
# Bounded: a hang on the mount fails the run instead of stalling it.
TIMEOUT_S=${STDLIB_TIMEOUT_S:-1200}

[ "$(id -u)" -eq 0 ] || { echo "needs root (a FUSE mount)" >&2; exit 1; }
has_tests() { "$1" -c 'import test.support, test.test_os' 2>/dev/null; }
PY=${PYTHON:-python3}
if ! has_tests "$PY"; then
  [ -z "${PYTHON:-}" ] || { echo "$PYTHON has no test package (CPython's test suite)" >&2; exit 1; }
  PY=/usr/bin/python3
  [ -x "$PY" ] || { echo "no python3 with its test package, and no $PY" >&2; exit 1; }
  if ! has_tests "$PY"; then
    command -v apt-get >/dev/null \
      || { echo "$PY has no test package and apt-get is missing to install it" >&2; exit 1; }
    pkg=$("$PY" -c 'import sys; print("libpython%d.%d-testsuite" % sys.version_info[:2])')
    echo "== installing $pkg (CPython's test package for $PY)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" >/dev/null; }
    has_tests "$PY" || { echo "$PY still has no test package after installing $pkg" >&2; exit 1; }
  fi
fi
echo "== $("$PY" --version) ($PY): ${#MODULES[@]} modules"

work=$(mktemp -d /tmp/tessera-stdlib.XXXXXX)
mnt=$work/mnt
state=$work/state
cleanup() {
  "$BIN_DIR/tessera" down --forget "$mnt" --state-dir "$state" >/dev/null 2>&1 || true
  # Never remove files under a mount point still mounted.
  if ! mountpoint -q "$mnt"; then rm -rf "$work"; fi
}
trap cleanup EXIT
mkdir -p "$mnt" "$work/local"
"$BIN_DIR/tessera" up --state-dir "$state" "$mnt" >/dev/null

# run WHERE LOG: the modules with their temporary files under WHERE; prints the modules
# that failed, one per line, from regrtest's progress lines ("[ 4/23/1] test_x failed",
# "... crashed", "... worker non-zero exit code", "... timed out"; not "failed (env
# changed)", which regrtest itself does not count as a failure without
# --fail-env-changed). SIGINT at the timeout: regrtest then stops its workers (they run
# in sessions of their own, which a TERM to the main process would leave behind).
run() {
  local rc=0 failed
  (cd "$1" && TMPDIR="$1" timeout -s INT -k 60 "$TIMEOUT_S" "$PY" -m test -j2 --timeout 600 \
    "${MODULES[@]}") > "$2" 2>&1 || rc=$?
  failed=$(grep -E '\] test_[a-z0-9_]+ (failed|crashed|worker|timed out|interrupted)' "$2" \
    | grep -v 'env changed' | grep -oE 'test_[a-z0-9_]+ ' | sort -u || true)
  # 2: some test failed; it must then be named above. Anything else but 0 is the run
  # itself failing (a timeout: 124).
  if { [ "$rc" != 0 ] && [ "$rc" != 2 ]; } || { [ "$rc" = 2 ] && [ -z "$failed" ]; }; then
    echo "python3 -m test under $1 ended with $rc:" >&2; tail -20 "$2" >&2; exit 1
  fi
  echo "$failed"
}
echo "== on the local disk ($work/local)"
local_failed=$(run "$work/local" "$work/local.log")
tail -4 "$work/local.log"
echo "== on the mount ($mnt)"
mount_failed=$(run "$mnt" "$work/mount.log")
tail -4 "$work/mount.log"
new=$(comm -13 <(echo "$local_failed") <(echo "$mount_failed") | sed '/^$/d')
if [ -n "$new" ]; then
  echo "failed on the mount, passed on the local disk:" >&2
  echo "$new" >&2
  for m in $new; do
    grep -A25 -E "\] $m (failed|crashed|worker|timed out)" "$work/mount.log" >&2 || true
  done
  exit 1
fi
# A case that skips itself on the mount and runs on the disk passes unseen above: the
# mount may skip no more cases than the disk ("Total tests: run=N skipped=M"), give or
# take SKIP_SLACK (the disk's own count moved by 2 between two runs: 392, then 390).
skipped() { grep -oE 'Total tests: run=[0-9,]+( [a-z]+=[0-9,]+)*' "$1" | tail -1 \
  | grep -oE 'skipped=[0-9,]+' | tr -dc '0-9'; }
local_skipped=$(skipped "$work/local.log")
mount_skipped=$(skipped "$work/mount.log")
if [ "${mount_skipped:-0}" -gt $((${local_skipped:-0} + ${SKIP_SLACK:-4})) ]; then
  echo "the mount skipped $mount_skipped cases, the local disk $local_skipped" >&2
  exit 1
fi
[ -z "$local_failed" ] || echo "failed on the local disk too (not counted): $local_failed"
echo "== every module that passes on the local disk passes on the mount" \
  "(cases skipped: $mount_skipped there, $local_skipped on the disk)"
