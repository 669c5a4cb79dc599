"""Idle cost: statements per second of one idle worker with 25 slots, on 1 and on 4 queues.

`python -m bench.idle_statements [--seconds 60]`: an embedded cluster, a worker started and
left idle; the driver's own statement counts (every statement the worker process sends, by
name) over the window after start-up, so the figure includes claim polls and every service's
periodic statement (the leader's maintenance pass, which also heartbeats, keeps the leader
seat and reads the scheduler's next fire time). `server_per_second` is what the server ran in
the same window (pg_stat_statements: pool pings, BEGIN/COMMIT and LISTEN included). Also the
same in virtual time on the in-memory driver (10 virtual minutes, exact counts).
"""

from __future__ import annotations

import argparse
import json

import psycopg
import trio
import trio.testing

import trioq
from trioq._memory import MemoryDriver
from trioq.embedded import EmbeddedPostgres, EmbeddedSettings


def make_app(url: str | None, schema: str) -> trioq.App:
    app = trioq.App(url, schema=schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    return app


def server_statements(url: str | None, reset: bool = False) -> int:
    """Statements the server ran since the last reset (none counted on the memory driver)."""
    if url is None:
        return 0
    with psycopg.connect(url, autocommit=True) as conn:
        if reset:
            conn.execute("SELECT pg_stat_statements_reset()")
            return 0
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
            " WHERE query NOT ILIKE '%pg_stat_statements%'"
        ).fetchone()
        return int(row[0]) if row else 0


async def measure(app: trioq.App, queues: list[str], seconds: float, driver=None) -> dict:  # type: ignore[no-untyped-def]
    url = None if driver is not None else app.database_url
    async with app.client(migrate=True, driver=driver) as client, trio.open_nursery() as nursery:
        worker = await nursery.start(
            lambda task_status: app.run_worker(queues, 25, grace_seconds=0, task_status=task_status)
        )
        await trio.sleep(2.0)  # start-up rounds
        await trio.to_thread.run_sync(server_statements, url, True)
        before = dict(client.driver.statistics().calls)
        await trio.sleep(seconds)
        after = dict(client.driver.statistics().calls)
        server = await trio.to_thread.run_sync(server_statements, url)
        worker.request_drain()
    by_name = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}
    total = sum(by_name.values())
    rate = round(total / seconds, 3)
    result = {"queues": len(queues), "seconds": seconds, "per_second": rate, "by_name": by_name}
    if url is not None:
        result["server_per_second"] = round(server / seconds, 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    results = {}
    settings = EmbeddedSettings(shared_preload_libraries=("pg_stat_statements",))
    with EmbeddedPostgres(settings=settings) as cluster:
        with psycopg.connect(cluster.conninfo, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for n in (1, 4):
            queues = [f"q{i}" for i in range(n)]
            app = make_app(cluster.conninfo, f"idle{n}")
            results[f"postgres_{n}_queues"] = trio.run(measure, app, queues, args.seconds)
    for n in (1, 4):
        queues = [f"q{i}" for i in range(n)]
        app = make_app(None, "virtual")
        results[f"virtual_{n}_queues"] = trio.run(
            measure,
            app,
            queues,
            600.0,
            MemoryDriver(),
            clock=trio.testing.MockClock(autojump_threshold=0),
        )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
