#!/bin/sh
# /init of the lab guests' initrd (busybox). Built into the initrd by `lab.sh setup`.
# Kernel command line: lh.host=NAME lh.mode=v4|v3local lh.mnt=/guest/mount/path lh.id=UNIQUE
export PATH=/sbin:/bin
fail() { echo "LH-FAIL: $*" >/dev/console; sleep 1; exit 1; }   # init exits -> panic -> VM exits
step() { read -r up _ </proc/uptime; echo "LH-STEP $up $*" >/dev/console; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
for d in /tmp /run /dev/shm /var/tmp; do mount -t tmpfs -o mode=1777 tmpfs "$d"; done
exec </dev/console >/dev/console 2>&1

arg() { for a in $(cat /proc/cmdline); do case "$a" in "$1="*) echo "${a#*=}"; return;; esac; done; }
HOST=$(arg lh.host); MODE=$(arg lh.mode); MNT=$(arg lh.mnt); ID=$(arg lh.id)
[ -n "$HOST" ] && [ -n "$MODE" ] && [ -n "$MNT" ] || fail "missing lh.* kernel arguments"
step init
hostname "$HOST"
echo "$HOST" >/etc/hostname
echo "127.0.0.1 localhost" >/etc/hosts
echo "10.0.2.15 $HOST" >>/etc/hosts

# modules, in dependency order (computed by lab.sh setup)
while read -r m; do
    case "$m" in
        nfs.ko) insmod "/lh/mod/$m" nfs4_unique_id="$ID" || fail "insmod $m" ;;
        *) insmod "/lh/mod/$m" || fail "insmod $m" ;;
    esac
done </lh/modorder

step modules loaded
i=0
while [ ! -e /sys/class/net/eth0 ]; do
    i=$((i + 1)); [ $i -gt 100 ] && fail "no eth0 after 10 s"; sleep 0.1
done
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0
ip link set eth0 up
ip route add default via 10.0.2.2

step network up
SRV=10.0.2.100
V4OPTS="vers=4.1,addr=$SRV,clientaddr=10.0.2.15,proto=tcp,port=2049,hard"
mount -t nfs4 -o "ro,$V4OPTS" "$SRV:/usr" /usr || fail "mount of host /usr (NFSv4.1) failed"
step /usr mounted
# host binaries from the read-only /usr: make /bin, /sbin, /lib, /lib64 lookups work
# (/bin and /sbin keep busybox's applets, but /bin/sh becomes the host's dash: busybox sh would
# run its own applets (date, flock, ...) instead of the host's; PATH puts /usr/bin first)
ln -s /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu
ln -s /usr/lib64 /lib64
ln -s /usr/bin/bash /bin/bash
[ -x /usr/bin/dash ] && ln -sf /usr/bin/dash /bin/sh
mkdir -p "$MNT"
if [ "$MODE" = v4 ]; then
    mount -t nfs4 -o "$V4OPTS" "$SRV:/lh" "$MNT" || fail "mount of the export (NFSv4.1) failed"
elif [ "$MODE" = v3local ]; then
    # text mount options straight to the kernel (busybox mount -t nfs would query rpcbind itself)
    /usr/bin/python3 - "$SRV" "$MNT" <<'EOF' || fail "mount of the export (NFSv3 local_lock=all) failed"
import ctypes, os, sys
srv, mnt = sys.argv[1], sys.argv[2]
opts = ("vers=3,proto=tcp,port=2049,mountproto=tcp,mountport=20048,mountaddr=%s,addr=%s,"
        "hard,local_lock=all,mountvers=3" % (srv, srv))
libc = ctypes.CDLL(None, use_errno=True)
if libc.mount(("%s:/lh" % srv).encode(), mnt.encode(), b"nfs", 0, opts.encode()) != 0:
    sys.exit("mount: " + os.strerror(ctypes.get_errno()))
EOF
else
    fail "unknown lh.mode=$MODE"
fi

grep " $MNT " /proc/mounts >/dev/console
step export mounted
exec /usr/bin/python3 -I -S /lh/lab.py serve 7000
