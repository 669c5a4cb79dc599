"""Messages and readable state: (a) message latency, client.send COMMIT -> the receiving
handler resumes, with free slots; (b) a drain, 10,000 messages queued for one workflow and
received; (c) client.get_value of a running workflow.

(a) `sizes.message_waiters` workflows wait in `ctx.receive("ping")`; once all are `waiting`
(no slot held), the harness sends to them one by one, paced, taking `time.time()` right after
each send's COMMIT; each handler returns `time.time()` as it resumes. The baseline is the raw
loop's pickup latency from the pickup scenario of the same run (as for event latency).
(b) one workflow waits for "go"; the harness queues `sizes.drain_messages` messages of "items"
in one statement (`SELECT send(...) FROM generate_series`), then sends "go"; the handler
receives until it has them all (1,000 per receive, the default limit) and returns the seconds
that took, measured in the handler (so the rate is the drain, not the queueing).
(c) a workflow publishes a value and keeps running; the harness times `sizes.value_reads`
sequential `client.get_value` calls from one client (its pool warm).
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


def waiting_sql(schema: str, task: str) -> str:
    return f"SELECT count(*) FROM {schema}.jobs WHERE state = 'waiting' AND task = '{task}'"


async def send_paced(app: trioq.App, ids: list[int], every: float) -> dict[int, float]:
    sent: dict[int, float] = {}
    async with app.client() as client:
        start = trio.current_time()
        for tick, job_id in enumerate(ids):
            await trio.sleep_until(start + tick * every)
            await client.send(job_id, "ping", tick)
            sent[job_id] = time.time()
    return sent


async def enqueue(app: trioq.App, task: str, payloads: list[object]) -> list[int]:
    async with app.client() as client:
        return [job.id for job in await client.enqueue_many(task, payloads)]


def message_latency_once(ctx: Context) -> list[float]:
    db, sizes = ctx.db, ctx.sizes
    schema = db.fresh_schema()
    try:
        worker = ctx.launcher.trioq_worker(schema, concurrency=sizes.concurrency)
        app = make_app(schema, db.conninfo(HARNESS_ROLE))
        ids = trio.run(enqueue, app, "message_waiter", [None] * sizes.message_waiters)
        wait = waiting_sql(schema, "message_waiter")
        db.wait_count(wait, [], len(ids), sizes.timeout, worker.check_alive)
        time.sleep(SETTLE_SECONDS)
        db.reset_statements()
        sent = trio.run(send_paced, app, ids, sizes.pickup_every)
        db.wait_count(completed_sql(schema), [], len(ids), sizes.timeout, worker.check_alive)
        ctx.results.note("message_latency", "statements", db.top_statements([worker.role]))
        rows = db.fetch(f"SELECT id, result::float8 FROM {schema}.jobs")
        worker.stop()
    finally:
        db.drop_schema(schema)
    return [(resumed - sent[job_id]) * 1000 for job_id, resumed in rows]


def run_message_latency(ctx: Context) -> None:
    for repeat in range(ctx.sizes.repeats):
        latencies = message_latency_once(ctx)
        for pct in (50, 95, 99):
            ctx.results.add("message_latency", f"p{pct}_ms", percentile(latencies, pct))
        ctx.log(
            f"message latency repeat {repeat + 1}: {len(latencies)} receives, p50 "
            f"{percentile(latencies, 50):.2f} ms, p95 {percentile(latencies, 95):.2f} ms"
        )


def message_drain_once(ctx: Context) -> float:
    """Messages per second received by one workflow."""
    db, sizes = ctx.db, ctx.sizes
    schema = db.fresh_schema()
    count = sizes.drain_messages
    try:
        worker = ctx.launcher.trioq_worker(schema, concurrency=sizes.concurrency)
        app = make_app(schema, db.conninfo(HARNESS_ROLE))
        [job_id] = trio.run(enqueue, app, "message_drainer", [{"messages": count}])
        db.wait_count(waiting_sql(schema, "message_drainer"), [], 1, sizes.timeout)
        db.fetch(
            f"SELECT count({schema}.send(%s, 'items', to_jsonb(n))) "
            "FROM generate_series(1, %s) AS n",
            [job_id, count],
        )
        db.reset_statements()
        db.fetch(f"SELECT {schema}.send(%s, 'go', 'null')", [job_id])
        db.wait_count(completed_sql(schema), [], 1, sizes.timeout, worker.check_alive)
        ctx.results.note("message_drain", "statements", db.top_statements([worker.role]))
        seconds = float(db.scalar(f"SELECT result::float8 FROM {schema}.jobs"))
        worker.stop()
    finally:
        db.drop_schema(schema)
    return count / seconds


def run_message_drain(ctx: Context) -> None:
    for repeat in range(ctx.sizes.repeats):
        rate = message_drain_once(ctx)
        ctx.results.add("message_drain", "messages_per_s", rate)
        ctx.log(
            f"message drain repeat {repeat + 1}: {ctx.sizes.drain_messages} messages, "
            f"{rate:,.0f} messages/s"
        )


async def read_values(app: trioq.App, job_id: int, reads: int) -> list[float]:
    timings = []
    async with app.client() as client:
        await client.get_value(job_id, "progress", wait=60)  # published, pool warm
        for _ in range(reads):
            start = time.perf_counter()
            await client.get_value(job_id, "progress")
            timings.append((time.perf_counter() - start) * 1000)
        if (await client.get_job(job_id)).state != "running":
            raise RuntimeError("the value holder stopped running during the reads")
        await client.cancel(job_id)  # ends the handler now, not at the worker's stop
    return timings


def get_value_once(ctx: Context) -> list[float]:
    db, sizes = ctx.db, ctx.sizes
    schema = db.fresh_schema()
    try:
        worker = ctx.launcher.trioq_worker(schema, concurrency=sizes.concurrency)
        app = make_app(schema, db.conninfo(HARNESS_ROLE))
        [job_id] = trio.run(enqueue, app, "value_holder", [{"seconds": 600.0}])
        timings = trio.run(read_values, app, job_id, sizes.value_reads)
        worker.stop()
    finally:
        db.drop_schema(schema)
    return timings


def run_get_value(ctx: Context) -> None:
    for repeat in range(ctx.sizes.repeats):
        timings = get_value_once(ctx)
        for pct in (50, 95):
            ctx.results.add("get_value", f"p{pct}_ms", percentile(timings, pct))
        ctx.log(
            f"get_value repeat {repeat + 1}: {len(timings)} reads, p50 "
            f"{percentile(timings, 50):.2f} ms, p95 {percentile(timings, 95):.2f} ms"
        )
