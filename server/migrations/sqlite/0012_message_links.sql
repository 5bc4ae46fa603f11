-- Each event names the message-log row it is about (`outbox.log_id`), so a message's
-- detail reads its events by an index instead of searching the customer's event
-- bodies; and a row is found by the provider's id of its message (status reports and
-- echoes of a send) by an index. Keep in step with postgres/0013_message_links.sql.
ALTER TABLE outbox ADD COLUMN log_id BIGINT;
CREATE INDEX outbox_log ON outbox (log_id) WHERE log_id IS NOT NULL;
CREATE INDEX message_log_provider_id ON message_log (instance_id, provider_message_id)
    WHERE provider_message_id IS NOT NULL;

-- Events written before this name their message only inside their body. Rather than
-- rewrite every one of them here, the detail of a row logged before this point (at or
-- below `log_through`) also looks among the events written before it (at or below
-- `outbox_through`) by the provider's message id; those rows leave with retention.
CREATE TABLE outbox_unlinked (
    log_through    BIGINT NOT NULL,
    outbox_through BIGINT NOT NULL
);
INSERT INTO outbox_unlinked (log_through, outbox_through)
SELECT (SELECT COALESCE(MAX(id), 0) FROM message_log), (SELECT COALESCE(MAX(id), 0) FROM outbox);
