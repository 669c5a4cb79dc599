"""Durable workflows: 3-step workflows (throughput, statements per step), durable sleep resume
latency, and the suspended-load drain (due work is not in the claim's path).

- `three_steps`: a backlog of workflows of 3 no-op steps drained by one worker (the throughput
  scenario's drain: t0 = COMMIT of the backlog, end = the last `finished_at`); statements per
  step = the worker's statements / (3 x workflows).
- sleep resume: workflows that sleep 1 s; each records `time.time()` when it resumes, and the
  harness subtracts the wake time stored in its sleep checkpoint (database time; one machine,
  one clock), with free slots.
- suspended load: the same no-op drain with 100,000 sleeping workflows and 50,000 jobs delayed
  by an hour at a better priority already in the table, against the drain of an empty table in
  the same repeat (ratio loaded / empty).
"""

from __future__ import annotations

import statistics

from bench.harness import Process
from bench.scenarios import Context
from bench.scenarios.throughput import drain

FILL_SQL = """
INSERT INTO {schema}.job_rows (queue, task, payload, phase, priority, run_at, created_at,
                           checkpoint_count)
SELECT 'default', 'noop', '{{}}', 'sleeping', 0, now() + interval '1 day', now(), 1
FROM generate_series(1, %s);
INSERT INTO {schema}.job_rows (queue, task, payload, phase, priority, run_at, created_at)
SELECT 'default', 'noop', '{{}}', 'scheduled', -1, now() + interval '1 hour', now()
FROM generate_series(1, %s);
ANALYZE {schema}.job_rows;
"""

RESUME_SQL = """
SELECT (j.result ->> 'resumed')::float8 - extract(epoch FROM (c.value ->> 'wake_at')::timestamptz)
FROM {schema}.jobs j JOIN {schema}.checkpoints c ON c.job_id = j.id AND c.kind = 'sleep'
WHERE j.state = 'completed'
"""


def run(ctx: Context) -> None:
    sizes, launcher, results = ctx.sizes, ctx.launcher, ctx.results

    def one_worker(schema: str) -> list[Process]:
        return [launcher.trioq_worker(schema, concurrency=sizes.concurrency)]

    for repeat in range(sizes.repeats):
        n = sizes.workflow_jobs
        flows = drain(ctx, one_worker, "three_steps", n)
        results.add("workflows", "three_step_workflows_per_s", flows.jobs_per_s)
        results.add("workflows", "statements_per_step", flows.statements / (3 * n))
        results.note("workflows", "three_steps_statements", flows.top_statements)

        latencies = sleep_resume_latencies(ctx)
        quantiles = statistics.quantiles(latencies, n=100, method="inclusive")
        results.add("workflows", "sleep_resume_p50_ms", quantiles[49] * 1000)
        results.add("workflows", "sleep_resume_p95_ms", quantiles[94] * 1000)

        empty = drain(ctx, one_worker, "noop", sizes.suspended_drain_jobs)
        loaded = drain(
            ctx,
            one_worker,
            "noop",
            sizes.suspended_drain_jobs,
            prepare=lambda schema: fill(ctx, schema),
        )
        results.add("workflows", "suspended_load_jobs_per_s", loaded.jobs_per_s)
        results.add("workflows", "empty_table_jobs_per_s", empty.jobs_per_s)
        results.add("workflows", "suspended_vs_empty", loaded.jobs_per_s / empty.jobs_per_s)
        results.add(
            "workflows", "suspended_vs_empty_db_cost", empty.db_us_per_job / loaded.db_us_per_job
        )
        ctx.log(
            f"workflows repeat {repeat + 1}: 3-step {flows.jobs_per_s:.0f}/s "
            f"({flows.statements / (3 * n):.3f} stmt/step), sleep resume p95 "
            f"{quantiles[94] * 1000:.1f} ms, suspended load {loaded.jobs_per_s:.0f}/s vs empty "
            f"{empty.jobs_per_s:.0f}/s"
        )


def fill(ctx: Context, schema: str) -> None:
    sizes = ctx.sizes
    for statement in FILL_SQL.format(schema=schema).split(";"):
        if statement.strip():
            count = (
                sizes.suspended_sleeping if "'sleeping'" in statement else sizes.suspended_delayed
            )
            params = [count] if "%s" in statement else None
            ctx.db.conn.execute(statement, params)


def sleep_resume_latencies(ctx: Context) -> list[float]:
    sizes, db = ctx.sizes, ctx.db
    schema = db.fresh_schema()
    try:
        concurrency = max(sizes.concurrency, sizes.sleep_workflows)  # a free slot for each
        worker = ctx.launcher.trioq_worker(schema, concurrency=concurrency)
        from bench.jobs import JobGroup, enqueue_committed

        n = sizes.sleep_workflows
        enqueue_committed(db, schema, [JobGroup("sleep_1s", n)])
        db.wait_count(
            f"SELECT count(*) FROM {schema}.jobs WHERE state = 'completed'",
            [],
            n,
            sizes.timeout,
            worker.check_alive,
        )
        worker.stop()
        return [row[0] for row in db.fetch(RESUME_SQL.format(schema=schema))]
    finally:
        db.drop_schema(schema)
