"""Table health under churn: dead tuples of the jobs table during a 200,000-job run.

Run once (not part of the test suite): `python -m bench.table_health [--jobs 200000]`.
An embedded cluster (autovacuum on, `autovacuum_naptime` 10 s as docs/operations.md recommends
for a queue database); a worker with 25 slots drains the jobs while a producer enqueues them
in batches of 1,000; every second the harness samples `pg_stat_user_tables` for the jobs
table. With `--defaults`, the jobs table's reloptions from migration 0005 are reset first, to
compare against PostgreSQL's default autovacuum settings on the same run shape.
"""

from __future__ import annotations

import argparse
import json
import time

import psycopg
import trio

import trioq
from trioq.embedded import EmbeddedPostgres, EmbeddedSettings

SCHEMA = "bench_health"
STATS = """
SELECT n_live_tup, n_dead_tup, autovacuum_count, pg_table_size(relid), pg_indexes_size(relid)
FROM pg_stat_user_tables WHERE relid = 'bench_health.jobs'::regclass
"""


def _sample(conninfo: str, started: float, out: list[dict[str, float]]) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(STATS).fetchone()
        done = conn.execute(
            "SELECT count(*) FROM bench_health.jobs WHERE state = 'completed'"
        ).fetchone()
    assert row is not None and done is not None
    live, dead, vacuums, table, index = row
    out.append(
        {
            "t": round(time.monotonic() - started, 1),
            "live": live,
            "dead": dead,
            "autovacuums": vacuums,
            "table_bytes": table,
            "index_bytes": index,
            "completed": done[0],
        }
    )


async def run(conninfo: str, jobs: int, defaults: bool) -> dict[str, object]:
    app = trioq.App(conninfo, schema=SCHEMA, pool_size=6)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    samples: list[dict[str, float]] = []
    async with app.client(migrate=True) as client, trio.open_nursery() as nursery:
        if defaults:
            await trio.to_thread.run_sync(_reset_reloptions, conninfo)
        worker = await nursery.start(
            lambda task_status: app.run_worker(
                ["default"], 25, grace_seconds=0, task_status=task_status
            )
        )
        started = time.monotonic()

        async def sampler() -> None:
            while True:
                await trio.to_thread.run_sync(_sample, conninfo, started, samples)
                await trio.sleep(1.0)

        nursery.start_soon(sampler)
        for start in range(0, jobs, 1000):
            await client.enqueue_many("noop", [None] * min(1000, jobs - start))
        while not samples or samples[-1]["completed"] < jobs:  # noqa: ASYNC110 -- another
            await trio.sleep(0.5)  # session's state, sampled (the harness polls it anyway)
        elapsed = time.monotonic() - started
        await trio.to_thread.run_sync(_sample, conninfo, started, samples)
        worker.request_drain()
        nursery.cancel_scope.cancel()
    dead = [s["dead"] for s in samples]
    return {
        "jobs": jobs,
        "reloptions": "postgres defaults" if defaults else "migration 0005",
        "seconds": round(elapsed, 1),
        "jobs_per_second": round(jobs / elapsed),
        "dead_tuples_max": max(dead),
        "dead_tuples_p50": sorted(dead)[len(dead) // 2],
        "dead_tuples_final": dead[-1],
        "autovacuums": samples[-1]["autovacuums"],
        "table_bytes_final": samples[-1]["table_bytes"],
        "index_bytes_final": samples[-1]["index_bytes"],
        "samples": samples,
    }


def _reset_reloptions(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE bench_health.jobs RESET (fillfactor, autovacuum_vacuum_scale_factor, "
            "autovacuum_vacuum_threshold, autovacuum_vacuum_insert_scale_factor, "
            "autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--defaults", action="store_true", help="reset the jobs reloptions")
    parser.add_argument("--out", default=None, help="write the result JSON here")
    args = parser.parse_args()
    settings = EmbeddedSettings(server_settings={"autovacuum_naptime": "10s"})
    with EmbeddedPostgres(settings=settings) as cluster:
        result = trio.run(run, cluster.conninfo, args.jobs, args.defaults)
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
