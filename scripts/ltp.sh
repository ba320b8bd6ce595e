#!/usr/bin/env bash
# The Linux Test Project's file-system cases (its `syscalls` tests of the calls a file
# system answers, and its `fs` stress and integrity tests: growfiles, rwtest, ftest,
# stream, inode, fs_racer, ...) with their temporary files on a Tessera mount, beside the
# same cases on the local disk: a case that passes on the disk must pass on the mount.
#
#   scripts/ltp.sh [CASE...]       (default: every case of both sets; needs root)
#   LTP_SET=syscalls scripts/ltp.sh   (or fs)
#
# LTP is GPL code fetched at run time, not kept here: LTP_SRC names a checkout to use,
# else it is cloned (LTP_REPO, LTP_REF) into BENCH_DIR and built (about 5 min). It needs
# a network for that and for its build packages, so `scripts/test.sh` does not run it.
# A case fails the run when it fails on the mount (exit status other than 0 and 32,
# LTP's TCONF) but not on the disk, unless `tests/ltp-known-failures.txt` lists it with
# its reason. Cases that skip (TCONF) only on the mount are listed, not failed. Results:
# "name status seconds" per case in $OUT/{local,mount}.res and each case's log beside.
# It builds a release, starts `tessera up` in its own state directory, and on exit (also
# on failure) stops it by its state directory and unmounts it.
set -euo pipefail
# `sort` and `join` below must agree on the order of names (fcntl11 before fcntl11_64).
export LC_ALL=C
[ "$(id -u)" = 0 ] || { echo "needs root (a FUSE mount; many cases need root)" >&2; exit 1; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp/tessera-bench}
LTP_REPO=${LTP_REPO:-https://github.com/linux-test-project/ltp.git}
LTP_REF=${LTP_REF:-20260529}
SRC=${LTP_SRC:-$BENCH_DIR/ltp}
SET=${LTP_SET:-all}
OUT=${OUT:-$BENCH_DIR/ltp-results}
BIN=${BIN_DIR:-$ROOT/target/release}/tessera
KNOWN=$ROOT/tests/ltp-known-failures.txt
# Per case: most take a second; the longest (writev03, the growfiles runs) bound
# themselves near 2 min.
CASE_TIMEOUT_S=${LTP_CASE_TIMEOUT_S:-400}
# The syscalls directories whose calls reach a file system.
SYSCALL_DIRS="access chdir chmod chown close close_range copy_file_range creat dup dup2
  dup3 faccessat faccessat2 fadvise fallocate fchdir fchmod fchmodat fchmodat2 fchown
  fchownat fcntl fdatasync fgetxattr flistxattr flock fremovexattr fsetxattr fstat fstatat
  fstatfs fsync ftruncate futimesat getcwd getdents getxattr lchown lgetxattr link linkat
  listxattr llistxattr llseek lremovexattr lseek lstat mkdir mkdirat mknod mknodat mmap
  msync munmap open openat openat2 pread preadv preadv2 pwrite pwritev pwritev2 read
  readahead readdir readlink readlinkat readv realpath removexattr rename renameat
  renameat2 rmdir sendfile setxattr splice stat statfs statvfs statx symlink symlinkat
  sync sync_file_range syncfs tee truncate umask unlink unlinkat utime utimensat utimes
  write writev"
# runtest/fs cases that work in $TMPDIR (not the ones that mount, fill or read /proc).
FS_CASES='^(gf[0-9]+|rwtest[0-9]+|iogen01|fs_inod01|linker01|openfile01|inode0[0-9]|stream0[0-9]|ftest0[0-9]|lftest01|fs_di|fs_racer)[[:space:]]'

work=$(mktemp -d /tmp/tessera-ltp.XXXXXX)
# Cases that switch to an unprivileged user reach their files by absolute paths.
chmod 755 "$work"
mnt=$work/mnt
state=$work/state
cleanup() {
  # The cluster's logs outlive the run, for a case that failed on the mount.
  [ -d "$state/logs" ] && mkdir -p "$OUT" && cp -r "$state/logs" "$OUT/" 2>/dev/null || true
  "$BIN" down --forget "$mnt" --state-dir "$state" >/dev/null 2>&1 || true
  # Never remove files under a mount point still mounted.
  if ! mountpoint -q "$mnt"; then rm -rf "$work"; fi
}
trap cleanup EXIT
# The running case's `timeout` is in a process group of its own: it is stopped first.
case_pid=
trap '[ -z "$case_pid" ] || kill -TERM "$case_pid" 2>/dev/null; exit 130' INT TERM

if [ ! -f "$SRC/lib/libltp.a" ]; then
  echo "== packages LTP builds with"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq autoconf automake libtool m4 make \
    gcc git pkg-config libaio-dev libacl1-dev libattr1-dev libcap-dev acl attr >/dev/null
  if [ ! -f "$SRC/configure.ac" ]; then
    # Never remove a directory the caller named: only the clone this script makes.
    [ -z "${LTP_SRC:-}" ] || { echo "LTP_SRC=$LTP_SRC is no LTP source tree" >&2; exit 1; }
    echo "== LTP $LTP_REF from $LTP_REPO"
    rm -rf "$SRC"
    git clone -q --depth 1 --branch "$LTP_REF" "$LTP_REPO" "$SRC"
  fi
  echo "== building LTP's library (log: $SRC/build.log)"
  (cd "$SRC" && make autotools && ./configure && make -C lib -j"$(nproc)") \
    >"$SRC/build.log" 2>&1 || { tail -20 "$SRC/build.log" >&2; exit 1; }
fi
bins=$SRC/tessera-bin
if [ ! -d "$bins" ]; then
  echo "== building LTP's file-system cases (log: $SRC/build.log)"
  dirs=()
  for d in $SYSCALL_DIRS; do dirs+=("testcases/kernel/syscalls/$d"); done
  dirs+=(testcases/kernel/fs testcases/lib tools/apicmds)
  for d in "${dirs[@]}"; do
    make -C "$SRC/$d" -j"$(nproc)" >>"$SRC/build.log" 2>&1 \
      || { tail -20 "$SRC/build.log" >&2; exit 1; }
  done
  mkdir -p "$bins.tmp"
  for d in "${dirs[@]}"; do
    find "$SRC/$d" -type f -executable ! -name '*.o' -exec cp {} "$bins.tmp/" \;
  done
  # rwtest is a script the build leaves unexecutable.
  install -m 755 "$SRC/testcases/kernel/fs/doio/rwtest" "$bins.tmp/"
  mv "$bins.tmp" "$bins"
fi
# rwtest runs $LTPROOT/testcases/bin/{iogen,doio}, where an installed LTP has them.
[ -e "$SRC/testcases/bin" ] || ln -s "$bins" "$SRC/testcases/bin"

# The cases: "name command..." lines of LTP's runtest files whose program was built.
cases=$work/cases
: > "$cases"
if [ "$SET" = all ] || [ "$SET" = syscalls ]; then
  awk '!/^#/ && NF >= 2' "$SRC/runtest/syscalls" | while read -r name cmd rest; do
    if [ -x "$bins/$cmd" ]; then echo "$name $cmd $rest"; fi
  done >> "$cases"
fi
if [ "$SET" = all ] || [ "$SET" = fs ]; then
  grep -E "$FS_CASES" "$SRC/runtest/fs" >> "$cases" || true
fi
if [ $# -gt 0 ]; then
  want=" $* "
  while read -r name rest; do
    if [[ "$want" == *" $name "* ]]; then echo "$name $rest"; fi
  done < "$cases" > "$cases.some"
  mv "$cases.some" "$cases"
fi
[ -s "$cases" ] || { echo "no LTP case selected" >&2; exit 1; }
echo "== $(wc -l < "$cases") cases (LTP $(cat "$SRC/VERSION" 2>/dev/null || echo "?"))"

(cd "$ROOT" && cargo build --release --bins -q)
mkdir -p "$mnt" "$work/local"
"$BIN" up --state-dir "$state" "$mnt" >/dev/null

# run WHERE RES: each case with its temporary files under WHERE (a directory per case,
# removed after it), "name status seconds" lines to RES, its output to RES.d/NAME.log.
run() {
  local where=$1 res=$2 name cmd s rc
  mkdir -p "$res.d"
  : > "$res"
  while read -r name cmd; do
    s=$(date +%s)
    rc=0
    if mkdir -p "$where/$name"; then
      # In the background, waited for: a signal to the script is handled at once.
      (cd "$where/$name" && TMPDIR="$where/$name" LTPROOT="$SRC" \
        PATH="$bins:$SRC/testcases/lib:$PATH" exec timeout -k 10 "$CASE_TIMEOUT_S" \
        sh -c "$cmd") > "$res.d/$name.log" 2>&1 < /dev/null &
      case_pid=$!
      wait "$case_pid" || rc=$?
      case_pid=
    else
      rc=125
    fi
    echo "$name $rc $(( $(date +%s) - s ))" >> "$res"
    rm -rf "${where:?}/$name" 2>/dev/null || echo "$name left files it could not remove" >&2
    if [ "$where" = "$mnt" ] && ! mountpoint -q "$mnt"; then
      echo "the mount went away during $name (logs: $OUT/logs)" >&2
      exit 1
    fi
  done < "$cases"
}
mkdir -p "$OUT"
echo "== on the local disk ($work/local)"
run "$work/local" "$OUT/local.res"
echo "== on a mount ($mnt)"
run "$mnt" "$OUT/mount.res"

# Status 0: passed; 32: TCONF (the case skipped itself).
ok() { [ "$1" = 0 ] || [ "$1" = 32 ]; }
known() { grep -qE "^$1([[:space:]]|$)" "$KNOWN" 2>/dev/null; }
failed=() known_failed=() skipped=()
while read -r name l_rc _ m_rc _; do
  if ok "$l_rc" && ! ok "$m_rc"; then
    if known "$name"; then known_failed+=("$name"); else failed+=("$name"); fi
  elif [ "$l_rc" = 0 ] && [ "$m_rc" = 32 ]; then
    skipped+=("$name")
  fi
done < <(join <(sort "$OUT/local.res") <(sort "$OUT/mount.res"))
echo "== $(awk '$2 == 0' "$OUT/mount.res" | wc -l) of $(wc -l < "$OUT/mount.res") cases passed on the mount, $(awk '$2 == 0' "$OUT/local.res" | wc -l) on the disk"
[ ${#skipped[@]} -eq 0 ] || echo "skipped on the mount only: ${skipped[*]}"
[ ${#known_failed[@]} -eq 0 ] || echo "known failures (tests/ltp-known-failures.txt): ${known_failed[*]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED on the mount only: ${failed[*]} (logs: $OUT/mount.res.d/)" >&2
  exit 1
fi
echo "== no case failed on the mount that passed on the disk"
