"""Server CPU per job of the hot path's two statements, on variants of the jobs table.

    python -m bench.hot_path_cost --jobs 10000 --repeats 12 --variant no_checks --variant floor

Replays a one-worker drain's statements on one session, without a worker: claim 25 ready
jobs (job_claim_plain), complete them (job_complete_plain), until the
backlog is gone. Each variant is a fresh schema with this checkout's migrations, then the
variant's changes (drop every CHECK of jobs, the concurrency-release trigger, some indexes),
so the cost of each element of the table shows as the difference it makes. Reported per
variant: the CPU of the replaying backend per job (/proc/PID/schedstat, nanoseconds), the
whole cluster's beside it, WAL bytes per job, and the backend's CPU as a ratio to `base`'s in
the same repeat (median of the ratios). Variants rotate each repeat. The backlog is inserted
and CHECKPOINTed before the timed window, so each variant writes the same full-page images.
"""

from __future__ import annotations

import argparse
import os
import statistics
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

from bench.harness import HARNESS_ROLE, Database, open_database
from bench.stats import rotated
from trioq._pg.replies import ClaimedRow
from trioq._sql import queries

BATCH = 25
# Indexes the drain of plain jobs never inserts into (their predicates never match its rows):
# each still costs an open and a predicate per statement and per row. (jobs_suspended_idx was
# one more until migration 0046 dropped it.)
COLD_INDEXES = (
    "jobs_parent_idx",
    "jobs_wait_event_idx",
    "jobs_deadline_idx",
)

Change = Callable[[psycopg.Connection[tuple[object, ...]], str], None]


def drop_checks(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    rows = conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'",
        [f"{schema}.jobs"],
    ).fetchall()
    for (name,) in rows:
        conn.execute(f'ALTER TABLE {schema}.jobs DROP CONSTRAINT "{name}"')


def drop_trigger(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    conn.execute(f"DROP TRIGGER jobs_concurrency_release_update ON {schema}.jobs")


def drop_indexes(*names: str) -> Change:
    def change(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
        for name in names:
            conn.execute(f"DROP INDEX {schema}.{name}")

    return change


def floor(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    drop_checks(conn, schema)
    drop_trigger(conn, schema)
    drop_indexes(*COLD_INDEXES, "jobs_lease_idx", "jobs_finished_idx")(conn, schema)


VARIANTS: dict[str, Change] = {
    "base": lambda conn, schema: None,
    "no_checks": drop_checks,
    "no_trigger": drop_trigger,
    "no_lease_idx": drop_indexes("jobs_lease_idx"),
    "no_finished_idx": drop_indexes("jobs_finished_idx"),
    "no_cold_idx": drop_indexes(*COLD_INDEXES),
    "floor": floor,
}


def schedstat_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as stat:
        return int(stat.read().split()[0])


def cluster_ns(postmaster: int, skip: int) -> int:
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == skip:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == postmaster:
                    total += schedstat_ns(int(entry))
        except (OSError, ValueError):
            pass
    return total


def claim_params() -> dict[str, Any]:
    """The claim parameters of a one-worker drain of `noop` jobs in the default queue."""
    return {
        "lookahead": 1.0,
        "queue": "default",
        "tasks": "{noop}",
        "task_versions": None,
        "limit": BATCH,
        "traced": False,
        "lease_seconds": 30.0,
        "worker_id": uuid.uuid4(),
    }


def insert_backlog(conn: psycopg.Connection[tuple[object, ...]], schema: str, jobs: int) -> None:
    """`jobs` ready no-op jobs in one statement, analyzed and checkpointed (so every replay
    writes the same full-page images). Since migration 0047 the table is `job_rows_legacy`
    (`jobs` a view) and its `state` is `phase`; since 0049 `job_rows`: any layout, so main and
    write-once replay too."""
    [[records, legacy]] = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
        [f"{schema}.job_rows", f"{schema}.job_rows_legacy"],
    ).fetchall()
    table, state = (
        ("job_rows", "phase")
        if records
        else ("job_rows_legacy", "phase")
        if legacy
        else ("jobs", "state")
    )
    conn.execute(
        f"INSERT INTO {schema}.{table} (queue, task, payload, {state}, priority, run_at,"
        " max_attempts, created_at, version)"
        " SELECT 'default', 'noop', '{}', 'ready', 0, now() - interval '1 s', 1, now(), 1"
        " FROM generate_series(1, %s)",
        [jobs],
    )
    conn.execute(f"ANALYZE {schema}.{table}")
    conn.execute("CHECKPOINT")


def complete(
    conn: psycopg.Connection[tuple[object, ...]],
    schema: str,
    leases: list[tuple[Any, Any, Any]],
    sql: str | None = None,
) -> None:
    """job_complete_plain (or `sql`, taking the same parameters) for the claimed (id, attempt,
    lease token) triples."""

    def array(values: Iterable[object]) -> str:
        return "{" + ",".join(str(value) for value in values) + "}"

    conn.execute(
        sql or queries(schema)["job_complete_plain"],
        {
            "ids": array(job_id for job_id, _, _ in leases),
            "attempts": array(attempt for _, attempt, _ in leases),
            "lease_tokens": array(token.hex for _, _, token in leases),
            "results": array(['"null"'] * len(leases)),
        },
        prepare=True,
    ).fetchall()


def replay(
    db: Database, schema: str, jobs: int, measure: int | None = None, jit: bool = False
) -> tuple[float, float, float]:
    """Backend and cluster CPU (us) and WAL bytes per job of one drain of `jobs` jobs, or of
    its first `measure` jobs out of a backlog of `jobs` (bench.backlog_depth)."""
    measure = jobs if measure is None else min(measure, jobs)
    sql = queries(schema)
    params = claim_params()
    with psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True) as conn:
        conn.execute(f"SET jit = {'on' if jit else 'off'}")  # off: as trioq's sessions run
        insert_backlog(conn, schema, jobs)
        pid = conn.info.backend_pid
        with open(f"/proc/{pid}/stat") as stat:
            postmaster = int(stat.read().rsplit(")", 1)[1].split()[1])
        harness = db.conn.info.backend_pid
        [[wal_before]] = conn.execute("SELECT pg_current_wal_lsn()").fetchall()
        backend_before, cluster_before = schedstat_ns(pid), cluster_ns(postmaster, harness)
        done = 0
        while done < measure:
            cursor = conn.execute(sql["job_claim_plain"], params, prepare=True)
            claimed = [row for row in cursor.fetchall() if row[ClaimedRow.id] is not None]
            if not claimed:
                break
            complete(
                conn,
                schema,
                [
                    (row[ClaimedRow.id], row[ClaimedRow.attempt], row[ClaimedRow.lease_token])
                    for row in claimed
                ],
            )
            done += len(claimed)
        backend = schedstat_ns(pid) - backend_before
        cluster = cluster_ns(postmaster, harness) - cluster_before
        [[wal]] = conn.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", [wal_before])
    if done != measure:
        raise RuntimeError(f"{schema}: the replay completed {done} of {measure} jobs")
    return backend / done / 1e3, cluster / done / 1e3, float(wal) / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variant", action="append", default=[], choices=sorted(VARIANTS))
    args = parser.parse_args()
    names = ["base", *[name for name in args.variant if name != "base"]]
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    with open_database() as db:
        for repeat in range(args.repeats):
            for name in rotated(names, repeat):
                schema = db.fresh_schema()
                try:
                    VARIANTS[name](db.conn, schema)
                    figures[name].append(replay(db, schema, args.jobs))
                finally:
                    db.drop_schema(schema)
                backend, cluster, wal = figures[name][-1]
                print(
                    f"repeat {repeat + 1} {name:>16}: {backend:6.1f} us backend/job"
                    f"  {cluster:6.1f} us cluster/job  {wal:5.0f} B WAL/job"
                    f"  (load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
    print(f"medians: ({args.repeats} repeats of {args.jobs} jobs)")
    for name in names:
        runs = figures[name]
        ratio = statistics.median(a[0] / b[0] for a, b in zip(runs, figures["base"], strict=True))
        print(
            f"{name:>16}: {statistics.median(r[0] for r in runs):6.1f} us backend/job"
            f"  {statistics.median(r[1] for r in runs):6.1f} us cluster/job"
            f"  {statistics.median(r[2] for r in runs):5.0f} B WAL/job  {ratio:.3f} x base"
        )


if __name__ == "__main__":
    main()
