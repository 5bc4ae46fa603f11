#!/usr/bin/env bash
# What exactly once costs, in one run: send-message (text, simulator, the purpose and
# content policy modules) on SQLite and PostgreSQL with
#   - BASE_BIN (the gateway before the attempt row: a reservation before the provider
#     call and the log row after it, SQLite synchronous=NORMAL), when given;
#   - this gateway, SQLite synchronous=NORMAL and FULL (the default);
#   - this gateway with a fresh Idempotency-Key on every request;
# beside a bare Dropshot JSON echo built the same way.
#
#   BASE_BIN=/tmp/gateway-base bench/exactly_once.sh    # needs wrk (apt-get install wrk)
#
# Throughput: wrk, 1 thread, 32 connections, DURATION seconds (closed loop, saturation).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
. bench/common.sh

measure() { # name url key [script]
  local name=$1 url=$2 key=$3 script=${4:-bench/send.lua}
  echo "### $name"
  API_KEY=$key wrk -t1 -c32 -d${DURATION}s --latency -s "$script" "$url" | grep -E "Requests/sec|^ +(50|99)%|Non-2xx|Socket errors"
}

mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"
"$BIN/examples/echo" 127.0.0.1:18081 "$work/echo.log" & wait_port 18081
measure "echo (bare Dropshot JSON POST)" http://127.0.0.1:18081/echo ""
kill %1; wait %1 2>/dev/null || true

run() { # name binary database_url port script [env...]
  local name=$1 bin=$2 db=$3 port=$4 script=$5; shift 5
  local key cus
  demo_tenant "$bin" "$db"
  env "$@" GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
    GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/$name.log" "$bin" --database-url "$db" serve --listen 127.0.0.1:$port &
  wait_port $port
  measure "send-message, $name" http://127.0.0.1:$port/api/send-message "$key" "$script"
  kill %1; wait %1 2>/dev/null || true
}

sqlite() { rm -f "$work/$1.db"*; echo "sqlite://$work/$1.db?mode=rwc"; }
if [ -n "${BASE_BIN:-}" ]; then
  run "sqlite, before (NORMAL)" "$BASE_BIN" "$(sqlite base)" 18082 bench/send.lua
fi
run "sqlite, NORMAL" "$BIN/gateway" "$(sqlite normal)" 18083 bench/send.lua GATEWAY_SQLITE_SYNCHRONOUS=normal
run "sqlite, FULL" "$BIN/gateway" "$(sqlite full)" 18084 bench/send.lua
run "sqlite, FULL, Idempotency-Key" "$BIN/gateway" "$(sqlite keyed)" 18085 bench/keyed.lua
if [ -n "${BASE_BIN:-}" ]; then
  run "postgres, before" "$BASE_BIN" "$(pg_fresh)" 18086 bench/send.lua
fi
run "postgres" "$BIN/gateway" "$(pg_fresh)" 18087 bench/send.lua
run "postgres, Idempotency-Key" "$BIN/gateway" "$(pg_fresh)" 18088 bench/keyed.lua
pg_drop
