#!/usr/bin/env bash
# Fuzzing, bounded: every cargo-fuzz target (fuzz/fuzz_targets) for FUZZ_SECONDS each
# (default 20), on the stable toolchain, starting from its committed seed corpus
# (fuzz/corpus/TARGET; the policy loader also from the bundled modules). New inputs go
# to a scratch directory; a crash, timeout or out-of-memory fails the run and leaves
# the input in fuzz/artifacts/TARGET/ (make it a regression test, fix, add it to the
# seeds).
#
#   scripts/fuzz.sh                    # every target, 20 s each
#   FUZZ_SECONDS=600 scripts/fuzz.sh media phone
#
# Stable Rust: no sanitizer (-s none, which needs no -Z flag), and
# -max-loads-per-memcmp=0 so that short string comparisons stay visible to libFuzzer.
# Debug assertions and overflow checks are on (--dev, also the quicker build).
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION =="
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --quiet
fi
export RUSTFLAGS="${RUSTFLAGS:-} -Cllvm-args=-max-loads-per-memcmp=0"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list --fuzz-dir fuzz)
fi
echo "== fuzz: building ${#targets[@]} targets =="
cargo fuzz build --fuzz-dir fuzz -s none --dev
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for target in "${targets[@]}"; do
  mkdir -p "$scratch/$target" "fuzz/artifacts/$target"
  seeds=("fuzz/corpus/$target")
  [ "$target" = policy_module ] && seeds+=(policies/dist)
  echo "== fuzz: $target for ${FUZZ_SECONDS}s =="
  status=0
  cargo fuzz run --fuzz-dir fuzz -s none --dev "$target" "$scratch/$target" "${seeds[@]}" -- \
    -max_total_time="$FUZZ_SECONDS" -timeout=20 -rss_limit_mb=3072 -print_final_stats=1 \
    -artifact_prefix="fuzz/artifacts/$target/" >"$scratch/$target.log" 2>&1 || status=$?
  grep -E "^(#|stat::number_of_executed_units|stat::new_units_added|==|SUMMARY|Done)" "$scratch/$target.log" | tail -4 || true
  if [ "$status" != 0 ]; then
    # What failed, with the input: the panic and its message, not only libFuzzer's summary.
    grep -E -A3 "panicked at|ERROR: libFuzzer|^error|Test unit written|^Base64:" "$scratch/$target.log" | head -40 >&2 || true
    echo "fuzz: $target failed (exit $status); the input is in fuzz/artifacts/$target/" >&2
    exit "$status"
  fi
done
