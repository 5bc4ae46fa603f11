-- Policy engine (PostgreSQL; keep in step with sqlite/0005_policies.sql).

ALTER TABLE message_log ADD COLUMN policy_trace TEXT;

ALTER TABLE customers ADD COLUMN approved_purposes TEXT;

CREATE TABLE contacts (
    instance_id    TEXT NOT NULL,
    phone          TEXT NOT NULL,
    first_sent_at  BIGINT,
    last_sent_at   BIGINT,
    sent_total     BIGINT NOT NULL DEFAULT 0,
    replies_total  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (instance_id, phone)
);

CREATE TABLE review_queue (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    log_id        BIGINT NOT NULL,
    customer_id   TEXT NOT NULL,
    instance_id   TEXT NOT NULL,
    source        TEXT NOT NULL,
    purpose       TEXT,
    recipient     TEXT,
    message_type  TEXT,
    text          TEXT,
    policy        TEXT NOT NULL,
    reason        TEXT NOT NULL,
    risk_score    BIGINT NOT NULL,
    status        TEXT NOT NULL DEFAULT 'pending',
    created_at    BIGINT NOT NULL,
    decided_at    BIGINT,
    decided_by    TEXT,
    note          TEXT
);
CREATE INDEX review_queue_instance ON review_queue (instance_id, created_at);
CREATE INDEX review_queue_status ON review_queue (status, id);

CREATE TABLE policy_gateways (
    gateway_id    TEXT PRIMARY KEY,
    host          TEXT NOT NULL,
    pid           BIGINT NOT NULL,
    started_at    BIGINT NOT NULL,
    heartbeat_at  BIGINT NOT NULL,
    command_seen  BIGINT NOT NULL,
    status        TEXT NOT NULL
);

CREATE TABLE policy_commands (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    command     TEXT NOT NULL,
    name        TEXT,
    created_at  BIGINT NOT NULL
);

-- The group-commit batch (0002) learns three things for `record`, with the same
-- semantics as the SQLite writer (server/src/store/writer.rs):
--   log.policy_trace    stored with the row;
--   log.went_out        the message went (or may have gone) out: upsert its contact;
--   review {text, policy, reason, risk_score, pause_threshold, window_ms,
--           pause_reason} | null
--                       queue it for review; if the instance now has pause_threshold
--                       reviews within window_ms of the attempt, pause it; answers
--                       "paused".
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
                policy_trace)
            VALUES (op->'log'->>'customer_id', op->'log'->>'instance_id', op->'log'->>'api_key_id',
                op->'log'->>'source', op->'log'->>'purpose', op->'log'->>'recipient',
                op->'log'->>'message_type', op->'log'->>'decision', op->'log'->>'error_code',
                op->'log'->>'policy', op->'log'->>'reason', op->'log'->>'provider_message_id',
                op->'log'->>'status', (op->'log'->>'created_at')::bigint, op->'log'->>'policy_trace')
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
