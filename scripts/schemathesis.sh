#!/usr/bin/env bash
# Schemathesis against the contract a running gateway serves (GET /openapi.json), both
# operations, every check; exits non-zero on any failure. Configuration and the listed
# allowance: schemathesis.toml (and the check in scripts/schemathesis_hooks.py).
#
#   scripts/schemathesis.sh            # the gateway binary from target/debug (built if missing)
#   ST_GATEWAY_BIN=path ST_SEED=7 scripts/schemathesis.sh
#   scripts/schemathesis.sh --fresh-venv   # a new venv in the temporary directory (scripts/test)
#
# Installs Schemathesis from PyPI into a venv (target/schemathesis-venv, or
# SCHEMATHESIS_VENV), exactly as scripts/requirements-schemathesis.txt pins it, starts the
# gateway on a fresh SQLite store in a temporary directory with a demo tenant (limits
# raised so quotas do not interfere, number aged past the warm-up) and a PBX integration
# (no HMAC, a template for every call event, no cooldown, no rate limit in reach), and
# stops it on exit, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/python-harness.sh

REQUIREMENTS=scripts/requirements-schemathesis.txt
BIN=${ST_GATEWAY_BIN:-target/debug/gateway}  # not GATEWAY_*: the gateway reads those as configuration
fresh_venv=false
case "${1:-}" in
    "") ;;
    --fresh-venv) fresh_venv=true ;;
    *) echo "usage: scripts/schemathesis.sh [--fresh-venv]" >&2; exit 2 ;;
esac

work=$(mktemp -d -t gateway-schemathesis.XXXXXX)
server_pid=
st_pid=
cleanup() {
    if [ -n "$st_pid" ]; then kill "$st_pid" 2>/dev/null || true; fi
    stop_gateway "$server_pid"
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the interpreter ----
# Not CPython 3.11 before 3.11.8: there ast.parse kept its recursion depth in state that
# every thread shared, and a garbage collection in the middle of one thread's parse could
# let another thread's parse change it, so a parse failed with "SystemError: AST
# constructor recursion depth mismatch" (python/cpython#106905; fixed in 3.11.8 and
# 3.12.2 by a depth per parse, which 3.13 has from the start; 3.12 collects garbage at
# other points and does not hit it). Schemathesis generates on two threads (workers =
# 2), and in the coverage phase it filters Hypothesis strategies with lambdas, which
# Hypothesis describes by parsing the whole file the lambda is in (lambda_sources.py;
# Schemathesis's coverage/_schema.py, 216 kB): on 3.11.7, with these pins, 2 runs of 10
# failed that way, in the PBX operation's coverage phase. pyenv's python3 on these
# machines is 3.11.7 and Debian 12's python3 is 3.11.2, both affected; the machines'
# pyenv also has 3.13.0 (and 3.12.1). So: SCHEMATHESIS_PYTHON if set, else the first of
# python3.13, pyenv's 3.13, python3.12, pyenv's 3.12 and python3 that is CPython 3.11.8
# or later, below 3.14 (the pins were made on 3.13 and run on 3.13 and 3.12; the pip
# check below tells when they do not fit another).
pick_python schemathesis.sh "${SCHEMATHESIS_PYTHON:-}" "3, 11, 8" || exit 1

# ---- Schemathesis and everything it pulls in, pinned with hashes, from PyPI ----
# Every package at an exact version and every file checked against its sha256
# (--require-hashes), nothing resolved at install time (--no-deps: the file lists the
# whole tree), and wheels only (--only-binary: an sdist would run a build backend that
# nothing pins). The venv is rebuilt when the pinned file or the interpreter changes (a
# stamp in the venv records both), or with --fresh-venv (scripts/test runs this twice
# that way, so that a failure that comes and goes shows).
if $fresh_venv; then
    VENV=$work/venv
else
    VENV=${SCHEMATHESIS_VENV:-target/schemathesis-venv}
fi
pinned_venv schemathesis.sh "$VENV" "$REQUIREMENTS" st || exit 1
echo "$("$VENV/bin/st" --version) on $("$VENV/bin/python" --version) ($PY)"

# ---- the gateway ----
if [ ! -x "$BIN" ]; then
    cargo build --quiet -p gateway-server --bin gateway
fi
mkdir -p target

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

start_gateway schemathesis.sh || exit 1

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
