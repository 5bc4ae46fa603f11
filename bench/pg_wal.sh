#!/usr/bin/env bash
# What a send writes on PostgreSQL, by table and index: the WAL of RATE sends a second for
# DURATION seconds (the open-loop generator; a text send, purpose and content deciding,
# limits lifted, no webhook endpoint), read back with pg_waldump and divided by the
# sends. A count of records and bytes, not a time: it moves little from run to run, so it
# shows a change in the work a send does on a day when throughput is all noise.
#
#   bench/pg_wal.sh                          # RATE=700 DURATION=8
#   GW_BIN=/tmp/gateway-base bench/pg_wal.sh # another build
#
# Needs pg_waldump (Debian's postgresql package has it) and a server on this machine
# (it reads the server's pg_wal directory).
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-700}
DURATION=${DURATION:-8}
. bench/common.sh
GW=${GW_BIN:-$BIN/gateway}
WALDUMP=$(ls /usr/lib/postgresql/*/bin/pg_waldump | tail -1)
BODY='{"instance_id":"demo","phone":"+14155550123","message_purpose":"transactional","message":"Your code is 123456"}'
db=$(pg_fresh)
demo_tenant "$GW" "$db"
bench_gateway "$GW" "$db" 18091
url=http://127.0.0.1:18091/api/send-message
# Warm up (prepared statements, plans, the policy modules), then measure.
API_KEY=$key "$BIN/examples/openloop" "$url" "$RATE" 2 "$BODY" >/dev/null
start=$(psql "$PG_ADMIN" -Atc "SELECT pg_current_wal_lsn()")
before=$(psql "$db" -Atc "SELECT COALESCE(MAX(id), 0) FROM message_log")
API_KEY=$key "$BIN/examples/openloop" "$url" "$RATE" "$DURATION" "$BODY"
end=$(psql "$PG_ADMIN" -Atc "SELECT pg_current_wal_lsn()")
sends=$(( $(psql "$db" -Atc "SELECT MAX(id) FROM message_log") - before ))
psql "$db" -Atc "SELECT relfilenode, relname FROM pg_class WHERE relfilenode <> 0" > "$work/relations"
"$WALDUMP" -p "$(psql "$PG_ADMIN" -Atc "SHOW data_directory")/pg_wal" -s "$start" -e "$end" > "$work/wal" 2>/dev/null || true
echo "sends: $sends (WAL $start to $end)"
python3 - "$work/wal" "$work/relations" "$sends" <<'PY'
import collections, re, sys
names = dict(line.rstrip("\n").split("|", 1) for line in open(sys.argv[2]) if "|" in line)
sends = int(sys.argv[3])
rows = collections.defaultdict(lambda: [0, 0, 0])
for line in open(sys.argv[1]):
    size = re.search(r"len \(rec/tot\):\s*\d+/\s*(\d+)", line)
    if not size:
        continue
    rel = re.search(r"rel \d+/\d+/(\d+)", line)
    kind = re.search(r"rmgr: (\w+).*?desc: (\w+)", line)
    key = (names.get(rel.group(1), rel.group(1)) if rel else "-", f"{kind.group(1)} {kind.group(2)}" if kind else "?")
    rows[key][0] += 1
    rows[key][1] += int(size.group(1))
    rows[key][2] += "FPW" in line
total = sum(r[1] for r in rows.values())
print(f"{total / sends:,.0f} bytes and {sum(r[0] for r in rows.values()) / sends:.1f} records a send")
print(f"{'bytes a send':>12} {'records':>8} {'full pages':>10}  relation, record")
for (rel, kind), (n, size, fpw) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
    if size / sends >= 5:
        print(f"{size / sends:12,.0f} {n / sends:8.2f} {fpw:10d}  {rel}, {kind}")
PY
kill %1; wait %1 2>/dev/null || true
pg_drop
