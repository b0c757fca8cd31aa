#!/usr/bin/env bash
# Exhaustive SPIN checks of model/leasehold.pml (see model/README.md).
#
# The real model, in several configurations, must pass; each broken variant (one safety step
# removed, or one of yesterday's rules) must fail, and with the property it is meant to break:
# pan's "assertion violated" line must carry that property's tag (P1_two_commands, ...; see
# the top of leasehold.pml), not any other error. A `gap-*` run is a known gap of the protocol
# (model/README.md): it must show its counterexample too, so the gap stays visible. For every
# run, prints pan's own summary: its `errors: N` line, the states stored, and the violated
# assertion if any. Exits non-zero if a real configuration has an error (or its search is
# incomplete) or a broken or gap run has no error or another one.
#
#   bash model/check.sh            everything
#   KEEP=dir bash model/check.sh   keep pan's files and trails in dir (replay a trail with
#                                  `spin -t -p -g <flags> leasehold.pml` there)
#   ONLY=regex bash model/check.sh only the runs whose name matches (e.g. ONLY='writer|mark')
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
  local name=$1 d="$work/$1" expect errors verdict ok=0
  expect=$(cat "$d/expect")
  expect=${expect//\//|}
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
    # expect = one property tag or several, `|`-separated as in an extended regex
    if [ -n "$errors" ] && [ "$errors" -gt 0 ] && grep 'assertion violated' "$d/pan.out" | grep -Eq "$expect"; then
      verdict="PASS (counterexample found, as it must be: $(grep -Eo "$expect" "$d/pan.out" | head -1))"
    elif [ -n "$errors" ] && [ "$errors" -gt 0 ]; then
      verdict="FAIL: the counterexample must violate $expect, not something else"; ok=1
    else
      verdict="FAIL: this variant must have a counterexample ($expect)"; ok=1
    fi
  fi
  echo "    => $verdict"
  return $ok
}

# name | expect | search | spin -D flags. expect: pass, or the property tag(s) the
# counterexample must violate (alternatives separated by /). dfs: exhaustive depth-first; bfs:
# breadth-first, which finds the shortest trail (used where depth-first wanders long before its
# first error).
P1=P1_two_commands
configs=(
  "real-2-hosts|pass|dfs|-DNC=2 -DNO_RM -DNO_FORGE"
  "real-queue|pass|dfs|-DNC=3 -DDRIFT=0 -DNO_PAUSE -DNO_BREAK -DNO_FORGE -DNO_RM"
  "real-mutex-replaced|pass|dfs|-DNC=2 -DNO_PAUSE -DNO_BREAK -DNO_FORGE"
  "real-writer|pass|dfs|-DNC=2 -DWRITER -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE"
  "broken-no-margin|$P1|dfs|-DNC=2 -DNO_RM -DNO_FORGE -DBROKEN_NO_MARGIN"
  "broken-wall-clock|$P1/P2_token_order|bfs|-DNC=2 -DNO_RM -DNO_FORGE -DBROKEN_WALL_CLOCK"
  "broken-no-inode-check|$P1|bfs|-DNC=2 -DNO_PAUSE -DNO_BREAK -DNO_FORGE -DBROKEN_NO_INODE_CHECK"
  "broken-break-frees|$P1|bfs|-DNC=2 -DNO_RM -DNO_FORGE -DBROKEN_BREAK_FREES -DBROKEN_NO_MARK"
  "broken-trust-other-uid|$P1|bfs|-DNC=2 -DNO_RM -DBROKEN_TRUST_OTHER_UID"
  "broken-no-mark|$P1|bfs|-DNC=2 -DWRITER -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DBROKEN_NO_MARK"
  "broken-flock-only|$P1|bfs|-DNC=2 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DBROKEN_FLOCK_ONLY -DNO_P5"
  "real-writer-and-mutex|pass|dfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DWRITER -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_P2"
  "real-writer-copy|pass|dfs|-DNC=2 -DWRITER -DWRITER_COPY -DCOPY_AT_ONCE -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH"
  "broken-no-dir-mark|$P1|bfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DWRITER -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_P2 -DBROKEN_NO_DIR_MARK"
  "broken-count-unseen|$P1|bfs|-DNC=2 -DWRITER -DWRITER_COPY -DCOPY_AT_ONCE -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH -DBROKEN_COUNT_UNSEEN"
  "gap-nfs-writer-and-mutex|$P1|bfs|-DNC=2 -DWRITER -DNO_BREAK -DNO_FORGE -DNO_PAUSE"
  "gap-writer-early-copy|$P1|bfs|-DNC=2 -DWRITER -DWRITER_COPY -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH"
  "real-remount|pass|dfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DREMOUNT"
  "broken-no-grace|$P1|bfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DREMOUNT -DBROKEN_NO_GRACE"
  "real-flock1|pass|dfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH -DFLOCK1 -DFRUNS=2"
  "broken-no-claim|$P1|bfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH -DFLOCK1 -DBROKEN_NO_CLAIM"
  "broken-no-serve|$P1|bfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH -DFLOCK1 -DBROKEN_NO_SERVE"
  "broken-no-look|$P1|bfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH -DFLOCK1 -DBROKEN_NO_LOOK"
  "broken-flock1-polling|$P1|bfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH -DFLOCK1 -DFLOCK1_POLL"
  "real-flock1-nfs-inplace|pass|dfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH -DFLOCK1 -DFRUNS=2 -DFLOCK1_POLL -DINPLACE"
  "broken-inplace-rename-release|$P1|bfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH -DFLOCK1 -DFLOCK1_POLL -DINPLACE -DBROKEN_RENAME_RELEASE"
  "real-flock1-polling|pass|dfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH -DFLOCK1 -DFRUNS=2 -DFLOCK1_POLL -DSEE_OPEN"
  "gap-flock1-holder-dies|$P1|bfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DFLOCK1"
  "real-handoff|pass|dfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DHANDOFF -DNO_RM -DNO_FORGE"
  "real-handoff-queue|pass|dfs|-DNC=3 -DONE_HOST -DDRIFT=0 -DHANDOFF -DNO_RM -DNO_FORGE -DNO_BREAK -DNO_CRASH"
  "broken-no-confirm|$P1/P2_token_order|dfs|-DNC=3 -DONE_HOST -DDRIFT=0 -DHANDOFF -DNO_RM -DNO_FORGE -DNO_BREAK -DNO_CRASH -DBROKEN_NO_CONFIRM"
  "broken-fresh-deadline|$P1|dfs|-DNC=3 -DONE_HOST -DDRIFT=0 -DHANDOFF -DNO_RM -DNO_FORGE -DNO_BREAK -DNO_CRASH -DBROKEN_FRESH_DEADLINE"
  "real-handoff-flock1|pass|dfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH -DFLOCK1 -DFRUNS=2 -DHANDOFF"
  "real-handoff-flock1-queue|pass|dfs|-DNC=3 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH -DFLOCK1 -DFRUNS=2 -DHANDOFF"
  "broken-handoff-no-claim|$P1|bfs|-DNC=2 -DONE_HOST -DDRIFT=0 -DNO_RM -DNO_BREAK -DNO_FORGE -DNO_PAUSE -DNO_CRASH -DFLOCK1 -DHANDOFF -DBROKEN_HANDOFF_NO_CLAIM"
)

start=$(date +%s)
echo "== SPIN $(spin -V | head -1); model/leasehold.pml; two pans at a time"
status=0
names=()
# Two at a time (the machine may have two cores).
i=0
for c in "${configs[@]}"; do
  IFS='|' read -r name expect search flags <<<"$c"
  if [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]]; then continue; fi
  names+=("$name")
  if [ "$search" = dfs ]; then
    cflags="-DCOLLAPSE"; pflags="-m1000000 -w26"
  else
    cflags="-DCOLLAPSE -DBFS"; pflags="-w24"
  fi
  mkdir -p "$work/$name" && echo "$flags" >"$work/$name/flags"
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
