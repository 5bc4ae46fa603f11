#!/usr/bin/env bash
# What PostgreSQL spends on the send path's read, alone and in batches: pgbench runs
# the gateway's own statement (taken from PostgreSQL's log while this build sends once)
# against a demo tenant, as the read of one send (-c CLIENTS at once) and as the batch
# form over N sends (SEND_BATCH_SQL: json_to_recordset of N rows, the read LATERAL for
# each), 8 s each. It prints the machine's busy CPU a read (from /proc/stat: PostgreSQL,
# pgbench and anything else running) and pgbench's own.
#
#   bench/pg_read_batch.sh          # as root (reads PostgreSQL's log); needs pgbench
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
LOG=${PG_LOG:-/var/log/postgresql/postgresql-15-main.log}
db=$(pg_fresh)
trap 'kill $(jobs -p) 2>/dev/null || true; pg_drop; rm -rf "$work"' EXIT
demo_tenant "$BIN/gateway" "$db"
body='{"instance_id":"demo","phone":"+14155550123","message_purpose":"transactional","message":"Your code is 123456"}'
psql "$db" -qc "ALTER DATABASE gw_bench SET log_min_duration_statement = 0"
from=$(($(wc -l <"$LOG") + 1))
GATEWAY_LOG_FILE="$work/gateway.log" "$BIN/gateway" --database-url "$db" serve --listen 127.0.0.1:18095 &
wait_port 18095
for _ in 1 2 3; do # the first resolves "demo" by name; the next read by the id the cache kept
  curl -s -o /dev/null -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "$body" \
    http://127.0.0.1:18095/api/send-message
done
kill %1; wait %1 2>/dev/null || true
psql "$db" -qc "ALTER DATABASE gw_bench RESET log_min_duration_statement"
sql=$(tail -n +"$from" "$LOG" | grep -o 'execute [^:]*: SELECT c\.id.*AND i\.id = \$2 LEFT JOIN.*' | head -1 | sed 's/^execute [^:]*: //')
[ -n "$sql" ] || { echo "the read of one send is not in $LOG" >&2; exit 1; }
ids=$(psql "$db" -Atc "SELECT c.id, i.id, k.id FROM customers c JOIN instances i ON i.customer_id = c.id \
  JOIN api_keys k ON k.customer_id = c.id LIMIT 1")
python3 - "$work" "$ids" "$sql" <<'PY'
import json, re, sys, time
work, ids, sql = sys.argv[1:]
cus, ins, key = ids.split("|")
now = int(time.time() * 1000)
hour = now - now % 3_600_000
day = now - now % 86_400_000
values = {1: f"'{cus}'", 2: f"'{ins}'", 3: "'+14155550123'", 4: str(day), 5: str(hour - 23 * 3_600_000),
          6: "'iday:'", 7: "'r24:'", 8: "'inew:'", 9: str(hour), 10: f"'{key}'"}
open(f"{work}/one.sql", "w").write(re.sub(r"\$(\d+)", lambda m: values[int(m.group(1))], sql) + ";\n")
# The batch form as store::send_context builds it: each parameter a column of q, the
# key's row joined (an unkeyed send's idem is null).
cols = {1: "q.cus", 2: "q.ins", 3: "q.phone", 4: "q.day_start", 5: "q.since", 9: "q.hour_start", 10: "q.api_key"}
inner = re.sub(r"\$(\d+)", lambda m: cols.get(int(m.group(1)), values[int(m.group(1))]), sql)
inner = inner.replace("CAST(NULL AS TEXT) AS ik_request_hash", ", ".join(
    f"ik.{c} AS ik_{c}" for c in
    ["request_hash", "lease_until", "log_id", "response_status", "response_body", "created_at", "owner_lease"]))
inner = inner.replace("k.phone = q.phone", "k.phone = q.phone LEFT JOIN idempotency_keys ik ON ik.idem_key = q.idem "
                      "AND ik.customer_id = c.id AND ik.expires_at > q.at", 1)
for n in (2, 4, 8, 16):
    rows = [dict(n=i, cus=cus, ins=ins, phone="+14155550123", api_key=key, idem=None, day_start=day,
                 since=hour - 23 * 3_600_000, hour_start=hour, at=now) for i in range(n)]
    batch = (f"SELECT q.n, r.* FROM json_to_recordset('{json.dumps(rows)}'::json) AS q(n BIGINT, cus TEXT, "
             "ins TEXT, phone TEXT, api_key TEXT, idem TEXT, day_start BIGINT, since BIGINT, hour_start BIGINT, "
             f"at BIGINT) CROSS JOIN LATERAL ({inner}) r;\n")
    open(f"{work}/batch{n}.sql", "w").write(batch)
PY
busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
run() { # label file clients reads_a_call
  local a b out
  a=$(busy)
  out=$( { /usr/bin/time -f "%U %S" pgbench -n -M prepared -c "$3" -j 1 -T 8 -f "$2" "$db" 2>&1; } )
  b=$(busy)
  python3 - "$1" "$3" "$4" "$((b - a))" "$(getconf CLK_TCK)" "$out" <<'PY'
import re, sys
label, clients, per, busy, hz, out = sys.argv[1:]
calls = int(re.search(r"actually processed: (\d+)", out).group(1))
reads = calls * int(per)
user, system = map(float, out.strip().splitlines()[-1].split())
print(f"{label:28} {clients:>2} clients  {reads / 8:8.0f} reads a second  "
      f"machine {int(busy) * 1e6 / int(hz) / reads:6.1f} us a read  pgbench {(user + system) * 1e6 / reads:5.1f}")
PY
}
run "the read of one send" "$work/one.sql" 1 1
run "the read of one send" "$work/one.sql" 8 1
run "the read of one send" "$work/one.sql" 32 1
for n in 2 4 8 16; do run "a batch of $n" "$work/batch$n.sql" 4 "$n"; done
