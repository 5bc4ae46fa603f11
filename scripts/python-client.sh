#!/usr/bin/env bash
# The contract as a Python user meets it: generates a Python client from
# openapi/openapi.json with openapi-python-client and, through that client, against a
# real gateway, sends a text message and media messages (200), reads refusals (403
# policy denial with its details, 401 bad key, 404 unknown instance) and PBX events,
# and checks that the request bodies' model classes are named by the contract's titles
# (TextMessage, ImageMessage, ..., PbxTestEvent, ...; never SendMessageRequestType0).
# The checks: scripts/python_client_check.py. Exits non-zero on any failure, including
# any warning from the generator.
#
#   scripts/python-client.sh                # the gateway binary from target/debug (built if missing)
#   PYCLIENT_GATEWAY_BIN=path scripts/python-client.sh
#   scripts/python-client.sh --fresh-venv   # a new venv in the temporary directory
#
# Installs openapi-python-client from PyPI into a venv (target/python-client-venv, or
# PYTHON_CLIENT_VENV), exactly as scripts/requirements-python-client.txt pins it, starts
# the gateway on loopback on a fresh SQLite store in a temporary directory with the demo
# tenant (number aged past the warm-up) and a PBX integration, and stops it on exit,
# whatever happens. The generated client is written to the temporary directory and
# imported from there.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/python-harness.sh

REQUIREMENTS=scripts/requirements-python-client.txt
# not GATEWAY_*: the gateway reads those as configuration
BIN=${PYCLIENT_GATEWAY_BIN:-${CARGO_TARGET_DIR:-target}/debug/gateway}
fresh_venv=false
case "${1:-}" in
    "") ;;
    --fresh-venv) fresh_venv=true ;;
    *) echo "usage: scripts/python-client.sh [--fresh-venv]" >&2; exit 2 ;;
esac

work=$(mktemp -d -t gateway-python-client.XXXXXX)
server_pid=
check_pid=
cleanup() {
    if [ -n "$check_pid" ]; then kill "$check_pid" 2>/dev/null || true; fi
    stop_gateway "$server_pid"
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the interpreter ----
# openapi-python-client 0.29 and the code it generates need CPython 3.11 or later. The
# pins were made on 3.13, so: PYTHON_CLIENT_PYTHON if set, else the first of python3.13,
# pyenv's 3.13, python3.12, pyenv's 3.12 and python3 that is CPython 3.11 to 3.13 (the
# pip check below tells when the pins do not fit it).
pick_python python-client.sh "${PYTHON_CLIENT_PYTHON:-}" "3, 11, 0" || exit 1

# ---- openapi-python-client and everything it pulls in, pinned with hashes, from PyPI ----
# As scripts/schemathesis.sh does: every package at an exact version and every file
# checked against its sha256 (--require-hashes), nothing resolved at install time
# (--no-deps: the file lists the whole tree), wheels only (--only-binary: an sdist would
# run a build backend that nothing pins). The venv is rebuilt when the pinned file or
# the interpreter changes (a stamp in the venv records both), or with --fresh-venv.
if $fresh_venv; then
    VENV=$work/venv
else
    VENV=${PYTHON_CLIENT_VENV:-target/python-client-venv}
fi
case "$VENV" in /*) ;; *) VENV=$PWD/$VENV ;; esac
pinned_venv python-client.sh "$VENV" "$REQUIREMENTS" openapi-python-client || exit 1
echo "$("$VENV/bin/openapi-python-client" --version) on $("$VENV/bin/python" --version) ($PY)"

# ---- the Python client, from the committed contract ----
# The generator formats its output with ruff (pinned above; on PATH from the venv).
# --fail-on-warning: a schema it cannot read, or a part it skips, fails the run.
mkdir -p "$work/pkg"
if ! generated=$(PATH="$VENV/bin:$PATH" "$VENV/bin/openapi-python-client" generate \
        --path openapi/openapi.json --output-path "$work/pkg/gateway_client" --meta none \
        --fail-on-warning 2>&1); then
    echo "$generated" >&2
    echo "python-client.sh: openapi-python-client could not generate a clean client from openapi/openapi.json" >&2
    exit 1
fi

# ---- the gateway ----
# (as scripts/test leaves it after cargo test; built when missing. The checks compare
# the contract it serves with openapi/openapi.json, so a stale binary shows.)
if [ ! -x "$BIN" ]; then
    cargo build --quiet -p gateway-server --bin gateway
fi
mkdir -p target

export GATEWAY_DATABASE_URL="sqlite://$work/gateway.db?mode=rwc"
# Compiled policy modules are kept between runs (a restart does not recompile them).
export GATEWAY_POLICIES__CACHE_DIR="$PWD/target/python-client-policy-cache"
gw() { "$BIN" "$@"; }
field() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }

demo=$(gw demo)
customer=$(field customer_id <<<"$demo")
instance=$(field instance_id <<<"$demo")
instance_name=$(field instance_name <<<"$demo")
api_key=$(field api_key <<<"$demo")
gw customer modules --customer "$customer" --pbx on >/dev/null
gw instance age "$instance" --days 365 >/dev/null
pbx=$(gw pbx create --customer "$customer" --instance "$instance_name" --business-name "Python Client Dental")
integration=$(field integration_id <<<"$pbx")
pbx_secret=$(field webhook_secret <<<"$pbx")

start_gateway python-client.sh || exit 1

# ---- the checks, through the generated client ----
# In the background, so that a signal to this script is handled at once.
PYTHONPATH="$work/pkg" PYTHONDONTWRITEBYTECODE=1 \
    PYCLIENT_BASE_URL="http://127.0.0.1:$port" PYCLIENT_API_KEY="$api_key" \
    PYCLIENT_INSTANCE="$instance_name" PYCLIENT_PBX_INTEGRATION="$integration" \
    PYCLIENT_PBX_SECRET="$pbx_secret" PYCLIENT_CONTRACT=openapi/openapi.json \
    "$VENV/bin/python" scripts/python_client_check.py &
check_pid=$!
status=0
wait "$check_pid" || status=$?
check_pid=
if [ "$status" != 0 ]; then
    echo "python-client.sh: failed (exit $status); the gateway's last log lines:" >&2
    tail -n 20 "$work/gateway.log" >&2
fi
exit "$status"
