-- Operations (SQLite; keep in step with postgres/0009_operations.sql).

-- Policy modules installed in the store (`gateway policy install`, the console's
-- upload): every replica loads the newest unretired row of each name. `policy
-- rollback NAME` retires the newest, so the one before it (or the directory's or
-- the bundled module) is live again on every replica.
CREATE TABLE policy_modules (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT NOT NULL,
    version       TEXT NOT NULL,
    sha256        TEXT NOT NULL,
    module        BLOB NOT NULL,
    size          BIGINT NOT NULL,
    installed_at  BIGINT NOT NULL,
    installed_by  TEXT NOT NULL,
    retired_at    BIGINT
);
CREATE INDEX policy_modules_name ON policy_modules (name, id);

-- The id Dropshot gave the request that made the row (`x-request-id`), and the
-- caller's own `X-Correlation-Id`, so a support ticket can be followed to the row.
ALTER TABLE message_log ADD COLUMN request_id TEXT;
ALTER TABLE message_log ADD COLUMN correlation_id TEXT;

-- The send path's cache (store/cache.rs) hears of every change to API keys, customers
-- and instances, by any process on this file: each adds a row here, which every
-- gateway polls (store/invalidation.rs) and prunes after a minute.
CREATE TABLE cache_changes (
    id   INTEGER PRIMARY KEY AUTOINCREMENT,
    tbl  TEXT NOT NULL,
    key  TEXT NOT NULL,
    at   BIGINT NOT NULL
);
CREATE TRIGGER api_keys_cache_insert AFTER INSERT ON api_keys BEGIN
    INSERT INTO cache_changes (tbl, key, at) VALUES ('api_keys', NEW.key_hash, CAST(strftime('%s', 'now') AS INTEGER) * 1000);
END;
CREATE TRIGGER api_keys_cache_update AFTER UPDATE OF revoked_at, key_hash, customer_id ON api_keys BEGIN
    INSERT INTO cache_changes (tbl, key, at) VALUES ('api_keys', OLD.key_hash, CAST(strftime('%s', 'now') AS INTEGER) * 1000);
    INSERT INTO cache_changes (tbl, key, at) VALUES ('api_keys', NEW.key_hash, CAST(strftime('%s', 'now') AS INTEGER) * 1000);
END;
CREATE TRIGGER api_keys_cache_delete AFTER DELETE ON api_keys BEGIN
    INSERT INTO cache_changes (tbl, key, at) VALUES ('api_keys', OLD.key_hash, CAST(strftime('%s', 'now') AS INTEGER) * 1000);
END;
CREATE TRIGGER customers_cache_update AFTER UPDATE ON customers BEGIN
    INSERT INTO cache_changes (tbl, key, at) VALUES ('customers', NEW.id, CAST(strftime('%s', 'now') AS INTEGER) * 1000);
END;
CREATE TRIGGER customers_cache_delete AFTER DELETE ON customers BEGIN
    INSERT INTO cache_changes (tbl, key, at) VALUES ('customers', OLD.id, CAST(strftime('%s', 'now') AS INTEGER) * 1000);
END;
CREATE TRIGGER instances_cache_insert AFTER INSERT ON instances BEGIN
    INSERT INTO cache_changes (tbl, key, at) VALUES ('instances', NEW.customer_id, CAST(strftime('%s', 'now') AS INTEGER) * 1000);
END;
CREATE TRIGGER instances_cache_update AFTER UPDATE ON instances BEGIN
    INSERT INTO cache_changes (tbl, key, at) VALUES ('instances', NEW.customer_id, CAST(strftime('%s', 'now') AS INTEGER) * 1000);
END;
CREATE TRIGGER instances_cache_delete AFTER DELETE ON instances BEGIN
    INSERT INTO cache_changes (tbl, key, at) VALUES ('instances', OLD.customer_id, CAST(strftime('%s', 'now') AS INTEGER) * 1000);
END;
