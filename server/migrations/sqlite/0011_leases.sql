-- Liveness of serving processes (SQLite; keep in step with postgres/0012_leases.sql).
--
-- Every serving process holds a lease that it renews every second (store/leases.rs).
-- What a process has in flight (a pending attempt row, an idempotency key taken before
-- its attempt, a PBX event claimed by its external_message_id) names the lease of its
-- owner; it is orphaned as soon as that lease has lapsed, and never while it holds,
-- however long the provider call runs. A row without a lease (written by a process that
-- holds none) keeps the clock rule it had: `deadline_at`, `lease_until`.
--
-- On SQLite every process shares one machine's clock, so `expires_at` is that clock.
CREATE TABLE process_leases (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    host        TEXT NOT NULL,
    pid         BIGINT NOT NULL,
    started_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
ALTER TABLE message_log ADD COLUMN owner_lease BIGINT;
ALTER TABLE idempotency_keys ADD COLUMN owner_lease BIGINT;
ALTER TABLE pbx_events ADD COLUMN owner_lease BIGINT;
