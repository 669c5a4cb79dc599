"""(5) database load of idle workers: statements per second with 25 slots on one queue, and on
four queues. Both workers run side by side (nothing to claim, so they do not interfere); each
connects as its own role, which is how pg_stat_statements tells their statements apart."""

from __future__ import annotations

import time

from bench.scenarios import Context

WARM_UP_SECONDS = 2.0  # start-up statements (register, LISTEN, first claim) are not idle load
SHAPES = {"one_queue": ("default",), "four_queues": ("q1", "q2", "q3", "q4")}


def run(ctx: Context) -> None:
    db, sizes = ctx.db, ctx.sizes
    for repeat in range(sizes.repeats):
        schemas = {shape: db.fresh_schema() for shape in SHAPES}
        try:
            workers = {
                shape: ctx.launcher.trioq_worker(
                    schemas[shape], concurrency=sizes.concurrency, queues=queues, poll_interval=1.0
                )
                for shape, queues in SHAPES.items()
            }
            schemas["raw"], schemas["pgqueuer"] = db.fresh_schema(), db.fresh_schema()
            workers["raw"] = ctx.launcher.baseline_worker(
                schemas["raw"], expect=1, batch=sizes.concurrency, listen=True
            )
            workers["pgqueuer"] = ctx.launcher.pgq_worker(
                schemas["pgqueuer"], batch=sizes.concurrency
            )
            time.sleep(WARM_UP_SECONDS)
            db.reset_statements()
            time.sleep(sizes.idle_seconds)
            rates = {
                shape: db.statement_calls([worker.role]) / sizes.idle_seconds
                for shape, worker in workers.items()
            }
            ctx.results.note(
                "database_load",
                "idle_one_queue_statements",
                db.top_statements([workers["one_queue"].role]),
            )
            for worker in workers.values():
                worker.stop()
        finally:
            for schema in schemas.values():
                db.drop_schema(schema)
        for shape in SHAPES:
            ctx.results.add("database_load", f"idle_{shape}_statements_per_s", rates[shape])
        ctx.results.add("baseline", "idle_statements_per_s", rates["raw"])
        ctx.results.add("peer", "idle_statements_per_s", rates["pgqueuer"])
        ctx.log(
            f"idle repeat {repeat + 1}: one queue {rates['one_queue']:.2f}/s, "
            f"four queues {rates['four_queues']:.2f}/s (raw {rates['raw']:.2f}/s, "
            f"pgqueuer {rates['pgqueuer']:.2f}/s)"
        )
