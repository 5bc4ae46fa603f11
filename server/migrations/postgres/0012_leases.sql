-- Liveness of serving processes (PostgreSQL; keep in step with sqlite/0011_leases.sql).
--
-- Every serving process holds a lease that it renews every second (store/leases.rs).
-- What a process has in flight (a pending attempt row, an idempotency key taken before
-- its attempt, a PBX event claimed by its external_message_id) names the lease of its
-- owner; it is orphaned as soon as that lease has lapsed, and never while it holds,
-- however long the provider call runs. A row without a lease (written by a process that
-- holds none) keeps the clock rule it had: `deadline_at`, `lease_until`.
--
-- Every time here is the database's clock (gateway_now_ms), never a replica's: a
-- replica whose clock runs ahead cannot see a live lease as lapsed.
CREATE TABLE process_leases (
    id          BIGSERIAL PRIMARY KEY,
    host        TEXT NOT NULL,
    pid         BIGINT NOT NULL,
    started_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
ALTER TABLE message_log ADD COLUMN owner_lease BIGINT;
ALTER TABLE idempotency_keys ADD COLUMN owner_lease BIGINT;
ALTER TABLE pbx_events ADD COLUMN owner_lease BIGINT;

-- The store's clock, in milliseconds since the epoch.
CREATE OR REPLACE FUNCTION gateway_now_ms() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint
$$;

-- Whether what a process holds is free for another: its owner's lease has lapsed, or,
-- without a lease, its own time (`until`) has passed.
CREATE OR REPLACE FUNCTION gateway_lapsed(owner bigint, until bigint) RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN owner IS NULL THEN until IS NOT NULL AND until <= gateway_now_ms()
        ELSE NOT EXISTS (SELECT 1 FROM process_leases p WHERE p.id = owner AND p.expires_at > gateway_now_ms())
    END
$$;

-- A key taken before its attempt row (log_id NULL) is free once its owner's lease has
-- lapsed (the owner_lease of `c`), as CLAIM_SQL in store/idempotency.rs.
CREATE OR REPLACE FUNCTION gateway_claim_key(c jsonb) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    n int;
BEGIN
    INSERT INTO idempotency_keys (customer_id, idem_key, request_hash, owner, created_at, expires_at, lease_until,
        log_id, owner_lease)
    VALUES (c->>'customer_id', c->>'key', c->>'hash', c->>'owner', (c->>'now')::bigint,
        (c->>'expires_at')::bigint, (c->>'lease_until')::bigint, (c->>'log_id')::bigint,
        (c->>'owner_lease')::bigint)
    ON CONFLICT (customer_id, idem_key) DO UPDATE SET request_hash = excluded.request_hash,
        owner = excluded.owner, created_at = excluded.created_at, expires_at = excluded.expires_at,
        lease_until = excluded.lease_until, log_id = excluded.log_id, owner_lease = excluded.owner_lease,
        response_status = NULL,
        response_body = NULL
    WHERE idempotency_keys.expires_at <= excluded.created_at
       OR (idempotency_keys.log_id IS NULL AND idempotency_keys.response_status IS NULL
           AND gateway_lapsed(idempotency_keys.owner_lease, idempotency_keys.lease_until)
           AND idempotency_keys.request_hash = excluded.request_hash)
       OR (idempotency_keys.owner = excluded.owner AND idempotency_keys.log_id IS NULL
           AND idempotency_keys.response_status IS NULL);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n > 0;
END;
$$;

-- The attempt writes of the send path (as 0009), the pending row naming its owner's
-- lease (`owner_lease` of a begin).
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
                policy_trace, request_id, correlation_id, deadline_at, idem_key, owner_lease)
            VALUES (op->'log'->>'customer_id', op->'log'->>'instance_id', op->'log'->>'api_key_id',
                op->'log'->>'source', op->'log'->>'purpose', op->'log'->>'recipient',
                op->'log'->>'message_type', op->'log'->>'decision', op->'log'->>'error_code',
                op->'log'->>'policy', op->'log'->>'reason', op->'log'->>'provider_message_id',
                op->'log'->>'status', (op->'log'->>'created_at')::bigint, op->'log'->>'policy_trace',
                op->'log'->>'request_id', op->'log'->>'correlation_id',
                (op->>'deadline_at')::bigint, op->'idem'->>'key', (op->>'owner_lease')::bigint)
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
