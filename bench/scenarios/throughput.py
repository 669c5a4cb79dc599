"""(1) throughput, (5) statements per job, (6) worker cost and (8) the raw baseline.

Workers start first and sit idle on an empty queue; the backlog is then enqueued in ONE
transaction, so it appears at once at COMMIT (t0). Elapsed time is t0 -> the last job's
`finished_at` (the database's `now()`; same machine, same clock). CPU is the worker processes'
user + system time between t0 and the moment the harness sees the last completion, so process
start-up is not counted. pg_stat_statements is reset just before COMMIT and read per worker role:
statement counts and their server-side execution time (which shows whether the claim gets
dearer as the backlog deepens).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from bench.harness import Process
from bench.jobs import PGQUEUER, RAW, TRIOQ, System
from bench.scenarios import Context

StartWorkers = Callable[[str], list[Process]]


@attrs.frozen
class Drain:
    jobs: int
    seconds: float
    statements: int
    db_ms: float  # server-side execution time of the workers' statements
    cpu_seconds: float
    peak_rss_mb: float
    top_statements: list[dict[str, Any]]
    # CPU of the whole PostgreSQL cluster (all its processes, less the harness's session) from
    # just after the backlog's COMMIT to the last completion (Database.server_cpu_seconds).
    server_cpu_seconds: float = 0.0

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds

    @property
    def statements_per_job(self) -> float:
        return self.statements / self.jobs

    @property
    def db_us_per_job(self) -> float:
        return self.db_ms * 1000 / self.jobs

    @property
    def server_us_per_job(self) -> float:
        return self.server_cpu_seconds / self.jobs * 1e6

    @property
    def cpu_s_per_10k(self) -> float:
        return self.cpu_seconds / self.jobs * 10_000


def drain(
    ctx: Context,
    start_workers: StartWorkers,
    task: str,
    jobs: int,
    system: System = TRIOQ,
    prepare: Callable[[str], None] | None = None,
    observe: Callable[[str], contextlib.AbstractContextManager[None]] | None = None,
    before_stop: Callable[[str], None] | None = None,
) -> Drain:
    """Run one backlog of `jobs` jobs of `task` to completion on freshly started workers
    (`prepare(schema)` first fills the fresh schema with whatever else the scenario needs;
    `observe(schema)` is entered around the drain; `before_stop(schema)` runs once it is
    done, with the workers still up)."""
    db = ctx.db
    schema = db.fresh_schema()
    try:
        if prepare is not None:
            prepare(schema)
        workers = start_workers(schema)
        cpu_before = sum(worker.cpu_seconds() for worker in workers)

        def all_alive() -> None:
            for worker in workers:
                worker.check_alive()

        with contextlib.nullcontext() if observe is None else observe(schema):
            t0 = system.enqueue(db, schema, task, jobs, db.reset_statements)
            db.wait_harness_sessions_gone()  # the enqueue's own session is not the drain's
            server_before = db.server_cpu_seconds()
            db.wait_count(
                system.completed(schema), [], jobs, ctx.sizes.timeout, all_alive, paced=True
            )
            server_cpu = db.server_cpu_seconds() - server_before
        if before_stop is not None:
            before_stop(schema)
        cpu_after = sum(worker.cpu_seconds() for worker in workers)
        roles = [worker.role for worker in workers]
        statements, db_ms = db.statement_totals(roles)
        top = db.top_statements(roles)
        peak_rss = max(worker.peak_rss_mb() for worker in workers)
        last = db.scalar(system.last_finished(schema))
        for worker in workers:
            worker.stop()
        return Drain(
            jobs, last - t0, statements, db_ms, cpu_after - cpu_before, peak_rss, top, server_cpu
        )
    finally:
        db.drop_schema(schema)


def run(ctx: Context) -> None:
    sizes, launcher, results = ctx.sizes, ctx.launcher, ctx.results
    n = sizes.throughput_jobs

    def trioq_workers(count: int) -> StartWorkers:
        return lambda schema: [
            launcher.trioq_worker(schema, concurrency=sizes.concurrency) for _ in range(count)
        ]

    def baseline(schema: str) -> list[Process]:
        return [launcher.baseline_worker(schema, expect=n, batch=sizes.concurrency)]

    def pgqueuer(schema: str) -> list[Process]:
        return [launcher.pgq_worker(schema, batch=sizes.concurrency)]

    for repeat in range(sizes.repeats):
        base = drain(ctx, baseline, "noop", n, RAW)
        peer = drain(ctx, pgqueuer, "noop", n, PGQUEUER)
        one = drain(ctx, trioq_workers(1), "noop", n)
        two = drain(ctx, trioq_workers(2), "noop", n)
        slow = drain(ctx, trioq_workers(1), "sleep_1ms", n)
        shallow, deep = (drain(ctx, trioq_workers(1), "noop", depth) for depth in sizes.depths)
        record_baseline(ctx, base)
        record_peer(ctx, peer)
        results.add("throughput", "one_worker_jobs_per_s", one.jobs_per_s)
        results.add("throughput", "two_workers_jobs_per_s", two.jobs_per_s)
        results.add("throughput", "two_vs_one_worker", two.jobs_per_s / one.jobs_per_s)
        results.add("throughput", "sleep_1ms_jobs_per_s", slow.jobs_per_s)
        results.add("throughput", "shallow_backlog_jobs_per_s", shallow.jobs_per_s)
        results.add("throughput", "deep_backlog_jobs_per_s", deep.jobs_per_s)
        results.add(
            "throughput", "deep_vs_shallow_cost_per_job", shallow.jobs_per_s / deep.jobs_per_s
        )
        results.add("database_load", "statements_per_job", one.statements_per_job)
        results.add("database_load", "statements_per_job_two_workers", two.statements_per_job)
        results.add("database_load", "db_us_per_job", one.db_us_per_job)
        results.add("database_load", "server_cpu_us_per_job", one.server_us_per_job)
        results.add("database_load", "db_us_per_job_shallow_backlog", shallow.db_us_per_job)
        results.add("database_load", "db_us_per_job_deep_backlog", deep.db_us_per_job)
        for name, run_ in (
            ("one_worker", one),
            ("shallow_backlog", shallow),
            ("deep_backlog", deep),
        ):
            results.note("throughput", f"{name}_statements", run_.top_statements)
        results.add("worker_cost", "cpu_s_per_10k_jobs", one.cpu_s_per_10k)
        results.add("worker_cost", "peak_rss_mb", one.peak_rss_mb)
        if repeat == 0:
            results.note("worker_cost", "profile_one_worker_noop", profile_worker(ctx))
        ctx.log(
            f"throughput repeat {repeat + 1}: raw {base.jobs_per_s:.0f}/s, "
            f"pgqueuer {peer.jobs_per_s:.0f}/s, "
            f"1 worker {one.jobs_per_s:.0f}/s, 2 workers {two.jobs_per_s:.0f}/s, "
            f"1 ms {slow.jobs_per_s:.0f}/s, depth {sizes.depths[0]} "
            f"{shallow.jobs_per_s:.0f}/s, depth {sizes.depths[1]} {deep.jobs_per_s:.0f}/s"
        )


def record_baseline(ctx: Context, base: Drain) -> None:
    ctx.results.add("baseline", "jobs_per_s", base.jobs_per_s)
    ctx.results.add("baseline", "statements_per_job", base.statements_per_job)
    ctx.results.add("baseline", "db_us_per_job", base.db_us_per_job)
    ctx.results.add("baseline", "server_cpu_us_per_job", base.server_us_per_job)
    ctx.results.add("baseline", "cpu_s_per_10k_jobs", base.cpu_s_per_10k)
    ctx.results.add("baseline", "peak_rss_mb", base.peak_rss_mb)


PROFILE_TOP = 20


def profile_worker(ctx: Context) -> list[dict[str, Any]]:
    """One extra 1-worker noop drain under cProfile (not timed): where the worker's CPU goes,
    as the top functions by own time. Threads (the libpq calls) are not in it."""
    import pstats

    path = ctx.launcher.log_dir / "worker.prof"
    sizes = ctx.sizes
    drain(
        ctx,
        lambda schema: [
            ctx.launcher.trioq_worker(schema, concurrency=sizes.concurrency, profile=path)
        ],
        "noop",
        sizes.throughput_jobs,
    )
    stats = pstats.Stats(str(path))
    total = stats.total_tt  # type: ignore[attr-defined]
    # Idle waiting (epoll) is not CPU; start-up (imports) is in, but small next to 20,000 jobs.
    rows = sorted(
        (item for item in stats.stats.items() if "epoll" not in item[0][2]),  # type: ignore[attr-defined]
        key=lambda item: item[1][2],
        reverse=True,
    )
    return [
        {
            "function": f"{Path(file).name}:{line} {name}",
            "own_s": round(own, 3),
            "own_share": round(own / total, 3) if total else 0.0,
            "cumulative_s": round(cumulative, 3),
            "calls": calls,
        }
        for (file, line, name), (_, calls, own, cumulative, _) in rows[:PROFILE_TOP]
    ]


def record_peer(ctx: Context, peer: Drain) -> None:
    ctx.results.add("peer", "jobs_per_s", peer.jobs_per_s)
    ctx.results.add("peer", "statements_per_job", peer.statements_per_job)
    ctx.results.add("peer", "db_us_per_job", peer.db_us_per_job)
    ctx.results.add("peer", "server_cpu_us_per_job", peer.server_us_per_job)
    ctx.results.add("peer", "cpu_s_per_10k_jobs", peer.cpu_s_per_10k)
    ctx.results.add("peer", "peak_rss_mb", peer.peak_rss_mb)
