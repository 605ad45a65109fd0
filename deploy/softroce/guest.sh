#!/usr/bin/env bash
# guest.sh - runs one command inside a throw-away QEMU guest that has real
# RDMA verbs: Debian's own kernel with Soft-RoCE (rdma_rxe), booted with
# software emulation (TCG), its root this machine's / shared read-only over
# 9p under a RAM overlay, so binaries built here run there unchanged.
#
#   deploy/softroce/guest.sh '<command>'
#
# Inside, before the command runs: veth0 10.0.0.1 <-> veth1 10.0.0.2, the
# RDMA devices rxe0 on veth0 and rxe1 on veth1 (traffic between them
# really crosses the veth pair), `ulimit -l unlimited`, cwd = $PWD here.
# The command's output streams back live; the script exits with its status.
#
# Exit: the command's status; 124 the guest ran past GUEST_TIMEOUT; 125 the
# guest reported no status (boot failure: the setup log and console tail
# are printed); 77 the guest cannot run on this machine (one line says why:
# callers treat it as a skip).
#
# Environment: GUEST_MEM (default 6G), GUEST_CPUS (2), GUEST_TIMEOUT
# (seconds, 1500, for each boot), GUEST_BOOT_TIMEOUT (seconds from a
# boot's start to the command's, 300: a boot that takes longer is stopped
# and the guest booted again), GUEST_BOOTS (boots at most, 2), GUEST_ENV (names of variables to pass in, space
# separated), RW_DIRS (directories shared read-write at the same path, for
# results), VERBOSE=1 (setup log and console tail even on success).
#
# Needs (Debian): qemu-system-x86 linux-image-amd64 busybox-static cpio
# rdma-core ibverbs-providers iproute2 (.ci/run installs them). Why TCG and
# not KVM, and why these sysctls: docs in the comments below and in
# ARCHITECTURE.md ("verbs: where it runs").
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 '<command>'" >&2; exit 2; }
CMD=$1
MEM=${GUEST_MEM:-6G}
CPUS=${GUEST_CPUS:-2}
TMO=${GUEST_TIMEOUT:-1500}
BOOT_TMO=${GUEST_BOOT_TIMEOUT:-300}
BOOTS=${GUEST_BOOTS:-2}
CACHE=${SOFTROCE_CACHE:-/tmp/oncilla-softroce}

skip() { echo "skipped: Soft-RoCE guest: $*"; exit 77; }

# ------------------------------------------------------------ requirements
[ "$(uname -m)" = x86_64 ] || skip "needs an x86-64 host (this is $(uname -m))"
for b in qemu-system-x86_64 cpio busybox; do
  command -v "$b" >/dev/null || skip "$b is not installed (apt-get install qemu-system-x86 cpio busybox-static)"
done
KVER=${KVER:-$(ls /lib/modules 2>/dev/null | grep -E '^[0-9]+\.[0-9]+\.[0-9]+-[0-9]+-amd64$' | sort -V | tail -1)}
[ -n "$KVER" ] && [ -r "/boot/vmlinuz-$KVER" ] ||
  skip "no Debian kernel under /boot (apt-get install linux-image-amd64)"
find "/lib/modules/$KVER" -name 'rdma_rxe.ko*' | grep -q . ||
  skip "kernel $KVER has no rdma_rxe module"
command -v rdma >/dev/null || skip "the rdma tool is missing (apt-get install iproute2)"
ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 ||
  skip "no user-space rxe provider (apt-get install ibverbs-providers)"
BUSYBOX=$(command -v busybox)
command -v file >/dev/null && file -L "$BUSYBOX" 2>/dev/null | grep -q 'dynamically linked' &&
  skip "busybox is dynamically linked (apt-get install busybox-static)"

# ------------------------------------------------------------- initramfs
# A busybox init that loads the virtio, 9p and overlay modules, mounts the
# host's / read-only under a tmpfs overlay and hands over to stage2.sh.
mkdir -p "$CACHE"
INITRD=$CACHE/initramfs-$KVER.cpio.gz
if [ ! -s "$INITRD" ] || [ "$0" -nt "$INITRD" ]; then
  T=$(mktemp -d)
  mkdir -p "$T"/{bin,dev,proc,sys,lower,upper,newroot,mods}
  cp "$BUSYBOX" "$T/bin/busybox"
  modprobe --show-depends -S "$KVER" -a virtio_pci 9pnet_virtio 9p overlay \
      virtio_console virtio-rng | awk '$1=="insmod"{print $2}' | awk '!s[$0]++' |
  while read -r ko; do
    n=$(basename "$ko"); n=${n%.xz}; n=${n%.zst}
    case "$ko" in
      *.xz)  xz -dc "$ko" > "$T/mods/$n" ;;
      *.zst) zstd -qdc "$ko" > "$T/mods/$n" ;;
      *)     cp "$ko" "$T/mods/$n" ;;
    esac
    echo "$n" >> "$T/mods/order"
  done
  cat > "$T/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
for m in $(cat /mods/order); do insmod /mods/$m 2>/dev/null; done
fail() { echo "initramfs: $*"; sleep 1; echo o > /proc/sysrq-trigger; }
mount -t 9p -o ro,trans=virtio,version=9p2000.L,cache=loose,msize=512000 hostroot /lower || fail "9p root"
mount -t tmpfs -o mode=0755 tmpfs /upper; mkdir -p /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot || fail overlay
mount -t tmpfs -o mode=0755 tmpfs /newroot/run; mkdir -p /newroot/run/job
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=512000 job /newroot/run/job || fail "9p job"
for d in proc sys dev; do mount --move /$d /newroot/$d; done
exec switch_root /newroot /bin/bash /run/job/stage2.sh
fail "switch_root"
EOF
  chmod 755 "$T/init"
  (cd "$T" && find . | cpio -o -H newc --quiet | gzip -1) > "$INITRD.tmp"
  mv "$INITRD.tmp" "$INITRD"
  rm -rf "$T"
fi

# -------------------------------------------------------------- the job
JOB=$(mktemp -d "$CACHE/job.XXXXXX")
QPID='' CATPID=''
cleanup() {
  [ -n "$QPID" ] && kill "$QPID" 2>/dev/null || true
  [ -n "$CATPID" ] && kill "$CATPID" 2>/dev/null || true
  rm -rf "$JOB"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
printf '%s' "$CMD" > "$JOB/cmd"
printf '%s' "$PWD" > "$JOB/cwd"
: > "$JOB/env"
for v in ${GUEST_ENV:-}; do
  [ -n "${!v+x}" ] && printf 'export %s=%q\n' "$v" "${!v}" >> "$JOB/env"
done

QRW=() RWMOUNT='' i=0
for d in ${RW_DIRS:-}; do
  d=$(readlink -f "$d"); [ -d "$d" ] || { echo "RW_DIRS: $d is not a directory" >&2; exit 2; }
  QRW+=(-fsdev "local,id=rw$i,path=$d,security_model=none,multidevs=remap"
        -device "virtio-9p-pci,fsdev=rw$i,mount_tag=rw$i")
  RWMOUNT+="mkdir -p '$d'; mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=512000 rw$i '$d'"$'\n'
  i=$((i+1))
done

cat > "$JOB/stage2.sh" <<EOF
#!/bin/bash
# PID 1 in the guest; / is overlay(host / read-only, tmpfs).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root USER=root LOGNAME=root TERM=dumb LANG=C.UTF-8
exec >/run/job/setup.log 2>&1
set -x
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
# /tmp stays the host's under the overlay (writes go to RAM): the
# checkout, and so the command's cwd and binaries, may well be under it.
$RWMOUNT
hostname softroce-guest
ulimit -l unlimited
ulimit -n 65536
ip link set lo up
modprobe -a rdma_rxe ib_uverbs rdma_ucm veth
ip link add veth0 type veth peer name veth1
ip addr add 10.0.0.1/24 dev veth0
ip addr add 10.0.0.2/24 dev veth1
ip link set veth0 up; ip link set veth1 up
rdma link add rxe0 type rxe netdev veth0
rdma link add rxe1 type rxe netdev veth1
# rxe routes by its netdev, so rxe1 -> 10.0.0.1 leaves by veth1 and
# arrives on veth0 with a source address that is local to this host:
# IPv4 drops that as martian (and RC retries then hang) unless
# accept_local=1 and rp_filter=0. rxe0 -> rxe0 loops back and needs
# nothing. rxe works only in the default network namespace on 6.1, so two
# RDMA nodes in one guest are two devices, not two namespaces.
for i in all default veth0 veth1; do
  sysctl -qw net.ipv4.conf.\$i.accept_local=1 net.ipv4.conf.\$i.rp_filter=0
done
# Under emulation the receive softirq runs late, so a veth's per-CPU
# backlog (1000 packets by default) overflows while a copy is in flight:
# rxe counts a send error for each dropped packet, has no congestion
# control, and its go-back-N retries can then leave a queue pair without
# a completion for over 10 s (measured: 451 drops and a stalled 64 MiB
# write at 1000; none, 3 of 3 passing, at 100000).
sysctl -qw net.core.netdev_max_backlog=100000
rdma link show; ibv_devices
OUT=/dev/null
for p in /sys/class/virtio-ports/*; do
  [ "\$(cat \$p/name 2>/dev/null)" = out ] && OUT=/dev/\${p##*/}
done
set +x
. /run/job/env
cd "\$(cat /run/job/cwd)" 2>/dev/null || cd /
: > /run/job/started
bash -c "\$(cat /run/job/cmd)" </dev/null >\$OUT 2>&1
echo \$? > /run/job/rc
sync
echo o > /proc/sysrq-trigger
sleep 10
EOF

# ---------------------------------------------------------------- boot
# TCG: /dev/kvm on these hosts is a paravirtual KVM that cannot run a stock
# kernel (it hangs in the decompressor or fails with "emulation failure").
# The guest's output travels over a virtio-serial port into a FIFO: a
# "stdio" chardev with stdin closed counts as disconnected and the guest's
# writes block forever.
#
# A boot can hang before the command starts: once in CI (stop 50) the
# guest's kernel stalled in early boot (RCU stalls, "timer wakeup didn't
# happen", no line of stage2) until the whole bound ran out, 45 minutes.
# Nothing has run then, so booting again loses nothing: a boot that has
# not started the command within BOOT_TMO seconds is stopped and the
# guest booted afresh, BOOTS times at most. Only the boot is retried:
# once the command starts, its status is the answer.
boot() {
  local n=$1 t0=$SECONDS
  rm -f "$JOB/started" "$JOB/setup.log" "$JOB/console.log" "$JOB/qemu.err" "$JOB/out.fifo"
  mkfifo "$JOB/out.fifo"
  cat "$JOB/out.fifo" &
  CATPID=$!
  timeout -k 5 "$TMO" qemu-system-x86_64 \
    -machine q35,accel=tcg -cpu max -smp "$CPUS" -m "$MEM" \
    -nodefaults -no-user-config -display none -no-reboot \
    -kernel "/boot/vmlinuz-$KVER" -initrd "$INITRD" \
    -append "console=ttyS0 loglevel=4 panic=-1 rdinit=/init" \
    -serial "file:$JOB/console.log" \
    -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
    -fsdev "local,id=job,path=$JOB,security_model=none,multidevs=remap" \
    -device virtio-9p-pci,fsdev=job,mount_tag=job \
    "${QRW[@]}" \
    -device virtio-rng-pci \
    -device virtio-serial-pci \
    -chardev "file,id=out,path=$JOB/out.fifo" -device virtserialport,chardev=out,name=out \
    </dev/null >"$JOB/qemu.err" 2>&1 &
  QPID=$!
  # The watchdog: a second at a time, BOOT_TMO of them at most, until the
  # guest says the command started or qemu ends.
  local hung=''
  while [ ! -e "$JOB/started" ] && kill -0 "$QPID" 2>/dev/null; do
    if [ $((SECONDS - t0)) -ge "$BOOT_TMO" ]; then hung=1; break; fi
    sleep 1
  done
  if [ -n "$hung" ]; then
    echo "guest.sh: boot $n of $BOOTS did not start the command within $BOOT_TMO s; the console's tail:" >&2
    tail -n 20 "$JOB/console.log" >&2 2>/dev/null || true
    kill "$QPID" 2>/dev/null || true
  fi
  wait "$QPID"; qrc=$?
  QPID=''
  # qemu died before opening the FIFO: cat still waits in open(); release it.
  kill -0 "$CATPID" 2>/dev/null && timeout 1 bash -c ": > '$JOB/out.fifo'" 2>/dev/null
  wait "$CATPID"; CATPID=''
  [ -z "$hung" ] || qrc="stopped, the boot hung"
  [ -z "$hung" ]
}
set +e
for ((b = 1; b <= BOOTS; b++)); do
  boot "$b" && break
done
set -e

if [ -s "$JOB/rc" ]; then
  rc=$(cat "$JOB/rc")
else
  rc=125; [ "$qrc" = 124 ] && rc=124
  echo "guest.sh: no exit status from the guest (qemu exit $qrc)" >&2
fi
if [ -n "${VERBOSE:-}" ] || [ "$rc" = 124 ] || [ "$rc" = 125 ]; then
  { echo "----- qemu stderr"; cat "$JOB/qemu.err"
    echo "----- guest setup log"; cat "$JOB/setup.log" 2>/dev/null || true
    echo "----- guest console (tail)"; tail -n 40 "$JOB/console.log" 2>/dev/null || true; } >&2
fi
exit "$rc"
