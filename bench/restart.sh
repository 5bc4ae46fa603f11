#!/usr/bin/env bash
# PostgreSQL restarted under send load: what the sends answer. The gateway of
# bench/run.sh (a text send, the purpose and content modules, limits lifted) on a fresh
# database takes wrk -t1 -c32 for DURATION seconds; AT seconds in, the cluster restarts
# (pg_ctlcluster, so run it as root on a Debian cluster that nothing else needs meanwhile).
# Prints wrk's count and its non-2xx answers, the message log by status (one `sent` row
# for each 200, plus at most the 32 requests in flight when wrk stopped), and what the
# gateway logged at warning level or above about the restart.
#
#   bench/restart.sh                        # needs wrk (Debian)
#   GW_BIN=/tmp/gateway-base ROUNDS=4 bench/restart.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
AT=${AT:-4}
ROUNDS=${ROUNDS:-1}
CLUSTER=${CLUSTER:-"15 main"}
. bench/common.sh
GW=${GW_BIN:-$BIN/gateway}
mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"

for round in $(seq 1 "$ROUNDS"); do
  db=$(pg_fresh)
  key=; cus=
  demo_tenant "$GW" "$db"
  GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
    GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/restart.log" \
    "$GW" --database-url "$db" serve --listen 127.0.0.1:18098 2>/dev/null &
  gw=$!
  wait_port 18098
  API_KEY=$key wrk -t1 -c32 -d${DURATION}s -s bench/send.lua "http://127.0.0.1:18098/api/send-message" > "$work/wrk.txt" &
  load=$!
  sleep "$AT"
  # shellcheck disable=SC2086
  pg_ctlcluster $CLUSTER restart
  wait $load || true
  echo "### round $round"
  grep -E "requests in|Non-2xx|Socket errors" "$work/wrk.txt" | sed 's/^ */  wrk: /'
  echo "  message log: $(psql "$db" -Atc "SELECT string_agg(status || ' ' || n, ', ') FROM (SELECT status, count(*) AS n FROM message_log GROUP BY 1 ORDER BY 1) t")"
  python3 - "$work/restart.log" <<'PY'
import collections, json, sys
seen = collections.Counter()
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("level", 0) >= 40 and "cancelled" not in e["msg"]:
        seen[(e["msg"], e.get("status") or e.get("committed", ""))] += 1
for (msg, what), n in sorted(seen.items()):
    print(f"  logged {n} x {msg} {what}".rstrip())
PY
  kill $gw; wait $gw 2>/dev/null || true
  rm -f "$work/restart.log"
  pg_drop
done
