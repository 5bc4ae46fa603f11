-- Each lane of the PostgreSQL writer (store/writer.rs) marks every batch with a token of
-- its own, in the batch's own statement and before its writes: a row per lane of each
-- process, updated in place, and only over a smaller token. When a batch loses its
-- connection, the lane writes a newer token on another connection unless the row holds
-- the lost batch's (waiting for the lost transaction if the server still runs it): if it
-- held it, the batch committed and its answer was lost (503, as before); if not, the
-- batch can never commit any more (its receipt would no longer be over the row's token,
-- and its writes are made only when it is), and it runs again.
--
-- It replaces a round trip (a ping) before every batch (BENCHMARKS.md, issue 22).
-- `at` (milliseconds) lets a starting writer remove the rows of processes gone for a
-- day. SQLite's writer is in the process and needs no such row.
CREATE TABLE writer_receipts (
    writer TEXT PRIMARY KEY,
    token BIGINT NOT NULL,
    at BIGINT NOT NULL
);
