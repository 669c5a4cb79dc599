"""Scheduler benchmark: run with `python -m bench.schedules [--seconds 300]`.

1. Idle load: a worker with 25 slots on one queue, poll 1 s, for `--idle-seconds`, first with
   no schedules, then with 10 daily cron schedules; statements per second from
   pg_stat_statements (every statement the server ran, BEGIN/COMMIT included).
2. Precision: a schedule firing every second (`* * * * * *`, misfire=all) for `--seconds`:
   every fire time must be enqueued exactly once; lateness = created_at - run_at (database
   time; run_at is the fire time), p50/p95/max.

One embedded PostgreSQL, one in-process worker (trio), the machine shared with whatever else
runs: read the lateness as an upper bound.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import statistics
import time

import psycopg
import trio

import trioq
from trioq.embedded import EmbeddedPostgres, EmbeddedSettings


def make_app(url: str, schema: str, schedules: int, per_second: bool) -> trioq.App:
    app = trioq.App(url, schema=schema)

    @app.task("digest")
    async def digest(ctx: trioq.Context, payload: object) -> None:
        return None

    for n in range(schedules):
        app.periodic(f"daily-{n}", cron=f"{n} 9 * * *", timezone="Europe/Paris", task="digest")
    if per_second:
        app.periodic("every-second", cron="* * * * * *", misfire="all", task="digest")
    return app


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def statements(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
            " WHERE query NOT ILIKE '%pg_stat_statements%'"
        ).fetchone()
        return int(row[0]) if row else 0


async def idle_rate(url: str, schema: str, schedules: int, seconds: float) -> float:
    app = make_app(url, schema, schedules, per_second=False)
    async with app.client(migrate=True), trio.open_nursery() as nursery:
        worker = await nursery.start(
            lambda task_status: app.run_worker(
                ["default"], 25, poll_interval=1.0, grace_seconds=0, task_status=task_status
            )
        )
        await trio.sleep(3)  # start-up statements are not idle load
        await trio.to_thread.run_sync(reset, url)
        await trio.sleep(seconds)
        calls = await trio.to_thread.run_sync(statements, url)
        worker.request_drain()
    return calls / seconds


async def per_second(url: str, schema: str, seconds: float) -> dict[str, object]:
    app = make_app(url, schema, 0, per_second=True)
    async with app.client(migrate=True) as client, trio.open_nursery() as nursery:
        worker = await nursery.start(
            lambda task_status: app.run_worker(
                ["default"], 25, poll_interval=1.0, grace_seconds=0, task_status=task_status
            )
        )
        await trio.sleep(seconds)
        await client.unschedule("every-second")
        worker.request_drain()
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT run_at, extract(epoch FROM created_at - run_at) FROM {schema}.jobs"
            " WHERE dedup_key LIKE 'schedule:every-second:%' ORDER BY run_at"
        ).fetchall()
    runs = [row[0] for row in rows]
    lateness = sorted(float(row[1]) for row in rows)
    gaps = [b - a for a, b in itertools.pairwise(runs)]
    one = datetime.timedelta(seconds=1)
    return {
        "fire_times": len(runs),
        "distinct": len(set(runs)),
        "gaps_not_one_second": sum(gap != one for gap in gaps),
        "lateness_p50_ms": round(1000 * statistics.median(lateness), 2),
        "lateness_p95_ms": round(1000 * lateness[int(0.95 * (len(lateness) - 1))], 2),
        "lateness_max_ms": round(1000 * lateness[-1], 2),
    }


async def main(args: argparse.Namespace) -> None:
    settings = EmbeddedSettings(shared_preload_libraries=("pg_stat_statements",))
    with EmbeddedPostgres(settings=settings) as cluster:
        url = cluster.conninfo
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        started = time.perf_counter()
        results: dict[str, object] = {
            "idle_no_schedules_statements_per_s": round(
                await idle_rate(url, "bench_idle_a", 0, args.idle_seconds), 3
            ),
            "idle_10_schedules_statements_per_s": round(
                await idle_rate(url, "bench_idle_b", 10, args.idle_seconds), 3
            ),
            "per_second_schedule": await per_second(url, "bench_cron", args.seconds),
            "wall_seconds": round(time.perf_counter() - started, 1),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    trio.run(main, parser.parse_args())
