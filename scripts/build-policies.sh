#!/usr/bin/env bash
# Builds the default policies (policies/{purpose,content,pacing}) from source into the
# components the gateway embeds (policies/dist/*.wasm), each with its fixtures, and
# runs every fixture file in the real sandbox.
#
#   scripts/build-policies.sh           build, test, and write policies/dist/
#   scripts/build-policies.sh --check   build and test; fail if policies/dist/ differs
#                                       from what the sources build (CI runs this)
#
# Toolchain: a normal machine needs `rustup target add wasm32-unknown-unknown` once.
# Where rustup has no wasm32 target (this project's CI machines), Debian's rustc-web,
# cargo-web, rust-web-src and lld build it with -Zbuild-std (installed here when
# missing and running as root). Paths are remapped so the bytes do not depend on
# where the checkout or the cargo home is: the same toolchain builds the same files.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mode=${1:-write}
policies=(purpose content pacing)

flags="-C link-arg=-zstack-size=65536 --remap-path-prefix=$root/policies=/policies"
flags+=" --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo"
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="$flags"

echo "== policies: native tests (rules and fixtures) =="
(cd policies && cargo test --quiet)

echo "== policies: wasm32 build =="
if rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  toolchain="rustup $(rustc --version)"
  (cd policies && cargo build --release --target wasm32-unknown-unknown)
else
  if ! { [ -x /usr/bin/rustc ] && [ -d /usr/lib/rustlib/src/rust/library ] && command -v wasm-ld >/dev/null; }; then
    if [ "$(id -u)" != 0 ]; then
      echo "no wasm32 toolchain: run 'rustup target add wasm32-unknown-unknown', or as root" \
           "'apt-get install rustc-web cargo-web rust-web-src lld'" >&2
      exit 1
    fi
    echo "installing Debian's rustc-web, cargo-web, rust-web-src and lld"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rustc-web cargo-web rust-web-src lld >/dev/null
  fi
  toolchain="debian $(/usr/bin/rustc --version)"
  (cd policies && RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=wasm-ld \
    /usr/bin/cargo build --release --target wasm32-unknown-unknown -Zbuild-std=std,panic_abort)
fi

echo "== gateway (for 'gateway policy build' and 'policy test') =="
cargo test --workspace --no-run --quiet
gateway=$root/target/debug/gateway

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for p in "${policies[@]}"; do
  echo "== $p =="
  GATEWAY_POLICIES__CACHE_DIR= "$gateway" policy build "policies/target/wasm32-unknown-unknown/release/policy_$p.wasm" \
    --fixtures "policies/$p/fixtures.json" -o "$out/$p.wasm" >"$out/$p.json"
  GATEWAY_POLICIES__CACHE_DIR= "$gateway" policy test "$out/$p.wasm" "policies/$p/fixtures.json" | tail -n 1
done

if [ "$mode" = "--check" ]; then
  stale=()
  for p in "${policies[@]}"; do
    cmp -s "$out/$p.wasm" "policies/dist/$p.wasm" || stale+=("$p")
  done
  if [ ${#stale[@]} -gt 0 ]; then
    recorded=$(cat policies/dist/TOOLCHAIN 2>/dev/null || echo unknown)
    if [ "$recorded" != "$toolchain" ]; then
      echo "note: policies/dist/ was built with '$recorded', this machine has '$toolchain';" \
           "the bytes differ (${stale[*]}) but every fixture passed on the fresh build" >&2
      exit 0
    fi
    echo "policies/dist/ is stale for: ${stale[*]} (run scripts/build-policies.sh and commit)" >&2
    exit 1
  fi
  echo "policies/dist/ matches the sources"
else
  mkdir -p policies/dist
  for p in "${policies[@]}"; do cp "$out/$p.wasm" "policies/dist/$p.wasm"; done
  echo "$toolchain" > policies/dist/TOOLCHAIN
  echo "wrote policies/dist/ (${policies[*]}) with $toolchain"
fi
