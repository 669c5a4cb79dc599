"""Durable waits: (a) event latency, emit_event COMMIT -> the waiting handler resumes, with free
slots; (b) fan-out, parents that each spawn children and gather them.

(a) `sizes.event_waiters` workflows wait for their own key; once all are `waiting` (no slot
held), the harness emits the keys one by one, paced, taking `time.time()` right after each
emit's COMMIT; each handler returns `time.time()` as it resumes past the wait. The baseline is
the raw loop's pickup latency (its LISTEN on an insert) from the pickup scenario of the same run.
(b) `sizes.fanout_parents` parents, each spawning `sizes.fanout_children` noop children and
gathering them, committed at once; elapsed is COMMIT -> the last parent's finished_at. The
baseline is the raw loop's drain rate (throughput scenario) over the same number of jobs
(parents + children).
"""

from __future__ import annotations

import time

import trio

import trioq
from bench.app import make_app
from bench.harness import HARNESS_ROLE
from bench.jobs import completed_sql
from bench.scenarios import Context
from bench.stats import percentile

SETTLE_SECONDS = 0.5


def waiting_sql(schema: str) -> str:
    return f"SELECT count(*) FROM {schema}.jobs WHERE state = 'waiting'"


async def emit_paced(app: trioq.App, keys: list[str], every: float) -> dict[str, float]:
    emitted: dict[str, float] = {}
    async with app.client() as client:
        start = trio.current_time()
        for tick, key in enumerate(keys):
            await trio.sleep_until(start + tick * every)
            await client.emit_event(key, {"tick": tick})
            emitted[key] = time.time()
    return emitted


async def enqueue_waiters(app: trioq.App, keys: list[str]) -> None:
    async with app.client() as client:
        await client.enqueue_many("event_waiter", [{"key": key} for key in keys])


def event_latency_once(ctx: Context) -> list[float]:
    db, sizes = ctx.db, ctx.sizes
    schema = db.fresh_schema()
    keys = [f"bench:{n}" for n in range(sizes.event_waiters)]
    try:
        worker = ctx.launcher.trioq_worker(schema, concurrency=sizes.concurrency)
        app = make_app(schema, db.conninfo(HARNESS_ROLE))
        trio.run(enqueue_waiters, app, keys)
        db.wait_count(waiting_sql(schema), [], len(keys), sizes.timeout, worker.check_alive)
        time.sleep(SETTLE_SECONDS)
        db.reset_statements()
        emitted = trio.run(emit_paced, app, keys, sizes.pickup_every)
        db.wait_count(completed_sql(schema), [], len(keys), sizes.timeout, worker.check_alive)
        ctx.results.note("event_latency", "statements", db.top_statements([worker.role]))
        rows = db.fetch(f"SELECT payload->>'key', result::float8 FROM {schema}.jobs")
        worker.stop()
    finally:
        db.drop_schema(schema)
    return [(resumed - emitted[key]) * 1000 for key, resumed in rows]


def run_event_latency(ctx: Context) -> None:
    for repeat in range(ctx.sizes.repeats):
        latencies = event_latency_once(ctx)
        for pct in (50, 95, 99):
            ctx.results.add("event_latency", f"p{pct}_ms", percentile(latencies, pct))
        ctx.log(
            f"event latency repeat {repeat + 1}: {len(latencies)} waits, p50 "
            f"{percentile(latencies, 50):.2f} ms, p95 {percentile(latencies, 95):.2f} ms"
        )


def fanout_once(ctx: Context) -> float:
    """Seconds from COMMIT of the parents to the last parent's completion."""
    db, sizes = ctx.db, ctx.sizes
    schema = db.fresh_schema()
    parents = sizes.fanout_parents
    try:
        worker = ctx.launcher.trioq_worker(schema, concurrency=sizes.concurrency)
        time.sleep(SETTLE_SECONDS)
        app = make_app(schema, db.conninfo(HARNESS_ROLE))

        async def enqueue() -> float:
            async with app.client() as client:
                await client.enqueue_many(
                    "fanout_parent", [{"children": sizes.fanout_children}] * parents
                )
                return time.time()

        db.reset_statements()
        t0 = trio.run(enqueue)
        done = completed_sql(schema, "task = 'fanout_parent'")
        db.wait_count(done, [], parents, sizes.timeout, worker.check_alive)
        ctx.results.note("fanout", "statements", db.top_statements([worker.role]))
        last = db.scalar(
            f"SELECT extract(epoch FROM max(finished_at))::float8 FROM {schema}.jobs "
            "WHERE task = 'fanout_parent'"
        )
        worker.stop()
    finally:
        db.drop_schema(schema)
    return float(last) - t0


def run_fanout(ctx: Context) -> None:
    sizes = ctx.sizes
    for repeat in range(sizes.repeats):
        seconds = fanout_once(ctx)
        parents = sizes.fanout_parents
        ctx.results.add("fanout", "parents_per_s", parents / seconds)
        ctx.results.add("fanout", "jobs_per_s", parents * (sizes.fanout_children + 1) / seconds)
        ctx.log(
            f"fan-out repeat {repeat + 1}: {parents} parents x {sizes.fanout_children} "
            f"children in {seconds:.2f} s ({parents / seconds:.1f} parents/s)"
        )
