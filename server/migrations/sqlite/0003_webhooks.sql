-- Customer webhooks (SQLite; keep in step with postgres/0004_webhooks.sql).

-- One destination per instance.
CREATE TABLE webhook_endpoints (
    instance_id           TEXT PRIMARY KEY REFERENCES instances (id),
    customer_id           TEXT NOT NULL REFERENCES customers (id),
    url                   TEXT NOT NULL,
    events                TEXT NOT NULL,              -- comma-separated event names
    secret                TEXT,                       -- signing secret; NULL: unsigned
    previous_secret       TEXT,                       -- still signs until previous_secret_until
    previous_secret_until BIGINT,
    disabled_at           BIGINT,
    disabled_reason       TEXT,
    failing_since         BIGINT,                     -- first failure since the last success
    created_at            BIGINT NOT NULL,
    updated_at            BIGINT NOT NULL
);

-- Delivery state of each outbox event: the dispatcher claims rows whose available_at
-- is due (a claim moves available_at to the end of its lease), and finishes a row by
-- setting delivered_at with the outcome: delivered | failed | skipped.
ALTER TABLE outbox ADD COLUMN outcome TEXT;

-- Every delivery attempt.
CREATE TABLE webhook_attempts (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    outbox_id     BIGINT,                             -- NULL for a test event
    customer_id   TEXT NOT NULL,
    instance_id   TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    url           TEXT NOT NULL,
    trigger_kind  TEXT NOT NULL,                      -- scheduled | manual | test
    attempt       BIGINT NOT NULL,                    -- 1 for the first scheduled attempt
    attempted_at  BIGINT NOT NULL,
    status_code   BIGINT,                             -- NULL when no response came
    latency_ms    BIGINT NOT NULL,
    response_body TEXT,                               -- first 4 KB
    error         TEXT,
    succeeded     BIGINT NOT NULL
);
CREATE INDEX webhook_attempts_outbox ON webhook_attempts (outbox_id);
CREATE INDEX webhook_attempts_instance ON webhook_attempts (instance_id, id);
CREATE INDEX webhook_attempts_time ON webhook_attempts (attempted_at);
CREATE INDEX outbox_instance ON outbox (instance_id, created_at);
-- The claim's index: only undelivered rows, in due order. (A plain index on
-- (delivered_at, available_at) let PostgreSQL sort every due row under FOR UPDATE for
-- each claim: 19 ms at 50,000 due rows against 0.8 ms with this one.)
DROP INDEX outbox_due;
CREATE INDEX outbox_pending ON outbox (available_at) WHERE delivered_at IS NULL;
