#!/usr/bin/env bash
# Load benchmark of the PBX webhook: signed `test` events (secret header, timestamp,
# HMAC-SHA256 signature, each signature used once), on SQLite and PostgreSQL, against
# the bare Dropshot JSON echo of bench/run.sh, in the same run.
#
#   bench/pbx.sh            # needs wrk (apt-get install wrk) and python3
#   GW_BIN=/tmp/gateway-base STORES=postgres ROUNDS=3 bench/pbx.sh
#
# GW_BIN: the gateway binary to measure (default: this checkout's release build);
# STORES (default both) and ROUNDS runs of each. DELAY_MS (read by bench/pbx.lua): each
# connection waits as long after each answer, for about a fixed rate instead of
# saturation (32 connections, DELAY_MS=4: some 6,000 events a second here). Each run also prints the gateway's CPU
# time (user and system, /proc) per request, and on PostgreSQL that of the database's
# server processes.
# wrk, 1 thread, 32 connections, DURATION seconds (closed loop). The requests are
# signed beforehand by python3 (hmac, hashlib) with fresh timestamps, one distinct body
# each, so the server does its full work for every one: integration lookup, secret,
# signature, replay record, rate-limit token (the limit is raised out of the way) and
# the event's log row.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
COUNT=${COUNT:-600000}
ROUNDS=${ROUNDS:-1}
STORES=${STORES:-sqlite postgres}
. bench/common.sh
GW=${GW_BIN:-$BIN/gateway}


echo "### echo (bare Dropshot JSON POST)"
"$BIN/examples/echo" 127.0.0.1:18081 "$work/echo.log" & wait_port 18081
python3 - "$work/echo.lua" <<'PY'
import sys
open(sys.argv[1], "w").write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
    'wrk.body = \'{"event_type":"test","conversation_id":"c000000001"}\'\n')
PY
wrk -t1 -c32 -d${DURATION}s --latency -s "$work/echo.lua" http://127.0.0.1:18081/echo \
  | grep -E "Requests/sec|^ +(50|99)%|Non-2xx|Socket errors"
kill %1; wait %1 2>/dev/null || true

run_gateway() { # name database_url port
  local name=$1 db=$2 port=$3
  local out cus pbx
  out=$("$GW" --database-url "$db" demo)
  cus=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["customer_id"])')
  "$GW" --database-url "$db" customer modules --customer "$cus" --pbx on >/dev/null
  pbx=$("$GW" --database-url "$db" pbx create --customer "$cus" --instance demo --hmac)
  local id secret key
  id=$(echo "$pbx" | python3 -c 'import json,sys; print(json.load(sys.stdin)["integration_id"])')
  secret=$(echo "$pbx" | python3 -c 'import json,sys; print(json.load(sys.stdin)["webhook_secret"])')
  key=$(echo "$pbx" | python3 -c 'import json,sys; print(json.load(sys.stdin)["hmac_secret"])')
  "$GW" --database-url "$db" pbx set --integration "$id" --rate-per-minute 60000 \
    --burst 1000000000 >/dev/null
  pbx_requests "$work/requests.txt" "$key" "$COUNT"
  GATEWAY_LOG_FILE="$work/$name.log" "$GW" --database-url "$db" serve --listen 127.0.0.1:$port &
  local pid=$! out t0 t1 p0 p1 rps
  wait_port $port
  echo "### PBX signed test events, $name"
  t0=$(cpu_ticks $pid); p0=$(pg_ticks)
  out=$(REQUESTS="$work/requests.txt" SECRET="$secret" INTEGRATION="$id" \
    wrk -t1 -c32 -d${DURATION}s --latency -s bench/pbx.lua "http://127.0.0.1:$port")
  t1=$(cpu_ticks $pid); p1=$(pg_ticks)
  echo "$out" | grep -E "Requests/sec|^ +(50|99)%|Non-2xx|Socket errors"
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  echo "  gateway CPU $(per_request $((t1 - t0)) "$rps") µs a request" \
    "$([ "$name" = postgres ] && echo "; PostgreSQL CPU $(per_request $((p1 - p0)) "$rps") µs a request")"
  kill $pid; wait $pid 2>/dev/null || true
}

for round in $(seq 1 "$ROUNDS"); do
  for store in $STORES; do
    case $store in
      sqlite) rm -f "$work/bench.db"*; run_gateway sqlite "sqlite://$work/bench.db?mode=rwc" 18082 ;;
      postgres) run_gateway postgres "$(pg_fresh)" 18083; pg_drop ;;
    esac
  done
done
