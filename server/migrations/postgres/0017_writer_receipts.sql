-- Each lane of the PostgreSQL writer (store/writer.rs) marks every batch it commits
-- with a token of its own, in the batch's own transaction: a row per lane of each
-- process, updated in place. When the server ends a batch's connection (a restart, an
-- administrator, the crash of another backend), the batch's transaction either
-- committed for good or never will, and the lane reads its row on a new connection to
-- learn which: a batch that left no token is run again, so a connection that died while
-- the lane waited costs a retry, not an answer; one that committed answers 503, as
-- before (its answer was lost with the connection).
--
-- It replaces a round trip (a ping) before every batch (BENCHMARKS.md, issue 22).
-- `at` (milliseconds) lets a starting writer remove the rows of processes gone for a
-- day. SQLite's writer is in the process and needs no such row.
CREATE TABLE writer_receipts (
    writer TEXT PRIMARY KEY,
    token BIGINT NOT NULL,
    at BIGINT NOT NULL
);
