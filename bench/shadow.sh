#!/usr/bin/env bash
# What shipping a policy safely costs a send (docs/policies.md, "Ship safely"), in one
# run, on SQLite and PostgreSQL: send-message (text, simulator, the purpose and content
# modules deciding, limits lifted) with the policy inputs not kept
# (input_retention_days = 0, in ABBA order against kept), kept (the default), and kept
# with a shadow of content (the bundled content module re-stamped 1.0.1-shadow)
# evaluated on every send, between two runs without it in the same process (the ratio
# is against their mean); each ROUNDS times. Then a backtest over the sends the runs kept (at most LIMIT),
# timed.
#
#   bench/shadow.sh                    # needs wrk (Debian)
#   STORES=sqlite ROUNDS=3 DURATION=8 bench/shadow.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-2}
STORES=${STORES:-"sqlite postgres"}
LIMIT=${LIMIT:-100000}
. bench/common.sh

mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"
GATEWAY_POLICIES__CACHE_DIR="$work/cache" "$BIN/gateway" policy build policies/dist/content.wasm \
  --version 1.0.1-shadow -o "$work/shadow.wasm" >/dev/null

rps() { # url key
  API_KEY=$2 wrk -t1 -c32 -d${DURATION}s -s bench/send.lua "$1" | awk '/Requests\/sec/ {print $2}'
}

start() { # database_url port retention_days
  GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
    GATEWAY_POLICIES__INPUT_RETENTION_DAYS=$3 GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/serve.log" \
    "$BIN/gateway" --database-url "$1" serve --listen 127.0.0.1:$2 &
  wait_port $2
  # Past the start's own work (the delivery watchdog reads the whole last day once).
  sleep 3
  API_KEY=$key wrk -t1 -c32 -d3s -s bench/send.lua "http://127.0.0.1:$2/api/send-message" >/dev/null
}

stop() { kill %1; wait %1 2>/dev/null || true; }

run() { # name database_url port
  local name=$1 db=$2 port=$3
  local key cus off on shadow round
  demo_tenant "$BIN/gateway" "$db"
  local url=http://127.0.0.1:$port/api/send-message
  local cli=("$BIN/gateway" --database-url "$db")
  for round in $(seq 1 "$ROUNDS"); do
    # Every other round the other way round (ABBA), so neither side always meets the
    # bigger store.
    if [ $((round % 2)) = 1 ]; then
      start "$db" "$port" 0; off=$(rps "$url" "$key"); stop
    fi
    # Kept, with the shadow, kept again: the shadow against the mean of the two beside it.
    start "$db" "$port" 7
    on=$(rps "$url" "$key")
    GATEWAY_POLICIES__CACHE_DIR="$work/cache" "${cli[@]}" policy install "$work/shadow.wasm" --shadow >/dev/null
    shadow=$(rps "$url" "$key")
    "${cli[@]}" policy rollback content >/dev/null
    again=$(rps "$url" "$key")
    stop
    if [ $((round % 2)) = 0 ]; then
      start "$db" "$port" 0; off=$(rps "$url" "$key"); stop
    fi
    printf '%-8s round %s: inputs off %8s req/s, kept %8s (%.2f); kept %8s, + shadow %8s, kept %8s (%.2f)\n' \
      "$name" "$round" "$off" "$on" "$(echo "$on / $off" | bc -l)" "$on" "$shadow" "$again" \
      "$(echo "2 * $shadow / ($on + $again)" | bc -l)"
  done
  local started=$SECONDS
  GATEWAY_POLICIES__CACHE_DIR="$work/cache" "${cli[@]}" policy backtest "$work/shadow.wasm" --since 1h \
    --limit "$LIMIT" 2>"$work/backtest.err" >"$work/backtest.json"
  printf '%-10s backtest of %s sends: %s s (%s)\n' "$name" \
    "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["evaluated"])' "$work/backtest.json")" \
    "$((SECONDS - started))" "$(tail -n 1 "$work/backtest.err")"
}

each_store shadow 18092 18093
