"""What a write-once layout's claim and completion cost when the record and the outcome tables
are partitioned by job-id epoch, against trioq's, replayed (bench-only SQL, no migration).

    python -m bench.epoch_claims --jobs 10000 --repeats 3 --epochs 1 --epochs 10 --epochs 30

The layout planned in bench/plans/write_once_layout.md writes a job's record once, at the
enqueue, into `job_rows` partitioned by job id (one partition per epoch of 2^32 ids, a UTC day,
as checkpoints, attempts and values are since migration 0043), takes a lease by inserting a
narrow `epoch_runs` row and appends the outcome to `job_outcomes`, partitioned the same way. A
generic plan over a partitioned table initialises and locks every partition the planner could
not prune (PostgreSQL 15), so the cost of naming the parents may grow with the epochs kept. Each
system drains `--jobs` ready no-op jobs of the newest epoch, 25 a claim, on one session of a
durable cluster, its backend CPU per job read from /proc/PID/schedstat:
- `trioq`: job_claim_plain and job_complete_plain on this checkout's schema (the reference);
- `parent-N`: the claim locks the ready entries (SKIP LOCKED), then their records in
  `job_rows` (FOR NO KEY UPDATE SKIP LOCKED: a record another transaction holds is skipped, as
  today's claim skips a job row), deletes the entries and inserts the leases; the completion
  deletes the leases fenced by id + attempt + token and appends the outcomes to `job_outcomes`;
  both name the parents, with N epochs of partitions;
- `current-N`: the same statements naming the newest epoch's partitions, as a claim prepared
  again each day could.
Plans are forced generic (`plan_cache_mode`), the plan a prepared statement settles on. The
prototype's tables are `proto_rows` and `proto_outcomes`: since migration 0049 the schema has the
product's `job_rows` and `job_outcomes` (stage 6 built; this stays as stage 0's record). The
claim has none of job_claim_plain's probes, pause check or per-task scan: compare `parent-N`
with `current-N` and with `parent-1`, not with `trioq`, for what the epochs cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import uuid
from typing import Any

import psycopg

from bench import statement_shape
from bench.harness import HARNESS_ROLE, Database, open_database
from bench.hot_path_cost import BATCH, complete, schedstat_ns
from bench.stats import rotated

Conn = psycopg.Connection[tuple[object, ...]]
EPOCH = 2**32

INSTALL_SQL = """
CREATE TABLE {schema}.proto_rows (
    id bigint NOT NULL, queue text NOT NULL, task text NOT NULL, payload jsonb NOT NULL,
    phase text NOT NULL, priority smallint NOT NULL, run_at timestamptz, attempt int NOT NULL,
    max_attempts int, created_at timestamptz NOT NULL, filed int NOT NULL DEFAULT 0,
    partition_key text, concurrency_key text, parent_id bigint, version int NOT NULL DEFAULT 1,
    cancel_requested boolean NOT NULL DEFAULT false, checkpoint_count int NOT NULL DEFAULT 0,
    result_watched boolean NOT NULL DEFAULT false, error jsonb, deadline_at timestamptz
) PARTITION BY RANGE (id);
CREATE TABLE {schema}.ready (
    queue text NOT NULL, priority smallint NOT NULL, run_at timestamptz NOT NULL,
    id bigint NOT NULL, filed int NOT NULL DEFAULT 0
);
CREATE INDEX ready_claim_idx ON {schema}.ready (queue, priority, run_at, id);
CREATE TABLE {schema}.epoch_runs (
    job_id bigint PRIMARY KEY, attempt int NOT NULL, lease_token uuid NOT NULL,
    lease_expires_at timestamptz NOT NULL, worker_id uuid, traced boolean NOT NULL,
    started_at timestamptz NOT NULL
);
CREATE INDEX epoch_runs_lease_idx ON {schema}.epoch_runs (lease_expires_at);
CREATE TABLE {schema}.proto_outcomes (
    job_id bigint NOT NULL, state text NOT NULL, result jsonb, attempt int NOT NULL,
    worker_id uuid, started_at timestamptz NOT NULL, finished_at timestamptz NOT NULL
) PARTITION BY RANGE (job_id);
"""

PARTITION_SQL = """
CREATE TABLE {schema}.proto_rows_e{n} PARTITION OF {schema}.proto_rows
    FOR VALUES FROM ({low}) TO ({high});
ALTER TABLE {schema}.proto_rows_e{n} ADD PRIMARY KEY (id);
CREATE TABLE {schema}.proto_outcomes_e{n} PARTITION OF {schema}.proto_outcomes
    FOR VALUES FROM ({low}) TO ({high});
ALTER TABLE {schema}.proto_outcomes_e{n} ADD PRIMARY KEY (job_id);
CREATE INDEX ON {schema}.proto_outcomes_e{n} (finished_at);
"""

BACKLOG_SQL = """
WITH rows AS (
    INSERT INTO {schema}.proto_rows (id, queue, task, payload, phase, priority, run_at, attempt,
                                   max_attempts, created_at)
    SELECT {low} + n, 'default', 'noop', '{{}}', 'ready', 0, now() - interval '1 s', 0, 1, now()
    FROM generate_series(1, %(jobs)s) AS n
    RETURNING id, run_at
)
INSERT INTO {schema}.ready (queue, priority, run_at, id) SELECT 'default', 0, run_at, id FROM rows
"""

CLAIM_SQL = """
WITH entries AS MATERIALIZED (
    SELECT r.ctid AS entry, r.id FROM {schema}.ready r
    WHERE r.queue = 'default' AND r.run_at <= now()
    ORDER BY r.priority, r.run_at, r.id
    LIMIT %(limit)s::int
    FOR UPDATE OF r SKIP LOCKED
),
records AS MATERIALIZED (
    SELECT j.id, j.queue, j.task, j.payload, j.attempt, j.max_attempts, j.priority, j.run_at,
           j.created_at
    FROM {rows} j
    WHERE j.id = ANY(ARRAY(SELECT id FROM entries)) AND j.phase = 'ready'
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
gone AS (
    DELETE FROM {schema}.ready x WHERE x.ctid = ANY(ARRAY(SELECT entry FROM entries))
),
run AS (
    INSERT INTO {schema}.epoch_runs (job_id, attempt, lease_token, lease_expires_at, worker_id,
                                   traced, started_at)
    SELECT id, attempt + 1, gen_random_uuid(), now() + interval '30 seconds',
           %(worker_id)s::uuid, false, now()
    FROM records
    RETURNING job_id, attempt, lease_token
)
SELECT j.id, j.queue, j.task, j.payload, r.attempt, j.max_attempts, r.lease_token, j.priority,
       j.run_at, j.created_at
FROM run r JOIN records j ON j.id = r.job_id
"""

COMPLETE_SQL = """
WITH input AS MATERIALIZED (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(lease_tokens)s::uuid[],
                         %(results)s::text[]) AS t(id, attempt, lease_token, result)
),
ended AS (
    DELETE FROM {schema}.epoch_runs r USING input i
    WHERE r.job_id = i.id AND r.attempt = i.attempt AND r.lease_token = i.lease_token
    RETURNING r.job_id, r.attempt, r.worker_id, r.started_at, i.result
)
INSERT INTO {outcomes} (job_id, state, result, attempt, worker_id, started_at, finished_at)
SELECT job_id, 'completed', result::jsonb, attempt, worker_id, started_at, now() FROM ended
RETURNING job_id
"""


def install(conn: Conn, schema: str, epochs: int) -> None:
    conn.execute(INSTALL_SQL.format(schema=schema))
    for n in range(epochs):
        conn.execute(PARTITION_SQL.format(schema=schema, n=n, low=n * EPOCH, high=(n + 1) * EPOCH))


def epoch_drain(db: Database, schema: str, epochs: int, current: bool, jobs: int) -> float:
    """Backend CPU (us) per job of one drain on `epochs` epochs, the statements naming the
    parents or (`current`) the newest epoch's partitions."""
    newest = epochs - 1
    rows = f"{schema}.proto_rows_e{newest}" if current else f"{schema}.proto_rows"
    outcomes = f"{schema}.proto_outcomes_e{newest}" if current else f"{schema}.proto_outcomes"
    claim = CLAIM_SQL.format(schema=schema, rows=rows)
    done_sql = COMPLETE_SQL.format(schema=schema, outcomes=outcomes)
    worker_id = uuid.uuid4()
    with psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True) as conn:
        install(conn, schema, epochs)
        conn.execute(BACKLOG_SQL.format(schema=schema, low=newest * EPOCH), {"jobs": jobs})
        conn.execute(f"ANALYZE {schema}.proto_rows")
        conn.execute(f"ANALYZE {schema}.ready")
        conn.execute("CHECKPOINT")
        # The generic plan a prepared statement settles on; seqscan off as the contract floor's
        # claim session (a delete by address planned on an empty table is a sequential scan).
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("SET enable_seqscan = off")
        pid = conn.info.backend_pid
        before, finished = schedstat_ns(pid), 0
        while finished < jobs:
            claimed = conn.execute(
                claim, {"limit": BATCH, "worker_id": worker_id}, prepare=True
            ).fetchall()
            if not claimed:
                break
            complete(conn, schema, [(row[0], row[4], row[6]) for row in claimed], done_sql)
            finished += len(claimed)
        used = schedstat_ns(pid) - before
    if finished != jobs:
        raise RuntimeError(f"the replay completed {finished} of {jobs} jobs")
    return used / jobs / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, action="append", default=[])
    args = parser.parse_args()
    systems: list[tuple[str, Any]] = [("trioq", None)]
    for epochs in args.epochs or [1, 10, 30]:
        systems += [(f"parent-{epochs}", (epochs, False)), (f"current-{epochs}", (epochs, True))]
    figures: dict[str, list[float]] = {}
    with open_database() as db:
        for repeat in range(args.repeats):
            for name, shape in rotated(systems, repeat):
                schema = db.fresh_schema()
                try:
                    if shape is None:  # statement_shape's `trioq` replay
                        db.install_raw(schema)
                        us = statement_shape.drain(db, schema, "trioq", args.jobs)
                    else:
                        us = epoch_drain(db, schema, shape[0], shape[1], args.jobs)
                finally:
                    db.drop_schema(schema)
                figures.setdefault(name, []).append(us)
                print(
                    f"repeat {repeat + 1} {name:>11}: {us:6.1f} us backend/job"
                    f"  (load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
    print(f"medians: ({args.repeats} repeats of {args.jobs} jobs)")
    base = figures["trioq"]
    for name, runs in figures.items():
        ratio = statistics.median(a / b for a, b in zip(runs, base, strict=True))
        print(f"{name:>11}: {statistics.median(runs):6.1f} us backend/job  {ratio:.3f} x trioq")


if __name__ == "__main__":
    main()
