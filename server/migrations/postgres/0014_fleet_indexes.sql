-- The fleet's charts read by time across every customer, and stay fast as the log
-- grows (BENCHMARKS.md, "Flat as the data grows"). Keep in step with
-- sqlite/0013_fleet_indexes.sql.
--
-- Refusals by rule, 24 hours: an index of refused rows only, so an allowed send never
-- writes it and the page reads the day's refusals rather than every row of the day.
CREATE INDEX message_log_refused ON message_log (created_at) WHERE decision = 'refused';
-- Sends a minute, the last hour: the time index carries the decision, so the count is
-- read from the index alone instead of looking up each of the hour's rows (the same one
-- index each send writes, and retention and the time filters use, as before).
DROP INDEX message_log_created;
CREATE INDEX message_log_created ON message_log (created_at, decision);
