#!/usr/bin/env bash
# Flat as the data grows (issue 22, item 3): the dashboard's pages and send-message on a
# store holding SIZES message-log rows (with their events, delivery reports, contacts,
# webhook attempts and inbound messages) spread over CUSTOMERS customers and 90 days,
# on SQLite and on PostgreSQL.
#
#   bench/scale.sh                                  # SIZES="0 1000000", CUSTOMERS=1000
#   SIZES="0 1000000 5000000" STORES=sqlite bench/scale.sh   # needs wrk (Debian)
#   BASE_BIN=/tmp/gateway-base bench/scale.sh       # each size also served by another build
#
# For each store and size: the rows are added by sdk-tests/examples/scale.rs (`seed`),
# the gateway is started on the store, each page is timed as a signed-in owner and an
# operator (`pages`: median and slowest of 5 GETs), and send-message is loaded as in
# bench/run.sh (wrk -t1 -c32, DURATION s, the demo tenant's limits lifted).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
SIZES=${SIZES:-0 1000000}
CUSTOMERS=${CUSTOMERS:-1000}
STORES=${STORES:-sqlite postgres}
. bench/common.sh
cargo build --release -q -p gateway-sdk-tests --example scale
SCALE=$BIN/examples/scale
mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"

run() { # store database_url port
  local name=$1 db=$2 port=$3 key cus seeded=0
  demo_tenant "$BIN/gateway" "$db"
  for size in $SIZES; do
    "$SCALE" seed "$db" $((size - seeded)) "$CUSTOMERS" >/dev/null
    seeded=$size
    for gw in ${BASE_BIN:-} "$BIN/gateway"; do
      GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
        GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/$name.log" GATEWAY_PUBLIC_URL="http://127.0.0.1:$port" \
        "$gw" --database-url "$db" serve --listen 127.0.0.1:$port 2>/dev/null &
      wait_port $port
      echo "### $name, $size seeded rows, $gw"
      "$SCALE" pages "$db" "http://127.0.0.1:$port"
      local rps
      rps=$(API_KEY=$key wrk -t1 -c32 -d${DURATION}s -s bench/send.lua "http://127.0.0.1:$port/api/send-message" | awk '/Requests\/sec/ {print $2}')
      echo "send-message: $rps req/s"
      echo "gateway resident memory: $(awk '/VmRSS/ {print $2, $3}' /proc/$!/status)"
      kill %1; wait %1 2>/dev/null || true
    done
  done
}

each_store scale 18084 18085
