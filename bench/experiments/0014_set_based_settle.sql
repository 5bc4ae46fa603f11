-- gateway_send_ops with the same signature, input and answers as 0013, but settling a
-- batch's `finish` ops together (PostgreSQL only: SQLite runs its own Rust code path,
-- store/attempts.rs, and is unaffected; it needs no migration).
--
-- Why: the function looped over its ops, and each finish ran 4 to 6 statements of its
-- own (its row, its event, its contact, its counters, its key). Profiled, most of the
-- ~430 µs of PostgreSQL CPU per op was the start-up of each statement in the PL/pgSQL
-- loop, not the work the statements do. Now:
--
--   finish  every finish of the batch at once, in ONE statement (data-modifying CTEs
--           over jsonb_array_elements(ops) WITH ORDINALITY): the pending rows get their
--           outcome; for the rows updated ("applied") the events are inserted in op
--           order, the contacts upserted once per (instance_id, phone), the counters
--           released once per (scope, window_start), the keys answered or given up. A
--           batch of finishes only is that one statement.
--   begin,  one at a time, in op order, exactly as in 0013 (they take counters: their
--   claim   order matters). A single statement for a begin (gateway_reserve inlined,
--           the row inserted in the same statement) measured no cheaper, so they are as
--           they were. A batch without finishes runs as in 0013.
-- Measured (bench/pg_send_ops_check.sh, BENCH=1; 200k log rows, batches of 25, CPU per
-- op including the commit, on a shared 2-core machine): finishes ~130-145 -> ~85-90 µs
-- with the plan cache's generic plans, ~330-365 -> ~110 µs when every statement is
-- planned anew (plan_cache_mode = force_custom_plan); begins unchanged.
--
-- The finishes of a batch are applied before its begins and claims. That is a valid
-- order: the writes of a batch were queued concurrently, and a finish never refers to a
-- begin of its own batch (its caller sends it only once the begin was answered). So a
-- batch may now answer as if its finishes had been queued first: a begin can find the
-- counters a finish of the batch released, a claim the key a finish of it gave up.
--
-- Running the finishes together gives what running them one after another gave:
--   * A row is settled once: of several finishes of one id, the first in the batch
--     applies and the others answer {"applied": false} (the row is no longer pending).
--     Only a finish that sets the status 'pending' (the writer sends none) would leave
--     its row pending for the next; a batch with such a finish among other finishes
--     runs its finishes one at a time, in op order, through the same statement.
--   * Contacts: n applied finishes that went out to one (instance_id, phone) add n to
--     sent_total; first_sent_at is kept if set, else it is the `at` of the first of
--     them in op order that has one (not the smallest `at`: the loop kept the first);
--     last_sent_at is the `at` of the last of them in op order.
--   * Counters: a finish took 1 off each counter of its `release` that was above 0 (a
--     counter named twice in one `release` once: UPDATE ... FROM touches a row once);
--     n finishes: GREATEST(count - n, 0), on counters above 0 only.
--   * Keys: an applied finish's key row names its id (log_id), so no two touch one.
--   * Events get their ids in op order.
--   * An op that is none of begin, claim, finish fails the batch ('unknown send write
--     %') as before; in a batch with finishes, before anything is written. A failing
--     batch is undone as before; the identity values it used up may differ (they are
--     not gap-free anyway).
-- Applying a finish again (a retried batch) changes nothing: its row is not pending.
--
-- Keep in step with the finish of 0013 (this is it, set-based), gateway_reserve (0008)
-- and gateway_claim_key (0012), and sqlite_finish in store/attempts.rs. Checked against
-- 0013 by bench/pg_send_ops_check.sh (psql only).
CREATE OR REPLACE FUNCTION gateway_send_ops(ops jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    op jsonb;
    ans jsonb;
    place int;
    -- The finishes' statement runs with pass 0 for every finish of the batch at once, or
    -- (the one-at-a-time path, see above) with pass k for the op at place k alone.
    pass int := 0;
    part bigint[];
    applied bigint[] := '{}';      -- places of the finishes that applied
    answers jsonb := '[]';         -- the answer: one element per op, in op order
    others bigint;                 -- begins and claims in the batch
    n_others bigint;
    has_unknown boolean;
    unknown_op text;
    stepwise boolean;
    reserved jsonb;
    new_id bigint;
    finishes boolean := coalesce(ops @? '$[*] ? (@.op == "finish")', false);
BEGIN
    -- The finishes, in one statement. (A batch without one skips it.)
    WHILE finishes LOOP
        WITH e AS MATERIALIZED (
            SELECT x.ord, x.v, x.v->>'op' AS kind
            FROM jsonb_array_elements(ops) WITH ORDINALITY AS x(v, ord)
            WHERE pass = 0 OR x.ord = pass
        ),
        meta AS (
            SELECT count(*) FILTER (WHERE kind IN ('begin', 'claim')) AS others,
                   coalesce(bool_or(kind IS NULL OR kind NOT IN ('begin', 'claim', 'finish')), false) AS bad,
                   (array_agg(kind ORDER BY ord)
                       FILTER (WHERE kind IS NULL OR kind NOT IN ('begin', 'claim', 'finish')))[1] AS bad_op,
                   coalesce(bool_or(kind = 'finish' AND v->>'status' = 'pending'), false)
                       AND count(*) FILTER (WHERE kind = 'finish') > 1 AS one_by_one
            FROM e
        ),
        -- The first finish of each id: the only one that can find its row pending.
        firsts AS (
            SELECT DISTINCT ON (f.id) f.ord, f.v AS fin, f.id
            FROM (SELECT ord, v, (v->>'id')::bigint AS id FROM e WHERE kind = 'finish') AS f, meta
            WHERE NOT meta.bad AND NOT meta.one_by_one
            ORDER BY f.id, f.ord
        ),
        settled AS (
            UPDATE message_log m SET status = s.fin->>'status', decision = coalesce(s.fin->>'decision', m.decision),
                error_code = s.fin->>'error_code',
                policy = s.fin->>'policy', reason = s.fin->>'reason',
                provider_message_id = s.fin->>'provider_message_id', deadline_at = NULL
            FROM firsts AS s
            WHERE m.id = s.id AND m.status = 'pending'
            RETURNING s.ord, s.fin, s.id
        ),
        events AS (
            INSERT INTO outbox (customer_id, instance_id, event_type, payload, created_at, available_at, log_id)
            SELECT fin->'event'->>'customer_id', fin->'event'->>'instance_id', fin->'event'->>'event_type',
                fin->'event'->>'payload', (fin->'event'->>'created_at')::bigint,
                (fin->'event'->>'created_at')::bigint, id
            FROM settled
            WHERE jsonb_typeof(fin->'event') = 'object'
            ORDER BY ord
        ),
        went AS (
            SELECT ord, fin->>'instance_id' AS instance_id, fin->>'recipient' AS phone, (fin->>'at')::bigint AS at
            FROM settled
            WHERE (fin->>'went_out')::boolean AND fin->>'instance_id' IS NOT NULL AND fin->>'recipient' IS NOT NULL
        ),
        contacted AS (
            INSERT INTO contacts (instance_id, phone, first_sent_at, last_sent_at, sent_total)
            SELECT instance_id, phone, (array_agg(at ORDER BY ord) FILTER (WHERE at IS NOT NULL))[1],
                (array_agg(at ORDER BY ord DESC))[1], count(*)
            FROM went
            GROUP BY instance_id, phone
            ORDER BY instance_id, phone
            ON CONFLICT (instance_id, phone) DO UPDATE SET
                first_sent_at = COALESCE(contacts.first_sent_at, excluded.first_sent_at),
                last_sent_at = excluded.last_sent_at, sent_total = contacts.sent_total + excluded.sent_total
        ),
        -- Each counter to release, with the number of finishes releasing it, in key
        -- order (as the contacts: replicas lock them in one order). As arrays, unnested
        -- below: the planner takes unnest of an array for ~10 rows (and looks each
        -- counter up by its key), where it takes a jsonb_array_elements for 100 and would
        -- rather scan the whole table.
        releases AS (
            SELECT array_agg(scope ORDER BY scope, window_start) AS scopes,
                   array_agg(window_start ORDER BY scope, window_start) AS starts,
                   array_agg(n ORDER BY scope, window_start) AS ns
            FROM (SELECT x->>'scope' AS scope, (x->>'window_start')::bigint AS window_start,
                         count(DISTINCT s.ord) AS n
                  FROM settled AS s, jsonb_array_elements(s.fin->'release') AS x
                  GROUP BY 1, 2) AS g
        ),
        released AS (
            UPDATE usage_counters u SET count = GREATEST(u.count - r.n, 0)
            FROM releases, unnest(releases.scopes, releases.starts, releases.ns) AS r(scope, window_start, n)
            WHERE u.scope = r.scope AND u.window_start = r.window_start AND u.count > 0
        ),
        keys_given_up AS (
            DELETE FROM idempotency_keys k
            USING settled AS s
            WHERE jsonb_typeof(s.fin->'idem') = 'object' AND s.fin->'answer'->>'release' = 'true'
              AND k.customer_id = s.fin->'idem'->>'customer_id' AND k.idem_key = s.fin->'idem'->>'key'
              AND k.log_id = s.id
        ),
        keys_answered AS (
            UPDATE idempotency_keys k SET response_status = (s.fin->'answer'->>'status')::int,
                response_body = s.fin->'answer'->>'body', lease_until = NULL
            FROM settled AS s
            WHERE jsonb_typeof(s.fin->'idem') = 'object' AND (s.fin->'answer'->>'release' = 'true') IS NOT TRUE
              AND jsonb_typeof(s.fin->'answer') = 'object'
              AND k.customer_id = s.fin->'idem'->>'customer_id' AND k.idem_key = s.fin->'idem'->>'key'
              AND k.log_id = s.id AND k.response_status IS NULL
        )
        SELECT meta.others, meta.bad, meta.bad_op, meta.one_by_one,
            (SELECT coalesce(array_agg(ord), '{}') FROM settled),
            (SELECT coalesce(jsonb_agg(CASE WHEN e.kind = 'finish'
                    THEN jsonb_build_object('applied', s.ord IS NOT NULL) END ORDER BY e.ord), '[]'::jsonb)
             FROM e LEFT JOIN settled AS s ON s.ord = e.ord)
        INTO n_others, has_unknown, unknown_op, stepwise, part, answers
        FROM meta;
        IF has_unknown THEN
            RAISE EXCEPTION 'unknown send write %', unknown_op;
        END IF;
        applied := applied || part;
        IF pass = 0 THEN
            others := n_others;
            EXIT WHEN NOT stepwise;
        END IF;
        pass := pass + 1;
        EXIT WHEN pass > jsonb_array_length(ops);
    END LOOP;
    IF pass > 0 THEN
        -- One at a time: the answers of the finishes that applied.
        answers := (SELECT jsonb_agg(CASE WHEN x.v->>'op' = 'finish'
                        THEN jsonb_build_object('applied', x.ord = ANY (applied)) END ORDER BY x.ord)
                    FROM jsonb_array_elements(ops) WITH ORDINALITY AS x(v, ord));
    END IF;
    IF finishes AND others = 0 THEN
        RETURN answers;
    END IF;

    -- The begins and claims, in op order, each exactly as in 0013. With finishes in the
    -- batch, each answer takes its place among theirs; without, they are all the ops.
    FOR place, op IN SELECT x.ord, x.v FROM jsonb_array_elements(ops) WITH ORDINALITY AS x(v, ord)
                     WHERE x.v->>'op' IS DISTINCT FROM 'finish' ORDER BY x.ord LOOP
        IF op->>'op' = 'begin' THEN
            reserved := gateway_reserve(op->'r');
            IF NOT (reserved->>'ok')::boolean THEN
                ans := reserved;
            ELSE
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
                    ans := jsonb_build_object('lost', true);
                ELSE
                    ans := jsonb_build_object('ok', true, 'id', new_id, 'counts', reserved->'counts');
                END IF;
            END IF;
        ELSIF op->>'op' = 'claim' THEN
            ans := jsonb_build_object('claimed', gateway_claim_key(op));
        ELSE
            RAISE EXCEPTION 'unknown send write %', op->>'op';
        END IF;
        IF finishes THEN
            answers := jsonb_set(answers, ARRAY[(place - 1)::text], ans);
        ELSE
            answers := answers || jsonb_build_array(ans);
        END IF;
    END LOOP;
    RETURN answers;
END;
$$;
