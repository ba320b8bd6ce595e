#!/usr/bin/env bash
# Runs programs on soft-RoCE (the kernel's rdma_rxe driver) inside a QEMU virtual machine,
# for machines without an RDMA device or a kernel with InfiniBand support.
#
# Usage: scripts/rdma-vm.sh [options] [--] COMMAND...
#   --bin PATH         copy the executable PATH (and every shared library it needs) into
#                      the guest as /opt/bin/<name>; /opt/bin is on the guest's PATH.
#                      Repeatable.
#   --file SRC[:DEST]  copy the file SRC into the guest at DEST (an absolute path; default
#                      /opt/files/<name>). Repeatable.
#   --env NAME=VALUE   set NAME in the command's environment. Repeatable. TESSERA_LOG,
#                      RUST_LOG and RUST_BACKTRACE are passed on when set.
#   --timeout SECS     bound on the whole run, boot included (default 1800).
#   --mem MIB          guest memory (default 4096).   --smp N   guest CPUs (default 2).
#   --selftest         instead of COMMAND: ibv_devinfo, then ibv_rc_pingpong between two
#                      processes of the guest over rxe0 (RoCE v2 GID of its IPv4 address).
#   COMMAND            shell text run by the guest's busybox sh in /work (a tmpfs); words
#                      are joined with spaces, as ssh does. Its output goes to the serial
#                      console, which this script prints.
#
# What the guest has: the Debian kernel linux-image-amd64 names, with the modules
# rdma_rxe needs (and virtio), and busybox-static, both downloaded as packages and
# unpacked into $RDMA_VM_CACHE (default /tmp/tessera-rdma-vm), never installed on the
# host; iproute2's `rdma`, ibv_devinfo, ibv_rc_pingpong, libibverbs with the rxe
# provider. At boot it loads the modules, gives
# eth0 10.0.2.15/24 (QEMU's user-mode network with restrict=on: no traffic leaves the
# VM, nothing changes on the host), runs `rdma link add rxe0 type rxe netdev eth0`, waits
# for port 1 to be ACTIVE with an IPv4 RoCE v2 GID, runs COMMAND and powers off.
# Programs inside reach each other on 127.0.0.1 or 10.0.2.15; verbs traffic is RoCE v2
# from rxe0 to itself.
#
# Exit status: COMMAND's status (read from a marker line on the console); 124 when the
# timeout ended the run; 125 for a failure of the setup (a download, a guest that did not
# reach /init, soft-RoCE that could not be set up); 77 only when QEMU itself refuses to
# start a guest on this machine (with a line "skipped: <reason>"). KVM is used when
# /dev/kvm opens and a first quick boot under it finishes (the verdict is cached per host
# kernel in $RDMA_VM_CACHE); otherwise TCG. RDMA_VM_ACCEL=kvm|tcg forces one.
# Installs QEMU and rdma-core with apt-get when missing. Everything it starts is stopped
# by PID on exit.
set -euo pipefail

die() { echo "rdma-vm: $*" >&2; exit 125; }
skip() { echo "skipped: $*"; exit 77; }

bins=() files=() envs=() timeout_s=1800 mem=4096 smp=2 selftest=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bins+=("$2"); shift 2 ;;
    --file) files+=("$2"); shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --mem) mem="$2"; shift 2 ;;
    --smp) smp="$2"; shift 2 ;;
    --selftest) selftest=1; shift ;;
    --) shift; break ;;
    -*) die "unknown option $1 (see the header of $0)" ;;
    *) break ;;
  esac
done
command_text="$*"
if [ "$selftest" = 0 ] && [ -z "$command_text" ]; then
  die "no command given (see the header of $0)"
fi
for v in TESSERA_LOG RUST_LOG RUST_BACKTRACE; do
  if [ -n "${!v:-}" ]; then envs+=("$v=${!v}"); fi
done

# ---- what the host needs -------------------------------------------------------------
# QEMU and the verbs tools are installed on the host; the guest's kernel and its static
# busybox are downloaded as packages and unpacked into the cache, never installed: a
# kernel package would change the host's /boot (and its boot loader's default), and
# busybox-static would replace the host's busybox.
cache="${RDMA_VM_CACHE:-/tmp/tessera-rdma-vm}"
provider_dir=/usr/lib/x86_64-linux-gnu/libibverbs
have_tools() {
  command -v qemu-system-x86_64 >/dev/null && command -v rdma >/dev/null \
    && command -v ibv_devinfo >/dev/null && command -v cpio >/dev/null \
    && command -v modprobe >/dev/null && command -v depmod >/dev/null \
    && command -v xz >/dev/null && command -v zstd >/dev/null \
    && command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
    && ls "$provider_dir"/librxe-rdmav*.so >/dev/null 2>&1 \
    && [ -e /etc/libibverbs.d/rxe.driver ]
}
if ! have_tools; then
  command -v apt-get >/dev/null \
    || skip "QEMU and the verbs tools are missing and there is no apt-get to install them"
  echo "rdma-vm: installing QEMU and rdma-core"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || true
  apt-get install -y -qq --no-install-recommends qemu-system-x86 rdma-core ibverbs-utils \
    ibverbs-providers iproute2 cpio kmod xz-utils zstd >/dev/null \
    || die "installing QEMU and rdma-core with apt-get failed"
  have_tools || die "QEMU or the verbs tools are still missing after apt-get"
fi
# The guest's packages, unpacked once per version into the cache.
guest_pkgs() {
  local kpkg dir
  kpkg="$(apt-cache depends linux-image-amd64 2>/dev/null \
    | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
  if [ -z "$kpkg" ]; then
    apt-get update -qq >/dev/null || true
    kpkg="$(apt-cache depends linux-image-amd64 2>/dev/null \
      | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
  fi
  [ -n "$kpkg" ] || die "apt knows no linux-image-amd64 kernel package"
  dir="$cache/guest-$kpkg"
  if [ ! -f "$dir/.ready" ]; then
    echo "rdma-vm: downloading $kpkg and busybox-static for the guest (not installed)" >&2
    rm -rf "$dir" && mkdir -p "$dir/debs" "$dir/root"
    (cd "$dir/debs" && apt-get download -qq -o APT::Sandbox::User=root "$kpkg" busybox-static \
      >/dev/null) \
      || die "apt-get download of $kpkg and busybox-static failed"
    for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root"; done
    local ver
    ver="$(ls "$dir/root/lib/modules" | head -1)"
    depmod -b "$dir/root" "$ver"
    touch "$dir/.ready"
  fi
  echo "$dir/root"
}
mkdir -p "$cache"
groot="$(guest_pkgs)"
kver="$(ls "$groot/lib/modules" | head -1)"
[ -r "$groot/boot/vmlinuz-$kver" ] || die "no kernel image in $groot/boot"
[ -d "$groot/lib/modules/$kver/kernel/drivers/infiniband/sw/rxe" ] \
  || die "kernel $kver has no rdma_rxe module"
[ -x "$groot/bin/busybox" ] || die "no static busybox in $groot/bin"

# ---- the initramfs -------------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/rdma-vm.XXXXXX")"
qemu_pid=""
cleanup() {
  if [ -n "$qemu_pid" ]; then
    kill "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
root="$work/root"
mkdir -p "$root"/{bin,sbin,dev,proc,sys,tmp,work,opt/bin,opt/files,etc/libibverbs.d,root}
cp "$groot/bin/busybox" "$root/bin/busybox"

# Copies a file to the same path in the guest (following symlinks).
put() { mkdir -p "$root$(dirname "$1")"; cp -L "$1" "$root$1"; }
# Copies the shared libraries (and the loader) an ELF file needs.
put_libs() {
  local lib
  for lib in $(ldd "$1" 2>/dev/null | grep -o '/[^ ]*' || true); do
    [ -e "$root$lib" ] || put "$lib"
  done
}
for tool in "$(command -v rdma)" "$(command -v ibv_devinfo)" "$(command -v ibv_rc_pingpong)"; do
  put "$tool"; put_libs "$tool"
done
for p in "$provider_dir"/librxe-rdmav*.so; do put "$p"; put_libs "$p"; done
cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
for b in ${bins[@]+"${bins[@]}"}; do
  [ -x "$b" ] || die "--bin $b: not an executable file"
  cp -L "$b" "$root/opt/bin/"; put_libs "$b"
done
for f in ${files[@]+"${files[@]}"}; do
  src="${f%%:*}"; dest="/opt/files/$(basename "$src")"
  if [ "$src" != "$f" ]; then dest="${f#*:}"; fi
  [ -e "$src" ] || die "--file $src: no such file"
  mkdir -p "$root$(dirname "$dest")"; cp -L "$src" "$root$dest"
done
# Kernel modules in load order, decompressed (busybox insmod takes plain .ko files).
: > "$root/modules"
# rdma_rxe computes its ICRC through the crypto API: crc32 must be loaded first.
for mod in virtio_pci virtio_net crc32_generic rdma_rxe; do
  for ko in $(modprobe -d "$groot" -S "$kver" --show-depends "$mod" \
      | awk '$1 == "insmod" {print $2}'); do
    plain="/lib/modules/$kver/$(basename "${ko%.ko*}").ko"
    grep -qx "$plain" "$root/modules" && continue
    mkdir -p "$root/lib/modules/$kver"
    case "$ko" in
      *.ko) cp "$ko" "$root$plain" ;;
      *.ko.xz) xz -dc "$ko" > "$root$plain" ;;
      *.ko.zst) zstd -qdc "$ko" > "$root$plain" ;;
      *.ko.gz) gzip -dc "$ko" > "$root$plain" ;;
    esac
    echo "$plain" >> "$root/modules"
  done
done
{
  echo "cd /work"
  for e in ${envs[@]+"${envs[@]}"}; do printf 'export %q\n' "$e"; done
  if [ "$selftest" = 1 ]; then
    cat <<'EOF'
ibv_devinfo -v -d rxe0 | grep -E 'hca_id|transport|state|active_mtu|link_layer|max_qp_wr|max_mw|device_cap_flags|MEM_WINDOW|GID\['
gid=$(roce_v2_ipv4_gid)
echo "ibv_rc_pingpong on rxe0, GID index $gid (RoCE v2, $(cat /sys/class/infiniband/rxe0/ports/1/gids/$gid))"
ibv_rc_pingpong -d rxe0 -g "$gid" -n 100 -s 4096 & server=$!
ok=1
for i in $(seq 50); do
  if ibv_rc_pingpong -d rxe0 -g "$gid" -n 100 -s 4096 10.0.2.15; then ok=0; break; fi
done
wait $server || ok=1
exit $ok
EOF
  else
    printf '%s\n' "$command_text"
  fi
} > "$root/command.sh"
cat > "$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/opt/bin:/bin:/sbin:/usr/bin:/usr/sbin HOME=/root
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp; mount -t tmpfs work /work
echo "RDMA-VM: booted ($(uname -r), $(nproc) CPUs)"
finish() {
  echo "RDMA-VM-EXIT-STATUS=$1"
  sync; poweroff -f
}
if grep -q rdmavm.probe /proc/cmdline; then finish 0; fi
# The index of rxe0's RoCE v2 GID that holds an IPv4 address.
roce_v2_ipv4_gid() {
  local d=/sys/class/infiniband/rxe0/ports/1
  for g in $(ls $d/gids); do
    case "$(cat $d/gids/$g)" in 0000:0000:0000:0000:0000:ffff:*) ;; *) continue ;; esac
    [ "$(cat $d/gid_attrs/types/$g 2>/dev/null)" = "RoCE v2" ] && { echo "$g"; return 0; }
  done
  return 1
}
for m in $(cat /modules); do
  insmod "$m" || { echo "RDMA-VM: insmod $m failed"; finish 125; }
done
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0 && ip link set eth0 up || { echo "RDMA-VM: no eth0"; finish 125; }
if ! rdma link add rxe0 type rxe netdev eth0; then
  echo "RDMA-VM: rdma link add failed"; ip addr; dmesg | tail -20; finish 125
fi
i=0
until [ "$(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null)" = "4: ACTIVE" ] \
    && roce_v2_ipv4_gid >/dev/null; do
  i=$((i + 1))
  [ $i -gt 300 ] && { echo "RDMA-VM: rxe0 not ACTIVE with an IPv4 RoCE v2 GID"; finish 125; }
  sleep 0.1
done
echo "RDMA-VM: rxe0 ACTIVE on eth0 10.0.2.15, RoCE v2 GID index $(roce_v2_ipv4_gid)"
echo "RDMA-VM: running the command"
# In a subshell, so that the command's `exit` still reaches `finish`.
( . /command.sh )
finish $?
EOF
chmod +x "$root/init" "$root/opt/bin/"* 2>/dev/null || true
(cd "$root" && find . | cpio -o -H newc --quiet) > "$work/initrd"

# ---- boot ----------------------------------------------------------------------------
log="$work/console.log"
boot() { # accel seconds [extra kernel argument] -> QEMU in the background, output to $log
  local accel=(-accel tcg,thread=multi -cpu max)
  [ "$1" = kvm ] && accel=(-accel kvm -cpu host)
  : > "$log"
  timeout --kill-after=10 "$2" qemu-system-x86_64 "${accel[@]}" -smp "$smp" -m "$mem" \
    -machine q35 -kernel "$groot/boot/vmlinuz-$kver" -initrd "$work/initrd" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init ${3:-}" \
    -nic user,model=virtio-net-pci,restrict=on \
    -display none -monitor none -serial "file:$log" -no-reboot 2> "$work/qemu.err" &
  qemu_pid=$!
}
status_of_log() { tr -d '\r' < "$log" | sed -n 's/^RDMA-VM-EXIT-STATUS=\([0-9]*\)$/\1/p' | tail -1; }
verdict="$cache/accel-$(uname -r)-$kver"
accel="${RDMA_VM_ACCEL:-auto}"
if [ "$accel" = auto ]; then
  accel=tcg
  if [ -e /dev/kvm ] && { exec 3<>/dev/kvm; } 2>/dev/null; then
    exec 3>&-
    if [ -f "$verdict" ]; then
      accel="$(cat "$verdict")"
    else
      # A quick boot under KVM; some nested hosts open /dev/kvm but hang the guest.
      boot kvm 60 rdmavm.probe 2>/dev/null; wait "$qemu_pid" 2>/dev/null || true; qemu_pid=""
      if [ "$(status_of_log)" = 0 ]; then accel=kvm; fi
      echo "$accel" > "$verdict.tmp" && mv "$verdict.tmp" "$verdict"
    fi
  fi
fi
echo "rdma-vm: booting kernel $kver under $accel ($smp CPUs, $mem MiB, timeout ${timeout_s}s)"
start=$(date +%s)
boot "$accel" "$timeout_s"
tail -n +1 -f --pid="$qemu_pid" "$log" | tr -d '\r' &
tail_pid=$!
rc=0; wait "$qemu_pid" || rc=$?
qemu_pid=""
wait "$tail_pid" 2>/dev/null || true
echo "rdma-vm: the guest ran $(( $(date +%s) - start ))s"
status="$(status_of_log)"
if [ -n "$status" ]; then exit "$status"; fi
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "rdma-vm: timed out after ${timeout_s}s" >&2; exit 124
fi
if ! grep -q 'RDMA-VM: booted' "$log"; then
  # QEMU itself refused to run (it says why on stderr): this machine cannot boot a
  # guest. A guest that ran but never reached /init is a failure of ours (the kernel,
  # the initramfs or /init), not a reason to skip.
  if [ "$rc" != 0 ] && [ -s "$work/qemu.err" ] && [ ! -s "$log" ]; then
    skip "QEMU could not start a guest here: $(head -c 400 "$work/qemu.err" | tr '\n' ' ')"
  fi
  echo "rdma-vm: console:" >&2; tr -d '\r' < "$log" | tail -40 >&2
  [ -s "$work/qemu.err" ] && { echo "rdma-vm: qemu said:" >&2; cat "$work/qemu.err" >&2; }
  die "the guest did not reach /init (qemu exit status $rc)"
fi
[ -s "$work/qemu.err" ] && { echo "rdma-vm: qemu said:" >&2; cat "$work/qemu.err" >&2; }
die "the guest ended without an exit status (qemu exit status $rc)"
