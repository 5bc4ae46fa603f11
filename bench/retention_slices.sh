#!/usr/bin/env bash
# Retention beside sends, in slices (issue 22, item 3): a store of ROWS
# (1,000,000) message-log rows over 90 days for 1,000 customers; each of ROUNDS (3)
# rounds offers 1,000 sends a second (open loop) in 3-second slices, three alone, then
# one after another for as long as `gateway retention run` deletes the log's oldest day;
# it prints each slice's p99 and how long retention took. A slice shows a stop that the
# p99 of a whole run dilutes (bench/retention.sh gives the whole run's quantiles).
#
#   bench/retention_slices.sh
#   STORE=postgres bench/retention_slices.sh     # a fresh database gw_bench, dropped after
#   GW_BIN=/tmp/base/gateway SCALE_BIN=/tmp/base/scale bench/retention_slices.sh
#
# GW_BIN: the gateway to measure; SCALE_BIN: the seeder (sdk-tests' `scale` example) of
# the same build. The seeder migrates the store as it opens it, so another build's
# gateway needs its own seeder, or it is measured on this checkout's schema.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-1000000}
ROUNDS=${ROUNDS:-3}
STORE=${STORE:-sqlite}
. bench/common.sh
cargo build --release -q -p gateway-sdk-tests --example scale
GW=${GW_BIN:-$BIN/gateway}
SCALE=${SCALE_BIN:-$BIN/examples/scale}
BODY='{"instance_id":"demo","phone":"+14155550123","message_purpose":"transactional","message":"Your code is 123456"}'
export GATEWAY_WEBHOOKS__RETENTION_DAYS=90 GATEWAY_RETENTION__CONTACTS_DAYS=365 GATEWAY_RETENTION__INBOUND_DAYS=90
case $STORE in
  sqlite) db="sqlite://$work/slices.db?mode=rwc" ;;
  postgres) db=$(pg_fresh); trap 'kill $(jobs -p) 2>/dev/null || true; pg_drop; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT ;;
  *) echo "STORE is sqlite or postgres" >&2; exit 2 ;;
esac
demo_tenant "$GW" "$db"
"$SCALE" seed "$db" "$ROWS" 1000 >/dev/null 2>&1
bench_gateway "$GW" "$db" 18099 2>/dev/null
url=http://127.0.0.1:18099/api/send-message
p99() { sed -n 's/.* p99 \([0-9.]*\) ms.*/\1/p'; }
slice() { API_KEY=$key "$BIN/examples/openloop" "$url" 1000 3 "$BODY" | p99; }
for round in $(seq 1 "$ROUNDS"); do
  alone=""; for _ in 1 2 3; do alone="$alone $(slice)"; done
  started=$(date +%s.%N)
  (GATEWAY_RETENTION__MESSAGE_LOG_DAYS=$((90 - round)) "$GW" --database-url "$db" retention run >/dev/null
    date +%s.%N > "$work/done") &
  retention=$! beside=""
  while kill -0 $retention 2>/dev/null; do beside="$beside $(slice)"; done
  wait $retention
  took=$(python3 -c "print(round($(cat "$work/done") - $started, 1))")
  echo "round $round: p99 (ms) alone:$alone | beside retention:$beside | retention took $took s"
done
kill %1; wait %1 2>/dev/null || true
