#!/usr/bin/env bash
# A real S3 server for the S3 store's tests: Ceph RADOS Gateway on 127.0.0.1, with one monitor
# and one memstore OSD (no disk to prepare), all under one scratch directory.
#
#   ceph.sh start DIR [PORT]   start mon, osd and two gateways (PORT, and PORT+1 for tests that
#                              freeze one); make user `leasehold` and bucket `leasehold`;
#                              write DIR/env (shell assignments) and print it
#   ceph.sh env DIR            print DIR/env
#   ceph.sh stop DIR           kill every daemon started in DIR, by its pid file; remove DIR
#
# Installs nothing: needs `radosgw ceph-mon ceph-osd uuid-runtime` (Debian 12; .ci/run installs
# them). Uses ports 3300, 6789, 6800-6807, PORT and PORT+1 (default 7480, 7481) on 127.0.0.1. Settings that
# matter (see ../../docs/s3.md): auth none, so the gateway needs ms_mon_client_mode = crc; pool
# size 1; tcp_nodelay on the gateway's frontend (a GET takes ~44 ms without it).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
port=${3:-7480}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|env|stop DIR [PORT]" >&2; exit 64; }

ACCESS=LHTESTACCESSKEY00001
SECRET=lhtestsecretkey0000000000000000000000001
BUCKET=leasehold

stop() {
  [ -d "$dir" ] || return 0
  local f pid
  for f in "$dir"/run/*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    [ -n "$pid" ] || continue
    kill -CONT "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
  done
  # Wait for them to be gone, so that the next start finds its ports free.
  for f in "$dir"/run/*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  rm -rf "$dir"
}

start() {
  for b in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph uuidgen; do
    command -v "$b" >/dev/null || { echo "ceph.sh: $b not installed (apt-get install --no-install-recommends radosgw ceph-mon ceph-osd uuid-runtime)" >&2; exit 69; }
  done
  mkdir -p "$dir"/{run,log,mon,osd}
  local fsid conf
  fsid=$(uuidgen)
  conf="$dir/ceph.conf"
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon_host = [v2:127.0.0.1:3300,v1:127.0.0.1:6789]
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
ms_mon_client_mode = crc
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
osd_objectstore = memstore
memstore_device_bytes = 1073741824
run_dir = $dir/run
pid_file = $dir/run/\$name.pid
log_file = $dir/log/\$name.log
admin_socket = $dir/run/\$name.asok
mon_data = $dir/mon/\$name
osd_data = $dir/osd/\$name
keyring = /dev/null
[client.rgw]
rgw_frontends = beast endpoint=127.0.0.1:$port tcp_nodelay=1
[client.rgw2]
rgw_frontends = beast endpoint=127.0.0.1:$((port + 1)) tcp_nodelay=1
EOF
  local c=(-c "$conf")
  monmaptool --create --fsid "$fsid" --addv a '[v2:127.0.0.1:3300,v1:127.0.0.1:6789]' "$dir/monmap" >/dev/null
  ceph-mon "${c[@]}" --mkfs -i a --monmap "$dir/monmap" >/dev/null
  ceph-mon "${c[@]}" -i a 2>>"$dir/log/daemons.err"
  local uuid id
  uuid=$(uuidgen)
  id=$(timeout 30 ceph "${c[@]}" osd new "$uuid")
  mkdir -p "$dir/osd/osd.$id"
  ceph-osd "${c[@]}" -i "$id" --mkfs --osd-uuid "$uuid" >/dev/null 2>&1
  ceph-osd "${c[@]}" -i "$id" 2>>"$dir/log/daemons.err"
  radosgw "${c[@]}" -n client.rgw 2>>"$dir/log/daemons.err"
  # A second gateway on the same cluster, for tests that freeze one (SIGSTOP) without
  # freezing the tests that run beside them.
  radosgw "${c[@]}" -n client.rgw2 2>>"$dir/log/daemons.err"
  # The gateway answers once it has made its pools (an OSD up and its PGs active).
  local up=
  for _ in $(seq 1 600); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then up=1; break; fi
    sleep 0.1
  done
  [ -n "$up" ] || { echo "ceph.sh: radosgw did not listen on 127.0.0.1:$port within 60 s (logs: $dir/log)" >&2; exit 69; }
  up=
  for _ in $(seq 1 600); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null; then up=1; break; fi
    sleep 0.1
  done
  [ -n "$up" ] || { echo "ceph.sh: the second radosgw did not listen on 127.0.0.1:$((port + 1)) within 60 s (logs: $dir/log)" >&2; exit 69; }
  timeout 60 radosgw-admin "${c[@]}" user create --uid=leasehold --display-name=leasehold \
    --access-key="$ACCESS" --secret-key="$SECRET" >/dev/null
  cat >"$dir/env" <<EOF
AWS_ENDPOINT_URL_S3=http://127.0.0.1:$port
AWS_ACCESS_KEY_ID=$ACCESS
AWS_SECRET_ACCESS_KEY=$SECRET
AWS_REGION=us-east-1
LH_S3_BUCKET=$BUCKET
LH_S3_FREEZABLE_ENDPOINT=http://127.0.0.1:$((port + 1))
LH_S3_FREEZABLE_PID=$(cat "$dir/run/client.rgw2.pid")
EOF
  # The bucket, made with a signed PUT (curl's --aws-sigv4 omits x-amz-content-sha256, which
  # RGW requires, so it is sent by hand; the empty body's hash).
  local i ok=
  for i in $(seq 1 100); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT "http://127.0.0.1:$port/$BUCKET" \
      --user "$ACCESS:$SECRET" --aws-sigv4 "aws:amz:us-east-1:s3" \
      -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" || true)
    case "$code" in 200|409) ok=1; break ;; esac
    sleep 0.2
  done
  [ -n "$ok" ] || { echo "ceph.sh: could not make bucket $BUCKET (HTTP $code; logs: $dir/log)" >&2; exit 69; }
  cat "$dir/env"
}

case "$cmd" in
  start) stop; start ;;
  env) cat "$dir/env" ;;
  stop) stop ;;
  *) echo "usage: $0 start|env|stop DIR [PORT]" >&2; exit 64 ;;
esac
