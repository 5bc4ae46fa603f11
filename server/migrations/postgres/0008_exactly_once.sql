-- Exactly once (PostgreSQL; keep in step with sqlite/0007_exactly_once.sql).
--
-- An allowed send writes its message-log row as `pending`, with its counters, before
-- the provider is called; the answer turns it into sent, failed or unknown. A row still
-- pending at `deadline_at` (the provider timeout plus a margin) belonged to a process
-- that stopped mid-call, and becomes `unknown` (see store/attempts.rs).
ALTER TABLE message_log ADD COLUMN deadline_at BIGINT;
-- The idempotency key of an attempt that had one (its key row is found by primary key).
ALTER TABLE message_log ADD COLUMN idem_key TEXT;
CREATE INDEX message_log_pending ON message_log (deadline_at) WHERE status = 'pending';

-- Idempotency keys of send-message, per customer, kept 24 hours (see the SQLite file).
CREATE TABLE idempotency_keys (
    customer_id     TEXT NOT NULL,
    idem_key        TEXT NOT NULL,
    request_hash    TEXT NOT NULL,
    owner           TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    lease_until     BIGINT,
    log_id          BIGINT,
    response_status INTEGER,
    response_body   TEXT,
    PRIMARY KEY (idem_key, customer_id)              -- the key first: looked up beside the API key
);
-- Only the primary key: every lookup on the send path is by (idem_key, customer_id);
-- the pruner's scan by expires_at runs every ten minutes.

-- Takes every counter of `r` ([{scope, window_start, expires_at, limit}]) or none:
-- {"ok": true, "counts": [n, ...]} with each counter's value after this increment (in
-- the order of `r`: the send's place among all sends that took it, which the pipeline
-- checks its policy decision against), or {"ok": false, "index": i, "used": n} naming
-- the first that is full.
-- The same semantics as the `reserve` write of gateway_write_batch (0002) and the SQLite
-- writer.
CREATE OR REPLACE FUNCTION gateway_reserve(r jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    taken text[];
    hit int;
    used bigint;
    got jsonb;
    counts jsonb;
BEGIN
    IF jsonb_array_length(r) = 0 THEN
        RETURN jsonb_build_object('ok', true, 'counts', '[]'::jsonb);
    END IF;
    WITH ins AS (
        INSERT INTO usage_counters (scope, window_start, count, expires_at, lim)
        SELECT x->>'scope', (x->>'window_start')::bigint, 1, (x->>'expires_at')::bigint, (x->>'limit')::bigint
        FROM jsonb_array_elements(r) AS x
        ON CONFLICT (scope, window_start) DO UPDATE
            SET count = usage_counters.count + 1, lim = excluded.lim
            WHERE usage_counters.count < excluded.lim
        RETURNING scope, count
    )
    SELECT coalesce(array_agg(scope), '{}'), coalesce(jsonb_object_agg(scope, count), '{}'::jsonb)
    INTO taken, got FROM ins;
    hit := NULL;
    FOR i IN 0 .. jsonb_array_length(r) - 1 LOOP
        IF NOT ((r->i->>'scope') = ANY (taken)) THEN
            hit := i;
            EXIT;
        END IF;
    END LOOP;
    IF hit IS NULL THEN
        SELECT jsonb_agg(got->(x.v->>'scope') ORDER BY x.ord) INTO counts
        FROM jsonb_array_elements(r) WITH ORDINALITY AS x(v, ord);
        RETURN jsonb_build_object('ok', true, 'counts', counts);
    END IF;
    UPDATE usage_counters u SET count = u.count - 1
    FROM jsonb_array_elements(r) AS x
    WHERE u.scope = x->>'scope' AND u.window_start = (x->>'window_start')::bigint
      AND u.scope = ANY (taken) AND u.count > 0;
    SELECT count INTO used FROM usage_counters
    WHERE scope = r->hit->>'scope' AND window_start = (r->hit->>'window_start')::bigint;
    RETURN jsonb_build_object('ok', false, 'index', hit, 'used', coalesce(used, (r->hit->>'limit')::bigint));
END;
$$;

-- Takes an idempotency key (c: {customer_id, key, hash, owner, now, expires_at,
-- lease_until, log_id}) if it is free (absent, expired, or left before its attempt row by a
-- request whose lease ended, with the same body) or already this request's; true when
-- taken. The same statement as CLAIM_SQL in store/idempotency.rs.
CREATE OR REPLACE FUNCTION gateway_claim_key(c jsonb) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    n int;
BEGIN
    INSERT INTO idempotency_keys (customer_id, idem_key, request_hash, owner, created_at, expires_at, lease_until,
        log_id)
    VALUES (c->>'customer_id', c->>'key', c->>'hash', c->>'owner', (c->>'now')::bigint,
        (c->>'expires_at')::bigint, (c->>'lease_until')::bigint, (c->>'log_id')::bigint)
    ON CONFLICT (customer_id, idem_key) DO UPDATE SET request_hash = excluded.request_hash,
        owner = excluded.owner, created_at = excluded.created_at, expires_at = excluded.expires_at,
        lease_until = excluded.lease_until, log_id = excluded.log_id, response_status = NULL,
        response_body = NULL
    WHERE idempotency_keys.expires_at <= excluded.created_at
       OR (idempotency_keys.log_id IS NULL AND idempotency_keys.response_status IS NULL
           AND idempotency_keys.lease_until <= excluded.created_at
           AND idempotency_keys.request_hash = excluded.request_hash)
       OR (idempotency_keys.owner = excluded.owner AND idempotency_keys.log_id IS NULL
           AND idempotency_keys.response_status IS NULL);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n > 0;
END;
$$;

-- The attempt writes of the send path, applied in order in the caller's statement:
--   claim  a key (gateway_claim_key): {"claimed": bool}.
--   begin  {r, log, deadline_at, idem: claim | null}
--          the counters are taken (else gateway_reserve's answer); the log row is
--          inserted as pending; the key is taken with it (else the row and counters
--          are taken back: {"lost": true}): {"ok": true, "id": n, "counts": [...]}.
--   finish {id, status, error_code, policy, reason, provider_message_id, went_out,
--           instance_id, recipient, at, event | null, release: [...], answer | null}
--          a pending row gets its outcome, its event, its contact and its released
--          counters; the key (linked to the row) gets the answer, or is given up
--          ({"release": true}): {"applied": bool}.
CREATE OR REPLACE FUNCTION gateway_send_ops(ops jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    op jsonb;
    results jsonb := '[]'::jsonb;
    reserved jsonb;
    new_id bigint;
    n int;
BEGIN
    FOR op IN SELECT value FROM jsonb_array_elements(ops) LOOP
        IF op->>'op' = 'begin' THEN
            reserved := gateway_reserve(op->'r');
            IF NOT (reserved->>'ok')::boolean THEN
                results := results || jsonb_build_array(reserved);
                CONTINUE;
            END IF;
            INSERT INTO message_log (customer_id, instance_id, api_key_id, source, purpose, recipient,
                message_type, decision, error_code, policy, reason, provider_message_id, status, created_at,
                policy_trace, deadline_at, idem_key)
            VALUES (op->'log'->>'customer_id', op->'log'->>'instance_id', op->'log'->>'api_key_id',
                op->'log'->>'source', op->'log'->>'purpose', op->'log'->>'recipient',
                op->'log'->>'message_type', op->'log'->>'decision', op->'log'->>'error_code',
                op->'log'->>'policy', op->'log'->>'reason', op->'log'->>'provider_message_id',
                op->'log'->>'status', (op->'log'->>'created_at')::bigint, op->'log'->>'policy_trace',
                (op->>'deadline_at')::bigint, op->'idem'->>'key')
            RETURNING id INTO new_id;
            IF jsonb_typeof(op->'idem') = 'object' AND NOT gateway_claim_key(
                    op->'idem' || jsonb_build_object('log_id', new_id, 'lease_until', NULL)) THEN
                DELETE FROM message_log WHERE id = new_id;
                UPDATE usage_counters u SET count = u.count - 1
                FROM jsonb_array_elements(op->'r') AS x
                WHERE u.scope = x->>'scope' AND u.window_start = (x->>'window_start')::bigint AND u.count > 0;
                results := results || jsonb_build_array(jsonb_build_object('lost', true));
                CONTINUE;
            END IF;
            results := results || jsonb_build_array(jsonb_build_object('ok', true, 'id', new_id,
                'counts', reserved->'counts'));
        ELSIF op->>'op' = 'claim' THEN
            results := results || jsonb_build_array(jsonb_build_object('claimed', gateway_claim_key(op)));
        ELSIF op->>'op' = 'finish' THEN
            UPDATE message_log SET status = op->>'status', decision = coalesce(op->>'decision', decision),
                error_code = op->>'error_code',
                policy = op->>'policy', reason = op->>'reason',
                provider_message_id = op->>'provider_message_id', deadline_at = NULL
            WHERE id = (op->>'id')::bigint AND status = 'pending';
            GET DIAGNOSTICS n = ROW_COUNT;
            IF n > 0 THEN
                IF jsonb_typeof(op->'event') = 'object' THEN
                    INSERT INTO outbox (customer_id, instance_id, event_type, payload, created_at, available_at)
                    VALUES (op->'event'->>'customer_id', op->'event'->>'instance_id',
                        op->'event'->>'event_type', op->'event'->>'payload', (op->'event'->>'created_at')::bigint,
                        (op->'event'->>'created_at')::bigint);
                END IF;
                IF (op->>'went_out')::boolean AND op->>'instance_id' IS NOT NULL
                   AND op->>'recipient' IS NOT NULL THEN
                    INSERT INTO contacts (instance_id, phone, first_sent_at, last_sent_at, sent_total)
                    VALUES (op->>'instance_id', op->>'recipient', (op->>'at')::bigint, (op->>'at')::bigint, 1)
                    ON CONFLICT (instance_id, phone) DO UPDATE SET
                        first_sent_at = COALESCE(contacts.first_sent_at, excluded.first_sent_at),
                        last_sent_at = excluded.last_sent_at, sent_total = contacts.sent_total + 1;
                END IF;
                UPDATE usage_counters u SET count = u.count - 1
                FROM jsonb_array_elements(op->'release') AS x
                WHERE u.scope = x->>'scope' AND u.window_start = (x->>'window_start')::bigint AND u.count > 0;
                IF jsonb_typeof(op->'idem') <> 'object' THEN
                    NULL;
                ELSIF op->'answer'->>'release' = 'true' THEN
                    DELETE FROM idempotency_keys WHERE customer_id = op->'idem'->>'customer_id'
                        AND idem_key = op->'idem'->>'key' AND log_id = (op->>'id')::bigint;
                ELSIF jsonb_typeof(op->'answer') = 'object' THEN
                    UPDATE idempotency_keys SET response_status = (op->'answer'->>'status')::int,
                        response_body = op->'answer'->>'body', lease_until = NULL
                    WHERE customer_id = op->'idem'->>'customer_id' AND idem_key = op->'idem'->>'key'
                      AND log_id = (op->>'id')::bigint AND response_status IS NULL;
                END IF;
            END IF;
            results := results || jsonb_build_array(jsonb_build_object('applied', n > 0));
        ELSE
            RAISE EXCEPTION 'unknown send write %', op->>'op';
        END IF;
    END LOOP;
    RETURN results;
END;
$$;
