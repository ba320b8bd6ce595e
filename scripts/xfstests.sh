#!/usr/bin/env bash
# xfstests (fstests), the kernel file systems' own regression suite, against a Tessera
# mount: its FUSE support (FSTYP=fuse) mounts TEST_DEV and SCRATCH_DEV with
# `mount -t fuse.tessera`, here two directories of one `tessera up` cluster.
#
#   scripts/xfstests.sh [CHECK ARGS...]     (default: -g generic/quick; needs root)
#
# e.g. `scripts/xfstests.sh generic/001 generic/013` or `scripts/xfstests.sh -g generic/rw`.
# The suite is GPL code fetched at run time, not kept here: XFSTESTS_SRC names a checkout
# to use, else it is cloned (XFSTESTS_REPO, XFSTESTS_REF) into BENCH_DIR. It needs a
# network for that and for its build packages, so `scripts/test.sh` does not run it.
# It builds a release, starts `tessera up` in its own state directory, links the mount
# helper as /sbin/mount.fuse.tessera if nothing is there, adds the users the suite's
# tests run as (fsgqa, fsgqa2, 123456-fsgqa), and on exit (also on failure) unmounts both
# directories, stops the cluster and removes the link it made. Results: the suite's
# `results/` directory, and the summary printed at the end.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "needs root (mount, users)" >&2; exit 1; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp/tessera-bench}
XFSTESTS_REPO=${XFSTESTS_REPO:-https://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git}
XFSTESTS_REF=${XFSTESTS_REF:-v2026.01.27}
SRC=${XFSTESTS_SRC:-$BENCH_DIR/xfstests}
STATE=$BENCH_DIR/xfstests-state
MNT=$BENCH_DIR/mnt/xfstests-cluster
TEST_DIR=$BENCH_DIR/mnt/xfstests-test
SCRATCH_MNT=$BENCH_DIR/mnt/xfstests-scratch
HELPER=/sbin/mount.fuse.tessera
BIN=$ROOT/target/release/tessera
[ $# -gt 0 ] || set -- -g generic/quick

made_helper=0
cleanup() {
  local m
  for m in "$SCRATCH_MNT" "$TEST_DIR"; do
    mountpoint -q "$m" 2>/dev/null && umount "$m" 2>/dev/null || true
  done
  [ -d "$STATE" ] && "$BIN" down --forget "$MNT" --state-dir "$STATE" >/dev/null 2>&1 || true
  rm -rf "$STATE"
  [ "$made_helper" = 1 ] && rm -f "$HELPER"
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== packages the suite builds and runs with"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq autoconf automake libtool make gcc \
  git uuid-dev libattr1-dev libacl1-dev libaio-dev liburing-dev xfslibs-dev libgdbm-dev \
  libcap-dev pkg-config xfsprogs attr acl bc gawk psmisc e2fsprogs quota fio >/dev/null

if [ ! -x "$SRC/check" ]; then
  echo "== xfstests $XFSTESTS_REF from $XFSTESTS_REPO"
  rm -rf "$SRC"
  git clone -q --depth 1 --branch "$XFSTESTS_REF" "$XFSTESTS_REPO" "$SRC"
fi
if [ ! -x "$SRC/src/nametest" ]; then
  echo "== building xfstests"
  make -C "$SRC" -j"$(nproc)" >"$SRC/build.log" 2>&1 || {
    tail -20 "$SRC/build.log" >&2
    exit 1
  }
fi
# The suite takes a mounted file system for its FSTYP when df names the type so; FUSE
# file systems with a subtype show as fuse.SUBTYPE (it knows only glusterfs and ceph's).
grep -q 'fuse\\.tessera' "$SRC/common/rc" ||
  sed -i "s|-e 's/fuse.ceph-fuse/ceph-fuse/'|& -e 's/^fuse\\\\.tessera\$/fuse/'|" \
    "$SRC/common/rc"
for u in fsgqa fsgqa2 123456-fsgqa; do
  id "$u" >/dev/null 2>&1 || useradd -m "$u"
done
getent group fsgqa >/dev/null || groupadd fsgqa

(cd "$ROOT" && cargo build --release --bins -q)
if [ ! -e "$HELPER" ]; then
  ln -s "$BIN" "$HELPER"
  made_helper=1
fi
rm -rf "$STATE"
mkdir -p "$MNT" "$TEST_DIR" "$SCRATCH_MNT"
up=$("$BIN" up "$MNT" --state-dir "$STATE" --data-servers 3 --replicas 3)
addr=$(echo "$up" | sed -n 's/^metadata server: //p' | head -1)
[ -n "$addr" ] || { echo "no metadata server address in tessera up's output" >&2; exit 1; }
mkdir -p "$MNT/test" "$MNT/scratch"
# The suite makes device nodes and set-id files; a mount is nodev,nosuid by default, and
# mount(8) does not pass a bare dev or suid on (it is what it does by default).
opts="-okey_file=$STATE/keys/admin.key,allow_other,default_permissions,dev=true,suid=true"
cat > "$SRC/local.config" <<EOF
export TEST_DEV=$addr:/test
export TEST_DIR=$TEST_DIR
export SCRATCH_DEV=$addr:/scratch
export SCRATCH_MNT=$SCRATCH_MNT
export FSTYP=fuse
export FUSE_SUBTYP=.tessera
export MOUNT_OPTIONS="$opts"
export TEST_FS_MOUNT_OPTS="$opts"
EOF

echo "== ./check $*"
cd "$SRC"
status=0
./check "$@" || status=$?
echo "== results: $SRC/results"
exit "$status"
