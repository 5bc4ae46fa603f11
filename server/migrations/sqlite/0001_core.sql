-- Core schema (SQLite). Times are Unix milliseconds; flags are 0/1 integers, so that
-- one query text serves SQLite and PostgreSQL.

CREATE TABLE customers (
    id                   TEXT PRIMARY KEY,
    name                 TEXT NOT NULL,
    plan                 TEXT,                         -- starter | scale | NULL
    plan_status          TEXT NOT NULL DEFAULT 'none', -- none | pending_approval | active
    plan_period_start    BIGINT,                       -- current 30-day period
    plan_period_end      BIGINT,                       -- after it the plan is expired
    module_api           BIGINT NOT NULL DEFAULT 1,
    module_pbx           BIGINT NOT NULL DEFAULT 0,
    daily_limit          BIGINT,                       -- reviewed overrides of the plan
    monthly_limit        BIGINT,
    instance_per_minute  BIGINT,
    recipient_per_minute BIGINT,
    created_at           BIGINT NOT NULL
);

CREATE TABLE instances (
    id               TEXT PRIMARY KEY,
    customer_id      TEXT NOT NULL REFERENCES customers (id),
    name             TEXT NOT NULL,
    provider         TEXT NOT NULL,
    connection_state TEXT NOT NULL DEFAULT 'close',   -- open | connecting | close
    paused           BIGINT NOT NULL DEFAULT 0,
    paused_reason    TEXT,
    created_at       BIGINT NOT NULL,
    UNIQUE (customer_id, name)
);

CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    customer_id  TEXT NOT NULL REFERENCES customers (id),
    name         TEXT NOT NULL,
    prefix       TEXT NOT NULL,
    key_hash     TEXT NOT NULL UNIQUE,                -- hex SHA-256 of the whole key
    created_at   BIGINT NOT NULL,
    revoked_at   BIGINT,
    last_used_at BIGINT
);
CREATE INDEX api_keys_customer ON api_keys (customer_id);

CREATE TABLE suppressed_recipients (
    customer_id TEXT NOT NULL REFERENCES customers (id),
    phone       TEXT NOT NULL,                        -- E.164
    reason      TEXT NOT NULL,
    source      TEXT NOT NULL,                        -- manual | opt_out
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (customer_id, phone)
);

CREATE TABLE message_log (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    customer_id         TEXT NOT NULL,
    instance_id         TEXT,
    api_key_id          TEXT,
    source              TEXT NOT NULL,                -- api | pbx | dashboard
    purpose             TEXT,
    recipient           TEXT,
    message_type        TEXT,
    decision            TEXT NOT NULL CHECK (decision IN ('allowed', 'refused')),
    error_code          TEXT,
    policy              TEXT,
    reason              TEXT,
    provider_message_id TEXT,
    status              TEXT NOT NULL,                -- sent | failed | refused
    created_at          BIGINT NOT NULL
);
CREATE INDEX message_log_customer ON message_log (customer_id, id);

-- Limit counters: one row per scope and window; updated with a conditional upsert so
-- that concurrent senders (and replicas) never overshoot.
CREATE TABLE usage_counters (
    scope        TEXT NOT NULL,                       -- day:C, month:C, inst:I, rcpt:I:P
    window_start BIGINT NOT NULL,
    count        BIGINT NOT NULL,
    lim          BIGINT NOT NULL,                     -- the limit the last increment checked
    expires_at   BIGINT NOT NULL,
    PRIMARY KEY (scope, window_start)
);
CREATE INDEX usage_counters_expiry ON usage_counters (expires_at);

-- Events to deliver, written in the transaction of the change that causes them.
CREATE TABLE outbox (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    customer_id   TEXT NOT NULL,
    instance_id   TEXT,
    event_type    TEXT NOT NULL,
    payload       TEXT NOT NULL,                      -- the event body (JSON)
    created_at    BIGINT NOT NULL,
    available_at  BIGINT NOT NULL,
    attempts      BIGINT NOT NULL DEFAULT 0,
    locked_until  BIGINT,
    delivered_at  BIGINT
);
CREATE INDEX outbox_due ON outbox (delivered_at, available_at);
