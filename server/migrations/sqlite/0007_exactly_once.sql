-- Exactly once (SQLite; keep in step with postgres/0008_exactly_once.sql).
--
-- An allowed send writes its message-log row as `pending`, with its counters, before
-- the provider is called; the answer turns it into sent, failed or unknown. A row still
-- pending at `deadline_at` (the provider timeout plus a margin) belonged to a process
-- that stopped mid-call, and becomes `unknown` (see store/attempts.rs).
ALTER TABLE message_log ADD COLUMN deadline_at BIGINT;
-- The idempotency key of an attempt that had one (its key row is found by primary key).
ALTER TABLE message_log ADD COLUMN idem_key TEXT;
CREATE INDEX message_log_pending ON message_log (deadline_at) WHERE status = 'pending';

-- Idempotency keys of send-message, per customer, kept 24 hours. A request claims its
-- key (owner, lease_until) before the pipeline runs; the attempt row it writes is
-- linked (log_id); its final answer is stored in the transaction of the log row, and
-- replayed byte for byte for the same key and body.
CREATE TABLE idempotency_keys (
    customer_id     TEXT NOT NULL,
    idem_key        TEXT NOT NULL,
    request_hash    TEXT NOT NULL,                    -- SHA-256 of the parsed request
    owner           TEXT NOT NULL,                    -- the claiming request's token
    created_at      BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    lease_until     BIGINT,                           -- in flight before its attempt row until then
    log_id          BIGINT,                           -- the attempt row, once written
    response_status INTEGER,                          -- the final answer, once known
    response_body   TEXT,
    PRIMARY KEY (idem_key, customer_id)              -- the key first: looked up beside the API key
);
-- Only the primary key: every lookup on the send path is by (idem_key, customer_id);
-- the pruner's scan by expires_at runs every ten minutes.
