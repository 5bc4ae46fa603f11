#!/usr/bin/env bash
# What PostgreSQL spends on the send path's writes, by batch size: pgbench runs the
# gateway's own batch function (gateway_send_ops) on a begin and a finish taken from
# PostgreSQL's log while this build sends three messages, as a cycle of N begins then the
# N finishes of the rows they wrote (N = SIZES), T seconds each, one client. It prints
# the machine's busy CPU a send (from /proc/stat: PostgreSQL, pgbench and anything else
# running) and, when pg_stat_statements is loaded (see bench/pg_statements.sh), each
# statement's time a call at the last size.
#
#   bench/pg_send_ops.sh                 # as root (reads PostgreSQL's log); needs pgbench
#   SIZES="8" T=8 bench/pg_send_ops.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
LOG=${PG_LOG:-/var/log/postgresql/postgresql-15-main.log}
SIZES=${SIZES:-1 4 8 16}
T=${T:-8}
db=$(pg_fresh)
trap 'kill $(jobs -p) 2>/dev/null || true; pg_drop; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
demo_tenant "$BIN/gateway" "$db"
psql "$db" -qc "ALTER DATABASE gw_bench SET log_min_duration_statement = 0"
from=$(($(wc -l <"$LOG") + 1))
bench_gateway "$BIN/gateway" "$db" 18094
body='{"instance_id":"demo","phone":"+14155550123","message_purpose":"transactional","message":"Your code is 123456"}'
for _ in 1 2 3; do # the last begin is that of a known contact, as under load
  curl -s -o /dev/null -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "$body" \
    http://127.0.0.1:18094/api/send-message
done
sleep 0.5
kill %1 2>/dev/null || true; wait %1 2>/dev/null || true
psql "$db" -qc "ALTER DATABASE gw_bench RESET log_min_duration_statement"
# The batch's ops are the last parameter of the writer's statement when it calls one
# function (a lone send's batches do).
tail -n +"$from" "$LOG" | grep -A2 'SELECT gateway_send_ops' | grep -o "\$4 = '.*'$" >"$work/ops.log" || true
python3 - "$work" "$SIZES" <<'PY'
import json, sys
work, sizes = sys.argv[1], sys.argv[2].split()
begin = finish = None
for line in open(f"{work}/ops.log"):
    for op in json.loads(line.strip()[len("$4 = '"):-1].replace("''", "'")):
        if op["op"] == "begin": begin = op
        if op["op"] == "finish": finish = op
if begin is None or finish is None:
    sys.exit("no begin or finish of gateway_send_ops in PostgreSQL's log")
q = lambda s: s.replace("'", "''")
seq = "currval(pg_get_serial_sequence('message_log', 'id'))"
for n in sizes:
    n = int(n)
    # The finishes name the rows the begins just drew (the sequence's last n); building
    # them is part of the measure, the same for any version of the function.
    open(f"{work}/cycle{n}.sql", "w").write(
        f"SELECT gateway_send_ops('{q(json.dumps([begin] * n))}'::jsonb);\n"
        f"SELECT gateway_send_ops((SELECT jsonb_agg(jsonb_set('{q(json.dumps(finish))}'::jsonb, '{{id}}', "
        f"to_jsonb(i)) ORDER BY i) FROM generate_series({seq} - {n - 1}, {seq}) i));\n")
PY
statements=$(psql "$db" -Atc "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'" 2>/dev/null || echo 0)
if [ "$statements" = 0 ] && psql "$PG_ADMIN" -Atc "SHOW shared_preload_libraries" | grep -q pg_stat_statements; then
  psql "$db" -qc "CREATE EXTENSION pg_stat_statements" && statements=1
fi
busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
for n in $SIZES; do
  [ "$statements" = 0 ] || psql "$db" -qAtc "SELECT pg_stat_statements_reset()" >/dev/null
  a=$(busy)
  if ! pgbench -n -c 1 -j 1 -T "$T" -f "$work/cycle$n.sql" "$db" >"$work/pgbench.out" 2>&1; then
    cat "$work/pgbench.out" >&2
    exit 1
  fi
  cycles=$(grep -o 'actually processed: [0-9]*' "$work/pgbench.out" | grep -o '[0-9]*$')
  b=$(busy)
  python3 -c "print(f'batches of $n: {$cycles / $T:7.0f} cycles a second, machine {($b - $a) * 1e6 / $(getconf CLK_TCK) / ($cycles * $n):6.1f} us a send')"
done
[ "$statements" = 0 ] || psql "$db" -c "SELECT calls, round((total_exec_time * 1000 / calls)::numeric, 1) AS us_a_call,
  toplevel, left(regexp_replace(query, '\s+', ' ', 'g'), 100) AS statement FROM pg_stat_statements
  WHERE calls > 10 ORDER BY total_exec_time DESC LIMIT 14"
