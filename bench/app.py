"""The benchmark's trioq App, loaded by the worker processes as `bench.app:app`.

The schema comes from $TRIOQ_BENCH_SCHEMA (each scenario run uses a fresh one). Timing handlers
return `time.time()` readings as their result: the harness compares them with its own
`time.time()` taken after the enqueue committed, so latencies use ONE clock (this machine's wall
clock) on both ends.
"""

from __future__ import annotations

import datetime
import os
import time

import trio

import trioq

SCHEMA_ENV = "TRIOQ_BENCH_SCHEMA"


def make_app(schema: str, database_url: str | None = None) -> trioq.App:
    app = trioq.App(database_url, schema=schema)

    @app.task("noop", max_attempts=1)
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    @app.task("noop_unkept", max_attempts=1, keep=False)
    async def noop_unkept(ctx: trioq.Context, payload: object) -> None:
        return None

    @app.task("sleep_1ms", max_attempts=1)
    async def sleep_1ms(ctx: trioq.Context, payload: object) -> None:
        await trio.sleep(0.001)

    @app.task("sleep_100ms", max_attempts=1)
    async def sleep_100ms(ctx: trioq.Context, payload: object) -> dict[str, float]:
        start = time.time()
        await trio.sleep(0.1)
        return {"start": start, "end": time.time()}

    @app.task("three_steps", max_attempts=1)
    async def three_steps(ctx: trioq.Context, payload: object) -> None:
        for name in ("one", "two", "three"):
            await ctx.step(name, _nothing)

    @app.task("sleep_1s", max_attempts=1)
    async def sleep_1s(ctx: trioq.Context, payload: object) -> dict[str, float]:
        await ctx.sleep("nap", datetime.timedelta(seconds=1))
        return {"resumed": time.time()}

    @app.task("probe", max_attempts=1)
    async def probe(ctx: trioq.Context, payload: object) -> float:
        return time.time()

    @app.task("event_waiter", max_attempts=1)
    async def event_waiter(ctx: trioq.Context, payload: dict[str, str]) -> float:
        await ctx.wait_for_event(payload["key"], timeout=datetime.timedelta(hours=1))
        return time.time()

    @app.task("fanout_child", max_attempts=1)
    async def fanout_child(ctx: trioq.Context, payload: object) -> None:
        return None

    @app.task("fanout_parent", max_attempts=1)
    async def fanout_parent(ctx: trioq.Context, payload: dict[str, int]) -> int:
        ids = [await ctx.spawn("fanout_child", None) for _ in range(payload["children"])]
        return len(await ctx.gather(*ids))

    @app.task("message_waiter", max_attempts=1)
    async def message_waiter(ctx: trioq.Context, payload: object) -> float:
        await ctx.receive("ping", timeout=datetime.timedelta(hours=1))
        return time.time()

    @app.task("message_drainer", max_attempts=1)
    async def message_drainer(ctx: trioq.Context, payload: dict[str, int]) -> float:
        """Wait for "go", then receive `messages` messages of "items"; returns the seconds
        the draining took (from the first receive of "items" to the last)."""
        await ctx.receive("go", timeout=datetime.timedelta(hours=1))
        start, got = time.time(), 0
        while got < payload["messages"]:
            got += len(await ctx.receive("items", timeout=datetime.timedelta(hours=1)))
        return time.time() - start

    @app.task("value_holder", max_attempts=1)
    async def value_holder(ctx: trioq.Context, payload: dict[str, float]) -> None:
        """Publish a value, then keep running (a handler busy for `seconds`)."""
        await ctx.set_value("progress", {"stage": "working", "done": 41})
        await ctx.step("publish", _nothing)
        await trio.sleep(payload["seconds"])

    return app


def _nothing() -> None:
    return None


app = make_app(os.environ.get(SCHEMA_ENV, "bench"))
