#!/usr/bin/env bash
# Flat as the data grows (issue 22, item 3), send-message alone: one build on an empty
# store and on a store holding ROWS message-log rows (seeded as bench/scale.sh seeds
# them: CUSTOMERS customers over 90 days, with their events, delivery reports, contacts,
# webhook attempts and inbound messages, then ANALYZE), alternated ROUNDS times so that
# the machine's drift falls on both sides. Each run: wrk -t1 -c32 for DURATION s (a text
# send of the demo tenant, the purpose and content modules, limits lifted), then the
# open-loop generator's p99 at 1,000 req/s; the gateway's CPU a send, and PostgreSQL's
# (its server processes).
#
#   STORES=sqlite ROWS=5000000 ROUNDS=4 bench/flat.sh     # needs wrk (Debian)
#   GW_BIN=/tmp/gateway-base NO_BUILD=1 bench/flat.sh      # another build, nothing built
#   SCALE_BIN=/tmp/scale-base ...     # another seeder (its SQLite writes the statistics)
# GW_BIN and SCALE_BIN are absolute paths (the script runs from the repository's root).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-4}
ROWS=${ROWS:-5000000}
CUSTOMERS=${CUSTOMERS:-1000}
STORES=${STORES:-sqlite postgres}
. bench/common.sh
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p gateway-sdk-tests --example scale
GW=${GW_BIN:-$BIN/gateway}
SCALE=${SCALE_BIN:-$BIN/examples/scale}
BODY='{"instance_id":"demo","phone":"+14155550123","message_purpose":"transactional","message":"Your code is 123456"}'
trap 'kill $(jobs -p) 2>/dev/null || true; [ -z "${pg_used:-}" ] || { pg_drop gw_flat_empty; pg_drop gw_flat_big; } || true
  [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

one() { # label database_url api_key port -> prints one line
  local label=$1 db=$2 api_key=$3 port=$4 c0 c1 p0 p1 rps p99 pg=""
  bench_gateway "$GW" "$db" "$port"
  local pid=$!
  c0=$(cpu_ticks $pid); p0=$(pg_ticks)
  rps=$(API_KEY=$api_key wrk -t1 -c32 -d${DURATION}s -s bench/send.lua "http://127.0.0.1:$port/api/send-message" |
    awk '/Requests\/sec/ {print $2}')
  awk -v r="${rps:-0}" 'BEGIN { exit !(r + 0 > 0) }' || { echo "$label: wrk gave no rate" >&2; exit 1; }
  c1=$(cpu_ticks $pid); p1=$(pg_ticks)
  p99=$(p99_at_1000 "http://127.0.0.1:$port/api/send-message" "$api_key" "$BODY")
  if [ "$store" = postgres ]; then pg=", PostgreSQL $(per_request $((p1 - p0)) "$rps") µs"; fi
  printf '%-6s %10s req/s (CPU a send: the gateway %s µs%s)   p99 at 1000 req/s: %s\n' \
    "$label" "$rps" "$(per_request $((c1 - c0)) "$rps")" "$pg" "$p99"
  echo "$rps" >>"$work/$label.rates"
  kill $pid; wait $pid 2>/dev/null || true
}

for store in $STORES; do
  case $store in
    sqlite) empty="sqlite://$work/empty.db?mode=rwc" big="sqlite://$work/big.db?mode=rwc" ;;
    postgres) pg_used=1 empty=$(pg_fresh gw_flat_empty) big=$(pg_fresh gw_flat_big) ;;
  esac
  key= cus=
  demo_tenant "$GW" "$empty"; key_empty=$key
  demo_tenant "$GW" "$big"; key_big=$key
  start=$(date +%s)
  "$SCALE" seed "$big" "$ROWS" "$CUSTOMERS" >/dev/null 2>"$work/seed.err" || { cat "$work/seed.err"; exit 1; }
  echo "### $store: empty, and $ROWS rows over $CUSTOMERS customers (seeded in $(($(date +%s) - start)) s)"
  rm -f "$work/empty.rates" "$work/big.rates"
  for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then
      one empty "$empty" "$key_empty" 18096; one big "$big" "$key_big" 18097
    else
      one big "$big" "$key_big" 18097; one empty "$empty" "$key_empty" 18096
    fi
  done
  python3 - "$work/empty.rates" "$work/big.rates" <<'PY'
import statistics, sys
empty, big = ([float(x) for x in open(p)] for p in sys.argv[1:3])
pairs = [b / e for e, b in zip(empty, big)]
print("big ÷ empty, each round:", ", ".join(f"{r:.2f}" for r in pairs), f"(median {statistics.median(pairs):.2f})")
PY
  if [ "$store" = postgres ]; then pg_drop gw_flat_empty || true; pg_drop gw_flat_big || true; fi
done
