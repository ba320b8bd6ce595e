#!/usr/bin/env bash
# Runs the public POSIX conformance suite pjdfstest (the Rust rewrite from crates.io)
# against a fresh Tessera mount, as root, and compares its failures with the list of known
# ones in tests/pjdfstest-known-failures.txt (one "test::name  # reason" per line).
#   scripts/pjdfstest.sh            uses the debug binaries of ${CARGO_TARGET_DIR:-target}
#                                   (scripts/test.sh builds them)
#   BIN_DIR=target/release scripts/pjdfstest.sh
#   STORE=etcd scripts/pjdfstest.sh   the namespace on etcd: the script starts one etcd
#                                     member on 127.0.0.1 (data on /dev/shm) and stops it
#   STORE=etcd-shared scripts/pjdfstest.sh   the same, both metadata servers serving at
#                                     once (`tessera up --etcd-shared`)
#   STORE=sled scripts/pjdfstest.sh   (or redb, the default) the embedded engines
# Exits non-zero on any failure that is not listed as known.
set -euo pipefail
cd "$(dirname "$0")/.."
PJD_VERSION=0.2.2
PJD_ROOT=${PJD_ROOT:-$HOME/.cache/tessera/pjdfstest-$PJD_VERSION}
BIN_DIR=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/debug}
KNOWN=tests/pjdfstest-known-failures.txt

[ "$(id -u)" -eq 0 ] || { echo "pjdfstest needs root (it switches users and makes devices)" >&2; exit 1; }
if [ ! -x "$PJD_ROOT/bin/pjdfstest" ]; then
  echo "== installing pjdfstest $PJD_VERSION into $PJD_ROOT"
  # In cargo's own temporary directory, not the project's (test.sh exports it).
  env -u CARGO_TARGET_DIR cargo install --quiet --locked pjdfstest --version "$PJD_VERSION" \
    --root "$PJD_ROOT"
fi
# The suite switches to these users; "nobody"/"nogroup" exist on Debian already.
id tests >/dev/null 2>&1 || useradd -M -U -s /usr/sbin/nologin tests

work=$(mktemp -d /tmp/tessera-pjdfstest.XXXXXX)
mnt=$work/mnt
state=$work/state
etcd_pid=""
etcd_dir=""
HELPER=/sbin/mount.fuse.tessera
made_helper=0
cleanup() {
  # --forget: also the record `up --state-dir` left under /var/lib/tessera.
  "$BIN_DIR/tessera" down --forget "$mnt" --state-dir "$state" >/dev/null 2>&1 || true
  if [ -n "$etcd_pid" ]; then kill "$etcd_pid" 2>/dev/null || true; wait "$etcd_pid" 2>/dev/null || true; fi
  [ -z "$etcd_dir" ] || rm -rf "$etcd_dir"
  [ "$made_helper" = 0 ] || rm -f "$HELPER"
  rm -rf "$work"
}
trap cleanup EXIT
chmod 755 "$work"   # the suite's unprivileged users must reach the mount
mkdir -p "$work/secondary"
store_args=()
case "${STORE:-}" in
  ""|redb|sled) [ -z "${STORE:-}" ] || store_args=(--store "$STORE") ;;
  etcd|etcd-shared)
    command -v etcd >/dev/null || { echo "STORE=$STORE needs etcd (Debian's etcd-server)" >&2; exit 1; }
    # Two ports free now, below the ephemeral range (which the mount's own outgoing
    # connections draw from) as transport::ports picks them.
    ports=$(python3 -c 'import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
got = []
for _ in range(1000):
    p = random.randrange(20000, max(low, 21024))
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    if p not in got:
        got.append(p)
    if len(got) == 2:
        break
print("\n".join(map(str, got)))')
    client_port=$(sed -n 1p <<<"$ports"); peer_port=$(sed -n 2p <<<"$ports")
    etcd_dir=$(mktemp -d /dev/shm/tessera-pjd-etcd.XXXXXX)
    etcd --name pjd --data-dir "$etcd_dir/data" \
      --listen-client-urls "http://127.0.0.1:$client_port" \
      --advertise-client-urls "http://127.0.0.1:$client_port" \
      --listen-peer-urls "http://127.0.0.1:$peer_port" \
      --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
      --initial-cluster "pjd=http://127.0.0.1:$peer_port" > "$etcd_dir/etcd.log" 2>&1 &
    etcd_pid=$!
    for _ in $(seq 300); do   # up to 30 s for it to answer
      (exec 3<>"/dev/tcp/127.0.0.1/$client_port") 2>/dev/null && break
      kill -0 "$etcd_pid" 2>/dev/null || { cat "$etcd_dir/etcd.log" >&2; exit 1; }
      sleep 0.1
    done
    store_args=(--store etcd --etcd "http://127.0.0.1:$client_port")
    # Both metadata servers serving at once: every change a checked transaction, open
    # files and locks in etcd, one leader for membership.
    mode=""
    [ "$STORE" = etcd ] || { store_args+=(--etcd-shared); mode=", two metadata servers at once"; }
    echo "== the namespace on etcd at http://127.0.0.1:$client_port (pid $etcd_pid)$mode" ;;
  *) echo "STORE must be redb, sled, etcd or etcd-shared" >&2; exit 1 ;;
esac
"$BIN_DIR/tessera" up "$mnt" --state-dir "$state" "${store_args[@]}" >/dev/null
mkdir "$mnt/pjd"
cat > "$work/pjdfstest.toml" <<'TOML'
[features]
posix_fallocate = {}
rename_ctime = {}
utime_now = {}
utimensat = {}

[settings]
naptime = 0.01
allow_remount = false

[dummy_auth]
entries = [["nobody", "nogroup"], ["tests", "tests"]]
TOML

log=$work/pjdfstest.log
set +e
timeout 1800 "$PJD_ROOT/bin/pjdfstest" -c "$work/pjdfstest.toml" -p "$mnt/pjd" \
  -s "$work/secondary" > "$log" 2>&1
status=$?
set -e
results=$(grep -E '^[a-z0-9_]+::[^ ]+ +(ok|FAILED|skipped)$' "$log" || true)
passed=$(grep -cE ' ok$' <<<"$results" || true)
skipped=$(grep -cE ' skipped$' <<<"$results" || true)
failed=$(grep -E ' FAILED$' <<<"$results" | awk '{print $1}' || true)
known=$(grep -vE '^\s*(#|$)' "$KNOWN" | awk '{print $1}' || true)
unexpected=$(comm -23 <(sort <<<"$failed" | sed '/^$/d') <(sort <<<"$known" | sed '/^$/d'))
nfailed=$(sed '/^$/d' <<<"$failed" | wc -l)
nknown=$(comm -12 <(sort <<<"$failed" | sed '/^$/d') <(sort <<<"$known" | sed '/^$/d') | wc -l)
echo "pjdfstest $PJD_VERSION: $passed passed, $nfailed failed ($nknown known), $skipped skipped"
if [ "$passed" -eq 0 ]; then
  echo "pjdfstest ran no test (exit $status); its output ends with:" >&2
  tail -20 "$log" >&2
  exit 1
fi
if [ -n "$unexpected" ]; then
  echo "unexpected failures:" >&2
  sed 's/^/  /' <<<"$unexpected" >&2
  grep -A3 -E "^($(paste -sd'|' <<<"$unexpected")) " "$log" >&2 || true
  exit 1
fi

# The EROFS cases remount the mount read-only and back (`mount -o remount,ro`), which
# the kernel refuses with EBUSY while a file on it is open for writing: in the whole
# run, earlier cases leave one open (on an ext4 loop mount the same six of them fail
# so), so they run in a pass of their own, on a fresh directory, and must all pass.
# `mount -o remount` of a fuse.tessera mount runs its helper (without one, fuse3's
# mount.fuse runs a program named `tessera`): linked for this pass if none is there.
if [ ! -e "$HELPER" ] && [ ! -L "$HELPER" ]; then
  ln -s "$(realpath "$BIN_DIR/tessera")" "$HELPER"
  made_helper=1
fi
sed 's/^allow_remount = false$/allow_remount = true/' "$work/pjdfstest.toml" > "$work/erofs.toml"
mkdir "$mnt/pjd-erofs"
erofs_log=$work/pjdfstest-erofs.log
set +e
timeout 600 "$PJD_ROOT/bin/pjdfstest" -c "$work/erofs.toml" -p "$mnt/pjd-erofs" \
  -s "$work/secondary" erofs > "$erofs_log" 2>&1
set -e
erofs=$(grep -E '^[a-z0-9_]+::[^ ]+ +(ok|FAILED|skipped)$' "$erofs_log" || true)
erofs_passed=$(grep -cE ' ok$' <<<"$erofs" || true)
erofs_other=$(grep -vE ' ok$' <<<"$erofs" | sed '/^$/d' || true)
echo "pjdfstest $PJD_VERSION, the EROFS cases with remounts: $erofs_passed passed"
if [ "$erofs_passed" -eq 0 ] || [ -n "$erofs_other" ]; then
  echo "EROFS cases that did not pass (or none ran):" >&2
  sed 's/^/  /' <<<"$erofs_other" >&2
  grep -m3 -A1 FAILED "$erofs_log" >&2 || true
  exit 1
fi
