#!/usr/bin/env bash
# Where a send's time goes: the gateway under the load of bench/run.sh (wrk -t1 -c32,
# DURATION seconds, a text send, the purpose and content modules, limits lifted) on
# SQLite and on PostgreSQL, then the mean of each stage of gateway_send_stage_seconds
# (its _sum / _count) and of the HTTP request as Dropshot timed it, in microseconds.
#
# With RATE set, the load is open loop instead (server/examples/openloop.rs: RATE sends a
# second, evenly spaced, after 2 s at 200 a second), and the means are of that window only.
#
#   bench/stages.sh                  # needs wrk
#   GW_BIN=/tmp/other EXTRA_ENV="GATEWAY_LOG_LEVEL=warn" bench/stages.sh
#   RATE=1000 STORES=postgres bench/stages.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
. bench/common.sh
# (GW_BIN, not GATEWAY_BIN: the gateway reads every GATEWAY_ variable as its configuration)
GW=${GW_BIN:-$BIN/gateway}
STORES=${STORES:-sqlite postgres}
BODY='{"instance_id":"demo","phone":"+14155550123","message_purpose":"transactional","message":"Your code is 123456"}'
mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"

stages() { # name database_url port
  local name=$1 db=$2 port=$3 mport=$(($3 + 100))
  local key cus
  demo_tenant "$GW" "$db"
  GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
    GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 env ${EXTRA_ENV:-} GATEWAY_LOG_FILE="$work/$name.log" GATEWAY_METRICS_LISTEN=127.0.0.1:$mport \
    "$GW" --database-url "$db" serve --listen 127.0.0.1:$port 2>/dev/null &
  wait_port $port
  local url="http://127.0.0.1:$port/api/send-message" load
  : > "$work/before"
  if [ -n "${RATE:-}" ]; then
    API_KEY=$key "$BIN/examples/openloop" "$url" 200 2 "$BODY" >/dev/null
    curl -s "http://127.0.0.1:$mport/metrics" > "$work/before"
    load=$(API_KEY=$key "$BIN/examples/openloop" "$url" "$RATE" "$DURATION" "$BODY")
  else
    load="$(API_KEY=$key wrk -t1 -c32 -d${DURATION}s -s bench/send.lua "$url" | awk '/Requests\/sec/ {print $2}') req/s"
  fi
  echo "### $name: $load; mean µs per send by stage"
  curl -s "http://127.0.0.1:$mport/metrics" | python3 -c '
import re, sys
def read(lines):
    sums, counts = {}, {}
    for line in lines:
        m = re.match(r"gateway_send_stage_seconds_(sum|count)\{stage=\"(\w+)\"\} (\S+)", line)
        if m:
            (sums if m[1] == "sum" else counts)[m[2]] = float(m[3])
        m = re.match(r"gateway_http_request_duration_seconds_(sum|count)\{route=\"/api/send-message\"\} (\S+)", line)
        if m:
            (sums if m[1] == "sum" else counts)["http"] = float(m[2])
        m = re.match(r"gateway_store_(write_batches|writes|write_seconds)_total (\S+)", line)
        if m:
            sums[m[1]] = float(m[2])
    return sums, counts
sums, counts = read(sys.stdin)
sums0, counts0 = read(open(sys.argv[1]))
sums = {k: v - sums0.get(k, 0) for k, v in sums.items()}
counts = {k: v - counts0.get(k, 0) for k, v in counts.items()}
for stage in ["http", "handler", "auth", "schema", "read", "policies", "begin", "provider", "settle"]:
    if counts.get(stage):
        print(f"  {stage:9} {1e6 * sums[stage] / counts[stage]:9.0f}  ({counts[stage]:.0f})")
if sums.get("write_batches"):
    b = sums["write_batches"]
    w, t = sums["writes"], sums["write_seconds"]
    print(f"  writer: {b:.0f} batches, {w / b:.1f} writes and {1e6 * t / b:.0f} µs each")
' "$work/before"
  kill %1; wait %1 2>/dev/null || true
}

for store in $STORES; do
  case $store in
    sqlite) stages sqlite "sqlite://$work/stages.db?mode=rwc" 18092 ;;
    postgres) stages postgres "$(pg_fresh)" 18093; pg_drop ;;
  esac
done
