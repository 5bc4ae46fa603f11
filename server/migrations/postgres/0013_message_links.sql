-- Each event names the message-log row it is about (`outbox.log_id`), so a message's
-- detail reads its events by an index instead of searching the customer's event
-- bodies; and a row is found by the provider's id of its message (status reports and
-- echoes of a send) by an index. Keep in step with sqlite/0012_message_links.sql.
ALTER TABLE outbox ADD COLUMN log_id BIGINT;
CREATE INDEX outbox_log ON outbox (log_id) WHERE log_id IS NOT NULL;
CREATE INDEX message_log_provider_id ON message_log (instance_id, provider_message_id)
    WHERE provider_message_id IS NOT NULL;

-- Events written before this name their message only inside their body. Rather than
-- rewrite every one of them here, the detail of a row logged before this point (at or
-- below `log_through`) also looks among the events written before it (at or below
-- `outbox_through`) by the provider's message id; those rows leave with retention.
CREATE TABLE outbox_unlinked (
    log_through    BIGINT NOT NULL,
    outbox_through BIGINT NOT NULL
);
INSERT INTO outbox_unlinked (log_through, outbox_through)
SELECT (SELECT COALESCE(MAX(id), 0) FROM message_log), (SELECT COALESCE(MAX(id), 0) FROM outbox);

-- gateway_send_ops as in 0009, with one change: the event a `finish` writes names its
-- row (`log_id`, the op's `id`). Marked "0013" below; otherwise as 0012 (the pending row
-- names its owner's lease).
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
                    -- 0013: the event names its row (log_id).
                    INSERT INTO outbox (customer_id, instance_id, event_type, payload, created_at, available_at,
                        log_id)
                    VALUES (op->'event'->>'customer_id', op->'event'->>'instance_id',
                        op->'event'->>'event_type', op->'event'->>'payload', (op->'event'->>'created_at')::bigint,
                        (op->'event'->>'created_at')::bigint, (op->>'id')::bigint);
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
