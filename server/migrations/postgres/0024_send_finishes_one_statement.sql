-- A batch of finishes on PostgreSQL in one statement (issue 22; BENCHMARKS.md, "Policy
-- inputs gathered; a batch of finishes in one statement"). 0021 settled a batch of
-- finishes with six statements (the rows, their events, their contacts, the keys given
-- up, the keys answered, the answer), and each statement costs PostgreSQL its start-up
-- (the plan's nodes made, the indexes opened) whatever the rows: under pgbench of the
-- gateway's own writes, a batch of eight finishes took 1,134 µs a call and 1,016 to 1,028
-- with one statement.
--
-- The statement's parts run on one snapshot: the rows are updated first (`u`), and the
-- rest reads which were (`a`, the ops applied), never the tables the others write. The
-- events, contacts and keys are each another table, and keys_once keeps the key given up
-- and the key answered apart, so no part needs to see another's writes. Everything else
-- (begins, and the batches 0021 sends to the loop) is as 0021.
--
-- store::attempts::set_tests holds the answers and every row written to 0013's loop
-- applied one write at a time.
CREATE OR REPLACE FUNCTION gateway_send_ops(ops jsonb) RETURNS jsonb LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off AS $$
DECLARE
    kinds text[];
    gives_back boolean;
    rows_once boolean;
    keys_once boolean;
    scopes_once boolean;
    op_ids bigint[];
    -- The begins' counters, by (begin, place in its list).
    c_n bigint[];
    c_lim bigint[];
    c_j int[];
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
    ok_n int[] := '{}';
    ok_id bigint[] := '{}';
    new_id bigint;
    seq regclass;
    answer jsonb;
BEGIN
    -- A write alone runs the loop: the statements below cost more than its own.
    IF jsonb_array_length(ops) < 2 THEN
        RETURN gateway_send_ops_each(ops);
    END IF;
    SELECT array_agg(DISTINCT e.value->>'op'),
        coalesce(bool_or(CASE WHEN jsonb_typeof(e.value->'release') = 'array'
                              THEN jsonb_array_length(e.value->'release') > 0 ELSE false END), false),
        count(*) = count(DISTINCT e.value->>'id'),
        count(e.value->'idem') FILTER (WHERE jsonb_typeof(e.value->'idem') = 'object')
            = count(DISTINCT e.value->'idem') FILTER (WHERE jsonb_typeof(e.value->'idem') = 'object'),
        array_agg((e.value->>'id')::bigint)
    INTO kinds, gives_back, rows_once, keys_once, op_ids
    FROM jsonb_array_elements(ops) e;
    IF kinds = ARRAY['finish'] AND NOT gives_back AND rows_once AND keys_once THEN
        -- One statement: the rows settled, then, from the ops that settled one, their
        -- events, their contacts and their keys.
        WITH f AS MATERIALIZED (
            SELECT e.op, e.n, (e.op->>'id')::bigint AS id FROM jsonb_array_elements(ops) WITH ORDINALITY AS e(op, n)
        ), u AS (
            UPDATE message_log m SET status = x.status, decision = coalesce(x.decision, m.decision),
                error_code = x.error_code, policy = x.policy, reason = x.reason,
                provider_message_id = x.provider_message_id, deadline_at = NULL
            FROM jsonb_to_recordset(ops) AS x(id bigint, status text, decision text, error_code text,
                policy text, reason text, provider_message_id text)
            -- By the primary key: `coalesce` keeps the planner off the partial index of
            -- pending rows (0021).
            WHERE m.id = ANY (op_ids) AND m.id = x.id AND coalesce(m.status, '') = 'pending'
            RETURNING m.id
        ), a AS MATERIALIZED (
            SELECT f.op, f.n, f.id FROM f WHERE f.id IN (SELECT u.id FROM u)
        ), o AS (
            -- 0013: the event names its row (log_id); in batch order.
            INSERT INTO outbox (customer_id, instance_id, event_type, payload, created_at, available_at, log_id)
            SELECT a.op->'event'->>'customer_id', a.op->'event'->>'instance_id', a.op->'event'->>'event_type',
                a.op->'event'->>'payload', (a.op->'event'->>'created_at')::bigint,
                (a.op->'event'->>'created_at')::bigint, a.id
            FROM a WHERE jsonb_typeof(a.op->'event') = 'object'
            ORDER BY a.n
        ), c AS (
            INSERT INTO contacts (instance_id, phone, first_sent_at, last_sent_at, sent_total)
            SELECT s.instance_id, s.phone, (array_agg(s.at ORDER BY s.n))[1], (array_agg(s.at ORDER BY s.n DESC))[1],
                count(*)
            FROM (SELECT a.op->>'instance_id' AS instance_id, a.op->>'recipient' AS phone, (a.op->>'at')::bigint AS at, a.n
                  FROM a WHERE (a.op->>'went_out')::boolean AND a.op->>'instance_id' IS NOT NULL
                    AND a.op->>'recipient' IS NOT NULL) s
            GROUP BY s.instance_id, s.phone
            ON CONFLICT (instance_id, phone) DO UPDATE SET
                first_sent_at = COALESCE(contacts.first_sent_at, excluded.first_sent_at),
                last_sent_at = excluded.last_sent_at, sent_total = contacts.sent_total + excluded.sent_total
        ), d AS (
            -- A request's idempotency key: given up, or given its answer to replay.
            DELETE FROM idempotency_keys k USING a
            WHERE jsonb_typeof(a.op->'idem') = 'object' AND a.op->'answer'->>'release' = 'true'
              AND k.customer_id = a.op->'idem'->>'customer_id' AND k.idem_key = a.op->'idem'->>'key' AND k.log_id = a.id
        ), k AS (
            UPDATE idempotency_keys k SET response_status = (a.op->'answer'->>'status')::int,
                response_body = a.op->'answer'->>'body', lease_until = NULL
            FROM a
            WHERE jsonb_typeof(a.op->'idem') = 'object' AND jsonb_typeof(a.op->'answer') = 'object'
              AND (a.op->'answer'->>'release') IS DISTINCT FROM 'true'
              AND k.customer_id = a.op->'idem'->>'customer_id' AND k.idem_key = a.op->'idem'->>'key' AND k.log_id = a.id
              AND k.response_status IS NULL
        )
        SELECT coalesce(jsonb_agg(jsonb_build_object('applied', f.id IN (SELECT a.id FROM a)) ORDER BY f.n), '[]'::jsonb)
        INTO answer FROM f;
        RETURN answer;
    END IF;

    IF kinds IS DISTINCT FROM ARRAY['begin'] THEN
        RETURN gateway_send_ops_each(ops);
    END IF;
    n_ops := jsonb_array_length(ops);
    -- Each counter of each begin, with the place of its row among the batch's counters in
    -- key order (c_j: where k_* below holds it).
    SELECT array_agg(s.n ORDER BY s.n, s.i), array_agg(s.lim ORDER BY s.n, s.i), array_agg(s.j ORDER BY s.n, s.i),
        count(*) = count(DISTINCT (s.n, s.scope))
    INTO c_n, c_lim, c_j, scopes_once
    FROM (SELECT e.n, x.i, x.v->>'scope' AS scope, (x.v->>'limit')::bigint AS lim,
              dense_rank() OVER (ORDER BY x.v->>'scope', (x.v->>'window_start')::bigint)::int AS j
          FROM jsonb_array_elements(ops) WITH ORDINALITY AS e(op, n),
              jsonb_array_elements(e.op->'r') WITH ORDINALITY AS x(v, i)) s;
    IF NOT scopes_once THEN
        RETURN gateway_send_ops_each(ops);
    END IF;
    -- Locked and read once, in the order the batch first names them, which is the order
    -- the loop takes them in (so a batch that runs the loop on another connection meets
    -- them in the same order, as before); a counter not yet there is made with nothing
    -- taken (as the loop's increment then give-back of a refused send leaves it), with the
    -- expiry and limit of the first begin that names it, and its first increment always
    -- succeeds (the loop's INSERT).
    WITH want AS (
        SELECT DISTINCT ON (x.v->>'scope', (x.v->>'window_start')::bigint) x.v->>'scope' AS scope,
            (x.v->>'window_start')::bigint AS ws, (x.v->>'expires_at')::bigint AS expires_at,
            (x.v->>'limit')::bigint AS lim, e.n, x.i
        FROM jsonb_array_elements(ops) WITH ORDINALITY AS e(op, n),
            jsonb_array_elements(e.op->'r') WITH ORDINALITY AS x(v, i)
        ORDER BY 1, 2, e.n, x.i
    ), got AS (
        INSERT INTO usage_counters AS u (scope, window_start, count, expires_at, lim)
        SELECT scope, ws, 0, expires_at, lim FROM want ORDER BY n, i
        ON CONFLICT (scope, window_start) DO UPDATE SET count = u.count
        RETURNING u.scope, u.window_start, u.count, u.lim, u.xmax = 0 AS fresh
    )
    SELECT array_agg(scope ORDER BY scope, window_start), array_agg(window_start ORDER BY scope, window_start),
        array_agg(count ORDER BY scope, window_start), array_agg(lim ORDER BY scope, window_start),
        array_agg(fresh ORDER BY scope, window_start), array_agg(false)
    INTO k_scope, k_ws, k_count, k_lim, k_fresh, k_changed FROM got;

    seq := pg_get_serial_sequence('message_log', 'id')::regclass;
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
            j := c_j[c];
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
            -- The row's id now, so that a key is claimed for it here, in batch order, as
            -- the loop claims it after writing the row; a key lost takes the id all the
            -- same (the loop writes the row, then deletes it).
            new_id := nextval(seq);
            IF jsonb_typeof(ops->(b - 1)->'idem') = 'object' AND NOT gateway_claim_key(
                    ops->(b - 1)->'idem' || jsonb_build_object('log_id', new_id, 'lease_until', NULL)) THEN
                FOREACH j IN ARRAY taken LOOP
                    IF k_count[j] > 0 THEN
                        k_count[j] := k_count[j] - 1;
                    END IF;
                END LOOP;
                res[b] := jsonb_build_object('lost', true);
            ELSE
                res[b] := jsonb_build_object('ok', true, 'id', new_id, 'counts', to_jsonb(counts));
                ok_n := ok_n || b;
                ok_id := ok_id || new_id;
            END IF;
        ELSE
            FOREACH j IN ARRAY taken LOOP
                IF k_count[j] > 0 THEN
                    k_count[j] := k_count[j] - 1;
                END IF;
            END LOOP;
            j := c_j[p + hit];
            res[b] := jsonb_build_object('ok', false, 'index', hit, 'used', k_count[j]);
        END IF;
        p := q;
    END LOOP;

    UPDATE usage_counters u SET count = k.count, lim = k.lim
    FROM unnest(k_scope, k_ws, k_count, k_lim, k_changed) AS k(scope, ws, count, lim, changed)
    WHERE k.changed AND u.scope = k.scope AND u.window_start = k.ws;

    INSERT INTO message_log (id, customer_id, instance_id, api_key_id, source, purpose, recipient,
        message_type, decision, error_code, policy, reason, provider_message_id, status, created_at,
        policy_trace, request_id, correlation_id, deadline_at, idem_key, owner_lease)
    OVERRIDING SYSTEM VALUE
    SELECT w.id, w.op->'log'->>'customer_id', w.op->'log'->>'instance_id', w.op->'log'->>'api_key_id',
        w.op->'log'->>'source', w.op->'log'->>'purpose', w.op->'log'->>'recipient',
        w.op->'log'->>'message_type', w.op->'log'->>'decision', w.op->'log'->>'error_code',
        w.op->'log'->>'policy', w.op->'log'->>'reason', w.op->'log'->>'provider_message_id',
        w.op->'log'->>'status', (w.op->'log'->>'created_at')::bigint, w.op->'log'->>'policy_trace',
        w.op->'log'->>'request_id', w.op->'log'->>'correlation_id',
        (w.op->>'deadline_at')::bigint, w.op->'idem'->>'key', (w.op->>'owner_lease')::bigint
    FROM (SELECT u.id, ops->(u.n - 1) AS op, u.n FROM unnest(ok_n, ok_id) AS u(n, id)) w
    ORDER BY w.n;
    RETURN to_jsonb(res);
END;
$$;
