"""Server CPU per job: trioq's statements against minimal ones on the same tables, the raw
loop's on its own table, and the floor of trioq's contract, so a gap splits into what the
statements cost and what the tables cost.

    python -m bench.statement_shape --jobs 10000 --repeats 6 [--system narrow ...]

Two replays per system, each on a fresh schema, the systems rotated each repeat, on one
session (durable cluster: every statement commits and waits for its WAL flush):
- drain: claim 25 ready jobs, complete them, until the backlog is gone. `trioq` runs
  job_claim_plain and job_complete_plain (the one-worker drain's statements); `minimal` runs a
  bare claim of the same rows on the same tables (the ready ring's scan in claim order, its
  entries locked and deleted, a run inserted per job with the same columns and RETURNING; no
  probes, no pause check, no per-task unnest, no lock of the job's row)
  and the same completion; `raw` runs
  the raw loop's CLAIM_SQL and COMPLETE_SQL (bench/baseline.py) on raw_jobs.
- enqueue: single inserts, one per statement. `trioq` runs job_insert_one (the client's single
  enqueue), `minimal` a bare INSERT into jobs of the same job with its notification, `raw`
  the raw loop's INSERT_SQL.
`raw` is the raw loop that keeps the finished row with its result (COMPLETE_SQL), `raw-del` the
one that deletes it (COMPLETE_DELETE_SQL: the drain targets' "raw loop"). `floor` and
`floor-del` are the floor of trioq's contract (bench/contract_floor.py, bench-only SQL): a
record written once, claimable entries apart, a fenced lease that recovery can find, the outcome
appended to a history apart (`floor-del`: nothing kept).
The prototypes of layouts (`runs`, `runs-append`, `runs-ring`: leases in a table of their own;
`hot`, `hot-runs`: the row updated in place; `narrow`, `ncopy`, `nwide`, `nlate`: a narrow hot
table) were written against the layout before migration 0047 and are retired from this replay:
0047 built the first (job_runs), so `trioq` is now that layout. Their modules
(bench/runs_table.py, hot_table.py, narrow_table.py) and figures (bench/RESULTS.md) stay as the
record; they run on a checkout before 0047. `discard` is
trioq's claim with the completion of a task that keeps nothing (job_complete_discard), and
`discard-bare` the same without the statement triggers that delete deleted jobs' satellite rows.
`--days N` makes N day partitions of finished jobs in the past first (a retention of N days).
Reported per system: the replaying backend's CPU per job (/proc/PID/schedstat) and its ratios
to `trioq`'s, `raw`'s and `raw-del`'s in the same repeat (medians of the ratios). `--system`
runs only the systems named (those three always run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import uuid
from collections.abc import Callable

import psycopg

from bench import baseline, contract_floor
from bench.harness import HARNESS_ROLE, Database, open_database
from bench.hot_path_cost import BATCH, claim_params, complete, insert_backlog, schedstat_ns
from bench.stats import rotated
from trioq._pg.inserts import insert_statement
from trioq._pg.replies import ClaimedRow
from trioq._seam.records import NewJob, NewJobs
from trioq._sql import queries

Conn = psycopg.Connection[tuple[object, ...]]
SYSTEMS = (
    "trioq",
    "minimal",
    "raw",
    "raw-del",
    "discard",
    "discard-bare",
    *contract_floor.VARIANTS,
)
# trioq's claim with job_complete_discard (`keep=False`), and the same without the statement
# triggers that delete what belongs to deleted jobs (`discard-bare`: what they cost).
DISCARD = ("discard", "discard-bare")
TRIOQ_CLAIM = ("trioq", *DISCARD)
# Every ratio is to one of these, in the same repeat, so they always run.
BASES = ("trioq", "raw", "raw-del")

MINIMAL_CLAIM = """
WITH taken AS MATERIALIZED (
    SELECT r.id, r.ctid AS ring_row FROM {schema}.ready_ring r
    WHERE r.queue = 'default' AND r.task = 'noop' AND r.run_at <= now()
    ORDER BY r.priority, r.run_at, r.id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM {schema}.ready_ring x
    WHERE x.ctid = ANY(ARRAY(SELECT ring_row FROM taken))
      AND x.id = ANY(ARRAY(SELECT id FROM taken))
),
run AS (
    INSERT INTO {schema}.job_runs (job_id, attempt, lease_token, lease_expires_at, worker_id,
                                   traced, started_at, executions, queue, partition_key,
                                   concurrency_key, parent_id, result_watched)
    SELECT j.id, j.attempt + 1, gen_random_uuid(), now() + interval '30 seconds',
           %(worker_id)s, false, greatest(now(), j.run_at), j.executions + 1, j.queue,
           j.partition_key, j.concurrency_key, j.parent_id, j.result_watched
    FROM {schema}.job_rows j
    WHERE j.id = ANY(ARRAY(SELECT id FROM taken)) AND j.phase = 'ready'
    RETURNING job_id, attempt, lease_token
)
SELECT j.id, j.queue, j.task, j.payload, u.attempt, j.max_attempts, u.lease_token,
       j.partition_key, j.priority, j.run_at, j.created_at, j.cancel_requested, j.version,
       NULL::jsonb AS history, j.parent_id, j.concurrency_key
FROM run u JOIN {schema}.job_rows j ON j.id = u.job_id
"""

MINIMAL_INSERT = """
INSERT INTO {schema}.job_rows AS j (queue, task, payload, phase, priority, run_at,
                                   max_attempts, created_at, version)
VALUES ('default', 'noop', '{{}}', 'ready', 0, now(), 3, now(), 1)
RETURNING j.id, pg_notify({schema}.ready_channel(j.queue), j.queue)
"""

# job_insert_one's parameters, as the client sends them for one no-op job.
INSERT_ONE = insert_statement(
    NewJobs(NewJob("default", "noop", "{}", max_attempts=3, task_deadline=False), ["{}"])
)[1]


def _round(system: str, conn: Conn, schema: str) -> int:
    """One claim and completion of up to BATCH jobs; the number claimed."""
    if system in ("raw", "raw-del"):
        claim = baseline.CLAIM_SQL.format(schema=schema).replace("$1", "'default'")
        rows = conn.execute(
            claim.replace("$2", "%(limit)s"), {"limit": BATCH}, prepare=True
        ).fetchall()
        if rows:
            raw_complete = (
                baseline.COMPLETE_SQL if system == "raw" else baseline.COMPLETE_DELETE_SQL
            )
            raw_complete = raw_complete.format(schema=schema)
            raw_complete = raw_complete.replace("$1", "%(ids)s").replace("$2", "%(tokens)s")
            params = {"ids": [r[0] for r in rows], "tokens": [r[3] for r in rows]}
            if system == "raw":
                raw_complete = raw_complete.replace("$3", "%(results)s")
                params["results"] = ["null"] * len(rows)
            conn.execute(raw_complete, params, prepare=True)
        return len(rows)
    if system in contract_floor.VARIANTS:
        rows = conn.execute(
            contract_floor.CLAIM_SQL.format(schema=schema),
            {"worker_id": uuid.uuid4(), "limit": BATCH},
            prepare=True,
        ).fetchall()
        if rows:  # the floor's completion returns nothing, as the raw loop's
            conn.execute(
                contract_floor.VARIANTS[system].format(schema=schema),
                {
                    "ids": [row[0] for row in rows],
                    "attempts": [row[4] for row in rows],
                    "lease_tokens": [row[5] for row in rows],
                    "results": ["null"] * len(rows),
                },
                prepare=True,
            )
        return len(rows)
    completion = None  # job_complete_plain
    if system in TRIOQ_CLAIM:
        claim = queries(schema)["job_claim_plain"]
        if system in DISCARD:
            completion = queries(schema)["job_complete_discard"]
        reply = conn.execute(claim, claim_params(), prepare=True).fetchall()
        first = ClaimedRow.id  # the claimed row's columns start here
        rows = [row[first:] for row in reply if row[first] is not None]
    else:
        rows = conn.execute(
            MINIMAL_CLAIM.format(schema=schema),
            {"worker_id": uuid.uuid4(), "limit": BATCH},
            prepare=True,
        ).fetchall()
    if rows:
        complete(conn, schema, [(row[0], row[4], row[6]) for row in rows], completion)
    return len(rows)


def drain(db: Database, schema: str, system: str, jobs: int) -> float:
    """Backend CPU (us) per job of one replayed drain of `jobs` jobs."""
    with psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True) as conn:
        if system in ("raw", "raw-del"):
            conn.execute(
                f"INSERT INTO {schema}.raw_jobs (queue, task, payload)"
                " SELECT 'default', 'noop', '{}' FROM generate_series(1, %s)",
                [jobs],
            )
            conn.execute(f"ANALYZE {schema}.raw_jobs")
            conn.execute("CHECKPOINT")
        elif system in contract_floor.VARIANTS:
            contract_floor.insert_backlog(conn, schema, jobs)
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
    if system in ("raw", "raw-del"):
        sql = baseline.INSERT_SQL.format(schema=schema)
        for number, name in (("$1", "queue"), ("$2", "task"), ("$3", "payload_json")):
            sql = sql.replace(number, f"%({name})s")
    elif system in TRIOQ_CLAIM:
        sql = queries(schema)["job_insert_one"]
    elif system in contract_floor.VARIANTS:
        sql = contract_floor.enqueue_sql(schema)
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
    parser.add_argument(
        "--days", type=int, default=0, help="day partitions of finished jobs made in the past"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--system", action="append", default=[], choices=SYSTEMS, help="default: every system"
    )
    args = parser.parse_args()
    systems = [name for name in SYSTEMS if name in {*BASES, *args.system}]
    if not args.system:
        systems = list(SYSTEMS)
    figures: dict[tuple[str, str], list[float]] = {}
    with open_database() as db:
        for repeat in range(args.repeats):
            order = rotated(systems, repeat)
            for replay_name, replay in REPLAYS.items():
                for system in order:
                    schema = db.fresh_schema()
                    try:
                        db.install_raw(schema)
                        if args.days:
                            db.conn.execute(
                                f"SELECT {schema}.job_history_add({schema}.job_lane(now()) - k)"
                                " FROM generate_series(1, %s) AS k",
                                [args.days],
                            )
                        if system in contract_floor.VARIANTS:
                            contract_floor.install(db.conn, schema)
                        if system == "discard-bare":
                            for trigger in ("jobs_deleted", "jobs_keys_delete"):
                                db.conn.execute(f"DROP TRIGGER {trigger} ON {schema}.job_rows")
                        us = replay(db, schema, system, args.jobs)
                    finally:
                        db.drop_schema(schema)
                    figures.setdefault((replay_name, system), []).append(us)
                    print(
                        f"repeat {repeat + 1} {replay_name:>7} {system:>11}: {us:6.1f} us"
                        f" backend/job  (load {os.getloadavg()[0]:.2f})",
                        flush=True,
                    )
    print(f"medians: ({args.repeats} repeats of {args.jobs} jobs)")
    for (replay_name, system), runs in figures.items():
        ratios = [
            statistics.median(
                a / b for a, b in zip(runs, figures[(replay_name, base)], strict=True)
            )
            for base in BASES
        ]
        print(
            f"{replay_name:>7} {system:>11}: {statistics.median(runs):6.1f} us backend/job"
            f"  {ratios[0]:.3f} x trioq  {ratios[1]:.3f} x raw  {ratios[2]:.3f} x raw-del"
        )


if __name__ == "__main__":
    main()
