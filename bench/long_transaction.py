"""Throughput during and after a long REPEATABLE READ transaction elsewhere, against a baseline.

Run once (not part of the test suite): `python -m bench.long_transaction [--jobs 60000]`.
The fault suite checks what a long transaction must never do to trioq (block a claim, lose or
double a job) and that VACUUM can remove what it kept once it ends; it does not compare rates,
because a timed assertion on a shared machine flakes. This compares them.

The durable embedded cluster of `python -m bench`. Each repeat makes two runs of the same shape,
in alternating order: one worker with 25 slots drains `--jobs` no-op jobs; in the "held" run a
separate session opens a REPEATABLE READ transaction (and reads the jobs table, so its
snapshot is taken) when 10 % of the jobs have run, and commits when 45 % have; the "baseline"
run marks the same points and holds nothing. Windows are counted in jobs, not seconds, so a
run that goes faster or slower still measures the same part of the backlog:
- during: from 10 % to 45 % of the jobs run (the transaction held);
- after: from 55 % to 90 % (a 10 % margin after it ends, for the first claims that step over,
  and mark dead, the index entries it kept alive).
Rates are handler starts per second of the worker's own clock. Reported: each window's rate,
its ratio to the baseline run of the same repeat, after/during within the held run, and the
jobs table's dead tuples at the commit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg
import trio
from psycopg import sql

import trioq
from bench.harness import open_database

#: Fractions of the jobs at which the windows open and close.
MARKS = (0.10, 0.45, 0.55, 0.90)
CONCURRENCY = 25


def hold_snapshot(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema)))


def dead_tuples(conn: psycopg.Connection[Any], schema: str) -> int:
    row = conn.execute(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'jobs'",
        (schema,),
    ).fetchone()
    assert row is not None
    return int(row[0])


async def one_run(conninfo: str, schema: str, jobs: int, hold: bool) -> dict[str, Any]:
    app = trioq.App(conninfo, schema=schema, pool_size=4)
    marks = [int(jobs * fraction) for fraction in MARKS]
    reached = {mark: trio.Event() for mark in marks}
    at: dict[int, float] = {}
    started = 0

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        nonlocal started
        started += 1
        if started in reached:
            at[started] = time.monotonic()
            reached[started].set()

    dead: int | None = None
    async with app.client(migrate=True) as client, trio.open_nursery() as nursery:
        for first in range(0, jobs, 5000):
            await client.enqueue_many("noop", [None] * min(5000, jobs - first))
        with psycopg.connect(conninfo, autocommit=True) as other:
            worker = await nursery.start(
                lambda task_status: app.run_worker(
                    ["default"], CONCURRENCY, grace_seconds=0, task_status=task_status
                )
            )
            with trio.fail_after(600):
                await reached[marks[0]].wait()
                if hold:
                    # Reading the table takes the snapshot the transaction then holds. The
                    # session's statements run in a thread, off the worker's event loop.
                    await trio.to_thread.run_sync(hold_snapshot, other, schema)
                await reached[marks[1]].wait()
                dead = await trio.to_thread.run_sync(dead_tuples, other, schema)
                if hold:
                    await trio.to_thread.run_sync(other.execute, "COMMIT")
                await reached[marks[3]].wait()
            worker.request_drain()
    during = (marks[1] - marks[0]) / (at[marks[1]] - at[marks[0]])
    after = (marks[3] - marks[2]) / (at[marks[3]] - at[marks[2]])
    return {"during": round(during), "after": round(after), "dead_tuples_at_commit": dead}


async def run(conninfo: str, jobs: int, repeats: int) -> dict[str, Any]:
    repeats_out: list[dict[str, Any]] = []
    for repeat in range(repeats):
        order = [True, False] if repeat % 2 == 0 else [False, True]
        runs: dict[str, dict[str, Any]] = {}
        for hold in order:
            name = "held" if hold else "baseline"
            runs[name] = await one_run(conninfo, f"bench_longtx_{repeat}_{name}", jobs, hold)
        held, base = runs["held"], runs["baseline"]
        repeats_out.append(
            {
                **runs,
                "during_vs_baseline": round(held["during"] / base["during"], 3),
                "after_vs_baseline": round(held["after"] / base["after"], 3),
                "after_vs_during": round(held["after"] / held["during"], 3),
            }
        )
        print(json.dumps(repeats_out[-1]), flush=True)
    summary = {
        key: statistics.median(r[key] for r in repeats_out)
        for key in ("during_vs_baseline", "after_vs_baseline", "after_vs_during")
    }
    return {"jobs": jobs, "concurrency": CONCURRENCY, "medians": summary, "repeats": repeats_out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=60_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    args = parser.parse_args()
    if args.jobs < 1000 or args.repeats < 1:
        parser.error("--jobs must be at least 1000 and --repeats at least 1")
    with open_database() as db:
        result = trio.run(run, db.cluster.conninfo, args.jobs, args.repeats)
    print(json.dumps(result["medians"], indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
