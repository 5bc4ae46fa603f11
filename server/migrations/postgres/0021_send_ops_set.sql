-- The send path's writes as a few statements over the whole batch instead of a few a
-- write. Under bench/run.sh a PostgreSQL send spent about 240 µs in gateway_send_ops,
-- 105 of them in PL/pgSQL, the statements' start-up and JSON between its statements
-- (BENCHMARKS.md, issue 22). The writer runs begins in its main lane and the settles
-- that give nothing back in the settle lane, so a batch is nearly always all begins or
-- all finishes:
--
-- - finishes: one UPDATE of the pending rows, one INSERT of their events in batch order,
--   one upsert a contact (its sends in batch order: the first time of the first, the
--   last of the last, the number of them);
-- - begins: each counter the batch names is locked and read once (one upsert, in key
--   order), stepped in memory begin by begin in batch order exactly as gateway_reserve
--   steps the row (0008), and written back once; then one INSERT of the rows of the
--   begins it allowed, in batch order, so their ids are the ones the loop would give.
--
-- Anything else runs the loop of 0013 (kept as gateway_send_ops_each): a key to claim
-- (idempotency), counters given back, a claim, begins and finishes together, one row
-- finished twice, one counter named twice by a begin. The answers and every row written
-- are the loop's; the test store::attempts::set_tests holds the two to each other.
ALTER FUNCTION gateway_send_ops(jsonb) RENAME TO gateway_send_ops_each;

CREATE FUNCTION gateway_send_ops(ops jsonb) RETURNS jsonb LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off AS $$
DECLARE
    kinds text[];
    applied bigint[];
    -- The begins' counters, by (begin, place in its list).
    c_n bigint[];
    c_scope text[];
    c_ws bigint[];
    c_lim bigint[];
    -- Each counter the batch names once: its row as the batch goes.
    k_scope text[];
    k_ws bigint[];
    k_count bigint[];
    k_lim bigint[];
    k_fresh boolean[];
    k_changed boolean[];
    n_ops int;
    p int := 1;
    q int;
    j int;
    hit int;
    taken int[];
    counts jsonb[];
    res jsonb[];
    ok_n bigint[] := '{}';
    new_ids bigint[];
BEGIN
    SELECT array_agg(DISTINCT e.value->>'op') INTO kinds FROM jsonb_array_elements(ops) e;
    IF kinds = ARRAY['finish']
       AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(ops) e
                       WHERE jsonb_typeof(e.value->'idem') = 'object'
                          OR jsonb_array_length(COALESCE(e.value->'release', '[]')) > 0)
       AND (SELECT count(*) = count(DISTINCT e.value->>'id') FROM jsonb_array_elements(ops) e) THEN
        WITH u AS (
            UPDATE message_log m SET status = f.status, decision = coalesce(f.decision, m.decision),
                error_code = f.error_code, policy = f.policy, reason = f.reason,
                provider_message_id = f.provider_message_id, deadline_at = NULL
            FROM jsonb_to_recordset(ops) AS f(id bigint, status text, decision text, error_code text,
                policy text, reason text, provider_message_id text)
            WHERE m.id = f.id AND m.status = 'pending'
            RETURNING m.id
        )
        SELECT coalesce(array_agg(id), '{}') INTO applied FROM u;
        -- 0013: the event names its row (log_id).
        INSERT INTO outbox (customer_id, instance_id, event_type, payload, created_at, available_at, log_id)
        SELECT e.op->'event'->>'customer_id', e.op->'event'->>'instance_id', e.op->'event'->>'event_type',
            e.op->'event'->>'payload', (e.op->'event'->>'created_at')::bigint,
            (e.op->'event'->>'created_at')::bigint, (e.op->>'id')::bigint
        FROM jsonb_array_elements(ops) WITH ORDINALITY AS e(op, n)
        WHERE jsonb_typeof(e.op->'event') = 'object' AND (e.op->>'id')::bigint = ANY (applied)
        ORDER BY e.n;
        INSERT INTO contacts (instance_id, phone, first_sent_at, last_sent_at, sent_total)
        SELECT s.instance_id, s.phone, (array_agg(s.at ORDER BY s.n))[1], (array_agg(s.at ORDER BY s.n DESC))[1],
            count(*)
        FROM (SELECT e.op->>'instance_id' AS instance_id, e.op->>'recipient' AS phone, (e.op->>'at')::bigint AS at, e.n
              FROM jsonb_array_elements(ops) WITH ORDINALITY AS e(op, n)
              WHERE (e.op->>'went_out')::boolean AND e.op->>'instance_id' IS NOT NULL
                AND e.op->>'recipient' IS NOT NULL AND (e.op->>'id')::bigint = ANY (applied)) s
        GROUP BY s.instance_id, s.phone
        ON CONFLICT (instance_id, phone) DO UPDATE SET
            first_sent_at = COALESCE(contacts.first_sent_at, excluded.first_sent_at),
            last_sent_at = excluded.last_sent_at, sent_total = contacts.sent_total + excluded.sent_total;
        RETURN coalesce((SELECT jsonb_agg(jsonb_build_object('applied', (e.op->>'id')::bigint = ANY (applied))
                                          ORDER BY e.n)
                         FROM jsonb_array_elements(ops) WITH ORDINALITY AS e(op, n)), '[]'::jsonb);
    END IF;

    IF kinds IS DISTINCT FROM ARRAY['begin']
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(ops) e WHERE jsonb_typeof(e.value->'idem') = 'object')
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(ops) WITH ORDINALITY AS e(op, n), jsonb_array_elements(e.op->'r') x
                  GROUP BY e.n, x->>'scope' HAVING count(*) > 1) THEN
        RETURN gateway_send_ops_each(ops);
    END IF;

    n_ops := jsonb_array_length(ops);
    SELECT array_agg(e.n ORDER BY e.n, x.i), array_agg(x.v->>'scope' ORDER BY e.n, x.i),
        array_agg((x.v->>'window_start')::bigint ORDER BY e.n, x.i), array_agg((x.v->>'limit')::bigint ORDER BY e.n, x.i)
    INTO c_n, c_scope, c_ws, c_lim
    FROM jsonb_array_elements(ops) WITH ORDINALITY AS e(op, n), jsonb_array_elements(e.op->'r') WITH ORDINALITY AS x(v, i);
    -- Locked and read once, in key order; a counter not yet there is made with nothing
    -- taken (as the loop's increment then give-back of a refused send leaves it), with the
    -- expiry and limit of the first begin that names it, and its first increment always
    -- succeeds (the loop's INSERT).
    WITH want AS (
        SELECT DISTINCT ON (x.v->>'scope', (x.v->>'window_start')::bigint) x.v->>'scope' AS scope,
            (x.v->>'window_start')::bigint AS ws, (x.v->>'expires_at')::bigint AS expires_at,
            (x.v->>'limit')::bigint AS lim
        FROM jsonb_array_elements(ops) WITH ORDINALITY AS e(op, n),
            jsonb_array_elements(e.op->'r') WITH ORDINALITY AS x(v, i)
        ORDER BY 1, 2, e.n, x.i
    ), got AS (
        INSERT INTO usage_counters AS u (scope, window_start, count, expires_at, lim)
        SELECT scope, ws, 0, expires_at, lim FROM want ORDER BY scope, ws
        ON CONFLICT (scope, window_start) DO UPDATE SET count = u.count
        RETURNING u.scope, u.window_start, u.count, u.lim, u.xmax = 0 AS fresh
    )
    SELECT array_agg(scope), array_agg(window_start), array_agg(count), array_agg(lim), array_agg(fresh),
        array_agg(false)
    INTO k_scope, k_ws, k_count, k_lim, k_fresh, k_changed FROM got;

    res := array_fill(NULL::jsonb, ARRAY[n_ops]);
    FOR b IN 1 .. n_ops LOOP
        q := p;
        WHILE q <= coalesce(array_length(c_n, 1), 0) AND c_n[q] = b LOOP
            q := q + 1;
        END LOOP;
        -- gateway_reserve: every counter of the begin is tried; if any is full, the ones
        -- taken are given back and the first full one is named.
        hit := NULL;
        taken := '{}';
        counts := '{}';
        FOR c IN p .. q - 1 LOOP
            j := 1;
            WHILE NOT (k_scope[j] = c_scope[c] AND k_ws[j] = c_ws[c]) LOOP
                j := j + 1;
            END LOOP;
            IF k_fresh[j] OR k_count[j] < c_lim[c] THEN
                k_fresh[j] := false;
                k_count[j] := k_count[j] + 1;
                k_lim[j] := c_lim[c];
                k_changed[j] := true;
                taken := taken || j;
                counts := counts || to_jsonb(k_count[j]);
            ELSIF hit IS NULL THEN
                hit := c - p;
            END IF;
        END LOOP;
        IF hit IS NULL THEN
            res[b] := jsonb_build_object('ok', true, 'counts', to_jsonb(counts));
            ok_n := ok_n || b::bigint;
        ELSE
            FOREACH j IN ARRAY taken LOOP
                IF k_count[j] > 0 THEN
                    k_count[j] := k_count[j] - 1;
                END IF;
            END LOOP;
            j := 1;
            WHILE NOT (k_scope[j] = c_scope[p + hit] AND k_ws[j] = c_ws[p + hit]) LOOP
                j := j + 1;
            END LOOP;
            res[b] := jsonb_build_object('ok', false, 'index', hit, 'used', k_count[j]);
        END IF;
        p := q;
    END LOOP;

    UPDATE usage_counters u SET count = k.count, lim = k.lim
    FROM unnest(k_scope, k_ws, k_count, k_lim, k_changed) AS k(scope, ws, count, lim, changed)
    WHERE k.changed AND u.scope = k.scope AND u.window_start = k.ws;

    WITH ins AS (
        INSERT INTO message_log (customer_id, instance_id, api_key_id, source, purpose, recipient,
            message_type, decision, error_code, policy, reason, provider_message_id, status, created_at,
            policy_trace, request_id, correlation_id, deadline_at, idem_key, owner_lease)
        SELECT e.op->'log'->>'customer_id', e.op->'log'->>'instance_id', e.op->'log'->>'api_key_id',
            e.op->'log'->>'source', e.op->'log'->>'purpose', e.op->'log'->>'recipient',
            e.op->'log'->>'message_type', e.op->'log'->>'decision', e.op->'log'->>'error_code',
            e.op->'log'->>'policy', e.op->'log'->>'reason', e.op->'log'->>'provider_message_id',
            e.op->'log'->>'status', (e.op->'log'->>'created_at')::bigint, e.op->'log'->>'policy_trace',
            e.op->'log'->>'request_id', e.op->'log'->>'correlation_id',
            (e.op->>'deadline_at')::bigint, NULL, (e.op->>'owner_lease')::bigint
        FROM jsonb_array_elements(ops) WITH ORDINALITY AS e(op, n)
        WHERE e.n = ANY (ok_n)
        ORDER BY e.n
        RETURNING id
    )
    -- Ids are drawn in the order the rows go in, which is batch order.
    SELECT array_agg(id ORDER BY id) INTO new_ids FROM ins;
    FOR i IN 1 .. coalesce(array_length(ok_n, 1), 0) LOOP
        res[ok_n[i]] := res[ok_n[i]] || jsonb_build_object('id', new_ids[i]);
    END LOOP;
    RETURN to_jsonb(res);
END;
$$;
