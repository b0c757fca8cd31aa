#!/usr/bin/env bash
# Instructions, not time: how many user-space instructions leasehold executes on its hot paths,
# counted by valgrind's callgrind — repeatable on a loaded machine, where timings are not, so
# that a regression shows without a quiet machine (issue 32). Kernel work (system calls, syncs)
# is not counted: the timed benchmarks (run.sh) measure that.
#
#   bash benches/compare/instructions.sh            # this tree
#   bash benches/compare/instructions.sh REV        # this tree and REV side by side, with ratios
#
# Rows:
# - `run L -- true`: the wrapper process only (not the command, not the guardian), tmpfs and disk;
#   under valgrind the guardian is forked (valgrind cannot run the dormant `clone(CLONE_VM)`
#   child that starts it elsewhere: src/supervise/guardian.rs), so this row counts a fork where
#   a real run clones;
# - acquire+release: the library's uncontended `try_acquire` + `release`, per round: the
#   difference between 1 and 41 rounds of lib/examples/acquire_release.rs, divided by 40
#   (start-up and exit cancel out), tmpfs and disk.
# Each figure is the smallest of 3 runs. Output: target/bench/instructions.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BASE=${1:-}
OUT=$ROOT/target/bench
mkdir -p "$OUT"
command -v valgrind >/dev/null || {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
  else
    echo "instructions.sh: valgrind is needed (Debian: apt-get install valgrind)" >&2
    exit 1
  fi
}
SCRATCH=$(mktemp -d /dev/shm/leasehold-ir.XXXXXX)
DISKDIR=$ROOT/target/bench-scratch/ir-$$
mkdir -p "$DISKDIR"
trap 'rm -rf "$SCRATCH" "$DISKDIR"; [ -n "${WT:-}" ] && git -C "$ROOT" worktree remove --force "$WT" >/dev/null 2>&1 || true' EXIT

# build DIR TARGET_DIR: the binary and the example, release.
build() {
  (cd "$1" && CARGO_TARGET_DIR=$2 cargo build --release --quiet --bin leasehold -p leasehold \
    && CARGO_TARGET_DIR=$2 cargo build --release --quiet -p leasehold-lib --example acquire_release)
}

# ir PROGRAM ARGS...: the instructions callgrind counted in the process it started (the smallest
# of 3 runs); every file it writes for forked processes is ignored.
ir() {
  local best="" n i f
  for i in 1 2 3; do
    f=$SCRATCH/cg.$i
    valgrind --tool=callgrind --trace-children=no --callgrind-out-file="$f.%p" "$@" \
      >/dev/null 2>"$SCRATCH/vg.log"
    n=$(grep -m1 -E '^==[0-9]+== Collected : ' "$SCRATCH/vg.log" | awk '{print $NF}')
    rm -f "$f".*
    [ -z "$best" ] || [ "$n" -lt "$best" ] && best=$n
  done
  echo "$best"
}

# measure LABEL BIN EXAMPLE: prints "LABEL row value" lines.
measure() {
  local label=$1 bin=$2 ex=$3 dir one many
  for where in tmpfs disk; do
    if [ $where = tmpfs ]; then dir=$SCRATCH/$label; else dir=$DISKDIR/$label; fi
    mkdir -p "$dir"
    # A first run creates the helper files: every measured run finds them, as a routine run does.
    "$bin" run "$dir/run.lock" -- true
    echo "$label run-true-$where $(ir "$bin" run "$dir/run.lock" -- true)"
    "$ex" "$dir/lib.lock" 1
    one=$(ir "$ex" "$dir/lib.lock" 1)
    many=$(ir "$ex" "$dir/lib.lock" 41)
    echo "$label acquire-release-$where $(((many - one) / 40))"
  done
}

echo "== building this tree" >&2
build "$ROOT" "$ROOT/target"
results=$(measure this "$ROOT/target/release/leasehold" "$ROOT/target/release/examples/acquire_release")
if [ -n "$BASE" ]; then
  echo "== building $BASE" >&2
  WT=$(mktemp -d /tmp/leasehold-base.XXXXXX)
  rm -rf "$WT"
  git -C "$ROOT" worktree add --detach --quiet "$WT" "$BASE"
  # The example may be newer than REV: the library calls it makes are older than it.
  mkdir -p "$WT/lib/examples"
  cp "$ROOT/lib/examples/acquire_release.rs" "$WT/lib/examples/"
  build "$WT" "$ROOT/target/instr-base"
  results+=$'\n'$(measure base "$ROOT/target/instr-base/release/leasehold" \
    "$ROOT/target/instr-base/release/examples/acquire_release")
fi
{
  echo "# Instructions (callgrind, user space only), $(date -u +%FT%TZ)"
  echo "# this tree: $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo '+changes')${BASE:+; base: $BASE}"
  printf '%-26s %14s' path this
  [ -n "$BASE" ] && printf ' %14s %8s' base ratio
  echo
  for row in run-true-tmpfs run-true-disk acquire-release-tmpfs acquire-release-disk; do
    t=$(echo "$results" | awk -v r=$row '$1 == "this" && $2 == r {print $3}')
    printf '%-26s %14s' "$row" "$t"
    if [ -n "$BASE" ]; then
      b=$(echo "$results" | awk -v r=$row '$1 == "base" && $2 == r {print $3}')
      printf ' %14s %8s' "$b" "$(awk -v t="$t" -v b="$b" 'BEGIN { printf "%.2fx", t / b }')"
    fi
    echo
  done
} | tee "$OUT/instructions.txt"
