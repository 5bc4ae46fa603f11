#!/usr/bin/env bash
# The worked example of "Ship safely" (policies/README.md), run for real: a gateway on
# SQLite with the bundled modules, and the links module built from policies/links.
#
#   gateway policy build policies/target/wasm32-unknown-unknown/release/policy_links.wasm \
#     --fixtures policies/links/fixtures.json -o links.wasm
#   policies/links/example-run.sh links.wasm 2>&1 | tee run.log
#
# GATEWAY: the binary (target/debug/gateway); needs curl, jq and sqlite3.
set -u
MODULE=$(realpath "${1:?usage: example-run.sh LINKS.wasm}")
cd "$(dirname "$0")/../.."
G=$(realpath "${GATEWAY:-target/debug/gateway}")
DIR=$(mktemp -d)
URL="sqlite://$DIR/g.db?mode=rwc"
PORT=18480
METRICS=127.0.0.1:19464
echo "# dir $DIR"

# Prints a command, runs it, prints its exit code.
run() { echo; echo "\$ $*"; "$@"; echo "[exit $?]"; }

# One send; appends "phone<TAB>status<TAB>error<TAB>rule" to $DIR/sends.tsv.
send() {
  local phone=$1 text=$2 body code
  body=$(curl -s -o "$DIR/answer.json" -w '%{http_code}' -H "authorization: Bearer $KEY" \
    -H 'content-type: application/json' \
    -d "{\"instance_id\":\"demo\",\"phone\":\"$phone\",\"message_purpose\":\"transactional\",\"message\":\"$text\"}" \
    "http://127.0.0.1:$PORT/api/send-message")
  code=$(jq -r '[.error // "", .details.rule // ""] | @tsv' "$DIR/answer.json")
  printf '%s\t%s\t%s\n' "$phone" "$body" "$code" >> "$DIR/sends.tsv"
}

# Counts the answers of sends.tsv from line $1 on: status, error, rule.
tally() { echo "answers:"; tail -n +"$1" "$DIR/sends.tsv" | cut -f2- | sort | uniq -c; }

link()      { echo "Your order $1 has shipped. Track it: https://shop.example/track/$1"; }
plain()     { case $(( $1 % 3 )) in
                0) echo "Your order $1 has shipped and arrives Thursday." ;;
                1) echo "Hi, your appointment on Tuesday at 10:00 is confirmed (booking $1)." ;;
                2) echo "Your package $1 was delivered to the front desk." ;;
              esac; }
marketing() { if (( $1 % 2 )); then echo "Black Friday: 50% OFF everything, promo code BF50. Buy now!";
              else echo "Flash sale today only: 30% off all shoes, use code SHOES30"; fi; }

echo "## set up"
echo "\$ $G --database-url \"$URL\" demo"
DEMO=$($G --database-url "$URL" demo); echo "$DEMO"
KEY=$(echo "$DEMO" | jq -r .api_key); C=$(echo "$DEMO" | jq -r .customer_id); I=$(echo "$DEMO" | jq -r .instance_id)
run $G --database-url "$URL" customer limits --customer "$C" --daily 1000000 --monthly 1000000 \
    --instance-per-minute 1000000 --recipient-per-minute 1000000
# A number moved from elsewhere, past pacing's 7-day warm-up (10 new recipients on day 0).
run $G --database-url "$URL" instance age "$I" --days 30

echo; echo "\$ GATEWAY_LOG_FILE=$DIR/serve.log GATEWAY_METRICS_LISTEN=$METRICS $G --database-url \"$URL\" serve --listen 127.0.0.1:$PORT &"
GATEWAY_LOG_FILE=$DIR/serve.log GATEWAY_METRICS_LISTEN=$METRICS \
  $G --database-url "$URL" serve --listen 127.0.0.1:$PORT > "$DIR/serve.out" 2>&1 &
SERVER=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$PORT/health/ready" > /dev/null && break; sleep 0.2; done
run curl -s "http://127.0.0.1:$PORT/health/ready"

echo; echo "## traffic before the module: 200 sends to 100 recipients (+14155551000..099)"
: > "$DIR/sends.tsv"
# First message to each: 30 with a link, 60 without, 10 marketing texts.
for i in $(seq 0 99); do
  p=+1415555$((1000 + i)); n=$((5000 + i))
  if (( i < 30 )); then send "$p" "$(link $n)"
  elif (( i < 90 )); then send "$p" "$(plain $n)"
  else send "$p" "$(marketing $i)"; fi
done
# Second message: 60 with a link, 30 without, and a link to the 10 whose first was refused.
for i in $(seq 0 99); do
  p=+1415555$((1000 + i)); n=$((6000 + i))
  if (( i < 60 )); then send "$p" "$(link $n)"
  elif (( i < 90 )); then send "$p" "$(plain $n)"
  else send "$p" "$(link $n)"; fi
done
tally 1
sleep 1

echo; echo "## test, backtest"
run $G policy test "$MODULE" policies/links/fixtures.json
run $G --database-url "$URL" policy backtest "$MODULE" --since 1h
run $G --database-url "$URL" policy backtest "$MODULE" --since 1h --customer "$C" --limit 50

echo; echo "## shadow"
run $G --database-url "$URL" policy install "$MODULE" --shadow
run $G --database-url "$URL" policy list

echo; echo "## traffic with the shadow: 80 sends"
START=$(( $(wc -l < "$DIR/sends.tsv") + 1 ))
# 40 new recipients (+14155552000..039): 20 with a link, 20 without.
for i in $(seq 0 39); do
  p=+1415555$((2000 + i)); n=$((7000 + i))
  if (( i < 20 )); then send "$p" "$(link $n)"; else send "$p" "$(plain $n)"; fi
done
# 30 links to recipients already messaged, 10 marketing texts to them.
for i in $(seq 30 59); do send "+1415555$((1000 + i))" "$(link $((8000 + i)))"; done
for i in $(seq 60 69); do send "+1415555$((1000 + i))" "$(marketing $i)"; done
tally "$START"
sleep 1

run $G --database-url "$URL" policy shadow links --since 1h
echo; echo "\$ curl -s http://$METRICS/metrics | grep -E '^gateway_policy_(shadow_changes_total|inputs_dropped_total)'"
curl -s "http://$METRICS/metrics" | grep -E '^gateway_policy_(shadow_changes_total|inputs_dropped_total)'
echo; echo "\$ sqlite3 $DIR/g.db 'SELECT id, status, error_code, policy_trace FROM message_log ORDER BY id DESC LIMIT 1'"
sqlite3 "$DIR/g.db" 'SELECT id, status, error_code, policy_trace FROM message_log ORDER BY id DESC LIMIT 1'
echo; echo "\$ sqlite3 $DIR/g.db 'SELECT id, status, error_code, policy_trace FROM message_log WHERE recipient = \"+14155552000\"'"
sqlite3 "$DIR/g.db" "SELECT id, status, error_code, policy_trace FROM message_log WHERE recipient = '+14155552000'"

echo; echo "## promote"
run $G --database-url "$URL" policy promote links
START=$(( $(wc -l < "$DIR/sends.tsv") + 1 ))
send +14155553000 "$(link 9000)"
send +14155553001 "$(plain 9001)"
send +14155551000 "$(link 9002)"
tally "$START"
echo "last answer:"; cat "$DIR/answer.json"; echo

echo; echo "## canary of a new version"
run $G policy build "$MODULE" --version 1.1.0 -o "$DIR/links-1.1.wasm"
run $G --database-url "$URL" policy install "$DIR/links-1.1.wasm" --canary 10
run $G --database-url "$URL" policy list
START=$(( $(wc -l < "$DIR/sends.tsv") + 1 ))
for i in $(seq 0 19); do send "+1415555$((1000 + i))" "$(plain $((9100 + i)))"; done
tally "$START"
echo; echo "\$ sqlite3 $DIR/g.db \"SELECT COUNT(*), policy_trace LIKE '%\\\"mode\\\":\\\"canary\\\"%' FROM message_log WHERE id > (SELECT MAX(id) - 20 FROM message_log) GROUP BY 2\""
sqlite3 "$DIR/g.db" "SELECT COUNT(*), policy_trace LIKE '%\"mode\":\"canary\"%' FROM message_log WHERE id > (SELECT MAX(id) - 20 FROM message_log) GROUP BY 2"
echo "\$ sqlite3 $DIR/g.db \"SELECT id, policy_trace FROM message_log WHERE policy_trace LIKE '%canary%' LIMIT 1\""
sqlite3 "$DIR/g.db" "SELECT id, policy_trace FROM message_log WHERE policy_trace LIKE '%canary%' LIMIT 1"
run $G --database-url "$URL" policy rollback links

echo; echo "## scope"
run $G --database-url "$URL" policy install "$DIR/links-1.1.wasm" --customers "$C"
run $G --database-url "$URL" policy list
START=$(( $(wc -l < "$DIR/sends.tsv") + 1 ))
send +14155553002 "$(link 9200)"
tally "$START"
echo; echo "\$ sqlite3 $DIR/g.db 'SELECT id, status, error_code, policy_trace FROM message_log ORDER BY id DESC LIMIT 1'"
sqlite3 "$DIR/g.db" 'SELECT id, status, error_code, policy_trace FROM message_log ORDER BY id DESC LIMIT 1'
run $G --database-url "$URL" policy rollback links

echo; echo "## roll back the promoted module, and once more"
run $G --database-url "$URL" policy rollback links
run $G --database-url "$URL" policy list
run $G --database-url "$URL" policy rollback links --wait 5

echo; echo "## kept inputs: retention and erasure"
echo "\$ sqlite3 $DIR/g.db 'SELECT COUNT(*) FROM policy_inputs'"; sqlite3 "$DIR/g.db" 'SELECT COUNT(*) FROM policy_inputs'
run $G --database-url "$URL" privacy erase --customer "$C" --phone +14155551000
echo "\$ sqlite3 $DIR/g.db 'SELECT COUNT(*) FROM policy_inputs'"; sqlite3 "$DIR/g.db" 'SELECT COUNT(*) FROM policy_inputs'
run $G --database-url "$URL" retention run

echo; echo "## stop"
echo "\$ kill -TERM $SERVER"
kill -TERM "$SERVER"; wait "$SERVER"; echo "[server exit $?]"
echo; echo "serve.out:"; cat "$DIR/serve.out"
echo; echo "log lines about policies:"
grep -E '"msg":"(policy|keeping)' "$DIR/serve.log" | jq -c '{time: .time, msg: .msg, module: .module, mode: .mode, scope: .scope, id: .id, generation: .generation, modules: .modules}'
echo "warnings and errors:"; jq -c 'select(.level >= 40)' "$DIR/serve.log" | head -20
echo "lines of serve.log holding a message text (shop.example):"; grep -c 'shop.example' "$DIR/serve.log"
