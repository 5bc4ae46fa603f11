#!/usr/bin/env python3
"""CPU microseconds a request by thread and stage, from `perf script` of a gateway
recorded with call graphs (bench/cpu_stages.sh runs it).

    perf script -F comm,tid,ip,sym -i gw.perf | bench/cpu_stages.py HZ SECONDS REQUESTS

Each sample is one 1/HZ s of one thread's CPU. A sample belongs to the first stage of
its thread's list whose pattern names any frame of its stack (so a sample in a socket
write made by the per-send read counts as the read), else to "other". REQUESTS is the
number of requests answered in SECONDS at the rate of the recording.
"""
import collections
import sys

# (stage, substrings of a frame's symbol); checked in this order.
WORKER = [
    ("policies (the two sandboxed evaluations)", ["policy::host", "PolicyEngine"]),
    ("the per-send read", ["Store::read_one", "Store::send_context"]),
    ("authentication", ["http::auth::authenticate"]),
    ("schema and phone", ["check_schema", "phone::"]),
    ("idempotency key", ["send::idempotency"]),
    ("begin: the attempt's write, queued", ["begin_attempt"]),
    ("provider call (simulator)", ["provider::"]),
    ("settle: the outcome's write, queued", ["settle_attempt", "send::settle"]),
    ("policy inputs kept", ["policy::inputs"]),
    ("webhook dispatcher", ["webhooks::"]),
    ("PostgreSQL writer lanes", ["store::writer"]),
    ("the rest of the pipeline", ["send::Sender", "send::outcome", "http::send_message"]),
    ("HTTP and JSON (hyper, Dropshot)", ["hyper::", "dropshot::", "serde_json::"]),
    ("tokio runtime (parking, waking)", ["tokio::runtime", "schedule", "futex"]),
]
WRITER = [
    ("begin (counters, the pending row)", ["attempts::Begin as", "sqlite_begin"]),
    ("settle (row, event, contact)", ["attempts::Finish as", "sqlite_finish"]),
    ("commit (WAL, fdatasync, checkpoint)", ["sqlite3BtreeCommitPhase", "walCheckpoint", "execute_batch", "fdatasync"]),
    ("PBX admissions", ["pbx::"]),
    ("webhook claims and outcomes", ["webhooks::", "delivery::"]),
    ("statements (Exec: inputs, skips)", ["writer::Exec", "sqlite_exec"]),
    ("answering the callers", ["Unit>::reply"]),
    ("waiting for work", ["blocking_recv", "futex"]),
]
LOG = [("log lines (the writing thread)", [""])]
RULES = {"tokio-rt-worker": WORKER, "sqlite-writer": WRITER, "log": LOG}


def samples(lines):
    comm, frames = None, []
    for line in lines:
        if not line.strip():
            if comm is not None:
                yield comm, frames
            comm, frames = None, []
        elif not line[0].isspace():
            comm, frames = line.split()[0], []
        else:
            parts = line.strip().split(None, 1)
            frames.append(parts[1] if len(parts) > 1 else parts[0])
    if comm is not None:
        yield comm, frames


def main():
    hz, seconds, requests = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    per = collections.defaultdict(collections.Counter)
    for comm, frames in samples(sys.stdin):
        rules = RULES.get(comm)
        if rules is None:
            per[comm]["(all)"] += 1
            continue
        stage = next((name for name, pats in rules if any(p in f for f in frames for p in pats)), "other")
        per[comm][stage] += 1
    us = lambda n: n / hz / requests * 1e6  # noqa: E731
    total = 0.0
    for comm in sorted(per, key=lambda c: -sum(per[c].values())):
        counts = per[comm]
        all_us = us(sum(counts.values()))
        total += all_us
        print(f"{comm}: {all_us:.0f} µs a request")
        for stage, n in counts.most_common():
            print(f"  {stage:45s} {us(n):6.1f}")
    print(f"all threads: {total:.0f} µs a request ({requests / seconds:.0f} req/s while recorded)")


if __name__ == "__main__":
    main()
