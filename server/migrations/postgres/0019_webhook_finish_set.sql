-- The writes of finished webhook attempts as three statements over the whole batch (the
-- attempt rows, the events' states, the endpoints' failure clocks) instead of three a
-- delivery: under bench/webhooks.sh the loop of 0004 spent about 60 µs a delivery, 25 of
-- them in PL/pgSQL between its statements (BENCHMARKS.md, issue 22). The writes are the
-- same as 0004's. The statements run in that order; within a batch the order of the
-- writes matters only where two of them meet: one event finished twice (a manual resend
-- beside its scheduled delivery), an event made due again, or an endpoint's failure clock
-- set or stopped (a failure, a disable). A batch with any of those runs the loop of 0004,
-- kept as gateway_webhook_finish_each.
ALTER FUNCTION gateway_webhook_finish(jsonb) RENAME TO gateway_webhook_finish_each;

-- A plan that looks each event up by its key, whatever the outbox's statistics say: a
-- hash join would read the whole outbox for a batch of a hundred.
CREATE FUNCTION gateway_webhook_finish(ops jsonb) RETURNS jsonb LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(ops) e
               WHERE e.value->>'state' NOT IN ('done', 'none') OR e.value->>'change' NOT IN ('none', 'succeeded'))
       OR (SELECT count(*) <> count(DISTINCT e.value->>'event_id') FROM jsonb_array_elements(ops) e
           WHERE e.value->>'state' = 'done') THEN
        RETURN gateway_webhook_finish_each(ops);
    END IF;
    -- In batch order, so that the attempts' ids follow it as in 0004.
    INSERT INTO webhook_attempts (outbox_id, customer_id, instance_id, event_type, url, trigger_kind,
        attempt, attempted_at, status_code, latency_ms, response_body, error, succeeded)
    SELECT a.outbox_id, a.customer_id, a.instance_id, a.event_type, a.url, a."trigger", a.attempt,
        a.attempted_at, a.status_code, a.latency_ms, a.response_body, a.error, a.succeeded
    FROM jsonb_array_elements(ops) WITH ORDINALITY AS e(op, n),
        jsonb_to_record(e.op->'attempt') AS a(outbox_id bigint, customer_id text, instance_id text,
            event_type text, url text, "trigger" text, attempt bigint, attempted_at bigint, status_code bigint,
            latency_ms bigint, response_body text, error text, succeeded bigint)
    WHERE jsonb_typeof(e.op->'attempt') = 'object'
    ORDER BY e.n;
    UPDATE outbox o SET attempts = o.attempts + x.counted, delivered_at = x.now, outcome = x.outcome,
        locked_until = NULL
    FROM jsonb_to_recordset(ops) AS x(event_id bigint, state text, counted bigint, now bigint, outcome text)
    WHERE x.state = 'done' AND o.id = x.event_id;
    UPDATE webhook_endpoints SET failing_since = NULL
    WHERE failing_since IS NOT NULL AND instance_id IN (
        SELECT e.value->'attempt'->>'instance_id' FROM jsonb_array_elements(ops) e
        WHERE e.value->>'change' = 'succeeded' AND jsonb_typeof(e.value->'attempt') = 'object');
    RETURN (SELECT COALESCE(jsonb_agg('{}'::jsonb), '[]'::jsonb) FROM jsonb_array_elements(ops));
END;
$$;
