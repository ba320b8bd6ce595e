#!/usr/bin/env bash
# The Debian package, installed and used (issue 26 item 6): builds it (scripts/package.sh;
# PROFILE=dev by default here, the test build's binaries), makes a fresh Debian 12 root
# (debootstrap --variant=minbase bookworm; TESSERA_DEB_ROOT_TAR names a tarball of one
# to use instead), installs the package there with dpkg, and in a chroot runs a cluster
# from the installed files only: tessera-meta and tessera-data from /usr/bin with
# configurations copied from the package's examples (addresses and directories given
# as flags), `mount -t fuse.tessera` through
# the installed helper, a file written and read back, `umount` (the mount process ends),
# the servers stopped, then `dpkg --purge` (the helper link goes with it).
# Servers listen on 127.0.0.1 only. Needs root, /dev/fuse, and the Debian mirror
# (DEBIAN_MIRROR) unless given a root tarball.
set -euo pipefail
cd "$(dirname "$0")/.."
deb="$(PROFILE="${PROFILE:-dev}" scripts/package.sh | tail -1)"
echo "package: $deb ($(du -h "$deb" | cut -f1))"
work="$(mktemp -d /var/tmp/tessera-deb-test.XXXXXX)"
root="$work/root"
pids=()

mounts_under_root() { awk -v r="$root" 'index($2, r) == 1' /proc/self/mounts; }

cleanup() {
  set +e
  # The mount first (its process ends with it), then whatever of it is left, then the
  # servers.
  umount -l "$root/mnt/t" 2>/dev/null
  for p in $(helper_pids) "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in $(helper_pids) "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  umount -l "$root/dev" 2>/dev/null
  umount -l "$root/proc" 2>/dev/null
  # Never delete through a mount still attached (the bind of /dev above all).
  if [ -n "$(mounts_under_root)" ]; then
    echo "left $work in place: still mounted under it:" >&2; mounts_under_root >&2
  else
    rm -rf --one-file-system "$work"
  fi
}
trap cleanup EXIT

helper_pids() { # the mount processes serving the chroot's /mnt/t
  for d in /proc/[0-9]*; do
    [ "$(readlink "$d/root" 2>/dev/null)" = "$root" ] || continue
    tr '\0' ' ' <"$d/cmdline" 2>/dev/null | grep -q '^/sbin/mount.fuse.tessera .* /mnt/t ' \
      && basename "$d"
  done
  return 0
}

if [ -n "${TESSERA_DEB_ROOT_TAR:-}" ] && [ -f "$TESSERA_DEB_ROOT_TAR" ]; then
  mkdir -p "$root"
  tar -xf "$TESSERA_DEB_ROOT_TAR" -C "$root"
else
  command -v debootstrap >/dev/null || { echo "debootstrap is missing (scripts/deps.sh)" >&2; exit 1; }
  echo "debootstrap: a fresh Debian 12 root (minbase)"
  if ! debootstrap --variant=minbase bookworm "$root" \
       "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$work/debootstrap.log" 2>&1; then
    tail -20 "$work/debootstrap.log" >&2; exit 1
  fi
fi
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
in_root() { chroot "$root" "$@"; }

cp "$deb" "$root/tmp/tessera.deb"
in_root dpkg -i /tmp/tessera.deb
examples=/usr/share/doc/tessera/examples
for f in /usr/bin/tessera /usr/bin/tessera-meta /usr/bin/tessera-data \
         /lib/systemd/system/tessera-meta.service /lib/systemd/system/tessera-data@.service \
         /lib/systemd/system/tessera-mount@.service $examples/meta.example.toml \
         $examples/data.example.toml $examples/client.example.toml; do
  in_root test -e "$f" || { echo "the package did not install $f" >&2; exit 1; }
done
# Checked inside the root: its /sbin may be a link that means /usr/sbin there only.
[ "$(in_root readlink /sbin/mount.fuse.tessera)" = /usr/bin/tessera ] \
  || { echo "the package has no /sbin/mount.fuse.tessera link" >&2; exit 1; }
in_root dpkg -S /sbin/mount.fuse.tessera >/dev/null \
  || { echo "dpkg does not own the helper link" >&2; exit 1; }

# Configurations as an operator makes them: the examples, copied and edited.
in_root sh -c 'mkdir -p /etc/tessera && cd /usr/share/doc/tessera/examples &&
  cp meta.example.toml /etc/tessera/meta.toml &&
  cp data.example.toml /etc/tessera/data-disk1.toml &&
  mkdir -p /srv/tessera/disk1 /mnt/t /run/tessera'
sed -i 's|^listen = .*|listen = "127.0.0.1:0"|; s|^addr_file = .*|addr_file = "/run/tessera/meta.addr"|' \
  "$root/etc/tessera/meta.toml"

wait_file() { # FILE WHAT PID
  for _ in $(seq 300); do
    [ -s "$1" ] && return 0
    kill -0 "$3" 2>/dev/null || { echo "$2 exited; its log:" >&2; cat "$work/$2.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "$2 did not start in 30 s; its log:" >&2; cat "$work/$2.log" >&2; exit 1
}

chroot "$root" /usr/bin/tessera-meta --config /etc/tessera/meta.toml >"$work/meta.log" 2>&1 &
pids+=($!)
wait_file "$root/run/tessera/meta.addr" meta "${pids[0]}"
meta="$(cat "$root/run/tessera/meta.addr")"
case "$meta" in 127.0.0.1:*) ;; *) echo "meta listens on $meta, not 127.0.0.1" >&2; exit 1 ;; esac
chroot "$root" /usr/bin/tessera-data --config /etc/tessera/data-disk1.toml \
  --listen 127.0.0.1:0 --meta "$meta" --data-dir /srv/tessera/disk1 \
  --addr-file /run/tessera/data.addr --capacity-bytes $((4 << 30)) >"$work/data.log" 2>&1 &
pids+=($!)
wait_file "$root/run/tessera/data.addr" data "${pids[1]}"

echo "mount -t fuse.tessera $meta:/ /mnt/t (in the Debian 12 root)"
in_root mount -t fuse.tessera "$meta:/" /mnt/t -o noatime,log_file=/var/log/tessera/t.log
grep -q " $root/mnt/t fuse.tessera " /proc/self/mounts \
  || { echo "not mounted as fuse.tessera:" >&2; grep "$root" /proc/self/mounts >&2; exit 1; }
in_root sh -c 'printf "installed from the package\n" > /mnt/t/hello && mkdir /mnt/t/dir &&
  cp /usr/share/doc/tessera/examples/client.example.toml /mnt/t/dir/ && sync'
[ "$(in_root cat /mnt/t/hello)" = "installed from the package" ] \
  || { echo "read back something else" >&2; exit 1; }
in_root cmp /usr/share/doc/tessera/examples/client.example.toml /mnt/t/dir/client.example.toml
in_root df -h -t fuse.tessera /mnt/t

[ -n "$(helper_pids)" ] || { echo "no mount process found" >&2; exit 1; }
in_root umount /mnt/t
for _ in $(seq 100); do [ -z "$(helper_pids)" ] && break; sleep 0.1; done
[ -z "$(helper_pids)" ] || { echo "the mount process outlived umount" >&2; exit 1; }

for p in "${pids[@]}"; do kill -TERM "$p"; done
for p in "${pids[@]}"; do wait "$p" || { echo "a server exited badly after SIGTERM" >&2; exit 1; }; done
pids=()
in_root dpkg --purge tessera
! in_root test -e /sbin/mount.fuse.tessera || { echo "purge left the helper link" >&2; exit 1; }
! in_root test -e /usr/bin/tessera || { echo "purge left /usr/bin/tessera" >&2; exit 1; }
echo "package test passed: installed, mounted, read back, unmounted, purged"
