"""Server CPU per job: trioq's statements against minimal ones on the same jobs table, and the
raw loop's on its own table, so a gap splits into what the statements cost and what the table
costs.

    python -m bench.statement_shape --jobs 10000 --repeats 6

Two replays per system, each on a fresh schema, the systems rotated each repeat, on one
session (durable cluster: every statement commits and waits for its WAL flush):
- drain: claim 25 ready jobs, complete them, until the backlog is gone. `trioq` runs
  job_claim_plain and job_complete_plain (the one-worker drain's statements); `minimal` runs a
  bare claim of the same rows on the same table (the scan, the lock, the same SET and
  RETURNING, no probes, no pause check, no per-task unnest) and the same completion; `raw` runs
  the raw loop's CLAIM_SQL and COMPLETE_SQL (bench/baseline.py) on raw_jobs.
- enqueue: single inserts, one per statement. `trioq` runs job_insert_one (the client's single
  enqueue), `minimal` a bare INSERT into jobs of the same job with its notification, `raw`
  the raw loop's INSERT_SQL.
Reported per system: the replaying backend's CPU per job (/proc/PID/schedstat) and its ratio
to `trioq`'s in the same repeat (median of the ratios).
"""

from __future__ import annotations

import argparse
import os
import statistics
import uuid
from collections.abc import Callable

import psycopg

from bench import baseline
from bench.harness import HARNESS_ROLE, Database, open_database
from bench.hot_path_cost import BATCH, claim_params, complete, insert_backlog, schedstat_ns
from trioq._sql import queries

Conn = psycopg.Connection[tuple[object, ...]]
SYSTEMS = ("trioq", "minimal", "raw")

MINIMAL_CLAIM = """
UPDATE {schema}.jobs j
SET state = 'running', attempt = j.attempt + 1, executions = j.executions + 1,
    lease_token = gen_random_uuid(), traced = false,
    lease_expires_at = now() + interval '30 seconds', worker_id = %(worker_id)s, error = NULL,
    started_at = greatest(now(), j.run_at)
WHERE j.id = ANY(ARRAY(
    SELECT c.id FROM {schema}.jobs c
    WHERE c.queue = 'default' AND c.task = 'noop' AND c.state = 'ready'
      AND c.partition_key IS NULL AND c.concurrency_key IS NULL AND c.run_at <= now()
    ORDER BY c.priority, c.run_at, c.id LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
RETURNING j.id, j.queue, j.task, j.payload, j.attempt, j.max_attempts, j.lease_token,
          j.partition_key, j.priority, j.run_at, j.created_at, j.cancel_requested, j.version,
          NULL::jsonb AS history, j.parent_id, j.concurrency_key
"""

MINIMAL_INSERT = """
INSERT INTO {schema}.jobs AS j (queue, task, payload, state, priority, run_at, max_attempts,
                               created_at, version)
VALUES ('default', 'noop', '{{}}', 'ready', 0, now(), 3, now(), 1)
RETURNING j.id, pg_notify({schema}.ready_channel(j.queue), j.queue)
"""

INSERT_ONE = {
    "queue": "default",
    "task": "noop",
    "payload": "{}",
    "priority": 0,
    "partition_key": None,
    "max_attempts": 3,
    "version": 1,
    "trace_context": None,
    "deadline_at": None,
    "deadline": None,
    "deadline_source": None,
    "run_at": None,
    "delay": None,
    "task_deadline": False,
}


def _round(system: str, conn: Conn, schema: str) -> int:
    """One claim and completion of up to BATCH jobs; the number claimed."""
    if system == "raw":
        claim = baseline.CLAIM_SQL.format(schema=schema).replace("$1", "'default'")
        rows = conn.execute(
            claim.replace("$2", "%(limit)s"), {"limit": BATCH}, prepare=True
        ).fetchall()
        if rows:
            raw_complete = baseline.COMPLETE_SQL.format(schema=schema)
            raw_complete = raw_complete.replace("$1", "%(ids)s").replace("$2", "%(tokens)s")
            params = {"ids": [r[0] for r in rows], "tokens": [r[3] for r in rows]}
            conn.execute(
                raw_complete.replace("$3", "%(results)s"),
                {**params, "results": ["null"] * len(rows)},
                prepare=True,
            )
        return len(rows)
    if system == "trioq":
        reply = conn.execute(
            queries(schema)["job_claim_plain"], claim_params(), prepare=True
        ).fetchall()
        rows = [row[8:] for row in reply if row[8] is not None]  # the claimed row's columns
    else:
        rows = conn.execute(
            MINIMAL_CLAIM.format(schema=schema),
            {"worker_id": uuid.uuid4(), "limit": BATCH},
            prepare=True,
        ).fetchall()
    if rows:
        complete(conn, schema, [(row[0], row[4], row[6]) for row in rows])
    return len(rows)


def drain(db: Database, schema: str, system: str, jobs: int) -> float:
    """Backend CPU (us) per job of one replayed drain of `jobs` jobs."""
    with psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True) as conn:
        if system == "raw":
            conn.execute(
                f"INSERT INTO {schema}.raw_jobs (queue, task, payload)"
                " SELECT 'default', 'noop', '{}' FROM generate_series(1, %s)",
                [jobs],
            )
            conn.execute(f"ANALYZE {schema}.raw_jobs")
            conn.execute("CHECKPOINT")
        else:
            insert_backlog(conn, schema, jobs)
        pid = conn.info.backend_pid
        before, done = schedstat_ns(pid), 0
        while done < jobs and (claimed := _round(system, conn, schema)):
            done += claimed
        used = schedstat_ns(pid) - before
    if done != jobs:
        raise RuntimeError(f"{system}: the replay completed {done} of {jobs} jobs")
    return used / jobs / 1e3


def enqueue(db: Database, schema: str, system: str, jobs: int) -> float:
    """Backend CPU (us) per single insert, `jobs` of them."""
    if system == "raw":
        sql = baseline.INSERT_SQL.format(schema=schema)
        sql = sql.replace("$1", "%(queue)s").replace("$2", "%(task)s").replace("$3", "%(payload)s")
    elif system == "trioq":
        sql = queries(schema)["job_insert_one"]
    else:
        sql = MINIMAL_INSERT.format(schema=schema)
    params = INSERT_ONE if "%(" in sql else None
    with psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True) as conn:
        for _ in range(20):  # prepared and planned before the timed part
            conn.execute(sql, params, prepare=True)
        pid = conn.info.backend_pid
        before = schedstat_ns(pid)
        for _ in range(jobs):
            conn.execute(sql, params, prepare=True)
        used = schedstat_ns(pid) - before
    return used / jobs / 1e3


REPLAYS: dict[str, Callable[[Database, str, str, int], float]] = {
    "drain": drain,
    "enqueue": enqueue,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    figures: dict[tuple[str, str], list[float]] = {}
    with open_database() as db:
        for repeat in range(args.repeats):
            order = SYSTEMS[repeat % 3 :] + SYSTEMS[: repeat % 3]
            for replay_name, replay in REPLAYS.items():
                for system in order:
                    schema = db.fresh_schema()
                    try:
                        db.install_raw(schema)
                        us = replay(db, schema, system, args.jobs)
                    finally:
                        db.drop_schema(schema)
                    figures.setdefault((replay_name, system), []).append(us)
                    print(
                        f"repeat {repeat + 1} {replay_name:>7} {system:>7}: {us:6.1f} us"
                        f" backend/job  (load {os.getloadavg()[0]:.2f})",
                        flush=True,
                    )
    print(f"medians: ({args.repeats} repeats of {args.jobs} jobs)")
    for (replay_name, system), runs in figures.items():
        base = figures[(replay_name, "trioq")]
        ratio = statistics.median(a / b for a, b in zip(runs, base, strict=True))
        print(
            f"{replay_name:>7} {system:>7}: {statistics.median(runs):6.1f} us backend/job"
            f"  {ratio:.3f} x trioq"
        )


if __name__ == "__main__":
    main()
