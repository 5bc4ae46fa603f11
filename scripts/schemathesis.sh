#!/usr/bin/env bash
# Schemathesis against the contract a running gateway serves (GET /openapi.json), both
# operations, every check; exits non-zero on any failure. Configuration and the listed
# allowance: schemathesis.toml (and the check in scripts/schemathesis_hooks.py).
#
#   scripts/schemathesis.sh            # the gateway binary from target/debug (built if missing)
#   ST_GATEWAY_BIN=path ST_SEED=7 scripts/schemathesis.sh
#
# Installs Schemathesis from PyPI into a venv (target/schemathesis-venv), starts the
# gateway on a fresh SQLite store in a temporary directory with a demo tenant (limits
# raised so quotas do not interfere, number aged past the warm-up) and a PBX integration
# (no HMAC, a template for every call event, no cooldown, no rate limit in reach), and
# stops it on exit, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
VENV=${SCHEMATHESIS_VENV:-target/schemathesis-venv}
BIN=${ST_GATEWAY_BIN:-target/debug/gateway}  # not GATEWAY_*: the gateway reads those as configuration

# ---- Schemathesis, pinned, from PyPI ----
if ! "$VENV/bin/st" --version 2>/dev/null | grep -qx "st, version $SCHEMATHESIS_VERSION"; then
    rm -rf "$VENV"
    if ! python3 -m venv "$VENV" 2>/dev/null; then
        # Debian's python3 has no venv module until python3-venv is installed.
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
            rm -rf "$VENV"
            python3 -m venv "$VENV"
        else
            echo "schemathesis.sh: python3 cannot make a venv (Debian: apt-get install python3-venv)" >&2
            exit 1
        fi
    fi
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi
"$VENV/bin/st" --version

# ---- the gateway ----
if [ ! -x "$BIN" ]; then
    cargo build --quiet -p gateway-server --bin gateway
fi
mkdir -p target
work=$(mktemp -d -t gateway-schemathesis.XXXXXX)
server_pid=
st_pid=
cleanup() {
    if [ -n "$st_pid" ]; then kill "$st_pid" 2>/dev/null || true; fi
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill "$server_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export GATEWAY_DATABASE_URL="sqlite://$work/gateway.db?mode=rwc"
# Compiled policy modules are kept between runs (a restart does not recompile them).
export GATEWAY_POLICIES__CACHE_DIR="$PWD/target/schemathesis-policy-cache"
# Reviews never pause the instance (423 would hide every later answer).
export GATEWAY_POLICIES__REVIEW_PAUSE_THRESHOLD=1000
gw() { "$BIN" "$@"; }
field() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }

demo=$(gw demo)
customer=$(field customer_id <<<"$demo")
instance=$(field instance_id <<<"$demo")
api_key=$(field api_key <<<"$demo")
gw customer limits --customer "$customer" --daily 1000000000 --monthly 1000000000 \
    --instance-per-minute 1000000000 --recipient-per-minute 1000000000 >/dev/null
gw customer modules --customer "$customer" --pbx on >/dev/null
gw instance age "$instance" --days 365 >/dev/null
pbx=$(gw pbx create --customer "$customer" --instance demo --business-name "Schemathesis Dental")
integration=$(field integration_id <<<"$pbx")
# schemathesis.toml names it (a fresh store's first integration).
[ "$integration" = 1 ] || { echo "schemathesis.sh: expected integration 1, got $integration" >&2; exit 1; }
pbx_secret=$(field webhook_secret <<<"$pbx")
gw pbx set --integration "$integration" --rate-per-minute 60000 --burst 1000000000 --cooldown-minutes 0 >/dev/null
for event in missed_call voicemail after_hours queue_callback call_started call_ended queue_event inbound_reply; do
    gw pbx template set --integration "$integration" --event "$event" \
        --text "{{business_name}}: about your call at {{call_time}}, we will call you back." >/dev/null
done

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$BIN" serve --listen "127.0.0.1:$port" >"$work/serve.out" 2>"$work/gateway.log" &  # not through gw(): $! must be the gateway
server_pid=$!
# Up to 60 s: a first start compiles the policy modules.
ready() { python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
    "http://127.0.0.1:$port/openapi.json" 2>/dev/null; }
for _ in $(seq 300); do
    ready && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.2
done
if ! ready; then
    tail -n 20 "$work/gateway.log" >&2
    echo "schemathesis.sh: the gateway did not start" >&2
    exit 1
fi

# ---- Schemathesis ----
# In the background, so that a signal to this script is handled at once (the EXIT trap
# stops Schemathesis and the gateway). Hypothesis keeps its caches in the temporary
# directory, not in the work tree.
ST_GATEWAY_API_KEY=$api_key ST_GATEWAY_PBX_SECRET=$pbx_secret \
    HYPOTHESIS_STORAGE_DIRECTORY="$work/hypothesis" \
    "$VENV/bin/st" --config-file schemathesis.toml run "http://127.0.0.1:$port/openapi.json" \
    --checks all --no-color ${ST_SEED:+--seed "$ST_SEED"} \
    --report junit --report-junit-path target/schemathesis-junit.xml &
st_pid=$!
status=0
wait "$st_pid" || status=$?
st_pid=
if [ "$status" != 0 ]; then
    echo "schemathesis.sh: failed (exit $status); the gateway's last log lines:" >&2
    tail -n 20 "$work/gateway.log" >&2
fi
exit "$status"
