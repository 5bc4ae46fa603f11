-- A customer's days, counted once (issue 22, item 3: counters kept rather than counted on
-- read; docs/architecture.md, "A customer's days, counted once"). The dashboard's
-- overview reads a customer's last 30 UTC days from here, and counts from the message log
-- only the days not kept (today, and a day not yet counted); store::customer_days says
-- when a day is kept and how each later change keeps it exact. Keep in step with
-- sqlite/0019_customer_days.sql.
CREATE TABLE customer_days (
    customer_id TEXT NOT NULL,
    day         BIGINT NOT NULL,                 -- its UTC midnight (Unix ms)
    sent        BIGINT NOT NULL,                 -- send attempts by outcome
    refused     BIGINT NOT NULL,
    failed      BIGINT NOT NULL,
    unknown     BIGINT NOT NULL,
    delivered   BIGINT NOT NULL,                 -- of the sent, reported delivered
    read_n      BIGINT NOT NULL,                 -- and read
    refusals    TEXT NOT NULL,                   -- refusals by rule: {"rule": n, ...}
    PRIMARY KEY (customer_id, day)
);

-- A generation for each customer's day a change reached after it closed (day: its UTC
-- midnight), and one for the customer (day -1, moved on by an erasure): a day counted
-- while a change committed is not kept.
CREATE TABLE customer_day_changes (
    customer_id TEXT NOT NULL,
    day         BIGINT NOT NULL,
    gen         BIGINT NOT NULL,
    PRIMARY KEY (customer_id, day)
);
