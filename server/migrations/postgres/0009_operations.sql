-- Operations (PostgreSQL; keep in step with sqlite/0008_operations.sql).

-- Policy modules installed in the store (`gateway policy install`, the console's
-- upload): every replica loads the newest unretired row of each name. `policy
-- rollback NAME` retires the newest, so the one before it (or the directory's or
-- the bundled module) is live again on every replica.
CREATE TABLE policy_modules (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          TEXT NOT NULL,
    version       TEXT NOT NULL,
    sha256        TEXT NOT NULL,
    module        BYTEA NOT NULL,
    size          BIGINT NOT NULL,
    installed_at  BIGINT NOT NULL,
    installed_by  TEXT NOT NULL,
    retired_at    BIGINT
);
CREATE INDEX policy_modules_name ON policy_modules (name, id);

-- The id Dropshot gave the request that made the row (`x-request-id`), and the
-- caller's own `X-Correlation-Id`, so a support ticket can be followed to the row.
ALTER TABLE message_log ADD COLUMN request_id TEXT;
ALTER TABLE message_log ADD COLUMN correlation_id TEXT;

-- The batch functions write the two columns above with every log row (their bodies
-- are those of 0006 and 0008 with the columns added).
CREATE OR REPLACE FUNCTION gateway_write_batch(ops jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    op jsonb;
    results jsonb := '[]'::jsonb;
    taken text[];
    hit int;
    used bigint;
    new_id bigint;
    recent bigint;
    now_paused boolean;
    paused_rows int;
BEGIN
    FOR op IN SELECT value FROM jsonb_array_elements(ops) LOOP
        IF op->>'op' = 'reserve' THEN
            WITH ins AS (
                INSERT INTO usage_counters (scope, window_start, count, expires_at, lim)
                SELECT x->>'scope', (x->>'window_start')::bigint, 1, (x->>'expires_at')::bigint,
                       (x->>'limit')::bigint
                FROM jsonb_array_elements(op->'r') AS x
                ON CONFLICT (scope, window_start) DO UPDATE
                    SET count = usage_counters.count + 1, lim = excluded.lim
                    WHERE usage_counters.count < excluded.lim
                RETURNING scope
            )
            SELECT coalesce(array_agg(scope), '{}') INTO taken FROM ins;
            hit := NULL;
            FOR i IN 0 .. jsonb_array_length(op->'r') - 1 LOOP
                IF NOT ((op->'r'->i->>'scope') = ANY (taken)) THEN
                    hit := i;
                    EXIT;
                END IF;
            END LOOP;
            IF hit IS NULL THEN
                results := results || jsonb_build_array(jsonb_build_object('ok', true));
            ELSE
                UPDATE usage_counters u SET count = u.count - 1
                FROM jsonb_array_elements(op->'r') AS x
                WHERE u.scope = x->>'scope' AND u.window_start = (x->>'window_start')::bigint
                  AND u.scope = ANY (taken) AND u.count > 0;
                SELECT count INTO used FROM usage_counters
                WHERE scope = op->'r'->hit->>'scope' AND window_start = (op->'r'->hit->>'window_start')::bigint;
                results := results || jsonb_build_array(jsonb_build_object(
                    'ok', false, 'index', hit, 'used', coalesce(used, (op->'r'->hit->>'limit')::bigint)));
            END IF;
        ELSIF op->>'op' = 'release' THEN
            UPDATE usage_counters u SET count = u.count - 1
            FROM jsonb_array_elements(op->'r') AS x
            WHERE u.scope = x->>'scope' AND u.window_start = (x->>'window_start')::bigint AND u.count > 0;
            results := results || jsonb_build_array('{}'::jsonb);
        ELSIF op->>'op' = 'record' THEN
            INSERT INTO message_log (customer_id, instance_id, api_key_id, source, purpose, recipient,
                message_type, decision, error_code, policy, reason, provider_message_id, status, created_at,
                policy_trace, request_id, correlation_id)
            VALUES (op->'log'->>'customer_id', op->'log'->>'instance_id', op->'log'->>'api_key_id',
                op->'log'->>'source', op->'log'->>'purpose', op->'log'->>'recipient',
                op->'log'->>'message_type', op->'log'->>'decision', op->'log'->>'error_code',
                op->'log'->>'policy', op->'log'->>'reason', op->'log'->>'provider_message_id',
                op->'log'->>'status', (op->'log'->>'created_at')::bigint, op->'log'->>'policy_trace',
                op->'log'->>'request_id', op->'log'->>'correlation_id')
            RETURNING id INTO new_id;
            IF jsonb_typeof(op->'event') = 'object' THEN
                INSERT INTO outbox (customer_id, instance_id, event_type, payload, created_at, available_at)
                VALUES (op->'event'->>'customer_id', op->'event'->>'instance_id', op->'event'->>'event_type',
                    op->'event'->>'payload', (op->'event'->>'created_at')::bigint,
                    (op->'event'->>'created_at')::bigint);
            END IF;
            IF (op->'log'->>'went_out')::boolean AND op->'log'->>'instance_id' IS NOT NULL
               AND op->'log'->>'recipient' IS NOT NULL THEN
                INSERT INTO contacts (instance_id, phone, first_sent_at, last_sent_at, sent_total)
                VALUES (op->'log'->>'instance_id', op->'log'->>'recipient', (op->'log'->>'created_at')::bigint,
                    (op->'log'->>'created_at')::bigint, 1)
                ON CONFLICT (instance_id, phone) DO UPDATE SET
                    first_sent_at = COALESCE(contacts.first_sent_at, excluded.first_sent_at),
                    last_sent_at = excluded.last_sent_at, sent_total = contacts.sent_total + 1;
            END IF;
            now_paused := false;
            IF jsonb_typeof(op->'review') = 'object' AND op->'log'->>'instance_id' IS NOT NULL THEN
                INSERT INTO review_queue (log_id, customer_id, instance_id, source, purpose, recipient,
                    message_type, text, policy, reason, risk_score, created_at)
                VALUES (new_id, op->'log'->>'customer_id', op->'log'->>'instance_id', op->'log'->>'source',
                    op->'log'->>'purpose', op->'log'->>'recipient', op->'log'->>'message_type',
                    op->'review'->>'text', op->'review'->>'policy', op->'review'->>'reason',
                    (op->'review'->>'risk_score')::bigint, (op->'log'->>'created_at')::bigint);
                SELECT COUNT(*) INTO recent FROM review_queue
                WHERE instance_id = op->'log'->>'instance_id'
                  AND created_at >= (op->'log'->>'created_at')::bigint - (op->'review'->>'window_ms')::bigint;
                IF recent >= (op->'review'->>'pause_threshold')::bigint THEN
                    UPDATE instances SET paused = 1, paused_reason = op->'review'->>'pause_reason'
                    WHERE id = op->'log'->>'instance_id' AND paused = 0;
                    GET DIAGNOSTICS paused_rows = ROW_COUNT;
                    now_paused := paused_rows > 0;
                END IF;
            END IF;
            results := results || jsonb_build_array(jsonb_build_object('id', new_id, 'paused', now_paused));
        ELSE
            RAISE EXCEPTION 'unknown write %', op->>'op';
        END IF;
    END LOOP;
    RETURN results;
END;
$$;

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
                policy_trace, request_id, correlation_id, deadline_at, idem_key)
            VALUES (op->'log'->>'customer_id', op->'log'->>'instance_id', op->'log'->>'api_key_id',
                op->'log'->>'source', op->'log'->>'purpose', op->'log'->>'recipient',
                op->'log'->>'message_type', op->'log'->>'decision', op->'log'->>'error_code',
                op->'log'->>'policy', op->'log'->>'reason', op->'log'->>'provider_message_id',
                op->'log'->>'status', (op->'log'->>'created_at')::bigint, op->'log'->>'policy_trace',
                op->'log'->>'request_id', op->'log'->>'correlation_id',
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

-- The send path's cache (store/cache.rs) hears of every change to API keys, customers
-- and instances, by any process: NOTIFY gateway_cache, 'table:key' (sent at commit),
-- which every gateway LISTENs to (store/invalidation.rs).
CREATE FUNCTION gateway_cache_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    row_new record;
    row_old record;
BEGIN
    -- Each field is read in its own table's branch (a plpgsql expression naming a field
    -- the row does not have fails even when not taken).
    IF TG_OP <> 'INSERT' THEN
        row_old := OLD;
        IF TG_TABLE_NAME = 'api_keys' THEN
            PERFORM pg_notify('gateway_cache', 'api_keys:' || row_old.key_hash);
        ELSIF TG_TABLE_NAME = 'customers' THEN
            PERFORM pg_notify('gateway_cache', 'customers:' || row_old.id);
        ELSE
            PERFORM pg_notify('gateway_cache', TG_TABLE_NAME || ':' || row_old.customer_id);
        END IF;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        row_new := NEW;
        IF TG_TABLE_NAME = 'api_keys' THEN
            PERFORM pg_notify('gateway_cache', 'api_keys:' || row_new.key_hash);
        ELSIF TG_TABLE_NAME = 'customers' THEN
            PERFORM pg_notify('gateway_cache', 'customers:' || row_new.id);
        ELSE
            PERFORM pg_notify('gateway_cache', TG_TABLE_NAME || ':' || row_new.customer_id);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER api_keys_cache AFTER INSERT OR DELETE OR UPDATE OF revoked_at, key_hash, customer_id ON api_keys
    FOR EACH ROW EXECUTE FUNCTION gateway_cache_notify();
CREATE TRIGGER customers_cache AFTER UPDATE OR DELETE ON customers
    FOR EACH ROW EXECUTE FUNCTION gateway_cache_notify();
CREATE TRIGGER instances_cache AFTER INSERT OR UPDATE OR DELETE ON instances
    FOR EACH ROW EXECUTE FUNCTION gateway_cache_notify();
