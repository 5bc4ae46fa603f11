-- PBX integrations (SQLite; keep in step with postgres/0003_pbx.sql).

-- One integration binds a customer's phone system to one of its instances.
CREATE TABLE pbx_integrations (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
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
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
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
) WITHOUT ROWID;

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
