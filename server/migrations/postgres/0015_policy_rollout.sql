-- Shipping a policy module safely (PostgreSQL; keep in step with
-- sqlite/0014_policy_rollout.sql). See docs/policies.md, "Ship safely".

-- How a stored module runs: `live` (decides every send of its name, as before),
-- `shadow` (evaluated beside the live module of its name, never deciding), `canary`
-- (decides `canary_percent` of the sends, chosen by a stable hash, the live module the
-- rest). `scope_customers` / `scope_plans` (comma-separated) limit a live install to
-- those customers' or plans' sends. One shadow or canary runs per name at a time;
-- `policy promote NAME` copies it as a new live row and retires it.
ALTER TABLE policy_modules ADD COLUMN mode TEXT NOT NULL DEFAULT 'live';
ALTER TABLE policy_modules ADD COLUMN canary_percent INTEGER;
ALTER TABLE policy_modules ADD COLUMN scope_customers TEXT;
ALTER TABLE policy_modules ADD COLUMN scope_plans TEXT;

-- What the policy modules saw of each send (the context, text and counters included),
-- for `gateway policy backtest`: kept `[policies] input_retention_days` (retention),
-- removed with the person's other data by `gateway privacy erase`. Keyed by the
-- message-log row, so rows arrive in key order and retention deletes from the front.
CREATE TABLE policy_inputs (
    log_id       BIGINT PRIMARY KEY,
    customer_id  TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    context      TEXT NOT NULL
);
