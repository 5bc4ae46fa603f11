#!/usr/bin/env bash
# What an Idempotency-Key costs: send-message (text, simulator, the purpose and content
# modules, limits lifted) with a fresh key on every request (bench/keyed.lua) against
# none (bench/unkeyed.lua: the same request made afresh each time by wrk, with an ignored
# header in place of the key, so that wrk's own work a request is on both sides), in
# pairs on a fresh store each run, alternating which of the pair runs first; STORES
# (default both) and ROUNDS pairs each.
#
#   ROUNDS=4 DURATION=8 bench/keyed.sh        # needs wrk (Debian)
#   PERF=1 STORES=sqlite ROUNDS=1 bench/keyed.sh
#   PLAIN=bench/send.lua bench/keyed.sh       # the unkeyed side formatted once (before
#                                             # 2026-11-30: it charged wrk's work to the key)
#   PLAIN=bench/send.lua KEYED=bench/unkeyed.lua bench/keyed.sh   # what that work costs
#
# PERF=1 also records the gateway with `perf record -g` for 5 s in the middle of each
# run (linux-perf) and prints its top symbols, self time, keyed beside unkeyed.
# Each line also gives the gateway's CPU time (user and system, /proc) per request, and
# on PostgreSQL that of the database's server processes (unkeyed / keyed).
# GW_BIN: the gateway binary to measure (default: this checkout's release build).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
PLAIN=${PLAIN:-bench/unkeyed.lua}
KEYED=${KEYED:-bench/keyed.lua}
ROUNDS=${ROUNDS:-3}
STORES=${STORES:-sqlite postgres}
. bench/common.sh
GW=${GW_BIN:-$BIN/gateway}
mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"

one() { # store script port -> prints req/s
  local store=$1 script=$2 port=$3 db key cus rps
  case $store in
    sqlite) rm -f "$work/k.db"*; db="sqlite://$work/k.db?mode=rwc" ;;
    postgres) db=$(pg_fresh) ;;
  esac
  demo_tenant "$GW" "$db"
  GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
    GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/gw.log" "$GW" --database-url "$db" serve --listen 127.0.0.1:$port &
  local pid=$!
  wait_port $port
  if [ -n "${PERF:-}" ]; then
    (sleep 2; perf record -q -F ${PERF_HZ:-999} ${PERF_CALLGRAPH:--g} -p $pid -o "$work/$(basename "$script" .lua).perf" -- sleep 5 >/dev/null 2>&1) &
  fi
  local t0 t1 p0 p1
  t0=$(cpu_ticks $pid); p0=$(pg_ticks)
  rps=$(API_KEY=$key wrk -t1 -c32 -d${DURATION}s -s "$script" http://127.0.0.1:$port/api/send-message | awk '/Requests\/sec/ {print $2}')
  t1=$(cpu_ticks $pid); p1=$(pg_ticks)
  wait_jobs_but $pid
  kill $pid; wait $pid 2>/dev/null || true
  [ "$store" = postgres ] && pg_drop
  # req/s, and the gateway's and PostgreSQL's CPU time (user and system) per request in µs
  echo "$rps $(per_request $((t1 - t0)) "$rps") $(per_request $((p1 - p0)) "$rps")"
}
wait_jobs_but() { local j; for j in $(jobs -p); do [ "$j" = "$1" ] || wait "$j" 2>/dev/null || true; done; }

for store in $STORES; do
  for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then
      read -r plain plain_cpu plain_pg < <(one "$store" "$PLAIN" 18091)
      read -r keyed keyed_cpu keyed_pg < <(one "$store" "$KEYED" 18092)
    else
      read -r keyed keyed_cpu keyed_pg < <(one "$store" "$KEYED" 18092)
      read -r plain plain_cpu plain_pg < <(one "$store" "$PLAIN" 18091)
    fi
    pg=""
    [ "$store" = postgres ] && pg=" (PostgreSQL $plain_pg / $keyed_pg µs)"
    printf '%-9s round %s   unkeyed %9s req/s %4s µs CPU   keyed %9s req/s %4s µs CPU   keyed/unkeyed %s%s\n' \
      "$store" "$round" "$plain" "$plain_cpu" "$keyed" "$keyed_cpu" "$(python3 -c "print(f'{$keyed / $plain:.2f}')")" "$pg"
    if [ -n "${PERF:-}" ]; then
      for p in "$(basename "$PLAIN" .lua)" "$(basename "$KEYED" .lua)"; do
        echo "--- $store $p: top self symbols"
        perf report -q -g none -i "$work/$p.perf" --no-children --sort symbol 2>/dev/null | grep -v '^$' | head -25
      done
    fi
  done
done
