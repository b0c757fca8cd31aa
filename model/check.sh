#!/usr/bin/env bash
# Exhaustive SPIN checks of model/leasehold.pml (see model/README.md).
#
# The real model, in two configurations, must pass; each broken variant (one safety step
# removed) must fail on the assertion it is built to break (P1 or P2). For every run, prints
# pan's own summary: its `errors: N` line, the states stored, and the violated assertion if any.
# Exits non-zero if the real model has an error (or its search is incomplete) or a broken
# variant has none, or violates another assertion than its own.
#
#   bash model/check.sh            everything
#   KEEP=dir bash model/check.sh   keep pan's files and trails in dir (replay a trail with
#                                  `spin -t -p -g <flags> leasehold.pml` there)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
for tool in spin cc; do
  command -v "$tool" >/dev/null || { echo "check.sh: $tool is missing (apt-get install spin gcc)" >&2; exit 2; }
done
work="${KEEP:-$(mktemp -d)}"
mkdir -p "$work"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
MEMLIM="${MEMLIM:-6000}"   # MB per pan

# run NAME EXPECT SPINFLAGS CCFLAGS PANFLAGS: builds and runs one pan in $work/NAME
run() {
  local name=$1 expect=$2 sflags=$3 cflags=$4 pflags=$5 d="$work/$1"
  mkdir -p "$d" && cp "$here/leasehold.pml" "$d/" || return 2
  (
    cd "$d" &&
      spin $sflags -a leasehold.pml >spin.log 2>&1 &&
      cc -O2 -DSAFETY -DMEMLIM="$MEMLIM" $cflags -o pan pan.c >cc.log 2>&1 &&
      { t0=$SECONDS; ./pan $pflags >pan.out 2>&1; echo $((SECONDS - t0)) >time.txt; }
  ) || { echo "$name: could not build (see $d)"; cat "$d/spin.log" "$d/cc.log" 2>/dev/null; return 2; }
  echo "$expect" >"$d/expect"
}

report() {
  local name=$1 d="$work/$1" expect errors verdict want ok=0
  expect=$(cat "$d/expect")
  errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$d/pan.out" | tail -1)
  printf '%-26s %s\n' "$name" "spin $(cat "$d/flags")"
  grep -E 'errors:|states, stored|assertion violated|Search not completed|reached -DMEMLIM' "$d/pan.out" |
    sed -e 's/^ */    /' -e 's/(at depth/\n    (at depth/'
  echo "    time: $(cat "$d/time.txt" 2>/dev/null)s"
  if [ "$expect" = pass ]; then
    if [ "$errors" = 0 ] && ! grep -q 'Search not completed' "$d/pan.out"; then
      verdict="PASS (exhaustive, no error)"
    else
      verdict="FAIL: the real model must have no error and a complete search"; ok=1
    fi
  else
    # The counterexample must be the one the variant is built to show: its violated assertion
    # (any other error, e.g. a model bug the variant happens to reach, is no proof).
    want=$(cat "$d/want")
    if [ -z "$errors" ] || [ "$errors" -eq 0 ]; then
      verdict="FAIL: this broken variant must have a counterexample"; ok=1
    elif grep 'assertion violated' "$d/pan.out" | grep -qF -- "$want"; then
      verdict="PASS (counterexample found, as it must be: $want)"
    else
      verdict="FAIL: a counterexample, but not the intended assertion ($want)"; ok=1
    fi
  fi
  echo "    => $verdict"
  return $ok
}

# The assertions a broken variant must violate, as pan prints them (after spin's macros): P1,
# never two commands running at once (ONE_CMD with NC=2), and P2, tokens strictly increase in
# start order (README.md's table says which each variant shows).
P1='!(((running[0]&& !(paused[0]))&&(running[1]&& !(paused[1]))))'
P2='(t>last_tok)'

# name | expect | search | spin -D flags | the assertion a broken variant must violate.
# dfs: exhaustive depth-first; bfs: breadth-first, which finds the shortest trail (used where
# depth-first wanders long before its first error).
configs=(
  "real-2-hosts|pass|dfs|-DNC=2 -DNO_RM -DNO_FORGE|"
  "real-queue|pass|dfs|-DNC=3 -DDRIFT=0 -DNO_PAUSE -DNO_BREAK -DNO_FORGE -DNO_RM|"
  "real-mutex-replaced|pass|dfs|-DNC=2 -DNO_PAUSE -DNO_BREAK -DNO_FORGE|"
  "broken-no-margin|fail|dfs|-DNC=2 -DNO_RM -DNO_FORGE -DBROKEN_NO_MARGIN|$P1"
  "broken-wall-clock|fail|bfs|-DNC=2 -DNO_RM -DNO_FORGE -DBROKEN_WALL_CLOCK|$P2"
  "broken-no-inode-check|fail|bfs|-DNC=2 -DNO_PAUSE -DNO_BREAK -DNO_FORGE -DBROKEN_NO_INODE_CHECK|$P1"
  "broken-break-frees|fail|bfs|-DNC=2 -DNO_RM -DNO_FORGE -DBROKEN_BREAK_FREES|$P1"
  "broken-trust-other-uid|fail|bfs|-DNC=2 -DNO_RM -DBROKEN_TRUST_OTHER_UID|$P1"
)

start=$(date +%s)
echo "== SPIN $(spin -V | head -1); model/leasehold.pml; two pans at a time"
status=0
names=()
# Two at a time (the machine may have two cores).
i=0
for c in "${configs[@]}"; do
  IFS='|' read -r name expect search flags want <<<"$c"
  names+=("$name")
  if [ "$search" = dfs ]; then
    cflags="-DCOLLAPSE"; pflags="-m1000000 -w26"
  else
    cflags="-DCOLLAPSE -DBFS"; pflags="-w24"
  fi
  mkdir -p "$work/$name" && echo "$flags" >"$work/$name/flags" && echo "$want" >"$work/$name/want"
  run "$name" "$expect" "$flags" "$cflags" "$pflags" &
  i=$((i + 1))
  if [ $((i % 2)) = 0 ]; then wait; fi
done
wait
for name in "${names[@]}"; do
  report "$name" || status=1
done
echo "== total $(($(date +%s) - start))s; $([ $status = 0 ] && echo 'all as expected' || echo 'NOT as expected')"
exit $status
