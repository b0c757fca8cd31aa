#!/usr/bin/env bash
# THE benchmark command: runs every benchmark of issue 6 and writes docs/benchmarks.md and
# docs/bench.svg.
#
#   bash benches/compare/run.sh            # full run, ~18–23 min on 2 cores (includes a 60 s idle holder)
#   QUICK=1 bash benches/compare/run.sh    # ~4–6 min smoke run, same outputs with fewer samples
#
# Run the full one on a quiet machine: the ratios compare cells measured minutes apart, and the
# hand-over ratio alternates leasehold and flock cells (LEASEHOLD_BENCH_ROUNDS, default 5) so
# that a moving baseline shows as spread rather than as a wrong ratio.
#
# Installs what it needs: hyperfine, lockfile-progs, liblockfile-bin (Debian, when root) and a
# venv with Python filelock (target/bench-venv). Raw results go to target/bench/. Re-run it after
# any change to waiting or release: every table and the plot are regenerated from scratch.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
QUICK=${QUICK:-0}
export LEASEHOLD_BENCH_QUICK=$QUICK
FILELOCK_VERSION=${FILELOCK_VERSION:-4.3.1}
OUT=$ROOT/target/bench
TMPFS=/dev/shm/leasehold-bench-$$
DISK=$ROOT/target/bench-scratch/run-$$
export LEASEHOLD_BENCH_DISK=$ROOT/target/bench-scratch
# Criterion writes under $CARGO_TARGET_DIR when it is set; report.py reads target/criterion.
export CRITERION_HOME=$ROOT/target/criterion
mkdir -p "$OUT" "$TMPFS" "$DISK"
trap 'rm -rf "$TMPFS" "$DISK"' EXIT
rm -f "$OUT"/*.json "$OUT"/*.txt
log() { printf '\n== %s (%s)\n' "$*" "$(date +%T)" >&2; }

log "tools"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  for p in hyperfine lockfile-progs liblockfile-bin python3-venv; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null || true
  fi
fi
VENV=$ROOT/target/bench-venv
if ! "$VENV/bin/python" -c "import filelock, sys; sys.exit(filelock.__version__ != '$FILELOCK_VERSION')" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "filelock==$FILELOCK_VERSION"
fi
PY=$VENV/bin/python
export LEASEHOLD_BENCH_PYTHON=$PY

log "build"
cargo build --release
# The statically linked build the README offers (glibc's crt-static; an explicit --target keeps
# the proc-macros dynamic): its whole-process row stands beside the default build's.
HOST=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --target "$HOST" --bin leasehold ||
  echo "static build failed: its row will be missing" >&2
cargo bench --no-run --bench ops --bench contention

log "ops (criterion)"
rm -rf target/criterion/ops_tmpfs target/criterion/ops_disk
cargo bench --bench ops || echo "ops bench failed: its rows will be missing" >&2
"$PY" benches/compare/py_ops.py "$OUT/py_ops.json" "tmpfs=$TMPFS" "disk=$DISK" || echo "py_ops failed" >&2

log "contention"
LEASEHOLD_BENCH_OUT=$OUT/contention.json cargo bench --bench contention ||
  echo "contention bench failed: its tables will be missing" >&2

log "shared locks (leasehold --shared beside kernel flock -s)"
# N ≤ 16 here: the growth curves to N = 64 are the exclusive lock's.
LEASEHOLD_BENCH_IMPLS=flock-s,leasehold-shared LEASEHOLD_BENCH_ROUNDS=0 LEASEHOLD_BENCH_NS=1,2,4,8,16 \
  LEASEHOLD_BENCH_OUT=$OUT/shared.json cargo bench --bench contention ||
  echo "shared-lock bench failed: its table will be missing" >&2

log "whole process (hyperfine)"
# cargo builds into $CARGO_TARGET_DIR when it is set.
LH=${CARGO_TARGET_DIR:-$ROOT/target}/release/leasehold
LHS=${CARGO_TARGET_DIR:-$ROOT/target}/$HOST/release/leasehold
STATIC=()
if [ -x "$LHS" ] && "$LHS" run "$TMPFS/probe.lock" -- true; then STATIC=(1); fi
if [ "$QUICK" = 1 ]; then HF=(--warmup 3 --min-runs 20 --max-runs 40); else HF=(--warmup 20 --min-runs 300); fi
if ! "$LH" run "$TMPFS/probe.lock" -- true; then
  echo "leasehold run does not work; skipping the whole-process comparison" >&2
elif command -v hyperfine >/dev/null; then
  for fs in tmpfs disk; do
    d=$TMPFS; [ $fs = disk ] && d=$DISK
    hyperfine -N "${HF[@]}" --export-json "$OUT/hyperfine-$fs.json" \
      -n true "true" \
      -n leasehold "$LH run $d/lh.lock -- true" \
      ${STATIC:+-n "leasehold (static)" "$LHS run $d/lhs.lock -- true"} \
      -n flock "flock $d/fl.lock true" \
      -n dotlockfile "dotlockfile -l $d/dot.lock true" \
      -n lockfile-progs "sh -c 'lockfile-create $d/lp && true && lockfile-remove $d/lp'" \
      -n "sh -c true" "sh -c true" >&2
  done
fi

log "whole process against the number of processes on the host"
# P1 used to grow with every process on the host (a /proc scan at exit). Idle `sleep`
# processes are added in one process group of our own and removed by that group's id.
if [ "$QUICK" = 1 ]; then EXTRA=(0 2000); HP=(--warmup 3 --min-runs 20 --max-runs 40); else EXTRA=(0 1000 5000); HP=(--warmup 10 --min-runs 100); fi
if "$LH" run "$TMPFS/probe.lock" -- true && command -v hyperfine >/dev/null; then
  for k in "${EXTRA[@]}"; do
    pg=
    if [ "$k" -gt 0 ]; then
      setsid bash -c "for i in \$(seq $k); do sleep 100000 & done; wait" </dev/null >/dev/null 2>&1 &
      pg=$!
      # Wait until they are all there.
      for _ in $(seq 600); do
        [ "$(pgrep -c -g "$pg" 2>/dev/null || echo 0)" -gt "$k" ] && break
        sleep 0.1
      done
    fi
    procs=$(ls /proc | grep -c '^[0-9]')
    hyperfine -N "${HP[@]}" --export-json "$OUT/hostprocs-$k.json" \
      -n leasehold "$LH run $TMPFS/hp.lock -- true" -n flock "flock $TMPFS/hpf.lock true" >&2 || true
    echo "{\"extra\": $k, \"procs\": $procs}" > "$OUT/hostprocs-$k.meta.json"
    if [ -n "$pg" ]; then kill -- "-$pg" 2>/dev/null || true; wait "$pg" 2>/dev/null || true; fi
  done
fi

log "whole process, one run every 50 ms (as cron or a deploy calls it)"
# Back-to-back runs keep the kernel's caches warm: a read of /proc/locks, for one, costs an RCU
# grace period (milliseconds) when nobody read it in the last few (docs/performance.md).
if [ "$QUICK" = 1 ]; then HS=(--warmup 2 --min-runs 15 --max-runs 15); else HS=(--warmup 3 --min-runs 60 --max-runs 60); fi
if "$LH" run "$TMPFS/probe.lock" -- true && command -v hyperfine >/dev/null; then
  hyperfine -N "${HS[@]}" --prepare 'sleep 0.05' --export-json "$OUT/spaced-tmpfs.json" \
    -n leasehold "$LH run $TMPFS/sp.lock -- true" -n flock "flock $TMPFS/spf.lock true" >&2 || true
fi

log "idle holder"
if [ "$QUICK" = 1 ]; then WINDOW=10; else WINDOW=60; fi
if "$LH" run "$TMPFS/probe.lock" -- true; then
  "$PY" benches/compare/idle.py "$LH" "$TMPFS/idle.lock" "$WINDOW" "$OUT/idle.json" || echo "idle measurement failed" >&2
fi

log "where the time goes (strace -c)"
if command -v strace >/dev/null; then
  B=$(cargo bench --no-run --bench ops --message-format=json 2>/dev/null |
    "$PY" -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="ops" and m.get("executable"): print(m["executable"])' | tail -1)
  if [ -n "$B" ]; then
    LEASEHOLD_BENCH_DISK=$DISK strace -f -c -o "$OUT/strace-acquire.txt" "$B" --bench --profile-time 1 'ops_tmpfs/leasehold_acquire_release' >/dev/null 2>&1 || true
  fi
  strace -f -c -o "$OUT/strace-run.txt" "$LH" run "$TMPFS/strace.lock" -- true || true
fi

log "report"
python3 benches/compare/report.py "$OUT" docs/benchmarks.md docs/bench.svg
echo "wrote docs/benchmarks.md and docs/bench.svg" >&2
