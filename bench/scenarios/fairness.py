"""(7) partition fairness: one key with a long backlog and many keys with a few jobs each.

Everything is enqueued in one transaction (the big key first, so its jobs lead the claim order).
A small key's job waits from COMMIT until its handler starts; the scenario ends once every small
key has drained (the big key is then still draining; how far it got is recorded).
"""

from __future__ import annotations

import time

from bench.jobs import JobGroup, completed_sql, enqueue_committed
from bench.scenarios import Context
from bench.stats import percentile

BIG_KEY = "big"
SETTLE_SECONDS = 0.5


def run(ctx: Context) -> None:
    db, sizes = ctx.db, ctx.sizes
    small_jobs = sizes.fairness_small_keys * sizes.fairness_jobs_per_small_key
    groups = [JobGroup("probe", sizes.fairness_big_key_jobs, BIG_KEY)] + [
        JobGroup("probe", sizes.fairness_jobs_per_small_key, f"small-{key}")
        for key in range(sizes.fairness_small_keys)
    ]
    small = f"partition_key <> '{BIG_KEY}'"
    for repeat in range(sizes.repeats):
        schema = db.fresh_schema()
        try:
            worker = ctx.launcher.trioq_worker(schema, concurrency=sizes.concurrency)
            time.sleep(SETTLE_SECONDS)
            t0 = enqueue_committed(db, schema, groups)
            db.wait_count(
                completed_sql(schema, small), [], small_jobs, sizes.timeout, worker.check_alive
            )
            big_done = db.scalar(completed_sql(schema, f"partition_key = '{BIG_KEY}'"))
            waits = [
                row[0] - t0
                for row in db.fetch(f"SELECT result::float8 FROM {schema}.jobs WHERE {small}")
            ]
            last_small = (
                db.scalar(
                    f"SELECT extract(epoch FROM max(finished_at))::float8 "
                    f"FROM {schema}.jobs WHERE {small}"
                )
                - t0
            )
            worker.stop()
        finally:
            db.drop_schema(schema)
        results = ctx.results
        results.add("partition_fairness", "small_key_wait_p50_s", percentile(waits, 50))
        results.add("partition_fairness", "small_key_wait_p95_s", percentile(waits, 95))
        results.add("partition_fairness", "small_keys_drained_s", last_small)
        results.add("partition_fairness", "big_key_jobs_done_meanwhile", big_done)
        ctx.log(
            f"fairness repeat {repeat + 1}: small keys wait p95 "
            f"{percentile(waits, 95):.3f} s, all drained after {last_small:.3f} s "
            f"(big key: {big_done} done meanwhile)"
        )
