#!/bin/bash
# Real-NFS lab for leasehold (issue 7): nfs-ganesha on 127.0.0.1 + two QEMU (TCG) guests,
# "hosta" and "hostb", each a real Linux NFS client of the same export.
#
#   lab.sh setup                  install/download/unpack everything (idempotent, cached)
#   lab.sh start [v4|v3local]     start ganesha + both guests, wait until ready
#   lab.sh exec GUEST CMD...      run CMD (sh -c) in GUEST; streams output; exits with its status
#   lab.sh crash GUEST            SIGKILL GUEST's VM
#   lab.sh stop                   stop exactly what start started
#   lab.sh env                    print LAB_EXPORT (host dir) and LAB_MOUNT (guest path), eval-able
#   lab.sh status                 show what is running
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

main() {
    local cmd=${1:-}; shift || true
    case "$cmd" in
        setup) setup "$@" ;;
        *) die "usage: lab.sh setup|start [v4|v3local]|exec GUEST CMD...|crash GUEST|stop|env|status" ;;
    esac
}
main "$@"
