#!/usr/bin/env bash
# Where a send's time goes: the gateway under the load of bench/run.sh (wrk -t1 -c32,
# DURATION seconds, a text send, the purpose and content modules, limits lifted) on
# SQLite and on PostgreSQL, then the mean of each stage of gateway_send_stage_seconds
# (its _sum / _count) and of the HTTP request as Dropshot timed it, in microseconds.
#
#   bench/stages.sh                  # needs wrk
#   GATEWAY_BIN=/tmp/other EXTRA_ENV="GATEWAY_LOG_LEVEL=warn" bench/stages.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
. bench/common.sh
GW=${GATEWAY_BIN:-$BIN/gateway}
mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"

stages() { # name database_url port
  local name=$1 db=$2 port=$3 mport=$(($3 + 100))
  local key cus
  demo_tenant "$GW" "$db"
  GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
    GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 env ${EXTRA_ENV:-} GATEWAY_LOG_FILE="$work/$name.log" GATEWAY_METRICS_LISTEN=127.0.0.1:$mport \
    "$GW" --database-url "$db" serve --listen 127.0.0.1:$port 2>/dev/null &
  wait_port $port
  local rps
  rps=$(API_KEY=$key wrk -t1 -c32 -d${DURATION}s -s bench/send.lua "http://127.0.0.1:$port/api/send-message" | awk '/Requests\/sec/ {print $2}')
  echo "### $name: $rps req/s; mean µs per send by stage"
  curl -s "http://127.0.0.1:$mport/metrics" | python3 -c '
import re, sys
sums, counts = {}, {}
for line in sys.stdin:
    m = re.match(r"gateway_send_stage_seconds_(sum|count)\{stage=\"(\w+)\"\} (\S+)", line)
    if m:
        (sums if m[1] == "sum" else counts)[m[2]] = float(m[3])
    m = re.match(r"gateway_http_request_duration_seconds_(sum|count)\{route=\"/api/send-message\"\} (\S+)", line)
    if m:
        (sums if m[1] == "sum" else counts)["http"] = float(m[2])
    m = re.match(r"gateway_store_(write_batches|writes|write_seconds)_total (\S+)", line)
    if m:
        sums[m[1]] = float(m[2])
for stage in ["http", "handler", "auth", "schema", "read", "policies", "begin", "provider", "settle"]:
    if counts.get(stage):
        print(f"  {stage:9} {1e6 * sums[stage] / counts[stage]:9.0f}  ({counts[stage]:.0f})")
if sums.get("write_batches"):
    b = sums["write_batches"]
    w, t = sums["writes"], sums["write_seconds"]
    print(f"  writer: {b:.0f} batches, {w / b:.1f} writes and {1e6 * t / b:.0f} µs each")
'
  kill %1; wait %1 2>/dev/null || true
}

stages sqlite "sqlite://$work/stages.db?mode=rwc" 18092
stages postgres "$(pg_fresh)" 18093
pg_drop
