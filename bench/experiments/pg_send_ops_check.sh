#!/usr/bin/env bash
# Checks gateway_send_ops of migration 0014 (set-based finishes) against 0013's (one op
# at a time), on PostgreSQL, with psql only (no cargo):
#   database A: the migrations up to 0013 (applied by a gateway binary), then 0013's
#               gateway_send_ops loaded again from the repository (so A has the old
#               function whatever the binary embeds);
#   database B: a copy of A, then server/migrations/postgres/0014_set_based_settle.sql.
# Both get the same seed rows and the same batches; every batch's answer and, after
# every batch, the whole of message_log, outbox, contacts, usage_counters and
# idempotency_keys must be the same in both. Exits non-zero on any difference.
#
# 0014 applies a batch's finishes before its begins and claims (see its header). So A's
# reference is 0013's function applied to the batch reordered the same way (finishes
# first, each group in batch order), its answers put back in batch order; for a batch
# of finishes only, or one without finishes, that is exactly 0013's function.
#
# BENCH=1 also times batches of 25 finishes (and of 25 begins), old against new, in a
# database with 200k message-log rows (see "timing" below).
#
#   bench/pg_send_ops_check.sh            # from anywhere; KEEP=1 keeps the databases
# Env: PG_ADMIN (postgres://postgres@127.0.0.1:5432/postgres), GW_BIN
# (target/debug/gateway), NEW_SQL (the 0014 file), BENCH, BATCHES (600).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
PG_ADMIN=${PG_ADMIN:-postgres://postgres@127.0.0.1:5432/postgres}
GW_BIN=${GW_BIN:-$root/target/debug/gateway}
MIG=$root/server/migrations/postgres
NEW_SQL=${NEW_SQL:-$root/bench/experiments/0014_set_based_settle.sql}
A=gwh_ops_old B=gwh_ops_new T=gwh_ops_bench
url() { echo "${PG_ADMIN%/*}/$1"; }
q() { psql "$(url "$1")" -X -q -v ON_ERROR_STOP=1 "${@:2}"; }
work=$(mktemp -d)
drop_all() {
  for d in $A $B $T; do psql "$PG_ADMIN" -X -qc "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1 || true; done
}
cleanup() { [ -n "${KEEP:-}" ] || drop_all; rm -rf "$work"; }
trap cleanup EXIT
drop_all

# 0013's gateway_send_ops, as written in its migration (the statement runs to the end of
# the file).
sed -n '/^CREATE OR REPLACE FUNCTION gateway_send_ops/,$p' "$MIG/0013_message_links.sql" > "$work/old.sql"
grep -q 'LOOP' "$work/old.sql"

# make_pair D: a new database D, migrated by the gateway binary, holding 0013's function.
# make_new D E: a copy E of D with 0014 applied.
make_pair() {
  psql "$PG_ADMIN" -X -qc "CREATE DATABASE $1" >/dev/null
  "$GW_BIN" --database-url "$(url "$1")" migrate >/dev/null
  q "$1" -f "$work/old.sql"
}
make_new() {
  psql "$PG_ADMIN" -X -qc "CREATE DATABASE $2 TEMPLATE $1" >/dev/null
  q "$2" -f "$NEW_SQL"
  # B must now hold the set-based function, A the loop.
  [ "$(q "$2" -Atc "SELECT prosrc LIKE '%settled AS (%' FROM pg_proc WHERE proname = 'gateway_send_ops'")" = t ]
  [ "$(q "$1" -Atc "SELECT prosrc LIKE '%settled AS (%' FROM pg_proc WHERE proname = 'gateway_send_ops'")" = f ]
}

# Helpers to write ops as the Rust writer does (store/attempts.rs: begin_json,
# finish_json; store/idempotency.rs: claim_json), and to print the state.
cat > "$work/helpers.sql" <<'SQL'
CREATE SCHEMA chk;
-- The id of the row of request `req` (request_id).
CREATE FUNCTION chk.lid(req text) RETURNS bigint LANGUAGE sql AS $$
    SELECT id FROM message_log WHERE request_id = req
$$;
-- A counter of a reservation.
CREATE FUNCTION chk.c(scope text, lim bigint, ws bigint DEFAULT 0) RETURNS jsonb LANGUAGE sql AS $$
    SELECT jsonb_build_object('scope', scope, 'window_start', ws, 'expires_at', ws + 86400000, 'limit', lim)
$$;
-- A key claim (an op of its own, or the idem of a begin).
CREATE FUNCTION chk.k(cus text, key text, owner text DEFAULT 'me', hash text DEFAULT 'h',
                      lease bigint DEFAULT NULL) RETURNS jsonb LANGUAGE sql AS $$
    SELECT jsonb_build_object('op', 'claim', 'customer_id', cus, 'key', key, 'hash', hash, 'owner', owner,
        'now', 1000, 'expires_at', 1000 + 86400000, 'lease_until', 1000 + 30000, 'owner_lease', lease)
$$;
-- A begin of request `req`.
CREATE FUNCTION chk.b(req text, rcpt text, r jsonb, idem jsonb DEFAULT NULL, cus text DEFAULT 'cus_1',
                      ins text DEFAULT 'ins_1') RETURNS jsonb LANGUAGE sql AS $$
    SELECT jsonb_build_object('op', 'begin', 'r', r, 'log', jsonb_build_object(
            'customer_id', cus, 'instance_id', ins, 'api_key_id', 'key_1', 'source', 'api',
            'purpose', 'otp', 'recipient', rcpt, 'message_type', 'text', 'decision', 'allowed',
            'error_code', NULL, 'policy', NULL, 'reason', NULL, 'provider_message_id', NULL,
            'status', 'pending', 'created_at', 1000, 'policy_trace', '[]', 'request_id', req,
            'correlation_id', 'c-' || req, 'went_out', false),
        'deadline_at', 61000, 'idem', idem, 'owner_lease', NULL)
$$;
-- The usual counters of a send to rcpt.
CREATE FUNCTION chk.r(rcpt text, VARIADIC more jsonb[] DEFAULT '{}') RETURNS jsonb LANGUAGE sql AS $$
    SELECT jsonb_build_array(chk.c('day:cus_1', 1000), chk.c('inst:ins_1', 100), chk.c('rcpt:ins_1:' || rcpt, 5))
        || coalesce((SELECT jsonb_agg(m) FROM unnest(more) AS m), '[]'::jsonb)
$$;
-- A finish of request `req`; `extra` overrides any field.
CREATE FUNCTION chk.f(req text, status text, extra jsonb DEFAULT '{}') RETURNS jsonb LANGUAGE sql AS $$
    SELECT jsonb_build_object('op', 'finish', 'id', chk.lid(req), 'status', status, 'decision', NULL,
        'error_code', NULL, 'policy', NULL, 'reason', NULL, 'provider_message_id', NULL,
        'went_out', status IN ('sent', 'unknown'), 'instance_id', 'ins_1',
        'recipient', (SELECT recipient FROM message_log WHERE request_id = req), 'at', 2000,
        'event', NULL, 'release', '[]'::jsonb, 'idem', NULL, 'answer', NULL) || extra
$$;
-- An outbox event.
CREATE FUNCTION chk.ev(req text, typ text DEFAULT 'message.sent', at bigint DEFAULT 2000) RETURNS jsonb
LANGUAGE sql AS $$
    SELECT jsonb_build_object('customer_id', 'cus_1', 'instance_id', 'ins_1', 'event_type', typ,
        'payload', jsonb_build_object('request', req, 'type', typ)::text, 'created_at', at)
$$;
-- A batch's answer, or the error that failed it (its writes then undone, as the
-- writer's transaction would be).
CREATE FUNCTION chk.run(ops jsonb) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RETURN chk.call(ops)::text;
EXCEPTION WHEN OTHERS THEN
    RETURN 'ERROR: ' || SQLERRM;
END;
$$;
-- Every row of the tables a send writes, in key order.
CREATE FUNCTION chk.state() RETURNS SETOF text LANGUAGE sql AS $$
    SELECT t FROM (
        SELECT 1 AS k, lpad(id::text, 20) AS s, 'message_log ' || to_jsonb(m)::text AS t FROM message_log m
        UNION ALL SELECT 2, lpad(id::text, 20), 'outbox ' || to_jsonb(o)::text FROM outbox o
        UNION ALL SELECT 3, instance_id || ' ' || phone, 'contacts ' || to_jsonb(c)::text FROM contacts c
        UNION ALL SELECT 4, scope || ' ' || window_start, 'usage_counters ' || to_jsonb(u)::text FROM usage_counters u
        UNION ALL SELECT 5, customer_id || ' ' || idem_key, 'idempotency_keys ' || to_jsonb(i)::text
            FROM idempotency_keys i
    ) x ORDER BY k, s
$$;

INSERT INTO customers (id, name, created_at) VALUES ('cus_1', 'one', 0), ('cus_2', 'two', 0);
INSERT INTO instances (id, customer_id, name, provider, created_at)
VALUES ('ins_1', 'cus_1', 'a', 'echo', 0), ('ins_2', 'cus_2', 'b', 'echo', 0);
-- A contact that only replied so far (first_sent_at NULL), and one sent to before.
INSERT INTO contacts (instance_id, phone, first_sent_at, last_sent_at, sent_total, replies_total)
VALUES ('ins_1', '+100', NULL, NULL, 0, 2), ('ins_1', '+101', 10, 20, 3, 0);
-- Counters: full, at 5, at 0, below 0.
INSERT INTO usage_counters (scope, window_start, count, lim, expires_at)
VALUES ('tiny:cus_1', 0, 1, 1, 86400000), ('small:cus_1', 0, 5, 10, 86400000),
       ('zero:cus_1', 0, 0, 10, 86400000), ('neg:cus_1', 0, -1, 10, 86400000);
-- A key another request holds, and an expired one.
INSERT INTO idempotency_keys (customer_id, idem_key, request_hash, owner, created_at, expires_at, lease_until,
    log_id, response_status, response_body, owner_lease)
VALUES ('cus_1', 'k-held', 'h', 'other', 900, 86400900, 9999999999999, NULL, NULL, NULL, NULL),
       ('cus_1', 'k-exp', 'h', 'other', 1, 2, NULL, 5, 200, 'old', NULL);
SQL

# The batches, each followed by the whole state.
cat > "$work/steps.sql" <<'SQL'
\pset format unaligned
\pset tuples_only on
\echo == 1: begins and claims (limit hit, lost key, empty r)
SELECT chk.run(jsonb_build_array(
    chk.b('r1', '+100', chk.r('+100')), chk.b('r2', '+100', chk.r('+100')),
    chk.b('r3', '+200', chk.r('+200')), chk.b('r4', '+200', chk.r('+200')),
    chk.b('r5', '+300', chk.r('+300', chk.c('small:cus_1', 10))),
    chk.b('full1', '+301', chk.r('+301', chk.c('tiny:cus_1', 1))),
    chk.b('r6', '+302', chk.r('+302')), chk.b('r7', '+303', chk.r('+303')),
    chk.b('r8', '+304', chk.r('+304'), chk.k('cus_1', 'k1')),
    chk.b('r9', '+305', chk.r('+305'), chk.k('cus_1', 'k2')),
    chk.b('r10', '+306', chk.r('+306'), chk.k('cus_1', 'k3')),
    chk.b('lost1', '+307', chk.r('+307'), chk.k('cus_1', 'k-held')),
    chk.k('cus_1', 'k-exp'), chk.k('cus_1', 'k-held'),
    chk.b('r11', '+308', '[]'::jsonb), chk.b('r12', NULL, chk.r('+309')),
    chk.b('r13', '+310', chk.r('+310')), chk.b('r14', '+311', chk.r('+311')),
    chk.b('r15', '+312', chk.r('+312')), chk.b('r16', '+313', chk.r('+313'), chk.k('cus_1', 'k4')),
    chk.b('r17', '+100', chk.r('+100')), chk.b('r18', '+314', chk.r('+314')),
    chk.b('r19', '+315', chk.r('+315'), chk.k('cus_1', 'k5')),
    chk.b('r20', '+316', chk.r('+316'))));
SELECT * FROM chk.state();
-- A key answered already: its finish must not answer it again.
UPDATE idempotency_keys SET response_status = 201, response_body = 'first' WHERE idem_key = 'k3';
\echo == 2: finishes
SELECT chk.run(jsonb_build_array(
    -- two to one contact whose first_sent_at is NULL, the later one with the earlier `at`
    chk.f('r1', 'sent', jsonb_build_object('event', chk.ev('r1'), 'at', 1000, 'provider_message_id', 'p1')),
    chk.f('r2', 'sent', jsonb_build_object('event', chk.ev('r2'), 'at', 900, 'provider_message_id', 'p2')),
    -- two to a new contact
    chk.f('r3', 'sent', jsonb_build_object('event', chk.ev('r3'), 'at', 1100)),
    chk.f('r4', 'unknown', jsonb_build_object('event', chk.ev('r4', 'message.unknown'), 'at', 1050,
        'error_code', 'timeout', 'reason', 'no answer')),
    -- failed, releasing its counters and small:cus_1 (at 5 + 1 from r5's begin)
    chk.f('r5', 'failed', jsonb_build_object('error_code', 'provider', 'event', chk.ev('r5', 'message.failed'),
        'release', chk.r('+300', chk.c('small:cus_1', 10)))),
    -- refused after the fact: decision and policy change, counters released
    chk.f('r6', 'refused', jsonb_build_object('decision', 'refused', 'policy', 'p', 'reason', 'late',
        'release', chk.r('+302', chk.c('small:cus_1', 10), chk.c('zero:cus_1', 10), chk.c('neg:cus_1', 10)))),
    -- a duplicate of r1 (only the first applies)
    chk.f('r1', 'failed', jsonb_build_object('event', chk.ev('r1', 'message.failed'), 'release', chk.r('+100'))),
    -- one counter named twice in one release: taken off once
    chk.f('r7', 'failed', jsonb_build_object('release', jsonb_build_array(chk.c('small:cus_1', 10),
        chk.c('small:cus_1', 10)))),
    -- keys: given up, answered, answered before (unchanged), no answer
    chk.f('r8', 'failed', jsonb_build_object('idem', jsonb_build_object('customer_id', 'cus_1', 'key', 'k1'),
        'answer', '{"release": true}'::jsonb, 'release', chk.r('+304'))),
    chk.f('r9', 'sent', jsonb_build_object('idem', jsonb_build_object('customer_id', 'cus_1', 'key', 'k2'),
        'answer', jsonb_build_object('status', 200, 'body', '{"id":"r9"}'), 'event', chk.ev('r9'))),
    chk.f('r10', 'sent', jsonb_build_object('idem', jsonb_build_object('customer_id', 'cus_1', 'key', 'k3'),
        'answer', jsonb_build_object('status', 200, 'body', '{"id":"r10"}'))),
    chk.f('r16', 'sent', jsonb_build_object('idem', jsonb_build_object('customer_id', 'cus_1', 'key', 'k4'))),
    -- a key of another row: untouched
    chk.f('r11', 'sent', jsonb_build_object('idem', jsonb_build_object('customer_id', 'cus_1', 'key', 'k5'),
        'answer', jsonb_build_object('status', 200, 'body', 'x'))),
    -- no such row; a row whose key was lost (deleted)
    jsonb_build_object('op', 'finish', 'id', 999999, 'status', 'sent', 'went_out', true, 'instance_id', 'ins_1',
        'recipient', '+999', 'at', 1, 'event', chk.ev('none'), 'release', chk.r('+999')),
    chk.f('lost1', 'sent', jsonb_build_object('event', chk.ev('lost1'))),
    -- went out without a recipient: no contact
    chk.f('r12', 'sent', jsonb_build_object('event', chk.ev('r12'))),
    -- a third to +100, and one to the contact sent to before
    chk.f('r17', 'sent', jsonb_build_object('at', 1200)),
    chk.f('r13', 'sent', jsonb_build_object('recipient', '+101', 'at', 5)),
    -- a finish of the whole day counter twice more: GREATEST
    chk.f('r14', 'failed', jsonb_build_object('release', jsonb_build_array(chk.c('tiny:cus_1', 1)))),
    chk.f('r15', 'failed', jsonb_build_object('release', jsonb_build_array(chk.c('tiny:cus_1', 1)),
        'event', 'null'::jsonb))));
SELECT * FROM chk.state();
\echo == 3: the same finishes again (a retried batch): nothing applies, nothing changes
SELECT chk.run(jsonb_build_array(
    chk.f('r1', 'sent', jsonb_build_object('event', chk.ev('r1'), 'at', 1000)),
    chk.f('r5', 'failed', jsonb_build_object('release', chk.r('+300'))),
    chk.f('r8', 'failed', jsonb_build_object('idem', jsonb_build_object('customer_id', 'cus_1', 'key', 'k1'),
        'answer', '{"release": true}'::jsonb)),
    chk.f('r9', 'sent', jsonb_build_object('idem', jsonb_build_object('customer_id', 'cus_1', 'key', 'k2'),
        'answer', jsonb_build_object('status', 500, 'body', 'again')))));
SELECT * FROM chk.state();
\echo == 4: mixed: a claim of a key and a begin on a counter that finishes of the batch give up
SELECT chk.run(jsonb_build_array(
    chk.k('cus_1', 'k5', 'me2'),
    chk.b('m1', '+400', jsonb_build_array(chk.c('tiny:cus_1', 1))),
    chk.f('r19', 'failed', jsonb_build_object('idem', jsonb_build_object('customer_id', 'cus_1', 'key', 'k5'),
        'answer', '{"release": true}'::jsonb, 'release', chk.r('+315'))),
    chk.f('r18', 'sent', jsonb_build_object('event', chk.ev('r18'))),
    chk.b('m2', '+401', chk.r('+401')),
    chk.f('r20', 'sent', jsonb_build_object('event', chk.ev('r20'), 'at', 3000)),
    chk.b('m3', '+402', chk.r('+402'), chk.k('cus_1', 'k6')),
    chk.k('cus_1', 'k6', 'other')));
SELECT * FROM chk.state();
\echo == 5: a finish that leaves its row pending, then another of the same row (one at a time)
SELECT chk.run(jsonb_build_array(
    chk.f('m2', 'pending', jsonb_build_object('event', chk.ev('m2', 'message.queued'), 'at', 10)),
    chk.b('m4', '+403', chk.r('+403')),
    chk.f('m3', 'sent', jsonb_build_object('at', 11, 'event', chk.ev('m3'))),
    chk.f('m2', 'sent', jsonb_build_object('event', chk.ev('m2'), 'at', 12, 'release', chk.r('+401'))),
    chk.f('m2', 'failed', '{}')));
SELECT * FROM chk.state();
\echo == 6: an unknown op fails the batch; so does a pending row given no status
SELECT chk.run(jsonb_build_array(chk.f('m4', 'sent'), '{"op": "frobnicate"}'::jsonb));
SELECT chk.run(jsonb_build_array(chk.f('m4', 'sent'), '{"id": 1}'::jsonb));
-- (the failing finish first: a failed batch may take identity values, which 0014 and
-- 0013 would take differently; here neither takes any)
SELECT chk.run(jsonb_build_array(jsonb_build_object('op', 'finish', 'id', chk.lid('m1'), 'status', NULL),
    chk.f('m4', 'sent', jsonb_build_object('event', chk.ev('m4')))));
SELECT chk.run(jsonb_build_array(chk.b('e1', '+500', chk.r('+500')), '{"op": "frobnicate"}'::jsonb));
SELECT chk.run(jsonb_build_array(chk.k('cus_1', 'k9'), '{"op": null}'::jsonb, chk.f('m4', 'sent')));
SELECT chk.run('[]'::jsonb), chk.run(NULL);
SELECT * FROM chk.state();
\echo == 7: 25 begins, then their 25 finishes (the mix of the timing below)
SELECT chk.run((SELECT jsonb_agg(chk.b('z' || i, '+5' || (i % 7), chk.r('+5' || (i % 7)),
        CASE WHEN i % 3 = 0 THEN chk.k('cus_1', 'kz' || i) END) ORDER BY i) FROM generate_series(1, 25) i));
SELECT chk.run((SELECT jsonb_agg(CASE WHEN i % 5 = 0
        THEN chk.f('z' || i, 'failed', jsonb_build_object('release', chk.r('+5' || (i % 7)), 'error_code', 'e',
            'event', chk.ev('z' || i, 'message.failed'),
            'idem', CASE WHEN i % 3 = 0 THEN jsonb_build_object('customer_id', 'cus_1', 'key', 'kz' || i) END,
            'answer', CASE WHEN i % 3 = 0 THEN '{"release": true}'::jsonb END))
        ELSE chk.f('z' || i, 'sent', jsonb_build_object('event', chk.ev('z' || i), 'at', 4000 + (i * 37) % 11,
            'provider_message_id', 'pz' || i,
            'idem', CASE WHEN i % 3 = 0 THEN jsonb_build_object('customer_id', 'cus_1', 'key', 'kz' || i) END,
            'answer', CASE WHEN i % 3 = 0 THEN jsonb_build_object('status', 200, 'body', 'z' || i) END)) END
        ORDER BY i) FROM generate_series(1, 25) i));
SELECT * FROM chk.state();
SQL

make_pair $A
make_new $A $B
q $A -f "$work/helpers.sql"
q $B -f "$work/helpers.sql"
# A: 0013's function, the batch's finishes first (see the top); B: 0014's as it is.
q $A <<'SQL'
CREATE FUNCTION chk.call(ops jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    res jsonb;
BEGIN
    IF ops IS NULL THEN
        RETURN gateway_send_ops(ops);
    END IF;
    res := gateway_send_ops((SELECT coalesce(jsonb_agg(v ORDER BY (v->>'op' = 'finish') IS NOT TRUE, ord), '[]')
                             FROM jsonb_array_elements(ops) WITH ORDINALITY AS x(v, ord)));
    RETURN (SELECT coalesce(jsonb_agg(res->(pos::int - 1) ORDER BY ord), '[]')
            FROM (SELECT ord, row_number() OVER (ORDER BY (v->>'op' = 'finish') IS NOT TRUE, ord) AS pos
                  FROM jsonb_array_elements(ops) WITH ORDINALITY AS x(v, ord)) AS y);
END;
$$;
SQL
q $B -c "CREATE FUNCTION chk.call(ops jsonb) RETURNS jsonb LANGUAGE sql AS \$\$ SELECT gateway_send_ops(ops) \$\$"

q $A -f "$work/steps.sql" > "$work/old.out"
q $B -f "$work/steps.sql" > "$work/new.out"
if ! diff -u "$work/old.out" "$work/new.out"; then
  echo "pg_send_ops_check: 0014 differs from 0013 (above: - old, + new)" >&2
  exit 1
fi
echo "pg_send_ops_check: 0013 and 0014 give the same answers and rows after every batch ($(wc -l < "$work/old.out") lines compared)"
if [ -n "${KEEP:-}" ]; then cp "$work/old.out" "$work/new.out" /tmp/; fi

[ -n "${BENCH:-}" ] || exit 0

# ---- timing ----
# One database holds both functions: chk.v13 (0013's, renamed) and gateway_send_ops
# (0014's). Batch b runs under one or the other in turn (b odd: 0013, even: 0014), each
# in its own transaction, so that both see the same tables and the same load. CPU is
# the backend's own (utime + stime from /proc/self/stat, read with pg_read_file: Linux,
# superuser), per op, including the batch's commit; wall is beside it.
BATCHES=${BATCHES:-600}
n=$((BATCHES * 25))
make_pair $T
q $T -f "$NEW_SQL" >/dev/null
sed 's/^CREATE OR REPLACE FUNCTION gateway_send_ops(ops jsonb)/CREATE OR REPLACE FUNCTION chk.v13(ops jsonb)/' \
  "$work/old.sql" > "$work/v13.sql"
q $T -c "CREATE SCHEMA chk"
q $T -f "$work/v13.sql"
q $T <<SQL
-- 200k settled rows of history, then $n pending rows to settle (25 per batch), keys for
-- a third of them, contacts and counters.
INSERT INTO message_log (customer_id, instance_id, api_key_id, source, purpose, recipient, message_type,
    decision, status, created_at, request_id)
SELECT 'cus_1', 'ins_1', 'key_1', 'api', 'otp', '+55' || (i % 50000), 'text', 'allowed', 'sent', i, 'h' || i
FROM generate_series(1, 200000) i;
INSERT INTO message_log (customer_id, instance_id, api_key_id, source, purpose, recipient, message_type,
    decision, status, created_at, deadline_at, idem_key, request_id)
SELECT 'cus_1', 'ins_1', 'key_1', 'api', 'otp', '+55' || (i % 20000), 'text', 'allowed', 'pending', 300000 + i,
    400000 + i, CASE WHEN i % 3 = 0 THEN 'b' || i END, 'b' || i
FROM generate_series(1, $n) i;
INSERT INTO contacts (instance_id, phone, first_sent_at, last_sent_at, sent_total)
SELECT 'ins_1', '+55' || i, 1, 1, 4 FROM generate_series(0, 49999) i;
INSERT INTO usage_counters (scope, window_start, count, lim, expires_at)
VALUES ('day:cus_1', 0, 1000000, 100000000, 86400000), ('month:cus_1', 0, 1000000, 100000000, 86400000),
       ('inst:ins_1', 0, 1000000, 100000000, 86400000);
INSERT INTO usage_counters (scope, window_start, count, lim, expires_at)
SELECT 'rcpt:ins_1:+55' || i, 0, 100, 100000000, 86400000 FROM generate_series(0, 19999) i;
CREATE FUNCTION chk.c(scope text) RETURNS jsonb LANGUAGE sql AS \$\$
    SELECT jsonb_build_object('scope', scope, 'window_start', 0, 'expires_at', 86400000, 'limit', 100000000)
\$\$;
-- Finish batch b: the rows 25 (b - 1) + 1 .. 25 b. 80 % sent (event, contact, key
-- answered), 20 % failed (event, 4 counters released, key given up).
CREATE TABLE chk.finishes AS
SELECT b, jsonb_agg(jsonb_build_object('op', 'finish', 'id', m.id, 'status', s.status, 'decision', NULL,
        'error_code', CASE WHEN s.status = 'failed' THEN 'provider' END, 'policy', NULL, 'reason', NULL,
        'provider_message_id', 'wamid.' || m.id, 'went_out', s.status = 'sent', 'instance_id', 'ins_1',
        'recipient', m.recipient, 'at', 500000 + m.id,
        'event', jsonb_build_object('customer_id', 'cus_1', 'instance_id', 'ins_1',
            'event_type', 'message.' || s.status, 'payload', jsonb_build_object('id', m.id, 'status', s.status,
                'to', m.recipient, 'provider_message_id', 'wamid.' || m.id, 'text', repeat('x', 160))::text,
            'created_at', 500000 + m.id),
        'release', CASE WHEN s.status = 'failed' THEN jsonb_build_array(chk.c('day:cus_1'), chk.c('month:cus_1'),
            chk.c('inst:ins_1'), chk.c('rcpt:ins_1:' || m.recipient)) ELSE '[]'::jsonb END,
        'idem', CASE WHEN m.idem_key IS NOT NULL THEN jsonb_build_object('customer_id', 'cus_1', 'key', m.idem_key) END,
        'answer', CASE WHEN m.idem_key IS NULL THEN NULL WHEN s.status = 'failed' THEN '{"release": true}'::jsonb
            ELSE jsonb_build_object('status', 200, 'body', '{"id":' || m.id || '}') END) ORDER BY m.id) AS ops
FROM (SELECT id, recipient, idem_key, (row_number() OVER (ORDER BY id) - 1) / 25 + 1 AS b
      FROM message_log WHERE status = 'pending') m,
     LATERAL (SELECT CASE WHEN m.id % 5 = 0 THEN 'failed' ELSE 'sent' END AS status) s
GROUP BY b;
-- Begin batch b: 25 begins with 4 counters each, a third with a key.
CREATE TABLE chk.begins AS
SELECT (i - 1) / 25 + 1 AS b, jsonb_agg(jsonb_build_object('op', 'begin',
        'r', jsonb_build_array(chk.c('day:cus_1'), chk.c('month:cus_1'), chk.c('inst:ins_1'),
            chk.c('rcpt:ins_1:+77' || (i % 20000))),
        'log', jsonb_build_object('customer_id', 'cus_1', 'instance_id', 'ins_1', 'api_key_id', 'key_1',
            'source', 'api', 'purpose', 'otp', 'recipient', '+77' || (i % 20000), 'message_type', 'text',
            'decision', 'allowed', 'status', 'pending', 'created_at', 600000 + i, 'policy_trace', '[]',
            'request_id', 'q' || i, 'correlation_id', NULL, 'went_out', false),
        'deadline_at', 700000 + i, 'owner_lease', NULL,
        'idem', CASE WHEN i % 3 = 0 THEN jsonb_build_object('op', 'claim', 'customer_id', 'cus_1', 'key', 'q' || i,
            'hash', 'h', 'owner', 'me', 'now', 600000 + i, 'expires_at', 99999999999, 'lease_until', 700000 + i,
            'owner_lease', NULL) END) ORDER BY i) AS ops
FROM generate_series(1, $n) i
GROUP BY 1;
INSERT INTO idempotency_keys (customer_id, idem_key, request_hash, owner, created_at, expires_at, log_id)
SELECT 'cus_1', idem_key, 'h', 'me', 1, 99999999999, id FROM message_log WHERE idem_key IS NOT NULL;
CREATE INDEX ON chk.finishes (b);
CREATE INDEX ON chk.begins (b);
CREATE FUNCTION chk.cpu_ticks() RETURNS bigint LANGUAGE sql AS \$\$
    SELECT split_part(s, ' ', 14)::bigint + split_part(s, ' ', 15)::bigint FROM pg_read_file('/proc/self/stat') s
\$\$;
-- Runs the batches of table tab, batch b under variants[b % 2 + 1], one transaction each.
CREATE PROCEDURE chk.ab(tab text, variants text[]) LANGUAGE plpgsql AS \$\$
DECLARE
    o jsonb;
    k int;
    t0 timestamptz;
    c0 bigint;
    cpu bigint[] := '{0,0}';
    wall float8[] := '{0,0}';
    ops_n bigint[] := '{0,0}';
    msg text := '';
BEGIN
    SET synchronous_commit = off;
    FOR b IN 1 .. $BATCHES LOOP
        k := b % 2 + 1;
        EXECUTE format('SELECT ops FROM chk.%I WHERE b = \$1', tab) INTO o USING b;
        COMMIT;
        c0 := chk.cpu_ticks();
        t0 := clock_timestamp();
        EXECUTE format('SELECT %s(\$1)', variants[k]) USING o;
        COMMIT;
        wall[k] := wall[k] + extract(epoch FROM clock_timestamp() - t0);
        cpu[k] := cpu[k] + chk.cpu_ticks() - c0;
        ops_n[k] := ops_n[k] + jsonb_array_length(o);
    END LOOP;
    FOR k IN 1 .. 2 LOOP
        msg := msg || format('  %s: cpu %s µs/op, wall %s µs/op', variants[k],
            round(cpu[k] * 1e6 / current_setting('chk.hz')::int / ops_n[k]), round((wall[k] * 1e6 / ops_n[k])::numeric));
    END LOOP;
    RAISE NOTICE '%', msg;
END;
\$\$;
VACUUM ANALYZE;
SQL
cat > "$work/reset.sql" <<'SQL'
UPDATE message_log SET status = 'pending', deadline_at = 1, provider_message_id = NULL, error_code = NULL
WHERE request_id LIKE 'b%' AND status <> 'pending';
UPDATE idempotency_keys SET response_status = NULL, response_body = NULL, lease_until = NULL
WHERE log_id IS NOT NULL AND response_status IS NOT NULL;
INSERT INTO idempotency_keys (customer_id, idem_key, request_hash, owner, created_at, expires_at, log_id)
SELECT 'cus_1', idem_key, 'h', 'me', 1, 99999999999, id FROM message_log WHERE idem_key LIKE 'b%'
ON CONFLICT DO NOTHING;
DELETE FROM message_log WHERE request_id LIKE 'q%';
DELETE FROM idempotency_keys WHERE idem_key LIKE 'q%';
DELETE FROM usage_counters WHERE scope LIKE 'rcpt:ins_1:+77%';
TRUNCATE outbox;
VACUUM ANALYZE;
SQL
hz=$(getconf CLK_TCK)
echo "timing: $BATCHES batches of 25 ops, alternating 0013 (chk.v13) and 0014 (gateway_send_ops); per op, incl. commit:"
for mode in auto force_custom_plan; do
  for tab in finishes begins; do
    q $T -f "$work/reset.sql" >/dev/null
    out=$(q $T -c "SET chk.hz = $hz" -c "SET plan_cache_mode = $mode" -c "CALL chk.ab('$tab', '{chk.v13,gateway_send_ops}')" 2>&1)
    echo "  plan_cache_mode=$mode, $tab:${out#*NOTICE: }"
  done
done
