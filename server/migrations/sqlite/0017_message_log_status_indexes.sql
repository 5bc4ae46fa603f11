-- The message log's index on (status, ack_checked_at, created_at), made by
-- 0004_ingress.sql for the delivery watchdog, gives way to a partial index of the rows
-- whose outcome is unknown (issue 22; BENCHMARKS.md, "The message log's pages a
-- commit"). Keep in step with postgres/0025_message_log_status_indexes.sql.
--
-- Every send wrote the old index twice: an entry at its attempt (status 'pending') and
-- another at its settle (status 'sent'), at two places in the index, about 2.5 pages of
-- WAL a commit of the writer. What read by it:
--
-- - The delivery watchdog now reads its window by message_log_created. A message the
--   provider acknowledged keeps status 'sent' and ack_checked_at NULL, so the old index
--   held nearly every send of the window too; the time index also holds the window's
--   refused, failed and flagged rows, which the watchdog now reads and passes over. It
--   reads outside the write lock.
-- - The echo of a send whose answer was lost (store::ingress::apply, lost_send) reads
--   the pending rows by message_log_pending and the unknown ones by this index, inside
--   the write transaction; with neither, it would read every send of the last ten
--   minutes. store::schema_tests holds its plan.
-- - Recovery of attempts left pending reads message_log_pending.
--
-- A send enters this index only when its outcome is unknown.
DROP INDEX message_log_ack;
CREATE INDEX message_log_unknown ON message_log (instance_id, recipient, created_at)
    WHERE status = 'unknown';
