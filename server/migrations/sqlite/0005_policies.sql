-- Policy engine (SQLite; keep in step with postgres/0006_policies.sql).

-- Every module's verdict, fuel and time for the attempt (JSON array; NULL when no
-- policy was asked, e.g. a schema error).
ALTER TABLE message_log ADD COLUMN policy_trace TEXT;

-- The purposes the operator approved for a customer (comma-separated); NULL: all five.
ALTER TABLE customers ADD COLUMN approved_purposes TEXT;

-- Who an instance talks to: first and last message sent, how many, and how many
-- replies (the pacing policy's new-recipient and never-replied rules). Its other
-- counters (sends today, to a recipient in 24 hours, new recipients today) are rows of
-- usage_counters, taken with the quota.
CREATE TABLE contacts (
    instance_id    TEXT NOT NULL,
    phone          TEXT NOT NULL,
    first_sent_at  BIGINT,
    last_sent_at   BIGINT,
    sent_total     BIGINT NOT NULL DEFAULT 0,
    replies_total  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (instance_id, phone)
);

-- Sends a policy sent to review: refused with 403 policy_violation (action review),
-- kept here for an operator. Enough review decisions for one instance in the window
-- pause it.
CREATE TABLE review_queue (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    log_id        BIGINT NOT NULL,
    customer_id   TEXT NOT NULL,
    instance_id   TEXT NOT NULL,
    source        TEXT NOT NULL,
    purpose       TEXT,
    recipient     TEXT,
    message_type  TEXT,
    text          TEXT,                                -- the message or caption, for the reviewer
    policy        TEXT NOT NULL,
    reason        TEXT NOT NULL,
    risk_score    BIGINT NOT NULL,
    status        TEXT NOT NULL DEFAULT 'pending',     -- pending | dismissed | confirmed
    created_at    BIGINT NOT NULL,
    decided_at    BIGINT,
    decided_by    TEXT,
    note          TEXT
);
CREATE INDEX review_queue_instance ON review_queue (instance_id, created_at);
CREATE INDEX review_queue_status ON review_queue (status, id);

-- Each running gateway's policy host: what it runs (JSON), written every few seconds.
CREATE TABLE policy_gateways (
    gateway_id    TEXT PRIMARY KEY,
    host          TEXT NOT NULL,
    pid           BIGINT NOT NULL,
    started_at    BIGINT NOT NULL,
    heartbeat_at  BIGINT NOT NULL,
    command_seen  BIGINT NOT NULL,
    status        TEXT NOT NULL
);

-- `gateway policy reload` and `policy rollback NAME`, carried out by every gateway.
CREATE TABLE policy_commands (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    command     TEXT NOT NULL,                         -- reload | rollback
    name        TEXT,
    created_at  BIGINT NOT NULL
);
