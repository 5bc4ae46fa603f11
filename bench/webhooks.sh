#!/usr/bin/env bash
# Webhook delivery throughput: COUNT events already in the outbox (written straight
# into the table, as the send path would have), then a gateway starts and delivers them
# to a local receiver that answers 200 at once; deliveries per second = COUNT / the
# time until none is left undelivered (and, beside it, the rate between the first and
# the last attempt, which leaves the process's start out). On SQLite and on PostgreSQL,
# in the same run.
#
#   bench/webhooks.sh        # needs python3 and psql
#   GW_BIN=/tmp/gateway-base bench/webhooks.sh    # another build, the same load
#
# The receiver is the bare Dropshot echo (server/examples/echo.rs) on loopback; the
# endpoint signs (HMAC-SHA256) every delivery; every attempt is logged in the store.
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${COUNT:-50000}
CONCURRENCY=${CONCURRENCY:-64}
. bench/common.sh
GW=${GW_BIN:-$BIN/gateway}
export GATEWAY_ALLOW_LOOPBACK_TARGETS=1


"$BIN/examples/echo" 127.0.0.1:18081 "$work/echo.log" & wait_port 18081

# The events: COUNT message.sent bodies for the demo instance, due now.
INSERT_SQL="WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $COUNT)
INSERT INTO outbox (customer_id, instance_id, event_type, payload, created_at, available_at)
SELECT :customer, :instance, 'message.sent',
  '{\"event\":\"message.sent\",\"instance_id\":\"' || :instance || '\",\"instance_name\":\"demo\",' ||
  '\"timestamp\":\"2026-11-21T10:00:00.000Z\",\"to\":\"+14155550123\",\"message_purpose\":\"transactional\",' ||
  '\"message_id\":\"SIM' || i || '\"}', 0, 0 FROM n"

run_case() { # name database_url port
  local name=$1 db=$2 port=$3
  local demo cus ins
  demo=$("$GW" --database-url "$db" demo)
  cus=$(echo "$demo" | python3 -c 'import json,sys; print(json.load(sys.stdin)["customer_id"])')
  ins=$(echo "$demo" | python3 -c 'import json,sys; print(json.load(sys.stdin)["instance_id"])')
  "$GW" --database-url "$db" webhook set --instance "$ins" --url http://127.0.0.1:18081/echo \
    --events all >/dev/null
  local sql=${INSERT_SQL//:customer/\'$cus\'}
  sql=${sql//:instance/\'$ins\'}
  if [ "$name" = sqlite ]; then
    python3 -c 'import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(sys.argv[2]); c.commit()' \
      "$work/bench.db" "$sql"
  else
    psql "${db}" -qc "$sql"
  fi
  local start
  start=$(date +%s.%N)
  GATEWAY_LOG_FILE="$work/$name.log" GATEWAY_WEBHOOKS__CONCURRENCY=$CONCURRENCY GATEWAY_WEBHOOKS__POLL_INTERVAL_MS=10 \
    "$GW" --database-url "$db" serve --listen 127.0.0.1:$port &
  local pid=$!
  python3 - "$name" "$db" "$work/bench.db" "$start" "$COUNT" <<'PY'
import subprocess, sqlite3, sys, time
name, db, path, start, count = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
def left():
    # Whether any is left, through the dispatcher's own index (outbox_pending): a count
    # read every undelivered row, 11 ms a poll at 50,000 on PostgreSQL, which took a
    # tenth of a core from the run it measured.
    q = "SELECT count(*) FROM (SELECT 1 FROM outbox WHERE delivered_at IS NULL ORDER BY available_at LIMIT 1) AS t"
    if name == "sqlite":
        c = sqlite3.connect(path, timeout=30)
        try:
            return c.execute(q).fetchone()[0]
        finally:
            c.close()
    return int(subprocess.check_output(["psql", db, "-tAc", q]).strip())
while left() > 0:
    time.sleep(0.05)
elapsed = time.time() - start
q = "SELECT count(*), min(attempted_at), max(attempted_at) FROM webhook_attempts WHERE succeeded = 1"
if name == "sqlite":
    ok, first, last = sqlite3.connect(path).execute(q).fetchone()
else:
    ok, first, last = map(int, subprocess.check_output(["psql", db, "-tAc", q]).decode().strip().split("|"))
print(f"### {name}: {count} events delivered in {elapsed:.2f} s (from process start): "
      f"{count / elapsed:,.0f} deliveries/s; successful attempts logged: {ok}; "
      f"from the first attempt to the last {(last - first) / 1000:.2f} s: {ok / max(last - first, 1) * 1000:,.0f}/s")
PY
  kill $pid; wait $pid 2>/dev/null || true
}

run_case sqlite "sqlite://$work/bench.db?mode=rwc" 18082
run_case postgres "$(pg_fresh)" 18083
pg_drop
