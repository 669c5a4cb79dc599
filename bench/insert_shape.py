"""One insert shape for every writer: can a generic JSON-rows insert replace trioq's three
enqueue statements without costing the hot path? A PROTOTYPE replay (bench-only SQL, no
migration).

    python -m bench.insert_shape --jobs 5000 --repeats 5

Six places insert jobs (job_insert_one, job_insert_batch, job_insert_many, the cron tick, a
workflow's spawn, SQL `enqueue()`); they now share one insert (queries.sql's `job_insert`
fragment) and parameters named after `NewJob`'s fields, each writer sending its rows in its own
shape (scalars, one array per field, a function's arguments). The candidate measured here, and
rejected for the hot paths (bench/RESULTS.md, "One insert shape"), was one row FORMAT: every
writer sends its rows as ONE jsonb array of objects keyed by the record's field names, and ONE
statement reads them with `jsonb_populate_recordset(NULL::job_input, ...)`, a composite type
whose attributes are the record's fields: a new field is an attribute of the type (the
migration), a field of the record, and a column in the one insert.

Replays, each on a fresh migrated schema, on one session (prepared statements, autocommit):
- one: `--jobs` single enqueues: `trioq` runs job_insert_one with its scalar parameters;
  `json` the generic statement with a one-element array.
- batch: `--jobs / 1000` enqueues of 1,000 jobs sharing their options: `trioq` runs
  job_insert_batch (options as scalars, payloads as one text[] literal); `json` the generic
  statement.
- keyed: the same batches, every job with its own dedup key: `trioq` runs job_insert_many (one
  array per column; since migration 0037 its keys are upserted into `job_keys`, the shape the
  `keytable` prototype measured in bench/RESULTS.md, "Dedup keys in a table of their own").
  The generic statement has no keyed form any more (its ON CONFLICT named the unique index
  that migration 0037 dropped), so this replay, and `retake` (every key held by a failed job
  that no longer holds it, so each enqueue takes it over), time `trioq` alone: run them on two
  checkouts to compare.
Reported per replay and system: the backend's CPU per job (/proc/PID/schedstat) and the
client's CPU per job building the parameters (time.process_time around the builder only),
medians over the repeats with the systems alternating, and the ratio json / trioq.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import psycopg

from bench.harness import HARNESS_ROLE, Database, open_database
from bench.hot_path_cost import schedstat_ns
from bench.stats import rotated
from trioq._pg.inserts import insert_statement
from trioq._seam.records import NewJob, NewJobs
from trioq._sql import queries

Conn = psycopg.Connection[tuple[Any, ...]]
BATCH = 1_000

# The record's fields, as a composite type: what a writer may send.
INSTALL = """
CREATE TYPE {schema}.job_input AS (
    queue text, task text, payload jsonb, priority smallint, run_at timestamptz,
    delay_seconds float8, partition_key text, dedup_key text, max_attempts int,
    unique_for_seconds float8, unique_states text[], version int, trace_context text,
    concurrency_key text, concurrency_limit int, deadline_at timestamptz,
    deadline_seconds float8, deadline_source text, task_deadline boolean
);
"""

# The one insert: every column computed once, from the rows, the database's now and the task's
# registered deadline (timed on unkeyed batches only: see the module's docstring).
GENERIC = """
WITH n AS (SELECT {schema}.db_now() AS now OFFSET 0),
inserted AS (
    INSERT INTO {schema}.jobs AS j (queue, task, payload, state, priority, run_at,
                                   partition_key, dedup_key, max_attempts, created_at,
                                   unique_states, unique_until, version, trace_context,
                                   concurrency_key, concurrency_limit, deadline_at,
                                   deadline_source)
    SELECT r.queue, r.task, r.payload,
           CASE WHEN due.at > n.now THEN 'scheduled' ELSE 'ready' END,
           coalesce(r.priority, 0), due.at, r.partition_key, r.dedup_key, r.max_attempts, n.now,
           coalesce(r.unique_states, '{{}}'), n.now + r.unique_for_seconds * interval '1 second',
           coalesce(r.version, 1), r.trace_context, r.concurrency_key, r.concurrency_limit,
           coalesce(r.deadline_at,
                    n.now + coalesce(r.deadline_seconds, t.deadline_seconds)
                            * interval '1 second'),
           coalesce(r.deadline_source, 'set by task ' || t.task)
    FROM n,
         jsonb_populate_recordset(NULL::{schema}.job_input, %(jobs)s::jsonb)
             WITH ORDINALITY AS r
         CROSS JOIN LATERAL (
             SELECT coalesce(r.run_at, n.now + coalesce(r.delay_seconds, 0) * interval '1 second')
                        AS at
         ) AS due
         LEFT JOIN {schema}.task_defaults t
                ON r.task_deadline AND r.deadline_at IS NULL AND r.deadline_seconds IS NULL
               AND t.task = r.task AND t.version = coalesce(r.version, 1)
               AND t.deadline_seconds IS NOT NULL
    ORDER BY r.ordinality
    RETURNING j.id, j.queue
)
SELECT coalesce(array_agg(i.id ORDER BY i.id), '{{}}') AS ids,
       (SELECT count(pg_notify({schema}.ready_channel(q.queue), q.queue))
        FROM (SELECT DISTINCT queue FROM inserted) AS q) AS sent
FROM inserted i;
"""

FIELDS = (
    "queue", "task", "priority", "run_at", "delay_seconds", "partition_key", "max_attempts",
    "unique_for_seconds", "unique_states", "version", "trace_context", "concurrency_key",
    "concurrency_limit", "deadline_at", "deadline_seconds", "deadline_source", "task_deadline",
)  # fmt: skip


def json_rows(jobs: NewJobs) -> str:
    """The generic statement's one parameter: the template's options encoded once, each job
    its payload (already JSON text) and its key spliced in."""
    template = jobs.template
    options = json.dumps({name: getattr(template, name) for name in FIELDS}, default=str)
    head = options[:-1] + ',"payload":'
    if jobs.dedup_keys is None:
        return "[" + ",".join([head + payload + "}" for payload in jobs.payloads]) + "]"
    return (
        "["
        + ",".join(
            [
                head + payload + ',"dedup_key":' + json.dumps(key) + "}"
                for payload, key in zip(jobs.payloads, jobs.dedup_keys, strict=True)
            ]
        )
        + "]"
    )


def batches(replay: str, jobs: int, serial: list[int]) -> list[NewJobs]:
    keyed = replay in ("keyed", "retake")
    template = NewJob(
        queue="default",
        task="noop",
        payload_json="{}",
        max_attempts=3,
        task_deadline=False,
        unique_states=("completed",) if keyed else (),
    )
    size = 1 if replay == "one" else BATCH
    made = []
    for _ in range(jobs // size):
        payloads = [json.dumps({"n": serial[0]})] * size
        keys = [f"k{serial[0]}-{i}" for i in range(size)] if keyed else None
        serial[0] += 1
        made.append(NewJobs(template, payloads, keys))
    return made


# The retake replay's setup: every key of the timed batches is held by a failed job whose
# unique_states ({completed}) no longer hold it, so each enqueue must release the key first.
HOLDERS = """
INSERT INTO {schema}.jobs (queue, task, payload, state, run_at, created_at, max_attempts,
                           dedup_key, unique_states, finished_at)
SELECT 'default', 'noop', '{{}}', 'failed', now(), now(), 3, key, '{{completed}}', now()
FROM unnest(%(keys)s::text[]) AS key
"""
HOLDER_KEYS = """
INSERT INTO {schema}.job_keys (key, job_id, task)
SELECT dedup_key, id, task FROM {schema}.jobs WHERE state = 'failed'
"""


def replay(db: Database, schema: str, name: str, system: str, jobs: int) -> tuple[float, float]:
    """(backend us per job, client us per job building the parameters)."""
    statements = queries(schema)
    serial = [0]
    warmup = batches(name, 20 * (1 if name == "one" else BATCH), serial)
    timed = batches(name, jobs, serial)
    with psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True) as conn:
        if name == "retake":
            keys = [key for batch in timed for key in batch.dedup_keys or ()]
            conn.execute(HOLDERS.format(schema=schema), {"keys": keys})
            conn.execute(HOLDER_KEYS.format(schema=schema))
            conn.execute(f"ANALYZE {schema}.jobs")
            conn.execute(f"ANALYZE {schema}.job_keys")

        def build(batch: NewJobs) -> tuple[str, dict[str, Any]]:
            if system == "json":
                return GENERIC.format(schema=schema), {"jobs": json_rows(batch)}
            statement, params = insert_statement(batch)
            return statements[statement], params

        for batch in warmup:
            conn.execute(*build(batch), prepare=True)
        client = 0.0
        pid = conn.info.backend_pid
        before = schedstat_ns(pid)
        for batch in timed:
            started = time.process_time()
            text, params = build(batch)
            client += time.process_time() - started
            conn.execute(text, params, prepare=True)
        used = schedstat_ns(pid) - before
        count = conn.execute(f"SELECT count(*) FROM {schema}.jobs WHERE state = 'ready'").fetchone()
    expected = len(warmup) * len(warmup[0]) + jobs
    if count is None or count[0] != expected:
        raise RuntimeError(f"{name} {system}: {count} ready rows, expected {expected}")
    return used / jobs / 1e3, client / jobs * 1e6


REPLAYS: tuple[str, ...] = ("one", "batch", "keyed", "retake")
# Keyed batches: trioq alone (the generic statement has no keyed form since migration 0037).
SYSTEMS_OF: dict[str, tuple[str, ...]] = {
    "one": ("trioq", "json"),
    "batch": ("trioq", "json"),
    "keyed": ("trioq",),
    "retake": ("trioq",),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--replays", default=",".join(REPLAYS), help="comma-separated, of: " + ", ".join(REPLAYS)
    )
    args = parser.parse_args()
    replays = [name for name in REPLAYS if name in args.replays.split(",")]
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with open_database() as db:
        for repeat in range(args.repeats):
            for name in replays:
                systems = SYSTEMS_OF[name]
                for system in rotated(systems, repeat):
                    schema = db.fresh_schema()
                    try:
                        db.conn.execute(INSTALL.format(schema=schema))
                        result = replay(db, schema, name, system, args.jobs)
                    finally:
                        db.drop_schema(schema)
                    figures.setdefault((name, system), []).append(result)
                    print(
                        f"repeat {repeat + 1} {name:>6} {system:>8}: {result[0]:6.1f} us backend"
                        f"/job, {result[1]:5.2f} us client/job (load {os.getloadavg()[0]:.2f})",
                        flush=True,
                    )
    print(f"medians: ({args.repeats} repeats of {args.jobs} jobs)")
    for name in replays:
        base = figures[(name, "trioq")]
        for system in SYSTEMS_OF[name]:
            runs = figures[(name, system)]
            backend = statistics.median(r[0] / b[0] for r, b in zip(runs, base, strict=True))
            client = statistics.median(r[1] / b[1] for r, b in zip(runs, base, strict=True))
            print(
                f"{name:>6} {system:>8}: {statistics.median(r[0] for r in runs):6.1f} us backend"
                f"/job, {statistics.median(r[1] for r in runs):5.2f} us client/job;"
                f" x trioq: backend {backend:.3f}, client {client:.3f}"
            )


if __name__ == "__main__":
    main()
