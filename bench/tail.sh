#!/usr/bin/env bash
# Where the p99 of send-message comes from at an offered RATE (default 1,000 req/s, open
# loop: server/examples/openloop.rs), on SQLite and on PostgreSQL: the generator's line;
# each stage's quantiles from the gateway's histograms (gateway_send_stage_seconds, the
# HTTP request's, and the store writer's batches, gateway_store_write_batch_seconds; each
# figure is the upper bound of the bucket the quantile falls in);
# and the stalls: runs of answers that took SLOW ms or more (default 8), each with when it
# began in the run, how long it lasted (from the first slow request's due time to the
# last one's answer) and how many requests it held.
#
#   bench/tail.sh                           # needs the release build (bench/common.sh)
#   RATE=500 STORES=sqlite DURATION=8 bench/tail.sh
#   TMPDIR=/dev/shm STORES=sqlite bench/tail.sh     # the SQLite file on tmpfs: no disk
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
RATE=${RATE:-1000}
SLOW=${SLOW:-8}
STORES=${STORES:-sqlite postgres}
. bench/common.sh
# (GW_BIN, not GATEWAY_BIN: the gateway reads every GATEWAY_ variable as its configuration)
GW=${GW_BIN:-$BIN/gateway}
BODY='{"instance_id":"demo","phone":"+14155550123","message_purpose":"transactional","message":"Your code is 123456"}'
mkdir -p "$work/policies" && cp policies/dist/purpose.wasm policies/dist/content.wasm "$work/policies/"

run() { # name database_url port
  local name=$1 db=$2 port=$3 mport=$(($3 + 100))
  local key cus url="http://127.0.0.1:$3/api/send-message"
  demo_tenant "$GW" "$db"
  GATEWAY_POLICIES__BUNDLED=false GATEWAY_POLICIES_DIR="$work/policies" GATEWAY_POLICIES__CACHE_DIR="$work/cache" \
    GATEWAY_SIMULATOR_STATUS_DELAY_MS=0 GATEWAY_LOG_FILE="$work/$name.log" GATEWAY_METRICS_LISTEN=127.0.0.1:$mport \
    "$GW" --database-url "$db" serve --listen 127.0.0.1:$port 2>/dev/null &
  wait_port $port
  API_KEY=$key "$BIN/examples/openloop" "$url" 200 2 "$BODY" >/dev/null
  curl -s "http://127.0.0.1:$mport/metrics" > "$work/before"
  echo "### $name: $(API_KEY=$key OPENLOOP_TRACE="$work/trace" "$BIN/examples/openloop" "$url" "$RATE" "$DURATION" "$BODY")"
  curl -s "http://127.0.0.1:$mport/metrics" > "$work/after"
  kill %1; wait %1 2>/dev/null || true
  python3 - "$work/before" "$work/after" "$work/trace" "$SLOW" <<'PY'
import re, sys

def buckets(path):
    out = {}
    for line in open(path):
        m = re.match(r'(gateway_send_stage_seconds|gateway_http_request_duration_seconds|gateway_store_write_batch_seconds)'
                     r'_bucket\{(.*)\} (\S+)', line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m[2]))
        if labels.get("route", "/api/send-message") != "/api/send-message":
            continue
        name = labels.get("stage", "batch" if m[1].startswith("gateway_store") else "http")
        out.setdefault(name, {})[float(labels["le"])] = float(m[3])
    return out

before, after = buckets(sys.argv[1]), buckets(sys.argv[2])
print("  stage      n       p50 ≤    p90 ≤    p99 ≤  p99.9 ≤    max ≤   (ms, bucket bounds)")
for stage in ["http", "handler", "auth", "schema", "read", "policies", "begin", "provider", "settle", "batch"]:
    if stage not in after:
        continue
    counts = {le: n - before.get(stage, {}).get(le, 0) for le, n in after[stage].items()}
    total = counts[float("inf")]
    if not total:
        continue
    def q(p):
        le = next(le for le in sorted(counts) if counts[le] >= p * total)
        return "inf" if le == float("inf") else f"{le * 1e3:g}"
    print(f"  {stage:9} {total:6.0f} " + " ".join(f"{q(p):>8}" for p in (0.5, 0.9, 0.99, 0.999, 1)))

slow = float(sys.argv[4])
runs = []
for line in open(sys.argv[3]):
    due, took = map(float, line.split())
    if took < slow:
        continue
    if runs and due - runs[-1]["last_due"] < 100:
        run = runs[-1]
        run["last_due"], run["end"], run["n"] = due, max(run["end"], due + took), run["n"] + 1
    else:
        runs.append({"start": due, "last_due": due, "end": due + took, "n": 1})
print(f"  stalls (answers of {slow:g} ms or more): {len(runs)}")
for r in runs:
    print(f"    at {r['start'] / 1e3:6.3f} s: {r['end'] - r['start']:5.1f} ms, {r['n']} requests")
PY
}

each_store tail 18095 18096
