#!/usr/bin/env bash
# This gateway against another build (BASE_BIN) on PostgreSQL, alternating which runs
# first: send-message at saturation (wrk -t1 -c32, DURATION s after a 2 s warm-up, a text
# send, the purpose and content modules, limits lifted), with each process's CPU a send
# from /proc (the gateway's, and PostgreSQL's server processes' together) and the send
# path's reads a statement (gateway_store_send_reads_total over ..._read_batches_total).
#
#   BASE_BIN=/tmp/gateway-base ROUNDS=4 bench/pg_cpu_pairs.sh      # needs wrk (Debian)
#   SCRIPT=bench/keyed.lua BASE_BIN=... bench/pg_cpu_pairs.sh      # a fresh key a send
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
SCRIPT=${SCRIPT:-bench/send.lua}
: "${BASE_BIN:?set BASE_BIN to the gateway binary to compare with}"
. bench/common.sh
mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"

ticks() { local s; s=$(cut -d' ' -f14,15 "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }; echo $((${s% *} + ${s#* })); }
postgres_ticks() { local t=0 p; for p in $(pgrep -x postgres); do t=$((t + $(ticks "$p"))); done; echo $t; }
reads() { curl -s http://127.0.0.1:18097/metrics | awk '/^gateway_store_send_read(s|_batches)_total/ {printf "%s ", $2}'; }

one() { # name binary
  local name=$1 bin=$2 key cus db pid
  db=$(pg_fresh)
  demo_tenant "$bin" "$db"
  GATEWAY_METRICS_LISTEN=127.0.0.1:18097 GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" \
    GATEWAY_POLICIES__CACHE_DIR="$work/cache" GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/$name.log" \
    "$bin" --database-url "$db" serve --listen 127.0.0.1:18096 &
  pid=$!
  wait_port 18096
  API_KEY=$key wrk -t1 -c32 -d2s -s "$SCRIPT" http://127.0.0.1:18096/api/send-message >/dev/null
  local r0 n0 g0 p0 rps g1 p1 n1 r1
  r0=$(reads); n0=$(psql "$db" -Atc "SELECT COALESCE(MAX(id), 0) FROM message_log"); g0=$(ticks $pid); p0=$(postgres_ticks)
  rps=$(API_KEY=$key wrk -t1 -c32 -d"${DURATION}"s -s "$SCRIPT" http://127.0.0.1:18096/api/send-message | awk '/Requests\/sec/ {print $2}')
  g1=$(ticks $pid); p1=$(postgres_ticks); n1=$(psql "$db" -Atc "SELECT MAX(id) FROM message_log"); r1=$(reads)
  kill $pid; wait $pid 2>/dev/null || true
  pg_drop
  python3 - "$name" "$rps" "$((n1 - n0))" "$((g1 - g0))" "$((p1 - p0))" "$r0" "$r1" "$(getconf CLK_TCK)" <<'PY'
import sys
name, rps, sends, g, p, r0, r1, hz = sys.argv[1:]
sends, us = int(sends), 1e6 / int(hz)
(b0, n0), (b1, n1) = ([float(x) for x in r.split()] or [0, 0] for r in (r0, r1))
batch = f"{(n1 - n0) / (b1 - b0):.1f}" if b1 > b0 else "-"
print(f"{name:5} {rps:>9} req/s  gateway {int(g) * us / sends:5.0f} us a send  "
      f"postgres {int(p) * us / sends:5.0f} us a send  reads a statement {batch}")
PY
}

alternate
