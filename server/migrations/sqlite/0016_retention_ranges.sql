-- Retention reads each table's old rows by a range of an index, never by a scan of the
-- table (issue 22, "flat as the data grows"; BENCHMARKS.md, "Retention without a scan
-- of the table"). Keep in step with postgres/0023_retention_ranges.sql.
--
-- Each batch of retention is `DELETE … WHERE rowid IN (SELECT rowid … WHERE <old>
-- LIMIT n)` inside the writer's transaction, and the last batch of a table finds fewer
-- than n rows. Without an index on its time, that last batch read the whole table while
-- it held SQLite's one write lock: 250 ms for an outbox of a million events and 21 ms
-- for 60,000 policy inputs, at every run, and every send waited behind it. Each of these
-- times grows with the clock, so each index grows at its end (a commit writes its last
-- page).
--
-- Events delivered or skipped (an event still pending stays out of it).
CREATE INDEX outbox_delivered ON outbox (delivered_at) WHERE delivered_at IS NOT NULL;
-- What the policy modules saw of each send ([policies] input_retention_days).
CREATE INDEX policy_inputs_created ON policy_inputs (created_at);
-- Idempotency keys past their time (their primary key begins with the client's key).
-- 0007_exactly_once.sql kept the primary key alone and let retention scan by
-- expires_at; that scan held SQLite's write lock for as long as a day of keys takes to
-- read. A key's answer does not change expires_at, so the index is written once a key
-- (again only when a key is claimed anew).
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);
