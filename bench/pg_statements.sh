#!/usr/bin/env bash
# Where PostgreSQL's time goes under the load of bench/run.sh: pg_stat_statements after
# DURATION seconds of send-message (wrk -t1 -c32, a text send, purpose and content
# deciding, limits lifted), each statement's time per send. Statements inside the batch
# functions are listed too (toplevel = f). The times are wall times inside PostgreSQL
# (on a saturated machine they include waiting for a CPU), so read them beside a CPU
# profile; a statement whose time per call is far above its time alone is worth an
# EXPLAIN (a hash join where a keyed lookup was meant, for one).
#
# pg_stat_statements must be loaded by the server (this changes the cluster; as root):
#   psql -U postgres -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
#   pg_ctlcluster 15 main restart
#   psql -U postgres -c "ALTER SYSTEM SET pg_stat_statements.track = 'all'" -c "SELECT pg_reload_conf()"
# and afterwards: ALTER SYSTEM RESET shared_preload_libraries; ... track; restart.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
. bench/common.sh
if ! psql "$PG_ADMIN" -Atc "SHOW shared_preload_libraries" | grep -q pg_stat_statements; then
  sed -n '10,14p' "$0" >&2
  exit 1
fi
db=$(pg_fresh)
psql "$db" -qc "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
demo_tenant "$BIN/gateway" "$db"
mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"
GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
  GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/gateway.log" "$BIN/gateway" --database-url "$db" \
  serve --listen 127.0.0.1:18090 &
wait_port 18090
# Warm up (prepared statements, the plan cache, the policy modules), then count.
API_KEY=$key wrk -t1 -c32 -d2s -s bench/send.lua http://127.0.0.1:18090/api/send-message >/dev/null
psql "$db" -qAtc "SELECT pg_stat_statements_reset()" >/dev/null
before=$(psql "$db" -Atc "SELECT COALESCE(MAX(id), 0) FROM message_log")
API_KEY=$key wrk -t1 -c32 -d"${DURATION}"s -s bench/send.lua http://127.0.0.1:18090/api/send-message | grep Requests/sec
sends=$(( $(psql "$db" -Atc "SELECT MAX(id) FROM message_log") - before ))
echo "sends: $sends"
psql "$db" -c "SELECT calls, rows, round((total_exec_time * 1000 / $sends)::numeric, 1) AS us_a_send,
  round((total_exec_time * 1000 / greatest(calls, 1))::numeric, 1) AS us_a_call, wal_bytes / $sends AS wal_bytes_a_send,
  toplevel, left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS statement
  FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 16"
kill %1; wait %1 2>/dev/null || true
pg_drop
