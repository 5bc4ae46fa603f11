#!/usr/bin/env bash
# Where a send's CPU goes: microseconds of CPU a send by thread and stage, from a
# sampling profile of the gateway under the load of bench/run.sh (wrk -t1 -c32, a text
# send, the purpose and content modules, limits lifted), on SQLite and on PostgreSQL.
# bench/stages.sh gives each stage's wall time (waiting included); this gives its CPU.
#
#   bench/cpu_stages.sh                     # needs wrk and linux-perf (Debian), as root
#   GW_BIN=/tmp/other STORES=postgres bench/cpu_stages.sh
#   SCRIPT=bench/keyed.lua bench/cpu_stages.sh   # a fresh Idempotency-Key on every send
#   SCRIPT=bench/unkeyed.lua bench/cpu_stages.sh # its control: wrk makes each request afresh too
#
# `perf record --call-graph dwarf` samples the gateway's threads at HZ (default 499)
# for RECORD seconds (default 4) from 3 s into the load; bench/cpu_stages.py puts each
# sample in the stage its stack names and divides by the sends answered in as long (the
# rate from the metrics' request count before and after, perf's start and stop
# included). On PostgreSQL the database's own CPU a send (its server processes, from
# /proc, over the whole load) is printed too.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
HZ=${HZ:-499}
RECORD=${RECORD:-4}
STORES=${STORES:-sqlite postgres}
SCRIPT=${SCRIPT:-bench/send.lua}
. bench/common.sh
GW=${GW_BIN:-$BIN/gateway}
mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"

sends() { # metrics port -> requests answered on /api/send-message so far
  curl -s "http://127.0.0.1:$1/metrics" |
    awk '/^gateway_http_request_duration_seconds_count\{route="\/api\/send-message"\}/ {print $2}'
}

run() { # name database_url port (each_store calls it)
  local name=$1 db=$2 port=$3 mport=$(($3 + 100))
  local key cus
  demo_tenant "$GW" "$db"
  GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
    GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/$name.log" GATEWAY_METRICS_LISTEN=127.0.0.1:$mport \
    "$GW" --database-url "$db" serve --listen 127.0.0.1:$port 2>/dev/null &
  local pid=$!
  wait_port $port
  API_KEY=$key wrk -t1 -c32 -d${DURATION}s -s "$SCRIPT" "http://127.0.0.1:$port/api/send-message" > "$work/wrk.txt" &
  local load=$! p0 p1 n0 n1 t0 t1
  p0=$(pg_ticks)
  sleep 3
  n0=$(sends $mport); t0=$(date +%s.%N)
  perf record -q -F "$HZ" --call-graph dwarf,32768 -p $pid -o "$work/$name.perf" -- sleep "$RECORD" >/dev/null 2>&1
  n1=$(sends $mport); t1=$(date +%s.%N)
  wait $load
  p1=$(pg_ticks)
  local rps
  rps=$(awk '/Requests\/sec/ {print $2}' "$work/wrk.txt")
  echo "### $name: $rps req/s over the load"
  perf script -F comm,tid,ip,sym -i "$work/$name.perf" 2>/dev/null |
    python3 bench/cpu_stages.py "$HZ" "$RECORD" "$(python3 -c "print(($n1 - $n0) / ($t1 - $t0) * $RECORD)")"
  if [ "$name" = postgres ]; then
    echo "PostgreSQL's server processes: $(per_request $((p1 - p0)) "$rps") µs a send"
  fi
  kill $pid; wait $pid 2>/dev/null || true
}

each_store cpu 18094 18095
