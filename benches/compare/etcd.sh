#!/usr/bin/env bash
# The etcd store beside `etcdctl lock`, measured in the same run on a local 3-member cluster
# (loopback ports; Debian etcd-server/etcd-client). Needs a leasehold built with the etcd
# feature (`cargo build --release --features etcd`). Prints a Markdown table.
#
#   bash benches/compare/etcd.sh              # 30 rounds per measurement
#   ROUNDS=10 bash benches/compare/etcd.sh
#
# handoff:  the holder's command writes its end time and exits; the waiter (queued behind it)
#           writes its start time first thing: start - end, through release, wake-up and exec.
# takeover: the holder (TTL 2 s) is SIGKILLed; time until the waiter's command starts.
set -euo pipefail
cd "$(dirname "$0")/../.."
LH=${LEASEHOLD_BIN:-$PWD/target/release/leasehold}
ROUNDS=${ROUNDS:-30}
D=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$D"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
C=() P=()
for i in 0 1 2; do C+=("$(port)"); P+=("$(port)"); done
init="m0=http://127.0.0.1:${P[0]},m1=http://127.0.0.1:${P[1]},m2=http://127.0.0.1:${P[2]}"
for i in 0 1 2; do
  etcd --name m$i --data-dir "$D/m$i" --listen-client-urls http://127.0.0.1:${C[$i]} \
    --advertise-client-urls http://127.0.0.1:${C[$i]} --listen-peer-urls http://127.0.0.1:${P[$i]} \
    --initial-advertise-peer-urls http://127.0.0.1:${P[$i]} --initial-cluster "$init" \
    --initial-cluster-token bench-$$ --initial-cluster-state new --logger zap \
    --log-outputs "$D/m$i.log" >/dev/null 2>&1 &
  pids+=($!)
done
EPS="127.0.0.1:${C[0]},127.0.0.1:${C[1]},127.0.0.1:${C[2]}"
export ETCDCTL_API=3
E=(etcdctl --endpoints="$EPS")
for _ in $(seq 100); do "${E[@]}" endpoint health >/dev/null 2>&1 && break; sleep 0.2; done
now() { date +%s%N; }

# take TOOL NAME TTL CMD...: a lock holder of either kind.
take() {
  local tool=$1 name=$2 ttl=$3; shift 3
  # exec: a background `take` is then the holder itself (its pid is what gets SIGKILLed).
  if [ "$tool" = leasehold ]; then exec "$LH" run -q --ttl "$ttl" "etcd://$EPS/$name" -- "$@"
  else exec "${E[@]}" lock --ttl="$ttl" "$name" -- "$@"; fi
}

handoff() {
  local tool=$1 r
  for r in $(seq "$ROUNDS"); do
    take "$tool" "h-$tool" 10 sh -c "sleep 0.3; date +%s%N > $D/end" &
    local h=$!
    sleep 0.15
    take "$tool" "h-$tool" 10 sh -c "date +%s%N > $D/start" &
    local w=$!
    wait "$h" "$w"
    echo $(( $(cat "$D/start") - $(cat "$D/end") ))
  done
}

takeover() {
  local tool=$1 r
  for r in $(seq "$ROUNDS"); do
    take "$tool" "t-$tool" 2 sleep 100 &
    local h=$!
    sleep 0.3
    take "$tool" "t-$tool" 2 sh -c "date +%s%N > $D/start" &
    local w=$!
    sleep 0.3
    # etcdctl does not fence: its command outlives it, and is killed here by its pid.
    local kids; kids=$(ps -o pid= --ppid "$h" || true)
    local t0; t0=$(now)
    kill -KILL "$h"; wait "$h" 2>/dev/null || true
    wait "$w"
    for k in $kids; do kill -KILL "$k" 2>/dev/null || true; done
    echo $(( $(cat "$D/start") - t0 ))
  done
}

stats() { python3 -c '
import sys, statistics
v = sorted(int(x) / 1e6 for x in sys.stdin.read().split())
q = lambda p: v[min(len(v) - 1, int(p * len(v)))]
print(f"{q(0.5):.1f} ms | {q(0.9):.1f} ms | {v[-1]:.1f} ms | {len(v)}")'; }

echo "| measurement (3-member local etcd 3.4) | p50 | p90 | max | rounds |"
echo "|---|---|---|---|---|"
for tool in leasehold etcdctl; do
  echo "| handoff, $tool | $(handoff $tool | stats) |"
done
for tool in leasehold etcdctl; do
  echo "| SIGKILL takeover (TTL 2 s), $tool | $(takeover $tool | stats) |"
done
