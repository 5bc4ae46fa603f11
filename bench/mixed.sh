#!/usr/bin/env bash
# A mixed load on SQLite: keyed sends (bench/keyed.lua, a fresh Idempotency-Key each)
# and signed PBX `test` events (bench/pbx.lua) at once, 16 connections each, on one
# gateway; prints both rates, and with perf (linux-perf, as root) the writer thread's
# share of the gateway's CPU and the share of all of it spent compiling SQL statements
# (SQLite's parser and code generator, self time).
#
#   bench/mixed.sh                          # needs wrk and linux-perf (Debian)
#   for b in /tmp/base /tmp/new /tmp/base /tmp/new; do GW_BIN=$b bench/mixed.sh; done
#
# GW_BIN: the gateway binary to measure (default: this checkout's release build).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
. bench/common.sh
GW=${GW_BIN:-$BIN/gateway}
db="sqlite://$work/mixed.db?mode=rwc"
demo_tenant "$GW" "$db"
"$GW" --database-url "$db" customer modules --customer "$cus" --pbx on >/dev/null
pbx=$("$GW" --database-url "$db" pbx create --customer "$cus" --instance demo --hmac)
field() { echo "$pbx" | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
id=$(field integration_id) secret=$(field webhook_secret) hmac_key=$(field hmac_secret)
"$GW" --database-url "$db" pbx set --integration "$id" --rate-per-minute 60000 --burst 1000000000 >/dev/null
pbx_requests "$work/requests.txt" "$hmac_key" 400000
bench_gateway "$GW" "$db" 18096
pid=$(pgrep -n -f "serve --listen 127.0.0.1:18096")
API_KEY=$key wrk -t1 -c16 -d${DURATION}s -s bench/keyed.lua http://127.0.0.1:18096/api/send-message >"$work/sends.txt" &
sends=$!
REQUESTS="$work/requests.txt" SECRET="$secret" INTEGRATION="$id" \
  wrk -t1 -c16 -d${DURATION}s -s bench/pbx.lua http://127.0.0.1:18096 >"$work/pbx.txt" &
events=$!
sleep 3
perf record -q -F 999 -p "$pid" -o "$work/mixed.perf" -- sleep 5 >/dev/null 2>&1
wait $sends $events
rate() { awk '/Requests\/sec/ {print $2}' "$1"; }
echo "keyed sends $(rate "$work/sends.txt") req/s, PBX events $(rate "$work/pbx.txt") req/s"
perf report -q -i "$work/mixed.perf" --no-children --sort comm,symbol 2>/dev/null | awk '
  $2 == "sqlite-writer" { gsub("%", "", $1); writer += $1
    if ($4 ~ /^(yy_reduce|sqlite3(RunParser|GetToken|Prepare|LockAndPrepare|FinishCoding|Select|Insert|Update|DeleteFrom|Upsert|WhereBegin|WhereEnd|Resolve|Expr|Code|VdbeMakeReady|VdbeAdd|VdbeChange|VdbeResolve|Walk|Locate|SrcList|IdList|Parser))/) compile += $1 }
  END { printf "the writer: %.1f %% of the gateway'"'"'s CPU; compiling statements: %.2f %%\n", writer, compile }'
