-- wrk script: the control of bench/keyed.lua. The same requests, made afresh for each request
-- by the same code, with the sequence in a header the gateway ignores (X-Bench-Seq, as
-- long as the key) instead of an Idempotency-Key. Against bench/send.lua (one request
-- formatted once) the load generator's own work a request would count as the key's cost:
-- on this 2-core machine wrk's Lua takes CPU from the gateway (BENCHMARKS.md, issue 22).
-- Run from the repository's root, as the bench scripts do.
KEY_HEADER = "X-Bench-Seq"
dofile("bench/keyed.lua")
