# Shared by scripts/schemathesis.sh and scripts/python-client.sh (sourced, from the
# repository root): the interpreter, a venv installed exactly as a pinned file says, and
# a gateway started on loopback and stopped again.

# pick_python SCRIPT OVERRIDE MIN: sets PY to OVERRIDE if set, else to the first of
# python3.13, pyenv's 3.13, python3.12, pyenv's 3.12 and python3 that is CPython MIN
# ("3, 11, 8") or later, below 3.14 (the pins were made on 3.13; pip check tells when
# they do not fit another). Exits when none is.
pick_python() {
    local script=$1 override=$2 min=$3 candidate
    local pyenv_root=${PYENV_ROOT:-$HOME/.pyenv} candidates
    if [ -n "$override" ]; then
        candidates=("$override")
    else
        # (a glob that matches nothing, or a pyenv shim of a version not selected, fails
        # the check and is passed over)
        candidates=(python3.13 "$pyenv_root"/versions/3.13.*/bin/python3.13
            python3.12 "$pyenv_root"/versions/3.12.*/bin/python3.12 python3)
    fi
    PY=
    for candidate in "${candidates[@]}"; do
        if "$candidate" -c "import sys; v = sys.version_info[:3]; sys.exit(not (sys.implementation.name == 'cpython' and ($min) <= v < (3, 14)))" 2>/dev/null; then
            PY=$("$candidate" -c 'import sys; print(sys.executable)')
            return 0
        fi
    done
    echo "$script: none of ${candidates[*]} is CPython ${min//, /.} or later, below 3.14" >&2
    echo "  (python3 is $(python3 --version 2>&1))." >&2
    return 1
}

# pinned_venv SCRIPT VENV REQUIREMENTS PROBE: makes VENV with $PY and installs
# REQUIREMENTS into it: every package at an exact version and every file checked
# against its sha256 (--require-hashes), nothing resolved at install time (--no-deps:
# the file lists the whole tree), wheels only (--only-binary: an sdist would run a build
# backend that nothing pins). Kept while the pinned file and the interpreter are the
# same (a stamp in the venv records both) and VENV/bin/PROBE --version runs.
pinned_venv() {
    local script=$1 venv=$2 requirements=$3 probe=$4 stamp check
    stamp="$(sha256sum "$requirements" | cut -d' ' -f1) $PY $("$PY" -c 'import sys; print(sys.version.split()[0])')"
    if [ "$(cat "$venv/gateway-requirements.stamp" 2>/dev/null)" = "$stamp" ] \
            && "$venv/bin/$probe" --version >/dev/null 2>&1; then
        return 0
    fi
    rm -rf "$venv"
    if ! "$PY" -m venv "$venv" 2>/dev/null; then
        # Debian's python3 has no venv module until python3-venv is installed.
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
            rm -rf "$venv"
            "$PY" -m venv "$venv"
        else
            echo "$script: $PY cannot make a venv (Debian: apt-get install python3-venv)" >&2
            return 1
        fi
    fi
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        --require-hashes --no-deps --only-binary :all: -r "$requirements"
    # The pinned tree is whole and consistent for this interpreter.
    if ! check=$("$venv/bin/pip" check --disable-pip-version-check 2>&1); then
        echo "$script: $requirements does not fit $PY: $check" >&2
        return 1
    fi
    echo "$stamp" >"$venv/gateway-requirements.stamp"
}

# stop_gateway PID: TERM, up to 5 s to stop, then KILL.
stop_gateway() {
    local pid=$1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# start_gateway SCRIPT: runs "$BIN serve" on a free loopback port (its output in
# $work/serve.out and $work/gateway.log) and waits up to 60 s for it to answer (a first
# start compiles the policy modules); sets port and server_pid, the gateway's own pid.
start_gateway() {
    local script=$1
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$BIN" serve --listen "127.0.0.1:$port" >"$work/serve.out" 2>"$work/gateway.log" &
    server_pid=$!
    for _ in $(seq 300); do
        gateway_ready && return 0
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.2
    done
    gateway_ready && return 0
    tail -n 20 "$work/gateway.log" >&2
    echo "$script: the gateway did not start" >&2
    return 1
}
gateway_ready() {
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "http://127.0.0.1:$port/openapi.json" 2>/dev/null
}
