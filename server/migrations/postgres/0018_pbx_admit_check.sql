-- A PBX webhook request takes its integration from the process's cache (store/cache.rs)
-- instead of reading it: its admission now first checks that the integration is still as
-- the request was authenticated against (secrets, allowlist, settings, the customer's PBX
-- module). If not, it writes nothing and answers {"stale": true}, and the request is
-- checked again against the integration read anew, so a rotated secret or a module
-- turned off holds for the first request admitted after the command returned.
-- Otherwise as in 0003.
CREATE OR REPLACE FUNCTION gateway_pbx_admit(ops jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    op jsonb;
    u jsonb;
    results jsonb := '[]'::jsonb;
    n bigint;
    now_ms bigint;
    new_tat bigint;
    limited bigint;
    lg jsonb;
    new_id bigint;
BEGIN
    FOR op IN SELECT value FROM jsonb_array_elements(ops) LOOP
        u := op->'used';
        -- A caller of the 0003 form (a process not yet upgraded) sends no "used".
        IF u IS NOT NULL THEN
            PERFORM 1 FROM pbx_integrations p JOIN customers c ON c.id = p.customer_id
            WHERE p.id = (op->>'integration_id')::bigint
              AND p.secret_hash = u->>'secret_hash'
              AND p.hmac_secret IS NOT DISTINCT FROM u->>'hmac_secret'
              AND p.ip_allowlist IS NOT DISTINCT FROM u->>'ip_allowlist'
              AND p.rate_per_minute IS NOT DISTINCT FROM (u->>'rate_per_minute')::bigint
              AND p.burst IS NOT DISTINCT FROM (u->>'burst')::bigint
              AND p.cooldown_seconds IS NOT DISTINCT FROM (u->>'cooldown_seconds')::bigint
              AND p.strict_window_hours IS NOT DISTINCT FROM (u->>'strict_window_hours')::bigint
              AND p.business_name IS NOT DISTINCT FROM u->>'business_name'
              AND (c.module_pbx <> 0) = ((u->>'module_pbx')::bigint <> 0);
            IF NOT FOUND THEN
                results := results || jsonb_build_array(jsonb_build_object('stale', true));
                CONTINUE;
            END IF;
        END IF;
        IF jsonb_typeof(op->'signature') = 'string' THEN
            INSERT INTO pbx_seen_signatures (ts, integration_id, signature)
            VALUES ((op->>'signature_ts')::bigint, (op->>'integration_id')::bigint, op->>'signature')
            ON CONFLICT (ts, integration_id, signature) DO NOTHING;
            GET DIAGNOSTICS n = ROW_COUNT;
            IF n = 0 THEN
                results := results || jsonb_build_array(jsonb_build_object('replay', true));
                CONTINUE;
            END IF;
        END IF;
        limited := NULL;
        IF jsonb_typeof(op->'rate') = 'object' THEN
            now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
            INSERT INTO rate_limits AS r (key, tat, expires_at)
            VALUES (op->'rate'->>'key', now_ms + (op->'rate'->>'interval')::bigint,
                    now_ms + (op->'rate'->>'interval')::bigint)
            ON CONFLICT (key) DO UPDATE
                SET tat = GREATEST(r.tat, now_ms) + (op->'rate'->>'interval')::bigint,
                    expires_at = GREATEST(r.tat, now_ms) + (op->'rate'->>'interval')::bigint
                WHERE GREATEST(r.tat, now_ms) - now_ms <= (op->'rate'->>'tolerance')::bigint
            RETURNING r.tat INTO new_tat;
            IF NOT FOUND THEN
                SELECT tat - now_ms - (op->'rate'->>'tolerance')::bigint INTO limited
                FROM rate_limits WHERE key = op->'rate'->>'key';
            END IF;
        END IF;
        new_id := NULL;
        IF jsonb_typeof(op->'log') = 'object' THEN
            lg := op->'log';
            IF limited IS NOT NULL THEN
                lg := lg || jsonb_build_object('action', 'rate_limited', 'status_code', 429,
                                               'error_code', 'webhook_rate_limited', 'response', NULL);
            END IF;
            INSERT INTO pbx_events (integration_id, customer_id, event_type, action, status_code, error_code,
                phone, message_id, external_message_id, response, created_at)
            VALUES ((lg->>'integration_id')::bigint, lg->>'customer_id', lg->>'event_type', lg->>'action',
                (lg->>'status_code')::bigint, lg->>'error_code', lg->>'phone', lg->>'message_id',
                lg->>'external_message_id', lg->>'response', (lg->>'created_at')::bigint)
            RETURNING id INTO new_id;
        END IF;
        results := results || jsonb_build_array(jsonb_build_object(
            'replay', false, 'rate_limited_for_ms', limited, 'log_id', new_id));
    END LOOP;
    RETURN results;
END;
$$;
