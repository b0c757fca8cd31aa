#!/usr/bin/env bash
# P1 on a disk, before/after: `leasehold run L -- true` of two builds against `flock L true`,
# on a freshly made ext4 on a loop device (root), or in $P1_DIR when given (its own file
# system, whatever it is). The three commands alternate, round by round (flock, before, after,
# flock, …), in one run, so that a noisy neighbour hits all three alike; each cell is
# `perf stat -r RUNS` (mean wall time of RUNS runs, fork and exec by perf alone).
#
#   bash benches/compare/p1_disk.sh BEFORE_BINARY [AFTER_BINARY] [ROUNDS] [RUNS]
#
# Prints one line per cell and, at the end, the median over rounds of each command and its
# ratio to flock's. Used for docs/performance.md ("Durable per mount epoch").
set -euo pipefail
BEFORE=${1:?usage: p1_disk.sh BEFORE_BINARY [AFTER_BINARY] [ROUNDS] [RUNS]}
AFTER=${2:-target/release/leasehold}
ROUNDS=${3:-7}
RUNS=${4:-100}
FLOCK=$(command -v flock)

cleanup() { :; }
if [ -n "${P1_DIR:-}" ]; then
  DIR=$P1_DIR
else
  [ "$(id -u)" = 0 ] || { echo "root needed for a loop-mounted ext4 (or set P1_DIR)" >&2; exit 2; }
  WORK=$(mktemp -d)
  truncate -s 256M "$WORK/disk.img"
  mkfs.ext4 -q -F "$WORK/disk.img"
  DEV=$(losetup -f --show "$WORK/disk.img")
  mkdir "$WORK/mnt"
  mount "$DEV" "$WORK/mnt"
  DIR=$WORK/mnt
  cleanup() {
    umount "$WORK/mnt" || umount -l "$WORK/mnt" || true
    losetup -d "$DEV" || true
    rm -rf "$WORK"
  }
fi
trap cleanup EXIT
echo "# $(date -u +%FT%TZ) on $(findmnt -no FSTYPE,SOURCE -T "$DIR"): rounds $ROUNDS, runs $RUNS"

cell() { # name, command... → mean seconds
  local name=$1; shift
  local out
  out=$(perf stat -r "$RUNS" "$@" 2>&1 >/dev/null | awk '/seconds time elapsed/ {print $1}')
  echo "$name $out"
}

# Warm every binary and the lock files (the first run on a disk writes the epoch record).
for b in "$BEFORE" "$AFTER"; do "$b" run "$DIR/warm-$RANDOM.lock" -- true; done
"$BEFORE" run "$DIR/before.lock" -- true
"$AFTER" run "$DIR/after.lock" -- true
"$FLOCK" "$DIR/flock.lock" true

RES=$(mktemp)
for r in $(seq 1 "$ROUNDS"); do
  for c in flock before after; do
    case $c in
      flock) line=$(cell flock "$FLOCK" "$DIR/flock.lock" true) ;;
      before) line=$(cell before "$BEFORE" run "$DIR/before.lock" -- true) ;;
      after) line=$(cell after "$AFTER" run "$DIR/after.lock" -- true) ;;
    esac
    echo "round $r $line"
    echo "$line" >>"$RES"
  done
done
python3 - "$RES" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
med = {}
for name in ("flock", "before", "after"):
    v = sorted(float(x) for n, x in rows if n == name)
    med[name] = statistics.median(v)
    print(f"{name:7} median {med[name]*1e3:.3f} ms  (min {v[0]*1e3:.3f}, max {v[-1]*1e3:.3f})  {med[name]/med['flock']:.2f}x flock")
EOF
rm -f "$RES"
