#!/usr/bin/env bash
# Retention beside sends (issue 22, item 3): sends at an offered RATE (1,000) req/s (open loop,
# server/examples/openloop.rs) on a store of ROWS message-log rows over 90 days, first
# alone, then while retention deletes the oldest day of the log (the retention period
# set to 89 days, then 88, ...); the latencies of both, ROUNDS times, on each store.
# Retention runs as `gateway retention run` beside the gateway (another process), or,
# with JOB=1, as the gateway's own background job (60 s after it starts: one round).
#
#   bench/retention.sh                       # ROWS=1000000 ROUNDS=2 DURATION=10
#   STORES=sqlite ROWS=5000000 JOB=1 bench/retention.sh
#   STORES=postgres RATE=300 bench/retention.sh  # below what PostgreSQL serves on this machine
#
# Every other table keeps its 90 days in both runs, so the log's day is all that goes.
# Retention spreads a run over up to 5 minutes (store::retention), so "beside retention"
# here is its first DURATION seconds; bench/retention_slices.sh follows the whole run.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
ROWS=${ROWS:-1000000}
ROUNDS=${ROUNDS:-2}
RATE=${RATE:-1000}
STORES=${STORES:-sqlite postgres}
. bench/common.sh
cargo build --release -q -p gateway-sdk-tests --example scale
BODY='{"instance_id":"demo","phone":"+14155550123","message_purpose":"transactional","message":"Your code is 123456"}'
mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"
export GATEWAY_WEBHOOKS__RETENTION_DAYS=90 GATEWAY_RETENTION__CONTACTS_DAYS=365 GATEWAY_RETENTION__INBOUND_DAYS=90

run() { # store database_url port
  local name=$1 db=$2 port=$3 key cus
  demo_tenant "$BIN/gateway" "$db"
  "$BIN/examples/scale" seed "$db" "$ROWS" 1000 >/dev/null 2>&1
  if [ -n "${JOB:-}" ]; then job "$name" "$db" "$port"; return; fi
  GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
    GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/$name.log" \
    "$BIN/gateway" --database-url "$db" serve --listen 127.0.0.1:$port 2>/dev/null &
  wait_port $port
  local url=http://127.0.0.1:$port/api/send-message
  for round in $(seq 1 "$ROUNDS"); do
    echo "### $name, $ROWS rows, round $round"
    echo "  sends alone:          $(API_KEY=$key "$BIN/examples/openloop" "$url" "$RATE" "$DURATION" "$BODY")"
    API_KEY=$key "$BIN/examples/openloop" "$url" "$RATE" "$DURATION" "$BODY" > "$work/during" &
    local load=$! started=$SECONDS
    sleep 1
    local pruned
    pruned=$(GATEWAY_RETENTION__MESSAGE_LOG_DAYS=$((90 - round)) "$BIN/gateway" --database-url "$db" retention run |
      python3 -c 'import json,sys; d=json.load(sys.stdin); print(d)')
    local took=$((SECONDS - started - 1))
    wait $load
    echo "  beside retention:     $(cat "$work/during")"
    echo "  retention deleted (in about $took s): $pruned"
  done
  kill %1; wait %1 2>/dev/null || true
}

# The gateway's own retention job: it first runs 60 s after start; sends alone from 30 s
# to 30 + DURATION, then from 55 s for DURATION + 10 s, across the job's run.
job() { # store database_url port
  local name=$1 db=$2 port=$3
  local started=$SECONDS
  GATEWAY_RETENTION__MESSAGE_LOG_DAYS=89 GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" \
    GATEWAY_POLICIES__CACHE_DIR="$work/cache" GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/$name.log" \
    "$BIN/gateway" --database-url "$db" serve --listen 127.0.0.1:$port 2>/dev/null &
  wait_port $port
  local url=http://127.0.0.1:$port/api/send-message
  sleep $((30 - (SECONDS - started)))
  echo "### $name, $ROWS rows, the gateway's retention job"
  echo "  sends alone:          $(API_KEY=$key "$BIN/examples/openloop" "$url" "$RATE" "$DURATION" "$BODY")"
  sleep $((55 - (SECONDS - started)))
  echo "  beside the job:       $(API_KEY=$key "$BIN/examples/openloop" "$url" "$RATE" $((DURATION + 10)) "$BODY")"
  echo "  the job: $(grep -h -o '"msg":"retention[^}]*' "$work/$name.log" | head -3)"
  kill %1; wait %1 2>/dev/null || true
}

each_store retention 18087 18088
