"""One insert shape for every writer: can a generic JSON-rows insert replace trioq's three
enqueue statements without costing the hot path? A PROTOTYPE replay (bench-only SQL, no
migration).

    python -m bench.insert_shape --jobs 5000 --repeats 5

Today six places insert jobs (job_insert_one, job_insert_batch, job_insert_many, the cron
tick, a workflow's spawn, SQL `enqueue()`), each with its own column list, and the Python side
builds one parameter per column (job_insert_many: one array per column). The candidate: every
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
  array per column); `json` the generic statement with ON CONFLICT on the key.
- keyed, `keytable`: the same keyed batches through job_insert_many's shape with the keys in a
  table of their own (`job_keys`, the key as its primary key, the holder's id, task and
  unique_states/unique_until) instead of a unique index on `jobs`: what any layout that keeps
  jobs in more than one table needs, since a unique index covers one table. A key held by a
  finished job that no longer holds it is taken over by the same upsert (its WHERE reads the
  holder's state); the holder is returned whether or not it changed (DO UPDATE, never DO
  NOTHING: a concurrent inserter's row is returned even when this snapshot cannot see it).
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
from trioq._pg.inserts import insert_params, insert_statement
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
# registered deadline; a dedup key conflicts on the unique index (job_insert_many's release of
# finished keys and its per-batch first-occurrence rule are left out of the prototype: they
# cost the keyed replay, not the other two).
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
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL
    DO UPDATE SET dedup_key = excluded.dedup_key
    RETURNING j.id, j.queue
)
SELECT coalesce(array_agg(i.id ORDER BY i.id), '{{}}') AS ids,
       (SELECT count(pg_notify({schema}.ready_channel(q.queue), q.queue))
        FROM (SELECT DISTINCT queue FROM inserted) AS q) AS sent
FROM inserted i;
"""

KEY_TABLE = """
CREATE TABLE {schema}.job_keys (
    dedup_key text PRIMARY KEY,
    job_id bigint NOT NULL,
    task text NOT NULL,
    unique_states text[] NOT NULL,
    unique_until timestamptz
);
DROP INDEX {schema}.jobs_dedup_key_idx;
"""

# job_insert_many's shape with the uniqueness in job_keys: the keys are upserted first (the
# primary key serialises two enqueuers of one key), a key whose holder is finished and no longer
# holds it is handed to the new job, and the jobs inserted are those whose key was won (or that
# have none). A repeated key within the batch is left out of the prototype (the first-occurrence
# rule costs both shapes alike).
KEYED_TABLE = """
WITH input AS MATERIALIZED (
    SELECT nextval(pg_get_serial_sequence('{schema}.jobs', 'id')) AS new_id, t.*
    FROM unnest(%(queues)s::text[], %(tasks)s::text[], %(payloads)s::text[],
                %(priorities)s::smallint[], %(run_ats)s::timestamptz[], %(delays)s::float8[],
                %(partition_keys)s::text[], %(dedup_keys)s::text[], %(max_attempts)s::int[],
                %(unique_fors)s::float8[], %(unique_states)s::text[], %(versions)s::int[],
                %(trace_contexts)s::text[], %(concurrency_keys)s::text[],
                %(concurrency_limits)s::int[], %(deadline_ats)s::timestamptz[],
                %(deadlines)s::float8[], %(deadline_sources)s::text[],
                %(task_deadlines)s::boolean[])
         WITH ORDINALITY AS t(queue, task, payload, priority, run_at, delay, partition_key,
                              dedup_key, max_attempts, unique_for, unique_states, version,
                              trace_context, concurrency_key, concurrency_limit, deadline_at,
                              deadline, deadline_source, task_deadline, ord)
),
keys AS (
    INSERT INTO {schema}.job_keys AS k (dedup_key, job_id, task, unique_states, unique_until)
    SELECT dedup_key, new_id, task, string_to_array(coalesce(unique_states, ''), ','),
           {schema}.db_now() + unique_for * interval '1 second'
    FROM input WHERE dedup_key IS NOT NULL
    ORDER BY dedup_key
    ON CONFLICT (dedup_key) DO UPDATE
    SET (job_id, task, unique_states, unique_until) =
        (SELECT CASE WHEN released THEN excluded.job_id ELSE k.job_id END,
                CASE WHEN released THEN excluded.task ELSE k.task END,
                CASE WHEN released THEN excluded.unique_states ELSE k.unique_states END,
                CASE WHEN released THEN excluded.unique_until ELSE k.unique_until END
         FROM (SELECT NOT EXISTS (
                   SELECT 1 FROM {schema}.jobs h
                   WHERE h.id = k.job_id
                     AND (h.state NOT IN ('completed', 'failed', 'cancelled')
                          OR (h.state = ANY(k.unique_states)
                              AND (k.unique_until IS NULL
                                   OR k.unique_until > {schema}.db_now())))) AS released
              ) AS r)
    RETURNING k.dedup_key, k.job_id
),
inserted AS (
    INSERT INTO {schema}.jobs AS j (id, queue, task, payload, state, priority, run_at,
                                   partition_key, dedup_key, max_attempts, created_at,
                                   unique_states, unique_until, version, trace_context,
                                   concurrency_key, concurrency_limit, deadline_at,
                                   deadline_source)
    SELECT new_id, queue, i.task, payload::jsonb,
           CASE WHEN due_at > {schema}.db_now() THEN 'scheduled' ELSE 'ready' END,
           priority, due_at, partition_key, dedup_key, i.max_attempts,
           {schema}.db_now(), string_to_array(coalesce(unique_states, ''), ','),
           {schema}.db_now() + unique_for * interval '1 second',
           coalesce(i.version, 1),
           trace_context, concurrency_key, concurrency_limit,
           coalesce(deadline_at, {schema}.db_now() + coalesce(deadline, t.deadline_seconds)
                                                     * interval '1 second'),
           coalesce(deadline_source, 'set by task ' || t.task)
    FROM (SELECT *, coalesce(run_at, {schema}.db_now() + coalesce(delay, 0) * interval '1 second')
                     AS due_at
          FROM input) AS i
    LEFT JOIN {schema}.task_defaults t
           ON i.task_deadline AND i.deadline_at IS NULL AND i.deadline IS NULL
          AND t.task = i.task AND t.version = coalesce(i.version, 1)
          AND t.deadline_seconds IS NOT NULL
    WHERE i.dedup_key IS NULL OR i.new_id IN (SELECT job_id FROM keys)
    ORDER BY ord
    RETURNING j.id, j.queue
),
notified AS (
    SELECT count(pg_notify({schema}.ready_channel(q.queue), q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM inserted) AS q
)
SELECT i.ord, coalesce(k.job_id, i.new_id) AS id, k.job_id IS NOT DISTINCT FROM i.new_id AS created
FROM input i LEFT JOIN keys k ON k.dedup_key = i.dedup_key CROSS JOIN notified
ORDER BY i.ord;
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
INSERT INTO {schema}.job_keys (dedup_key, job_id, task, unique_states)
SELECT dedup_key, id, task, unique_states FROM {schema}.jobs WHERE state = 'failed'
"""


def replay(db: Database, schema: str, name: str, system: str, jobs: int) -> tuple[float, float]:
    """(backend us per job, client us per job building the parameters)."""
    statements = queries(schema)
    serial = [0]
    warmup = batches(name, 20 * (1 if name == "one" else BATCH), serial)
    timed = batches(name, jobs, serial)
    with psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True) as conn:
        if system == "keytable":
            conn.execute(KEY_TABLE.format(schema=schema))
        if name == "retake":
            keys = [key for batch in timed for key in batch.dedup_keys or ()]
            conn.execute(HOLDERS.format(schema=schema), {"keys": keys})
            if system == "keytable":
                conn.execute(HOLDER_KEYS.format(schema=schema))
            conn.execute(f"ANALYZE {schema}.jobs")

        def build(batch: NewJobs) -> tuple[str, dict[str, Any]]:
            if system == "keytable":
                return KEYED_TABLE.format(schema=schema), insert_params(batch)
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
# The generic statement does not release keys (it would return the finished holders): retake
# compares the two shapes that do.
SYSTEMS_OF: dict[str, tuple[str, ...]] = {
    "one": ("trioq", "json"),
    "batch": ("trioq", "json"),
    "keyed": ("trioq", "json", "keytable"),
    "retake": ("trioq", "keytable"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with open_database() as db:
        for repeat in range(args.repeats):
            for name in REPLAYS:
                systems = SYSTEMS_OF[name]
                turn = repeat % len(systems)
                for system in systems[turn:] + systems[:turn]:
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
    for name in REPLAYS:
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
