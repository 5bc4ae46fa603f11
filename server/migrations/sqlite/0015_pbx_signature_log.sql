-- The PBX replay check on SQLite without a random key written per event (issue 22;
-- docs/architecture.md, "The replay check on SQLite"). SQLite only: PostgreSQL keeps
-- pbx_seen_signatures.
--
-- pbx_seen_signatures put each accepted signature at a random place among the
-- signatures of its second, so that a commit of n events wrote n pages of it. This log
-- is appended in arrival order (a commit writes its last page or two), and the store's
-- writer keeps the window's signatures in a table of its own connection, in memory,
-- which it brings up to date from this log before each check (rows a replica on the
-- same file appended), so the check stays exact across replicas and restarts.
CREATE TABLE pbx_signature_log (
    id             INTEGER PRIMARY KEY AUTOINCREMENT, -- not reused once committed: the writer reads on from the last id it saw
    ts             BIGINT NOT NULL,                    -- the signed timestamp (Unix seconds)
    integration_id BIGINT NOT NULL,
    signature      TEXT NOT NULL
);
-- Retention's range (ts < cut-off); the signed timestamps are near the time of arrival,
-- so this index grows at its end too.
CREATE INDEX pbx_signature_log_ts ON pbx_signature_log (ts);

-- The signatures remembered before this migration.
INSERT INTO pbx_signature_log (ts, integration_id, signature)
    SELECT ts, integration_id, signature FROM pbx_seen_signatures ORDER BY ts;

-- A replica of the previous version, during a rolling upgrade (or after a downgrade),
-- still records into pbx_seen_signatures and checks only that table. A signature already
-- in the log is not inserted there (RAISE(IGNORE): its ON CONFLICT DO NOTHING changes no
-- row, which it answers as a replay); a new one is copied into the log, so this version
-- refuses its replays too.
CREATE TRIGGER pbx_seen_signatures_known BEFORE INSERT ON pbx_seen_signatures
WHEN EXISTS (SELECT 1 FROM pbx_signature_log l WHERE l.ts = NEW.ts
             AND l.integration_id = NEW.integration_id AND l.signature = NEW.signature)
BEGIN
    SELECT RAISE(IGNORE);
END;
CREATE TRIGGER pbx_seen_signatures_to_log AFTER INSERT ON pbx_seen_signatures
BEGIN
    INSERT INTO pbx_signature_log (ts, integration_id, signature)
        VALUES (NEW.ts, NEW.integration_id, NEW.signature);
END;
