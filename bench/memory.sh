#!/usr/bin/env bash
# Resident memory of the release gateway (SQLite, simulator, the bundled policies, limits
# lifted): at rest, at its peak under wrk with CONNS connections (default 10,000) for
# 10 s of text sends, and 5 s after.
#
#   bench/memory.sh LABEL [ENV=VALUE ...]     # needs wrk (Debian)
#   bench/memory.sh arena2 MALLOC_ARENA_MAX=2
#   bench/memory.sh mimalloc LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2
set -u
cd "$(dirname "$0")/.."
cargo build --release -q -p gateway-server --bin gateway
CONNS=${CONNS:-10000}
label=$1; shift
w=$(mktemp -d)
db="sqlite://$w/g.db?mode=rwc"
BIN=${GW_BIN:-target/release/gateway}  # GW_BIN: another build to measure
out=$($BIN --database-url "$db" demo)
key=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["api_key"])')
cus=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["customer_id"])')
$BIN --database-url "$db" customer limits --customer "$cus" --daily 1000000000 --monthly 1000000000 --instance-per-minute 1000000000 --recipient-per-minute 1000000000 >/dev/null
ulimit -n 30000 2>/dev/null || true  # 10,000 connections need more than 1,024 descriptors
env "$@" GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE=$w/log $BIN --database-url "$db" serve --listen 127.0.0.1:18090 2>/dev/null &
pid=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/18090) 2>/dev/null && break; sleep 0.2; done
sleep 3
rest=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
API_KEY=$key wrk -t2 -c"$CONNS" -d10s -s bench/send.lua http://127.0.0.1:18090/api/send-message 2>&1 | grep -E "Requests/sec|Socket errors" | tr '\n' ' '
echo
hwm=$(awk '/VmHWM/ {print $2}' /proc/$pid/status)
sleep 5
after=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
echo "$label: rest $((rest/1024)) MiB, peak $((hwm/1024)) MiB, 5 s after $((after/1024)) MiB"
kill $pid; wait $pid 2>/dev/null
rm -rf $w
