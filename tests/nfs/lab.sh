#!/bin/bash
# Real-NFS lab for leasehold: nfs-ganesha on 127.0.0.1 + two QEMU (TCG) guests,
# "hosta" and "hostb", each a real Linux NFS client of the same export.
#
#   lab.sh setup                  install/download/unpack everything (idempotent, cached)
#   lab.sh start [v4|v3local]     start ganesha + both guests, wait until ready
#   lab.sh exec GUEST CMD...      run CMD (sh -c) in GUEST; streams output; exits with its status
#   lab.sh crash GUEST            SIGKILL GUEST's VM
#   lab.sh boot GUEST             boot a crashed GUEST again
#   lab.sh stop                   stop exactly what start started
#   lab.sh env                    print LAB_EXPORT (host dir) and LAB_MOUNT (guest path), eval-able
#   lab.sh status                 show what is running
#   lab.sh clock                  print each guest's wall clock offset to the host (s) and rtt
#
# Environment: LEASEHOLD_NFS_CACHE (default /var/cache/leasehold-nfs),
#   LEASEHOLD_NFS_RUN (default /run/leasehold-nfs), LEASEHOLD_NFS_BOOT_TIMEOUT (default 120 s).
# Guests: qemu -netdev user,restrict=on; the only ways out are guestfwd to 127.0.0.1:2049 (and
# :20048 in v3local mode); the command channel is a hostfwd bound to 127.0.0.1.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${LEASEHOLD_NFS_CACHE:-/var/cache/leasehold-nfs}
RUN=${LEASEHOLD_NFS_RUN:-/run/leasehold-nfs}
BOOT_TIMEOUT=${LEASEHOLD_NFS_BOOT_TIMEOUT:-120}
PY=/usr/bin/python3
GUESTS="hosta hostb"
GUEST_MOUNT=/mnt/nfs
HOST_PKGS="nfs-ganesha nfs-ganesha-vfs busybox-static rpcbind socat python3 cpio"
KERNEL_META=linux-image-cloud-amd64

die() { echo "lab.sh: ERROR: $*" >&2; exit 1; }
note() { echo "lab.sh: $*" >&2; }

need_root() { [ "$(id -u)" = 0 ] || die "must run as root (installs packages, runs ganesha)"; }

# ------------------------------------------------------------------------------------- setup
pkg_installed() { dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# Closure of hard Depends (no alternatives, no virtual packages) that are NOT installed on the host.
# apt-cache is slow here (~1 s a call), so one call per level of the dependency tree.
dep_closure() {
    local seen=" " level="$*" next d
    while [ -n "$level" ]; do
        seen="$seen$(echo $level) "
        next=""
        for d in $(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
                     --no-replaces --no-enhances $level 2>/dev/null |
                   awk 'alt { alt = 0; next } /^ *\|/ { alt = 1; next } /^  (Pre)?Depends: [^<]/ { print $2 }' | sort -u); do
            case "$seen$next " in *" $d "*) continue ;; esac
            pkg_installed "$d" || next="$next $d"
        done
        level=$next
    done
    echo $seen
}

# "pkg version" lines for the candidates of the given packages (one apt-cache call)
candidates() {
    apt-cache policy "$@" | awk '/^[^ ].*:$/ { p = substr($1, 1, length($1) - 1) } /Candidate:/ { print p, $2 }'
}

deb_of() {  # deb_of PKG VERSION -> cached .deb path (empty when absent)
    ls "$CACHE/debs/${1}_${2//:/%3a}_"*.deb 2>/dev/null | head -1
}

LAB_FORMAT=1  # bump when setup() changes what it builds
inputs_hash() { { echo "$LAB_FORMAT"; cat "$HERE/guest-init.sh" "$HERE/lab.py"; } | sha256sum | cut -c1-16; }

setup() {
    need_root
    command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
        die "needs a Debian system (apt-get, dpkg-deb); this machine has none"
    [ "$(dpkg --print-architecture)" = amd64 ] || die "needs amd64 (guest kernel and qemu are amd64 .debs)"
    local t0=$SECONDS
    mkdir -p "$CACHE/debs"

    # 1. host packages (no service may start during install: the lab starts its own daemons)
    local missing="" p
    for p in $HOST_PKGS; do pkg_installed "$p" || missing="$missing $p"; done
    if [ -n "$missing" ]; then
        note "installing host packages:$missing"
        apt-get update -q >/dev/null || die "apt-get update failed"
        local prc=/usr/sbin/policy-rc.d made_prc=""
        if [ ! -e $prc ]; then printf '#!/bin/sh\nexit 101\n' >$prc; chmod +x $prc; made_prc=1; fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing \
            >"$CACHE/apt-install.log" 2>&1 || { [ -n "$made_prc" ] && rm -f $prc
            tail -20 "$CACHE/apt-install.log" >&2; die "apt-get install$missing failed (log above)"; }
        [ -n "$made_prc" ] && rm -f $prc
    fi
    [ -x /usr/bin/ganesha.nfsd ] || die "ganesha.nfsd missing after installing nfs-ganesha"
    [ -e /usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so ] || die "ganesha VFS backend missing (nfs-ganesha-vfs)"
    [ -x /bin/busybox ] || die "/bin/busybox missing after installing busybox-static"

    local want_hash; want_hash=$(inputs_hash)
    if [ -f "$CACHE/setup.stamp" ] && [ -x "$CACHE/qemu/usr/bin/qemu-system-x86_64" ] &&
       [ -f "$CACHE/vmlinuz" ] && [ -f "$CACHE/initrd.img" ] &&
       grep -qx "inputs=$want_hash" "$CACHE/setup.stamp"; then
        note "setup: up to date in $CACHE ($((SECONDS - t0)) s)"
        return 0
    fi

    # 2. resolve and download qemu + its missing libraries + the cloud kernel
    apt-cache show "$KERNEL_META" >/dev/null 2>&1 || apt-get update -q >/dev/null || die "apt-get update failed"
    local kpkg
    kpkg=$(apt-cache depends "$KERNEL_META" | awk '/^  Depends: linux-image-/ { print $2; exit }')
    [ -n "$kpkg" ] || die "cannot resolve the kernel package behind $KERNEL_META"
    local kver=${kpkg#linux-image-}
    local qpkgs; qpkgs=$(dep_closure qemu-system-x86)
    note "downloading: $qpkgs $kpkg"
    local dl="" ver
    candidates $qpkgs $kpkg >"$CACHE/candidates"
    while read -r p ver; do
        [ -n "$ver" ] && [ "$ver" != "(none)" ] || die "no installable candidate for package $p"
        [ -n "$(deb_of "$p" "$ver")" ] || dl="$dl $p"
    done <"$CACHE/candidates"
    [ "$(wc -l <"$CACHE/candidates")" = "$(echo $qpkgs $kpkg | wc -w)" ] || die "apt-cache policy did not list every package"
    if [ -n "$dl" ]; then
        (cd "$CACHE/debs" && apt-get download -q $dl >"$CACHE/apt-download.log" 2>&1) || {
            tail -20 "$CACHE/apt-download.log" >&2; die "apt-get download failed (log above)"; }
    fi

    # 3. unpack qemu (never installed: on this image apt would remove the newer qemu-utils)
    rm -rf "$CACHE/qemu.new"; mkdir -p "$CACHE/qemu.new"
    while read -r p ver; do
        [ "$p" = "$kpkg" ] || dpkg-deb -x "$(deb_of "$p" "$ver")" "$CACHE/qemu.new"
    done <"$CACHE/candidates"
    rm -rf "$CACHE/qemu"; mv "$CACHE/qemu.new" "$CACHE/qemu"
    local q=$CACHE/qemu
    local ldmiss
    ldmiss=$(qemu_env ldd "$q/usr/bin/qemu-system-x86_64" | grep 'not found' || true)
    [ -z "$ldmiss" ] || die "unpacked qemu misses libraries:
$ldmiss"
    qemu_env "$q/usr/bin/qemu-system-x86_64" --version | head -1 >"$CACHE/qemu.version" ||
        die "unpacked qemu does not run"

    # 4. kernel: unpack, depmod, pick the NFS client + virtio-net modules
    ver=$(awk -v k="$kpkg" '$1 == k { print $2 }' "$CACHE/candidates")
    rm -rf "$CACHE/kernel"; mkdir -p "$CACHE/kernel"
    dpkg-deb -x "$(deb_of "$kpkg" "$ver")" "$CACHE/kernel"
    local kr=$CACHE/kernel
    [ -d "$kr/lib/modules/$kver" ] || { mkdir -p "$kr/lib/modules"; ln -s "../../usr/lib/modules/$kver" "$kr/lib/modules/$kver"; }
    busybox depmod -b "$kr" "$kver" || die "depmod failed"
    cp "$kr/boot/vmlinuz-$kver" "$CACHE/vmlinuz"

    # 5. initrd: busybox + modules + init + agent
    local ir=$CACHE/initrd.d
    rm -rf "$ir"; mkdir -p "$ir"/{bin,sbin,lib/modules,etc,proc,sys,dev,tmp,run,root,mnt,usr,var/tmp,lh/mod}
    cp /bin/busybox "$ir/bin/busybox"
    for a in $("$ir/bin/busybox" --list); do
        [ -e "$ir/bin/$a" ] || ln -s busybox "$ir/bin/$a"
    done
    $PY - "$kr/lib/modules/$kver" "$ir/lh" nfsv4 nfsv3 nfs virtio_net virtio_pci <<'EOF' || die "module selection failed"
import os, shutil, subprocess, sys
mdir, out, wanted = sys.argv[1], sys.argv[2], sys.argv[3:]
deps, byname = {}, {}
for line in open(os.path.join(mdir, "modules.dep")):
    mod, _, rest = line.partition(":")
    deps[mod] = rest.split()
    byname[os.path.basename(mod).split(".ko")[0].replace("-", "_")] = mod
builtin = {os.path.basename(l.strip()).split(".ko")[0].replace("-", "_")
           for l in open(os.path.join(mdir, "modules.builtin"))}
order = []
def visit(m):
    if m in order: return
    for d in deps[m]: visit(d)
    order.append(m)
for w in wanted:
    if w in byname: visit(byname[w])
    elif w not in builtin: sys.exit("kernel has neither a module nor a built-in " + w)
names = []
for m in order:
    src, base = os.path.join(mdir, m), os.path.basename(m)
    name = base.split(".ko")[0] + ".ko"
    dst = os.path.join(out, "mod", name)
    if base.endswith(".ko"): shutil.copy(src, dst)
    elif base.endswith(".ko.xz"): open(dst, "wb").write(subprocess.check_output(["xz", "-dc", src]))
    elif base.endswith(".ko.zst"): open(dst, "wb").write(subprocess.check_output(["zstd", "-dc", src]))
    elif base.endswith(".ko.gz"): open(dst, "wb").write(subprocess.check_output(["gzip", "-dc", src]))
    else: sys.exit("unknown module format " + base)
    names.append(name)
open(os.path.join(out, "modorder"), "w").write("\n".join(names) + "\n")
print("modules: " + " ".join(names))
EOF
    cp "$HERE/guest-init.sh" "$ir/init"; chmod +x "$ir/init"
    cp "$HERE/lab.py" "$ir/lh/lab.py"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$ir/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$ir/etc/group"
    printf 'passwd: files\ngroup: files\nhosts: files\n' >"$ir/etc/nsswitch.conf"
    (cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) >"$CACHE/initrd.img.new"
    mv "$CACHE/initrd.img.new" "$CACHE/initrd.img"
    rm -rf "$ir"

    {
        echo "inputs=$want_hash"
        echo "kernel=$kver ($kpkg $ver)"
        echo "qemu=$(cat "$CACHE/qemu.version")"
        echo "ganesha=$(dpkg-query -W -f='${Version}' nfs-ganesha)"
        echo "busybox=$(dpkg-query -W -f='${Version}' busybox-static)"
    } >"$CACHE/setup.stamp"
    note "setup done in $((SECONDS - t0)) s: $(tr '\n' ';' <"$CACHE/setup.stamp")"
}

qemu_env() {
    local q=$CACHE/qemu
    QEMU_MODULE_DIR=$q/usr/lib/x86_64-linux-gnu/qemu \
    LD_LIBRARY_PATH=$q/usr/lib/x86_64-linux-gnu:$q/lib/x86_64-linux-gnu \
        "$@"
}

# ------------------------------------------------------------------------------------- run
pidof_name() { [ -f "$RUN/$1.pid" ] && cat "$RUN/$1.pid" || true; }
alive() {  # alive PID: exists and is not a zombie
    local st
    st=$(awk '{ sub(/.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
supervisor_alive() { local p; p=$(pidof_name supervisor); [ -n "$p" ] && alive "$p"; }
port_busy() { $PY -c 'import socket,sys; s=socket.socket(); s.settimeout(1); sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)' "$1"; }
spawn() {  # spawn NAME ARGV... (child of the supervisor; log in $RUN/NAME.log)
    local name=$1; shift
    $PY "$HERE/lab.py" spawn "$RUN" "$name" "$RUN/$name.log" -- "$@" >/dev/null
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

write_ganesha_conf() {
    local mode=$1 protos=4
    [ "$mode" = v3local ] && protos="3, 4"
    cat >"$RUN/ganesha.conf" <<EOF
# generated by tests/nfs/lab.sh start $mode
NFS_CORE_PARAM {
    Bind_addr = 127.0.0.1;
    NFS_Port = 2049;
    MNT_Port = 20048;
    Protocols = $protos;
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
    Mount_Path_Pseudo = true;
}
NFSv4 {
    Graceless = true;
    Lease_Lifetime = 10;
    RecoveryBackend = fs;
    RecoveryRoot = "$RUN/ganesha-recovery";
    Only_Numeric_Owners = true;
}
NFS_KRB5 { Active_krb5 = false; }
LOG { Default_Log_Level = EVENT; }
EXPORT {
    Export_Id = 1;
    Path = "$RUN/export";
    Pseudo = /lh;
    Access_Type = RW;
    Squash = No_Root_Squash;
    Protocols = $protos;
    Transports = TCP;
    SecType = sys;
    Attr_Expiration_Time = 0;
    FSAL { Name = VFS; }
}
EXPORT {
    Export_Id = 2;
    Path = /usr;
    Pseudo = /usr;
    Access_Type = RO;
    Squash = No_Root_Squash;
    Protocols = 4;
    Transports = TCP;
    SecType = sys;
    FSAL { Name = VFS; }
}
EOF
}

start() {
    need_root
    local mode=${1:-v4}
    case "$mode" in v4|v3local) ;; *) die "unknown mode '$mode' (v4 or v3local)" ;; esac
    [ -f "$CACHE/setup.stamp" ] && [ -x "$CACHE/qemu/usr/bin/qemu-system-x86_64" ] ||
        die "lab not set up in $CACHE: run 'lab.sh setup' first"
    grep -qx "inputs=$(inputs_hash)" "$CACHE/setup.stamp" ||
        die "initrd in $CACHE is older than tests/nfs/{guest-init.sh,lab.py}: run 'lab.sh setup' again"
    [ -x /usr/bin/ganesha.nfsd ] || die "ganesha.nfsd not installed: run 'lab.sh setup'"
    command -v socat >/dev/null || die "socat not installed: run 'lab.sh setup'"
    supervisor_alive && die "a lab is already running from $RUN (mode $(cat "$RUN/mode" 2>/dev/null)): run 'lab.sh stop' first"
    local p
    for p in 2049 $([ "$mode" = v3local ] && echo 20048); do
        port_busy "$p" && die "127.0.0.1:$p is already in use (a leftover NFS server? a new ganesha would fail to bind while the old one answers with ESTALE). Stop it first."
    done
    local t0; t0=$(now)
    rm -rf "$RUN"; mkdir -p "$RUN/export" "$RUN/ganesha-recovery"
    chmod 1777 "$RUN/export"
    echo "$mode" >"$RUN/mode"
    trap 'note "start failed; logs in $RUN; stopping what was started"; stop >&2 || true' EXIT

    # supervisor: parent (and child subreaper) of everything below, so every process is reaped
    setsid $PY "$HERE/lab.py" supervise "$RUN" </dev/null >>"$RUN/supervisor.log" 2>&1 &
    echo $! >"$RUN/supervisor.pid"
    local i=0
    while [ ! -S "$RUN/supervisor.sock" ]; do
        i=$((i + 1)); [ $i -le 100 ] || die "lab supervisor did not start (see $RUN/supervisor.log)"
        sleep 0.05
    done

    if [ "$mode" = v3local ]; then
        if port_busy 111; then
            note "using the rpcbind already listening on 127.0.0.1:111 (not started by the lab)"
        else
            command -v rpcbind >/dev/null || die "rpcbind not installed: run 'lab.sh setup'"
            spawn rpcbind rpcbind -f -w
            $PY "$HERE/lab.py" waitport 111 10 "$RUN/rpcbind.pid" || die "rpcbind did not start (see $RUN/rpcbind.log)"
        fi
    fi
    write_ganesha_conf "$mode"
    spawn ganesha /usr/bin/ganesha.nfsd -F -f "$RUN/ganesha.conf" -L "$RUN/ganesha.log" \
        -p "$RUN/ganesha.internal.pid" -N NIV_EVENT
    $PY "$HERE/lab.py" waitport 2049 30 "$RUN/ganesha.pid" ||
        die "ganesha did not start serving 127.0.0.1:2049; ganesha.log tail:
$(tail -15 "$RUN/ganesha.log" 2>/dev/null)"
    if [ "$mode" = v3local ]; then
        $PY "$HERE/lab.py" waitport 20048 30 "$RUN/ganesha.pid" || die "ganesha mountd (20048) not up; see $RUN/ganesha.log"
    fi

    # per-connection forwarder for qemu's guestfwd (stderr must not go into the NFS stream)
    cat >"$RUN/fwd.sh" <<EOF
#!/bin/sh
exec 2>>"$RUN/fwd.log"
echo "fwd \$\$: \$(date +%T) guest connection -> 127.0.0.1:\$1" >&2
exec socat -t 2 - TCP:127.0.0.1:\$1
EOF
    chmod +x "$RUN/fwd.sh"
    local tb; tb=$(now)
    for g in $GUESTS; do launch_guest "$g"; done
    wait_guests $GUESTS || die "a guest did not come up (details above; logs in $RUN)"
    trap - EXIT
    note "lab up ($mode): guests booted in $(since "$tb") s, $(since "$t0") s in all"
    env_cmd
}

launch_guest() {  # launch_guest NAME: boot NAME's VM (child of the supervisor)
    local g=$1 mode q=$CACHE/qemu port fwd
    mode=$(cat "$RUN/mode")
    fwd="guestfwd=tcp:10.0.2.100:2049-cmd:/bin/sh $RUN/fwd.sh 2049"
    [ "$mode" = v3local ] && fwd="$fwd,guestfwd=tcp:10.0.2.100:20048-cmd:/bin/sh $RUN/fwd.sh 20048"
    port=$($PY "$HERE/lab.py" freeport)
    echo "$port" >"$RUN/$g.port"
    : >"$RUN/$g.console"
    qemu_env spawn "$g" "$q/usr/bin/qemu-system-x86_64" \
        -name "$g" -L "$q/usr/share/seabios" -L "$q/usr/share/qemu" \
        -accel tcg -cpu max -m 384 -smp 1 \
        -nodefaults -no-user-config -display none -monitor none -no-reboot \
        -serial "file:$RUN/$g.console" \
        -kernel "$CACHE/vmlinuz" -initrd "$CACHE/initrd.img" \
        -append "console=ttyS0 panic=-1 loglevel=4 printk.time=1 lh.host=$g lh.mode=$mode lh.mnt=$GUEST_MOUNT lh.id=$g-$(cat /proc/sys/kernel/random/uuid)" \
        -netdev "user,id=n0,restrict=on,net=10.0.2.0/24,host=10.0.2.2,hostfwd=tcp:127.0.0.1:$port-10.0.2.15:7000,$fwd" \
        -device virtio-net-pci,netdev=n0,romfile=
}

wait_guests() {  # wait_guests NAME...: in parallel; fails when any does not come up
    local g pids=() rc=0 p
    for g in "$@"; do
        $PY "$HERE/lab.py" wait "$g" "$(cat "$RUN/$g.port")" "$RUN/$g.pid" "$RUN/$g.console" "$BOOT_TIMEOUT" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

boot() {  # boot GUEST: boot a guest again (after crash), with a fresh NFS client identity
    [ $# = 1 ] || die "usage: lab.sh boot GUEST"
    guest_port "$1" >/dev/null
    supervisor_alive || die "lab not running: run 'lab.sh start'"
    local pid; pid=$(pidof_name "$1")
    [ -n "$pid" ] && alive "$pid" && die "guest $1 is running (pid $pid): crash it first"
    local tb; tb=$(now)
    launch_guest "$1"
    wait_guests "$1" || die "guest $1 did not come up (logs in $RUN)"
    note "$1 booted in $(since "$tb") s"
}

env_cmd() {
    echo "LAB_EXPORT=$RUN/export"
    echo "LAB_MOUNT=$GUEST_MOUNT"
    echo "LAB_MODE=$(cat "$RUN/mode" 2>/dev/null || echo none)"
    echo "LAB_RUN=$RUN"
}

guest_port() {
    case " $GUESTS " in *" $1 "*) ;; *) die "unknown guest '$1' (guests: $GUESTS)" ;; esac
    [ -f "$RUN/$1.port" ] || die "lab not started (no $RUN/$1.port): run 'lab.sh start'"
    cat "$RUN/$1.port"
}

exec_cmd() {
    [ $# -ge 2 ] || die "usage: lab.sh exec GUEST CMD..."
    local port; port=$(guest_port "$1"); shift
    exec $PY "$HERE/lab.py" exec "$port" "$*"
}

crash() {
    [ $# = 1 ] || die "usage: lab.sh crash GUEST"
    guest_port "$1" >/dev/null
    local pid; pid=$(pidof_name "$1")
    [ -n "$pid" ] && alive "$pid" || die "guest $1 is not running"
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "-name $1 " || die "pid $pid is not $1's qemu"
    kill -KILL "$pid"
    local i=0
    while alive "$pid"; do i=$((i + 1)); [ $i -le 200 ] || die "qemu $pid survived SIGKILL"; sleep 0.05; done
    note "crashed $1 (SIGKILL to qemu pid $pid)"
}

stop() {
    [ -d "$RUN" ] || { note "nothing to stop ($RUN does not exist)"; return 0; }
    if supervisor_alive; then
        $PY "$HERE/lab.py" shutdown "$RUN" || note "supervisor shutdown request failed"
        local sp i=0; sp=$(pidof_name supervisor)
        while alive "$sp"; do i=$((i + 1)); [ $i -le 200 ] || break; sleep 0.05; done
        alive "$sp" && kill -KILL "$sp"
    fi
    # fallback for anything still alive (e.g. the supervisor had died): only our own pid files,
    # and only when the process still is what we started
    local f pid name left=""
    for f in "$RUN"/*.pid; do
        [ -e "$f" ] || continue
        name=$(basename "$f" .pid); pid=$(cat "$f")
        [ "$name" = ganesha.internal ] && continue
        if alive "$pid"; then
            if tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qE "$RUN|-name $name "; then
                note "killing leftover $name (pid $pid)"
                kill -KILL "$pid" || true
                sleep 0.2
                alive "$pid" && left="$left $name:$pid"
            fi
        fi
    done
    rm -f "$RUN"/*.pid "$RUN"/*.port "$RUN/supervisor.sock"
    [ -z "$left" ] || die "could not stop:$left"
    note "stopped (logs kept in $RUN)"
}

status() {
    [ -d "$RUN" ] || { echo "not running"; return 0; }
    local f pid
    echo "mode: $(cat "$RUN/mode" 2>/dev/null)"
    for f in "$RUN"/*.pid; do
        [ -e "$f" ] || continue
        pid=$(cat "$f")
        if alive "$pid"; then echo "$(basename "$f" .pid): pid $pid running"; else echo "$(basename "$f" .pid): pid $pid dead"; fi
    done
}

main() {
    local cmd=${1:-}; shift || true
    case "$cmd" in
        setup) setup "$@" ;;
        start) start "$@" ;;
        exec) exec_cmd "$@" ;;
        crash) crash "$@" ;;
        boot) boot "$@" ;;
        stop) stop ;;
        env) env_cmd ;;
        status) status ;;
        clock) local g; for g in $GUESTS; do echo "$g $($PY "$HERE/lab.py" clock "$(guest_port "$g")")"; done ;;
        *) die "usage: lab.sh setup|start [v4|v3local]|exec GUEST CMD...|crash GUEST|boot GUEST|stop|env|status|clock" ;;
    esac
}
main "$@"
