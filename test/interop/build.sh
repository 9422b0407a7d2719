#!/bin/bash
# build.sh - build (or reuse) the interop guest: a Debian bookworm kernel with rdma_rxe, rdma-core,
# ibverbs-utils, perftest and rdmacm-utils (rping, ucmatose, udaddy, mckey), as vmlinuz + initrd.img + an ext4 rootfs image.
#
# Cache layout under $RXED_INTEROP_CACHE (default /var/tmp/rxed-interop):
#   dl/linux-image-*.deb        the kernel package (apt-get download)
#   rootfs-<H1>/                debootstrap tree with the kernel installed; H1 = hash(suite, packages, kernel)
#   img-<H2>/{vmlinuz,initrd.img,base.img,KVER}   boot artifacts; H2 = hash(H1, this script, guest/init)
#   ssh/id_ed25519              key that logs in as root to the guests
# Only the newest img-* and rootfs-* are kept. Prints "IMG=<dir>" as its last line.
# Needs root. Debian packages come through the host's configured apt mirror (or RXED_INTEROP_MIRROR).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${RXED_INTEROP_CACHE:-/var/tmp/rxed-interop}
SUITE=bookworm
PKGS=rdma-core,ibverbs-utils,ibverbs-providers,perftest,rdmacm-utils,iproute2,openssh-server,kmod,initramfs-tools,linux-base,busybox,zstd,procps,iputils-ping,tcpdump
t0=$(date +%s)
log() { echo "[build +$(( $(date +%s) - t0 ))s] $*" >&2; }

[ "$(id -u)" = 0 ] || { echo "build.sh: root required (debootstrap, chroot, mount)" >&2; exit 3; }
mkdir -p "$CACHE/dl" "$CACHE/ssh"

# --- host tools (CI machines are fresh) ------------------------------------------------------
need=""
command -v debootstrap >/dev/null || need+=" debootstrap"
command -v qemu-img >/dev/null || need+=" qemu-utils"
command -v mkfs.ext4 >/dev/null || need+=" e2fsprogs"
command -v qemu-system-x86_64 >/dev/null || need+=" qemu-system-x86"
command -v ssh >/dev/null || need+=" openssh-client"
command -v ssh-keygen >/dev/null || need+=" openssh-client"
command -v tc >/dev/null || need+=" iproute2"
if [ -n "$need" ]; then
  echo "build.sh: installing host packages:$need" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq $need >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get install -y -qq $need >/dev/null; }
fi

# --- 1. kernel package -------------------------------------------------------------------------
kver_from_apt() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{sub("linux-image-","",$2); print $2; exit}'; }
KVER=${KVER:-$(kver_from_apt)}
if [ -z "$KVER" ]; then apt-get update -qq >/dev/null 2>&1 || true; KVER=$(kver_from_apt); fi
[ -n "$KVER" ] || { echo "build.sh: cannot determine the kernel version (apt-cache depends linux-image-amd64)" >&2; exit 1; }
KDEB=$(ls "$CACHE"/dl/linux-image-"$KVER"_*.deb 2>/dev/null | head -1 || true)
if [ -z "$KDEB" ]; then
  log "downloading linux-image-$KVER"
  (cd "$CACHE/dl" && apt-get download -q "linux-image-$KVER" >/dev/null 2>&1) || { echo "build.sh: apt-get download linux-image-$KVER failed" >&2; exit 1; }
  KDEB=$(ls "$CACHE"/dl/linux-image-"$KVER"_*.deb | head -1)
fi

H1=$(printf '%s\n' "$SUITE" "$PKGS" "$(basename "$KDEB")" "initramfs:virtio_pci,virtio_blk,virtio_net,ext4" | sha256sum | cut -c1-16)
H2=$( (echo "$H1"; cat "$HERE/build.sh" "$HERE/guest/init") | sha256sum | cut -c1-16)
ROOT=$CACHE/rootfs-$H1
IMG=$CACHE/img-$H2
if [ -e "$IMG/.done" ]; then log "cached: $IMG"; echo "IMG=$IMG"; exit 0; fi

# --- 2. rootfs: debootstrap + kernel (modules, initramfs) ---------------------------------------
if [ ! -e "$ROOT/.done" ]; then
  MIRROR=${RXED_INTEROP_MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
  [ -n "$MIRROR" ] || MIRROR=$(awk '$1=="deb" && $3 ~ /^bookworm$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$MIRROR" ] || { echo "build.sh: no Debian bookworm mirror in the apt configuration: set RXED_INTEROP_MIRROR" >&2; exit 1; }
  log "debootstrap $SUITE minbase"
  rm -rf "$ROOT"
  # (lines naming the mirror are dropped so no log file records its address)
  debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$ROOT" "$MIRROR" 2>&1 | grep -v -F "$MIRROR" > "$CACHE/debootstrap.log" || true
  [ -x "$ROOT/usr/bin/ib_write_bw" ] && [ -x "$ROOT/usr/bin/rping" ] || { echo "build.sh: debootstrap failed:" >&2; tail -30 "$CACHE/debootstrap.log" >&2; exit 1; }
  log "installing kernel $KVER into the rootfs"
  cp "$KDEB" "$ROOT/tmp/kernel.deb"
  mount -t proc proc "$ROOT/proc"; mount --bind /dev "$ROOT/dev"; mount -t sysfs sysfs "$ROOT/sys"
  trap 'umount "$ROOT/proc" "$ROOT/dev" "$ROOT/sys" 2>/dev/null || true' EXIT
  # small initramfs: only what mounting /dev/vda (virtio, ext4) needs
  printf 'virtio_pci\nvirtio_blk\nvirtio_net\next4\n' > "$ROOT/etc/initramfs-tools/modules"
  sed -i 's/^MODULES=.*/MODULES=list/' "$ROOT/etc/initramfs-tools/initramfs.conf"
  chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive dpkg -i /tmp/kernel.deb > "$CACHE/kernel-install.log" 2>&1 \
    || { tail -30 "$CACHE/kernel-install.log" >&2; exit 1; }
  rm -f "$ROOT/tmp/kernel.deb"
  umount "$ROOT/proc" "$ROOT/dev" "$ROOT/sys"; trap - EXIT
  test -e "$ROOT/lib/modules/$KVER/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko" || { echo "build.sh: rdma_rxe.ko missing" >&2; exit 1; }
  chroot "$ROOT" ssh-keygen -A >/dev/null
  touch "$ROOT/.done"
fi

# --- 3. customisation + image -----------------------------------------------------------------
[ -e "$CACHE/ssh/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C rxed-interop -f "$CACHE/ssh/id_ed25519"
install -d -m 700 "$ROOT/root/.ssh"
install -m 600 "$CACHE/ssh/id_ed25519.pub" "$ROOT/root/.ssh/authorized_keys"
install -m 755 "$HERE/guest/init" "$ROOT/sbin/rxed-interop-init"
printf '/dev/vda / ext4 rw,noatime 0 1\n' > "$ROOT/etc/fstab"
printf '127.0.0.1 localhost\n10.78.0.1 rxedhost\n10.78.0.11 rxevm1\n10.78.0.12 rxevm2\n' > "$ROOT/etc/hosts"
rm -f "$ROOT/etc/resolv.conf"; : > "$ROOT/etc/resolv.conf"
log "creating ext4 image"
rm -rf "$IMG.tmp"; mkdir -p "$IMG.tmp"
cp "$ROOT/boot/vmlinuz-$KVER" "$IMG.tmp/vmlinuz"
cp "$ROOT/boot/initrd.img-$KVER" "$IMG.tmp/initrd.img"
echo "$KVER" > "$IMG.tmp/KVER"
mkfs.ext4 -q -F -L rxedroot -d "$ROOT" "$IMG.tmp/base.img" 2G
touch "$IMG.tmp/.done"
rm -rf "$IMG"; mv "$IMG.tmp" "$IMG"
# keep only the current artifacts
for d in "$CACHE"/img-* "$CACHE"/rootfs-*; do
  [ "$d" = "$IMG" ] || [ "$d" = "$ROOT" ] || rm -rf "$d"
done
log "done: $IMG (kernel $KVER)"
echo "IMG=$IMG"
