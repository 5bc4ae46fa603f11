#!/usr/bin/env bash
# This gateway against another build (BASE_BIN), alternating, in one run: send-message
# (text, simulator, the purpose and content modules, limits lifted) on SQLite and on
# PostgreSQL, each pair ROUNDS times; the bare Dropshot echo first, for the ratios.
#
#   git worktree add /tmp/base <commit>
#   (cd /tmp/base && CARGO_TARGET_DIR=$PWD/../main/target cargo build --release -p gateway-server --bin gateway)
#   cp target/release/gateway /tmp/gateway-base
#   BASE_BIN=/tmp/gateway-base ROUNDS=2 DURATION=8 bench/compare.sh   # needs wrk (Debian)
#
# Throughput: wrk -t1 -c32 (closed loop). Latency: the open-loop generator of
# server/examples/openloop.rs at 1,000 req/s offered, evenly spaced.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-2}
: "${BASE_BIN:?set BASE_BIN to the gateway binary to compare with}"
. bench/common.sh
BODY='{"instance_id":"demo","phone":"+14155550123","message_purpose":"transactional","message":"Your code is 123456"}'

measure() { # name url key
  local name=$1 url=$2 key=$3
  local rps p99
  rps=$(API_KEY=$key wrk -t1 -c32 -d${DURATION}s -s bench/send.lua "$url" | awk '/Requests\/sec/ {print $2}')
  p99=$(p99_at_1000 "$url" "$key" "$BODY")
  printf '%-28s %10s req/s   p99 at 1000 req/s: %s\n' "$name" "$rps" "$p99"
}

mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"
"$BIN/examples/echo" 127.0.0.1:18081 "$work/echo.log" & wait_port 18081
measure "echo" http://127.0.0.1:18081/echo ""
kill %1; wait %1 2>/dev/null || true

run() { # name binary database_url port
  local name=$1 bin=$2 db=$3 port=$4
  local key cus
  demo_tenant "$bin" "$db"
  GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
    GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/$name.log" "$bin" --database-url "$db" serve --listen 127.0.0.1:$port &
  wait_port $port
  measure "$name" http://127.0.0.1:$port/api/send-message "$key"
  kill %1; wait %1 2>/dev/null || true
}

# Which build runs first alternates from round to round: on this machine the first or
# the second run of a pair can be the faster one by more than a change being measured
# (BENCHMARKS.md, issue 22, sixteenth session).
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then order="base this"; else order="this base"; fi
  for store in sqlite postgres; do
    for build in $order; do
      bin=$BASE_BIN; [ "$build" = this ] && bin=$BIN/gateway
      db="sqlite://$work/$build$round.db?mode=rwc"; [ "$store" = postgres ] && db=$(pg_fresh)
      run "$store, $build" "$bin" "$db" 18082
    done
  done
done
pg_drop
