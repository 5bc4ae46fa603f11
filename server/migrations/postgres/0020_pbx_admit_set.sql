-- PBX admissions in a few statements a batch instead of four an event. The loop of 0018
-- ran, for each event, the check that its integration is unchanged, the signature, the
-- rate limit and the log row; under bench/pbx.sh on PostgreSQL the writer's backend was
-- on the CPU three quarters of the time, a fifth of it starting those statements
-- (BENCHMARKS.md, issue 22). Here a batch checks each integration and settings it meets
-- once, remembers its signatures in one INSERT, locks and reads each rate limiter once,
-- steps it in memory event by event, writes it back once, and inserts its log rows in
-- one INSERT. The writes and the answers are those of 0018, kept as
-- gateway_pbx_admit_each: the three kinds of write go to three tables, nothing in the
-- batch reads another's write but the rate limit its own key, and each keeps its batch
-- order (the first of two events with one signature is admitted, the second is its
-- replay; a limiter sees its events in batch order).
ALTER FUNCTION gateway_pbx_admit(jsonb) RENAME TO gateway_pbx_admit_each;

CREATE FUNCTION gateway_pbx_admit(ops jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    op jsonb;
    u jsonb;
    n int := 0;
    k text;
    checked_id text;                -- the last integration and settings found unchanged
    checked jsonb;
    fine boolean[] := '{}';         -- each event: not stale
    sigs jsonb[] := '{}';           -- the signatures of the events not stale
    fresh jsonb;                    -- the signatures remembered by this batch, as keys
    results jsonb[] := '{}';
    logs jsonb[] := '{}';           -- the log rows, in batch order
    log_at int[] := '{}';           -- the answer each log row belongs to
    ids bigint[];
    now_ms bigint;
    t bigint;
    tats jsonb := '{}'::jsonb;      -- each limiter's arrival time as the batch moves it (null: new)
    moved jsonb := '{}'::jsonb;     -- the limiters to write back
    limited bigint;
    lg jsonb;
BEGIN
    -- Stale or not (0018's check); a caller of the 0003 form sends no "used".
    FOR op IN SELECT value FROM jsonb_array_elements(ops) LOOP
        u := op->'used';
        IF u IS NOT NULL THEN
            IF op->>'integration_id' IS DISTINCT FROM checked_id OR u IS DISTINCT FROM checked THEN
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
                    fine := fine || false;
                    CONTINUE;
                END IF;
                checked_id := op->>'integration_id';
                checked := u;
            END IF;
        END IF;
        fine := fine || true;
        IF jsonb_typeof(op->'signature') = 'string' THEN
            sigs := sigs || jsonb_build_object('signature_ts', op->'signature_ts',
                'integration_id', op->'integration_id', 'signature', op->'signature');
        END IF;
    END LOOP;

    -- The signatures, remembered at once; one already seen is not returned.
    WITH seen AS (
        INSERT INTO pbx_seen_signatures (ts, integration_id, signature)
        SELECT (s->>'signature_ts')::bigint, (s->>'integration_id')::bigint, s->>'signature'
        FROM unnest(sigs) AS x(s)
        ON CONFLICT (ts, integration_id, signature) DO NOTHING
        RETURNING ts, integration_id, signature)
    SELECT COALESCE(jsonb_object_agg(ts || ' ' || integration_id || ' ' || signature, true), '{}'::jsonb)
    INTO fresh FROM seen;

    FOR op IN SELECT value FROM jsonb_array_elements(ops) LOOP
        n := n + 1;
        IF NOT fine[n] THEN
            results := results || jsonb_build_object('stale', true);
            CONTINUE;
        END IF;
        IF jsonb_typeof(op->'signature') = 'string' THEN
            k := (op->>'signature_ts')::bigint || ' ' || (op->>'integration_id')::bigint || ' ' || (op->>'signature');
            IF NOT fresh ? k THEN
                results := results || jsonb_build_object('replay', true);
                CONTINUE;
            END IF;
            fresh := fresh - k;
        END IF;
        limited := NULL;
        IF jsonb_typeof(op->'rate') = 'object' THEN
            k := op->'rate'->>'key';
            IF NOT tats ? k THEN
                -- The limiter's row, locked until the batch commits; a new key's row is
                -- made now (arrival time 0, read as new), so that a batch on another
                -- connection waits for this one. DO UPDATE rather than a read after DO
                -- NOTHING: a row deleted in between (retention) is made again.
                INSERT INTO rate_limits AS r (key, tat, expires_at) VALUES (k, 0, 0)
                ON CONFLICT (key) DO UPDATE SET tat = r.tat
                RETURNING r.tat INTO t;
                tats := tats || jsonb_build_object(k, NULLIF(t, 0));
            END IF;
            -- 0018's step: admitted when the theoretical arrival time is at most
            -- "tolerance" ahead (always, for a new key), which moves it on.
            t := (tats->>k)::bigint;
            now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
            IF t IS NULL THEN
                t := now_ms + (op->'rate'->>'interval')::bigint;
            ELSIF GREATEST(t, now_ms) - now_ms <= (op->'rate'->>'tolerance')::bigint THEN
                t := GREATEST(t, now_ms) + (op->'rate'->>'interval')::bigint;
            ELSE
                limited := t - now_ms - (op->'rate'->>'tolerance')::bigint;
            END IF;
            IF limited IS NULL THEN
                tats := tats || jsonb_build_object(k, t);
                moved := moved || jsonb_build_object(k, t);
            END IF;
        END IF;
        IF jsonb_typeof(op->'log') = 'object' THEN
            lg := op->'log';
            IF limited IS NOT NULL THEN
                lg := lg || jsonb_build_object('action', 'rate_limited', 'status_code', 429,
                                               'error_code', 'webhook_rate_limited', 'response', NULL);
            END IF;
            logs := logs || lg;
            log_at := log_at || n;
        END IF;
        results := results || jsonb_build_object('replay', false, 'rate_limited_for_ms', limited, 'log_id', NULL);
    END LOOP;

    -- Each limiter that admitted, once, at its last arrival time.
    IF moved <> '{}'::jsonb THEN
        UPDATE rate_limits r SET tat = (moved->>r.key)::bigint, expires_at = (moved->>r.key)::bigint
        WHERE r.key = ANY (ARRAY(SELECT jsonb_object_keys(moved)));
    END IF;

    -- The log rows in batch order, so that their ids follow it as in 0018.
    IF cardinality(logs) > 0 THEN
        WITH rows AS (
            INSERT INTO pbx_events (integration_id, customer_id, event_type, action, status_code, error_code,
                phone, message_id, external_message_id, response, created_at)
            SELECT (l->>'integration_id')::bigint, l->>'customer_id', l->>'event_type', l->>'action',
                (l->>'status_code')::bigint, l->>'error_code', l->>'phone', l->>'message_id',
                l->>'external_message_id', l->>'response', (l->>'created_at')::bigint
            FROM unnest(logs) WITH ORDINALITY AS x(l, i)
            ORDER BY i
            RETURNING id)
        SELECT array_agg(id ORDER BY id) INTO ids FROM rows;
        FOR n IN 1 .. array_length(ids, 1) LOOP
            results[log_at[n]] := results[log_at[n]] || jsonb_build_object('log_id', ids[n]);
        END LOOP;
    END IF;
    RETURN to_jsonb(results);
END;
$$;
