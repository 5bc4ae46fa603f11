#!/usr/bin/env bash
# What a SQLite send writes: the gateway's bytes written and write calls a send (from
# /proc: the HTTP answers' few hundred bytes and the log file's lines included), and the
# pages each commit of the writer put in the WAL, by table and index
# (bench/wal_pages.py). Neither moves with the machine's speed, as req/s does: a change
# to what a send writes is measured here.
#
#   bench/wal_pages.sh                          # needs wrk (Debian)
#   SCRIPT=bench/keyed.lua bench/wal_pages.sh   # a fresh Idempotency-Key on every send
#   GW_BIN=/tmp/other/gateway NO_BUILD=1 bench/wal_pages.sh
#
# The load of bench/run.sh (wrk -t1 -c32, a text send, the purpose and content modules,
# limits lifted) on a fresh store, read from 1 s in to DURATION s; then the gateway is
# killed (-9), so the WAL holds the commits since its last checkpoint, and a copy of the
# store is read.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-4}
SCRIPT=${SCRIPT:-bench/send.lua}
. bench/common.sh
GW=${GW_BIN:-$BIN/gateway}
io() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/io"; }
db="sqlite://$work/wal.db?mode=rwc"
demo_tenant "$GW" "$db"
GATEWAY_METRICS_LISTEN=127.0.0.1:18197 bench_gateway "$GW" "$db" 18097
pid=$!
API_KEY=$key wrk -t1 -c32 -d$((DURATION + 2))s -s "$SCRIPT" "http://127.0.0.1:18097/api/send-message" > /dev/null &
sleep 1
n0=$(curl -s http://127.0.0.1:18197/metrics | awk '/^gateway_http_request_duration_seconds_count\{route="\/api\/send-message"\}/ {print $2}')
w0=$(io $pid wchar) c0=$(io $pid syscw)
sleep $((DURATION - 1))
n1=$(curl -s http://127.0.0.1:18197/metrics | awk '/^gateway_http_request_duration_seconds_count\{route="\/api\/send-message"\}/ {print $2}')
w1=$(io $pid wchar) c1=$(io $pid syscw)
kill -9 $pid
wait $pid 2>/dev/null || true
cp "$work/wal.db" "$work/copy.db"
cp "$work/wal.db-wal" "$work/copy.db-wal"
[ -n "$n0" ] && [ -n "$n1" ] && [ "${n1%.*}" -gt "${n0%.*}" ] || { echo "no sends counted ($n0, $n1)" >&2; exit 1; }
python3 -c "n = $n1 - $n0; print(f'{n:.0f} sends: {($w1 - $w0) / n:.0f} bytes written and {($c1 - $c0) / n:.2f} write calls a send')"
python3 bench/wal_pages.py "$work/copy.db"
