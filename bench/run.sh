#!/usr/bin/env bash
# Load benchmark of POST /api/send-message (text, simulator) on SQLite and PostgreSQL,
# against a bare Dropshot JSON echo built the same way, in the same run.
#
#   bench/run.sh            # needs wrk (apt-get install wrk)
#
# Throughput: wrk, 1 thread, 32 connections, DURATION seconds (closed loop).
# Latency at an offered 1,000 req/s, open loop (server/examples/openloop.rs): a request
# every millisecond whatever the earlier ones do, each timed from when it was due.
# Limits of the demo customer are lifted so that quota and velocity never refuse.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
. bench/common.sh
BODY='{"instance_id":"demo","phone":"+14155550123","message_purpose":"transactional","message":"Your code is 123456"}'


measure() { # name url key
  local name=$1 url=$2 key=$3
  echo "### $name"
  API_KEY=$key wrk -t1 -c32 -d${DURATION}s --latency -s bench/send.lua "$url" | grep -E "Requests/sec|^ +(50|99)%|Non-2xx|Socket errors"
  API_KEY=$key "$BIN/examples/openloop" "$url" 1000 "$DURATION" "$BODY" | sed 's/^/  open loop: /'
}

mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"
"$BIN/examples/echo" 127.0.0.1:18081 "$work/echo.log" & wait_port 18081
measure "echo (bare Dropshot JSON POST)" http://127.0.0.1:18081/echo ""
kill %1; wait %1 2>/dev/null || true

run_gateway() { # name database_url port
  local name=$1 db=$2 port=$3
  local key cus
  demo_tenant "$BIN/gateway" "$db"
  # The simulator's delivered/read reports are off: this measures the send path. The
  # purpose and content policy modules decide every send; the pacing module is left
  # out, because a flood to one recipient is exactly what it refuses (its cost is in
  # bench/policies.sh).
  GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
    GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/$name.log" "$BIN/gateway" --database-url "$db" serve --listen 127.0.0.1:$port &
  wait_port $port
  measure "send-message, $name" http://127.0.0.1:$port/api/send-message "$key"
  kill %1; wait %1 2>/dev/null || true
}

run_gateway sqlite "sqlite://$work/bench.db?mode=rwc" 18082
run_gateway postgres "$(pg_fresh)" 18083
pg_drop
