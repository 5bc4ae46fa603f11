-- The batch functions give counters back (a refused or failed send's, a lost key's) with
-- `UPDATE usage_counters ... FROM jsonb_array_elements(...)`. The planner counts any
-- set-returning function as 100 rows, and while usage_counters held fewer than some tens
-- of thousands of rows it joined them by hashing: a sequential scan of the whole table
-- for each send that gave counters back (BENCHMARKS.md, "Batch statements by key on
-- PostgreSQL"). Every statement of these functions reads or writes rows by their keys,
-- so they are planned with nested loops only: each counter is one probe of the primary
-- key, whatever the table holds.
--
-- gateway_reserve runs only inside gateway_send_ops, under its settings (a setting of
-- its own would be saved and restored at every begin).
--
-- A function replaced later (CREATE OR REPLACE) loses these settings unless it repeats
-- them: the test `store::releases_find_their_counters_by_key` gives counters back through
-- both functions and fails if either scans the table.
ALTER FUNCTION gateway_send_ops(jsonb) SET enable_hashjoin = off;
ALTER FUNCTION gateway_send_ops(jsonb) SET enable_mergejoin = off;
ALTER FUNCTION gateway_write_batch(jsonb) SET enable_hashjoin = off;
ALTER FUNCTION gateway_write_batch(jsonb) SET enable_mergejoin = off;
