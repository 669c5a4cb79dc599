"""(2) enqueue: sequential single enqueues per second from one process, and bulk rows per second
(one `enqueue_many` statement), each next to the raw asyncpg insert on its own minimal table and
PgQueuer's enqueue, in the same schema and run."""

from __future__ import annotations

import asyncio
import time

import trio

import trioq
from bench import baseline
from bench.app import make_app
from bench.harness import HARNESS_ROLE
from bench.scenarios import Context


async def trioq_singles(app: trioq.App, seconds: float) -> float:
    """`client.enqueue` one after the other for `seconds`; returns enqueues per second."""
    async with app.client() as client:
        count, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            await client.enqueue("noop", {})
            count += 1
    return count / elapsed


async def trioq_bulk(app: trioq.App, rows: int) -> float:
    """One `client.enqueue_many` of `rows` jobs (payload encoding included); rows per second."""
    payloads = [{}] * rows
    async with app.client() as client:
        await client.enqueue("noop", {})  # the pool's first connection is open before timing
        start = time.perf_counter()
        await client.enqueue_many("noop", payloads)
        return rows / (time.perf_counter() - start)


def run(ctx: Context) -> None:
    db, sizes, results = ctx.db, ctx.sizes, ctx.results
    for repeat in range(sizes.repeats):
        schema = db.fresh_schema()
        try:
            app = make_app(schema, db.conninfo(HARNESS_ROLE))
            dsn = db.asyncpg_dsn(HARNESS_ROLE)
            db.install_raw(schema)
            db.pgq(schema, "install")
            singles = trio.run(trioq_singles, app, sizes.enqueue_seconds)
            raw_singles = asyncio.run(baseline.enqueue_singles(dsn, schema, sizes.enqueue_seconds))
            pgq_singles = db.pgq(schema, "enqueue-singles", "--seconds", str(sizes.enqueue_seconds))
            bulk = trio.run(trioq_bulk, app, sizes.bulk_rows)
            raw_bulk = asyncio.run(baseline.enqueue_bulk(dsn, schema, sizes.bulk_rows))
            pgq_bulk = db.pgq(schema, "enqueue-bulk", "--count", str(sizes.bulk_rows))
        finally:
            db.drop_schema(schema)
        results.add("enqueue", "single_per_s", singles)
        results.add("enqueue", "bulk_rows_per_s", bulk)
        results.add("baseline", "enqueue_single_per_s", raw_singles)
        results.add("baseline", "enqueue_bulk_rows_per_s", raw_bulk)
        results.add("peer", "enqueue_single_per_s", pgq_singles)
        results.add("peer", "enqueue_bulk_rows_per_s", pgq_bulk)
        ctx.log(
            f"enqueue repeat {repeat + 1}: single {singles:.0f}/s (raw {raw_singles:.0f}/s, "
            f"pgqueuer {pgq_singles:.0f}/s), bulk {bulk:.0f} rows/s (raw {raw_bulk:.0f} rows/s, "
            f"pgqueuer {pgq_bulk:.0f} rows/s)"
        )
