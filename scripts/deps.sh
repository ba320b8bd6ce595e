#!/usr/bin/env bash
# Installs the Debian packages Tessera's build, mount and tests need, if any is missing.
#   fuse3        fusermount3 (unprivileged mounts and unmounts) and /etc/fuse.conf
#   python3      the checkpoint test
#   python3-venv the Python package's virtual environment (scripts/python-test.sh)
#   git, rsync   tools the tests drive on the mount
#   procps       ps/pgrep for scripts that look at processes
#   iproute2     `ip netns` and veth pairs for the network partition test
#   attr         getfattr, which the xattr tests compare `cp -a` and `rsync -X` copies with
#   acl          setfacl and getfacl, which the POSIX ACL tests drive on a mount
set -euo pipefail
packages=(fuse3 python3 python3-venv git rsync procps iproute2 attr acl)
#   libibverbs-dev, librdmacm-dev, libclang-dev, clang, pkg-config: the `rdma` build feature
#   (rdma-sys generates its bindings with bindgen); the default build needs none of them
packages+=(libibverbs-dev librdmacm-dev libclang-dev clang pkg-config)
#   g++: the fuzz targets' libFuzzer, which the libfuzzer-sys crate compiles from C++
packages+=(g++)
#   protobuf-compiler, libprotobuf-dev: the etcd-client crate's build (protoc and the
#   well-known types); etcd-server: the etcd the etcd store's tests start on 127.0.0.1
packages+=(protobuf-compiler libprotobuf-dev etcd-server)
#   mount, systemd: `mount -t fuse.tessera` and fstab in the mount helper's tests, and
#   `systemd-analyze verify` of the units (scripts/check-units.sh); systemd need not run
packages+=(mount systemd)
#   debootstrap: the fresh Debian 12 root the package test installs the .deb into
packages+=(debootstrap)
#   python3-torch (with --tests: scripts/test.sh): Debian's CPU build of PyTorch 1.13, so
#   the Python package's torch tests run (scripts/python-test.sh); not needed to mount
#   (without its recommends, about 200 packages none of the tests use)
no_recommends=()
[ "${1:-}" = --tests ] && no_recommends+=(python3-torch)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
lean=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
for p in "${no_recommends[@]}"; do installed "$p" || lean+=("$p"); done
[ "${#missing[@]}" -eq 0 ] && [ "${#lean[@]}" -eq 0 ] && exit 0
echo "installing: ${missing[*]} ${lean[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]} ${lean[*]}" >&2; exit 1; }
  SUDO=sudo
fi
$SUDO apt-get update -qq
[ "${#missing[@]}" -eq 0 ] ||
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
[ "${#lean[@]}" -eq 0 ] ||
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${lean[@]}" >/dev/null
