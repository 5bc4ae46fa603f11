#!/usr/bin/env bash
# This gateway against another build (BASE_BIN), alternating which runs first, on a fresh
# store each run: send-message at saturation (wrk -t1 -c32, DURATION s, a text send, the
# purpose and content modules, limits lifted), or at an offered rate in open loop (OPEN
# req/s, server/examples/openloop.rs), with the CPU a send of each of the gateway's
# threads from /proc/<pid>/task (tokio-rt-worker, sqlite-writer, log, ...), on
# PostgreSQL of its server processes too, and the gateway's resident memory at the end.
#
#   BASE_BIN=/tmp/gateway-base ROUNDS=4 bench/thread_pairs.sh            # SQLite; needs wrk
#   BASE_BIN=... OPEN=1000 bench/thread_pairs.sh                         # 1,000 req/s, open loop
#   BASE_BIN=... STORE=postgres bench/thread_pairs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
STORE=${STORE:-sqlite}
SCRIPT=${SCRIPT:-bench/send.lua}
OPEN=${OPEN:-}
: "${BASE_BIN:?set BASE_BIN to the gateway binary to compare with}"
. bench/common.sh
BODY='{"instance_id":"demo","phone":"+14155550123","message_purpose":"transactional","message":"Your code is 123456"}'
URL=http://127.0.0.1:18098/api/send-message

threads() { # pid -> one line per thread name: "name ticks" (user and system)
  python3 - "$1" <<'PY'
import glob, re, sys
total = {}
for path in glob.glob(f"/proc/{sys.argv[1]}/task/*/stat"):
    try:
        s = open(path).read()
    except OSError:
        continue  # the thread ended meanwhile
    # The name is between the first "(" and the last ")"; utime and stime are the 12th
    # and 13th fields after it.
    name = re.sub(r"-[0-9]+$", "", s[s.index("(") + 1:s.rindex(")")]).replace(" ", "_")
    f = s[s.rindex(")") + 2:].split()
    total[name] = total.get(name, 0) + int(f[11]) + int(f[12])
for name, ticks in total.items():
    print(name, ticks)
PY
}

one() { # name binary
  local name=$1 bin=$2 key cus db pid rps t0 t1 p0 p1 rss
  case $STORE in
    sqlite) db="sqlite://$work/$name-$RANDOM.db?mode=rwc" ;;
    postgres) db=$(pg_fresh) ;;
  esac
  demo_tenant "$bin" "$db"
  bench_gateway "$bin" "$db" 18098 >/dev/null 2>&1
  pid=$!
  t0=$(threads "$pid"); p0=$(pg_ticks)
  if [ -n "$OPEN" ]; then
    echo "  $name: $(API_KEY=$key "$BIN/examples/openloop" "$URL" "$OPEN" "$DURATION" "$BODY")"
    rps=$OPEN
  else
    rps=$(API_KEY=$key wrk -t1 -c32 -d"${DURATION}"s -s "$SCRIPT" "$URL" | awk '/Requests\/sec/ {print $2}')
  fi
  t1=$(threads "$pid"); p1=$(pg_ticks)
  rss=$(awk '/^VmRSS/ {print int($2 / 1024)}' /proc/"$pid"/status)
  kill "$pid"; wait "$pid" 2>/dev/null || true
  [ "$STORE" = sqlite ] || pg_drop
  python3 - "$name" "$rps" "$DURATION" "$((p1 - p0))" "$(getconf CLK_TCK)" "$t0" "$t1" "$STORE" "$rss" <<'PY'
import sys
name, rps, duration, pg, hz, t0, t1, store, rss = sys.argv[1:]
sends, us = float(rps) * float(duration), 1e6 / int(hz)
before = {l.split()[0]: int(l.split()[1]) for l in t0.splitlines() if l.strip()}
per = {k: max(0, int(v) - before.get(k, 0)) * us / sends for k, v in (l.split() for l in t1.splitlines() if l.strip())}
parts = " ".join(f"{k} {v:.0f}" for k, v in sorted(per.items(), key=lambda x: -x[1]) if v >= 0.5)
pg_part = f"  postgres {int(pg) * us / sends:.0f}" if store == "postgres" else ""
print(f"{name:5} {float(rps):>8.0f} req/s  gateway {sum(per.values()):4.0f} us a send ({parts}){pg_part}  RSS {rss} MiB")
PY
}

alternate
