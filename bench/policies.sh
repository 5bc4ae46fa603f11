#!/usr/bin/env bash
# The policy engine's cost, in the same run:
#  1. criterion (server/benches/policies.rs): each bundled module evaluated on a fresh
#     instance in the sandbox, the same rules compiled natively, and both stages of a
#     send through the engine the pipeline calls; medians printed as a table;
#  2. a load of text sends (wrk, 1 thread, 32 connections, DURATION s, SQLite) against
#     the gateway with the purpose and content modules, then with no module at all.
#     (The pacing module is left out of the load: a flood to one recipient is exactly
#     what it refuses. Its cost is in part 1.)
#
#   bench/policies.sh        # needs wrk (installed with apt-get when missing, as root)
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }

echo "## criterion (medians)"
cargo bench -q -p gateway-server --bench policies -- --warm-up-time 2 --measurement-time "${MEASURE:-5}" >/dev/null
median() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['median']['point_estimate']/1000)" \
  "target/criterion/$1/new/estimates.json"; }
printf '| module | fresh instance (µs) | native (µs) | ratio |\n|---|---|---|---|\n'
for m in purpose content pacing; do
  f=$(median "fresh/$m"); n=$(median "native/$m")
  python3 -c "import sys; f,n=float(sys.argv[1]),float(sys.argv[2]); print(f'| {sys.argv[3]} | {f:.1f} | {n:.4f} | {f/n:,.0f}x |')" "$f" "$n" "$m"
done
printf "\nboth stages of a send through the engine (purpose, then content and pacing): %.1f µs\n\n" "$(median send_both-stages)"

. bench/common.sh
run() { # name GATEWAY_POLICIES__BUNDLED GATEWAY_POLICIES_DIR
  local name=$1 bundled=$2 dir=$3 db="sqlite://$work/$1.db?mode=rwc" port=18090
  local key cus
  demo_tenant "$BIN/gateway" "$db"
  GATEWAY_POLICIES__BUNDLED=$bundled GATEWAY_POLICIES_DIR=$dir GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
    GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/$name.log" \
    "$BIN/gateway" --database-url "$db" serve --listen 127.0.0.1:$port &
  wait_port $port
  echo "### $name"
  API_KEY=$key wrk -t1 -c32 -d${DURATION}s --latency -s bench/send.lua "http://127.0.0.1:$port/api/send-message" \
    | grep -E "Requests/sec|^ +(50|99)%|Non-2xx|Socket errors"
  kill %1; wait %1 2>/dev/null || true
}
mkdir -p "$work/policies" "$work/none"
cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"
run "send-message, purpose + content modules" false "$work/policies"
run "send-message, no policy module" false "$work/none"
