-- PBX integrations (PostgreSQL; keep in step with sqlite/0002_pbx.sql).

-- One integration binds a customer's phone system to one of its instances.
CREATE TABLE pbx_integrations (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id         TEXT NOT NULL REFERENCES customers (id),
    instance_id         TEXT NOT NULL REFERENCES instances (id),
    secret_hash         TEXT NOT NULL,                -- hex SHA-256 of the webhook secret
    secret_prefix       TEXT NOT NULL,                -- first characters, to recognise it
    hmac_secret         TEXT,                         -- signing key; NULL: HMAC signing off
    business_name       TEXT,
    rate_per_minute     BIGINT,                       -- NULL: the configured default
    burst               BIGINT,
    cooldown_seconds    BIGINT,
    strict_window_hours BIGINT,                       -- NULL: off
    ip_allowlist        TEXT,                         -- comma-separated IPs and CIDRs; NULL: any
    created_at          BIGINT NOT NULL,
    secret_rotated_at   BIGINT
);
CREATE INDEX pbx_integrations_customer ON pbx_integrations (customer_id);

CREATE TABLE pbx_templates (
    integration_id BIGINT NOT NULL REFERENCES pbx_integrations (id),
    event_type     TEXT NOT NULL,
    body           TEXT NOT NULL,
    purpose        TEXT NOT NULL,
    updated_at     BIGINT NOT NULL,
    PRIMARY KEY (integration_id, event_type)
);

-- Every authenticated event, with what was done and answered. A row with an
-- external_message_id is also the idempotency record: a repeat is answered from it.
CREATE TABLE pbx_events (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    integration_id      BIGINT NOT NULL,
    customer_id         TEXT NOT NULL,
    event_type          TEXT NOT NULL,
    action              TEXT NOT NULL,                -- received | message_sent | ignored | cooldown | ... | pending
    status_code         BIGINT NOT NULL,              -- HTTP status answered (0 while pending)
    error_code          TEXT,
    phone               TEXT,
    message_id          TEXT,
    external_message_id TEXT,
    response            TEXT,                         -- the body answered (JSON)
    created_at          BIGINT NOT NULL,
    UNIQUE (integration_id, external_message_id)
);
CREATE INDEX pbx_events_integration ON pbx_events (integration_id, id);
CREATE INDEX pbx_events_created ON pbx_events (created_at);

-- Signatures accepted inside the replay window. Keyed by their timestamp first, so
-- that inserts land at the end of the key order (few pages written per batch, where a
-- random signature first would touch a page per insert) and pruning is a key range.
CREATE TABLE pbx_seen_signatures (
    ts             BIGINT NOT NULL,                  -- the signed timestamp (Unix seconds)
    integration_id BIGINT NOT NULL,
    signature      TEXT NOT NULL,
    PRIMARY KEY (ts, integration_id, signature)
);

-- Templated messages sent, per (integration, event type, phone), until the cooldown ends.
CREATE TABLE pbx_cooldowns (
    integration_id BIGINT NOT NULL,
    event_type     TEXT NOT NULL,
    phone          TEXT NOT NULL,
    until_at       BIGINT NOT NULL,
    PRIMARY KEY (integration_id, event_type, phone)
);
CREATE INDEX pbx_cooldowns_expiry ON pbx_cooldowns (until_at);

-- GCRA rate limiters: one theoretical arrival time per key.
CREATE TABLE rate_limits (
    key        TEXT PRIMARY KEY,
    tat        BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX rate_limits_expiry ON rate_limits (expires_at);

-- When each phone last wrote to an instance (provider ingress keeps it; the PBX strict
-- conversation window reads it).
CREATE TABLE contact_activity (
    instance_id      TEXT NOT NULL,
    phone            TEXT NOT NULL,
    last_inbound_at  BIGINT NOT NULL,
    PRIMARY KEY (instance_id, phone)
);

-- Admission of PBX webhook requests, called with gateway_write_batch in the writer's
-- one statement (server/src/store/writer.rs); the same steps as the SQLite writer's
-- sqlite_pbx_admit, which the same tests check on both backends. For each op, in order:
--   signature: remember it; seen before → {"replay":true} and nothing else happens
--   rate: GCRA on rate_limits (allowed while tat - now <= tolerance; then tat += interval),
--         now from clock_timestamp(), one clock for every replica
--   log: insert the pbx_events row (as rate_limited/429 when the limit refused)
-- answers {"replay":false,"rate_limited_for_ms":n|null,"log_id":n|null}
CREATE FUNCTION gateway_pbx_admit(ops jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    op jsonb;
    results jsonb := '[]'::jsonb;
    n bigint;
    now_ms bigint;
    new_tat bigint;
    limited bigint;
    lg jsonb;
    new_id bigint;
BEGIN
    FOR op IN SELECT value FROM jsonb_array_elements(ops) LOOP
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
