-- Group commit for PostgreSQL: apply a batch of send-path writes in one statement (one
-- round trip, one transaction, one commit). The writes run in order with exactly the
-- semantics of the SQLite writer (server/src/store/writer.rs), which the same test
-- suite checks on both backends:
--   {"op":"reserve","r":[{scope,window_start,expires_at,limit},...]}
--       increments every counter below its limit, or none: if one is full, undoes the
--       increments made and answers {"ok":false,"index":i,"used":n}; else {"ok":true}
--   {"op":"release","r":[...]}   decrements (not below 0); answers {}
--   {"op":"record","log":{...},"event":{...}|null}
--       inserts the message-log row and the outbox event; answers {"id":n}
CREATE FUNCTION gateway_write_batch(ops jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    op jsonb;
    results jsonb := '[]'::jsonb;
    taken text[];
    hit int;
    used bigint;
    new_id bigint;
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
                message_type, decision, error_code, policy, reason, provider_message_id, status, created_at)
            VALUES (op->'log'->>'customer_id', op->'log'->>'instance_id', op->'log'->>'api_key_id',
                op->'log'->>'source', op->'log'->>'purpose', op->'log'->>'recipient',
                op->'log'->>'message_type', op->'log'->>'decision', op->'log'->>'error_code',
                op->'log'->>'policy', op->'log'->>'reason', op->'log'->>'provider_message_id',
                op->'log'->>'status', (op->'log'->>'created_at')::bigint)
            RETURNING id INTO new_id;
            IF jsonb_typeof(op->'event') = 'object' THEN
                INSERT INTO outbox (customer_id, instance_id, event_type, payload, created_at, available_at)
                VALUES (op->'event'->>'customer_id', op->'event'->>'instance_id', op->'event'->>'event_type',
                    op->'event'->>'payload', (op->'event'->>'created_at')::bigint,
                    (op->'event'->>'created_at')::bigint);
            END IF;
            results := results || jsonb_build_array(jsonb_build_object('id', new_id));
        ELSE
            RAISE EXCEPTION 'unknown write %', op->>'op';
        END IF;
    END LOOP;
    RETURN results;
END;
$$;
