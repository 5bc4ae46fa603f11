# Shared by the bench scripts (sourced, from the repository root): release binaries
# (built first; NO_BUILD=1 measures the ones already built), a work directory removed at
# exit (kept with KEEP=1), the loopback port wait, and a fresh PostgreSQL database for a
# run.
PG_ADMIN=${PG_ADMIN:-postgres://postgres@127.0.0.1:5432/postgres}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p gateway-server --bin gateway --example echo --example openloop
BIN=target/release
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

wait_port() { for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; return 1; }

# Prints the URL of a new, empty database $1 (default gw_bench; dropped again by pg_drop
# with the same name).
pg_fresh() {
  local name=${1:-gw_bench}
  psql "$PG_ADMIN" -qc "DROP DATABASE IF EXISTS $name WITH (FORCE)" -c "CREATE DATABASE $name" >/dev/null 2>&1
  echo "${PG_ADMIN%/*}/$name"
}
pg_drop() { psql "$PG_ADMIN" -qc "DROP DATABASE IF EXISTS ${1:-gw_bench} WITH (FORCE)" >/dev/null 2>&1; }

# A demo tenant made by gateway binary $1 on database $2, its limits lifted so that quota
# and velocity never refuse; sets key (its API key) and cus (its customer id), which the
# caller declares local.
demo_tenant() {
  local out
  out=$("$1" --database-url "$2" demo)
  key=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["api_key"])')
  cus=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["customer_id"])')
  "$1" --database-url "$2" customer limits --customer "$cus" --daily 1000000000 --monthly 1000000000 \
    --instance-per-minute 1000000000 --recipient-per-minute 1000000000 >/dev/null
}

# Calls the caller's `run NAME DATABASE_URL PORT` for each store in STORES (sqlite,
# postgres): a SQLite file $1.db in the work directory on port $2, a fresh PostgreSQL
# database on port $3 (dropped after).
each_store() { # file_stem sqlite_port postgres_port
  local store
  for store in $STORES; do
    case $store in
      sqlite) run sqlite "sqlite://$work/$1.db?mode=rwc" "$2" ;;
      postgres) run postgres "$(pg_fresh)" "$3"; pg_drop ;;
    esac
  done
}

# CPU time (user and system, in clock ticks) of process $1, and of every PostgreSQL
# server process (0 where there are none); per_request TICKS REQ_PER_S gives µs a request
# over a run of DURATION seconds.
cpu_ticks() { awk '{print $14 + $15}' /proc/$1/stat; }
pg_ticks() {
  local total=0 f
  for f in /proc/[0-9]*/stat; do
    [ "$(awk '{print $2}' "$f" 2>/dev/null)" = "(postgres)" ] && total=$((total + $(awk '{print $14 + $15}' "$f" 2>/dev/null || echo 0)))
  done
  echo $total
}
per_request() { python3 -c "print(round($1 / $(getconf CLK_TCK) / ($2 * $DURATION) * 1e6))"; }

# The p99 of sends to URL with API_KEY at 1,000 req/s offered for DURATION s (the
# open-loop generator, server/examples/openloop.rs), and the latest its own pacing woke:
# a run the machine stalled. Prints "P ms (the pacer late by at most M ms)".
p99_at_1000() { # url api_key body
  API_KEY=$2 "$BIN/examples/openloop" "$1" 1000 "$DURATION" "$3" |
    awk '{for (i = 1; i < NF; i++) if ($i == "p99") p = $(i + 1); print p, "ms (the pacer late by at most", $(NF - 1), "ms)"}'
}

# Starts gateway binary $1 on database $2 at 127.0.0.1:$3 as the send benchmarks run it:
# the purpose and content modules of policies/dist decide, the simulator's delivery
# reports are off, the log goes to the work directory. Waits for the port; the caller
# stops it (kill %1).
bench_gateway() { # binary database_url port
  mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"
  GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
    GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/gateway-$3.log" "$1" --database-url "$2" \
    serve --listen "127.0.0.1:$3" &
  wait_port "$3"
}

# Writes COUNT signed PBX `test` events to FILE for bench/pbx.lua, one a line: the
# timestamp, the HMAC-SHA256 signature with KEY, and a body of its own, so that every
# request is a new event (never a replay).
pbx_requests() { # file hmac_key count
  python3 - "$1" "$2" "$3" <<'PY'
import hashlib, hmac, sys, time
path, key, count = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
ts = str(int(time.time()))
with open(path, "w") as f:
    for i in range(count):
        body = '{"event_type":"test","conversation_id":"c%09d"}' % i
        sig = hmac.new(key, (ts + "." + body).encode(), hashlib.sha256).hexdigest()
        f.write(f"{ts} {sig} {body}\n")
PY
}

# Calls the caller's `one NAME BINARY` for BASE_BIN ("base") and this checkout's release
# build ("this"), ROUNDS times each, alternating which of the pair runs first.
alternate() {
  local round order build bin
  for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then order="base this"; else order="this base"; fi
    for build in $order; do
      bin=$BASE_BIN; [ "$build" = this ] && bin=$BIN/gateway
      one "$build" "$bin"
    done
  done
}
