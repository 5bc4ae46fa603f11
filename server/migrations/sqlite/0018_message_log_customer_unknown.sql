-- A customer's rows whose outcome is unknown, newest first: the message log's filter
-- state=unknown (dashboard, CSV export), which otherwise reads the customer's whole log
-- by message_log_customer to find the few such rows (issue 22; BENCHMARKS.md, "A large
-- customer's pending and unknown rows"). Keep in step with
-- postgres/0026_message_log_customer_unknown.sql.
--
-- A send enters this index only when its outcome is unknown, as it does
-- message_log_unknown (which the provider's echoes read by instance and recipient).
-- Every unknown row is an allowed one; the predicate names the decision all the same, as
-- the filter's condition does, so that no other reader of the unknown rows can use this
-- index: the echo's lost_send names no decision, and must keep reading by
-- message_log_unknown (store::schema_tests holds its plan; without statistics PostgreSQL
-- chose this index for it, and scanned it whole).
CREATE INDEX message_log_customer_unknown ON message_log (customer_id, id)
    WHERE status = 'unknown' AND decision = 'allowed';
