"""(3) pickup latency of an idle worker and (4) refill latency of a saturated one.

One clock: this machine's wall clock. The harness takes `time.time()` right after an enqueue's
COMMIT returned; the handlers (`probe`, `sleep_100ms` in bench/app.py) return `time.time()`
readings taken as they start and settle, stored as the job's result.
The baselines are the raw asyncpg loop waiting on the same ready notification (LISTEN); for
refill it runs batch-synchronously (claim 5, run them, complete 5), as the raw loop always does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import attrs
import trio

import trioq
from bench import baseline, pgq
from bench.app import make_app
from bench.harness import HARNESS_ROLE, Process
from bench.jobs import RAW, TRIOQ, System, completed_sql
from bench.scenarios import Context
from bench.stats import percentile

SETTLE_SECONDS = 0.5  # after start-up, before the idle worker is measured


async def enqueue_paced(app: trioq.App, seconds: float, every: float) -> dict[int, float]:
    """One `probe` enqueue every `every` seconds for `seconds`; job id -> commit time."""
    committed: dict[int, float] = {}
    async with app.client() as client:
        start = trio.current_time()
        for tick in range(round(seconds / every)):
            await trio.sleep_until(start + tick * every)
            called = time.time()  # the enqueue call is part of the pickup latency
            job = await client.enqueue("probe", {})
            committed[job.id] = called
    return committed


PickupRows = list[tuple[int, float, float]]  # job id, handler start, claim statement start


def pickup_once(
    ctx: Context, start_worker: Callable[[str], Process], label: str
) -> tuple[dict[int, float], PickupRows]:
    """Paced single enqueues to an idle worker; returns commit times and the jobs' timings.
    The worker's statements (with their server time) are noted under `label`."""
    db, sizes = ctx.db, ctx.sizes
    schema = db.fresh_schema()
    try:
        worker = start_worker(schema)
        time.sleep(SETTLE_SECONDS)
        app = make_app(schema, db.conninfo(HARNESS_ROLE))
        db.reset_statements()
        committed = trio.run(enqueue_paced, app, sizes.pickup_seconds, sizes.pickup_every)
        db.wait_count(completed_sql(schema), [], len(committed), sizes.timeout, worker.check_alive)
        ctx.results.note("pickup_latency", f"{label}_statements", db.top_statements([worker.role]))
        rows = db.fetch(
            f"SELECT id, result::float8, extract(epoch FROM started_at)::float8 FROM {schema}.jobs"
        )
        worker.stop()
        return committed, rows
    finally:
        db.drop_schema(schema)


def raw_pickup_once(ctx: Context) -> list[float]:
    """The raw loop (LISTEN on its own notification) on its own table: commit -> start, ms."""
    db, sizes = ctx.db, ctx.sizes
    expected = round(sizes.pickup_seconds / sizes.pickup_every)
    schema = db.fresh_schema()
    try:
        worker = ctx.launcher.baseline_worker(
            schema, expect=expected, batch=sizes.concurrency, listen=True
        )
        time.sleep(SETTLE_SECONDS)
        dsn = db.asyncpg_dsn(HARNESS_ROLE)
        committed = asyncio.run(
            baseline.enqueue_paced(dsn, schema, sizes.pickup_seconds, sizes.pickup_every)
        )
        completed = baseline.COMPLETED_SQL.format(schema=schema)
        db.wait_count(completed, [], len(committed), sizes.timeout, worker.check_alive)
        rows = db.fetch(f"SELECT id, result::float8 FROM {schema}.raw_jobs")
        worker.stop()
    finally:
        db.drop_schema(schema)
    return [(start - committed[job_id]) * 1000 for job_id, start in rows]


def pgq_pickup_once(ctx: Context) -> list[float]:
    """PgQueuer's worker (its own LISTEN) on its own tables: commit -> handler start, ms."""
    db, sizes = ctx.db, ctx.sizes
    schema = db.fresh_schema()
    record = ctx.launcher.log_dir / f"pgq_pickup_{schema}.json"
    try:
        worker = ctx.launcher.pgq_worker(schema, batch=sizes.concurrency, record=record)
        time.sleep(SETTLE_SECONDS)
        paced = db.pgq(
            schema,
            "enqueue-paced",
            "--seconds",
            str(sizes.pickup_seconds),
            "--every",
            str(sizes.pickup_every),
        )
        committed = {int(job_id): at for job_id, at in paced.items()}
        completed = pgq.COMPLETED_SQL.format(schema=schema)
        db.wait_count(completed, [], len(committed), sizes.timeout, worker.check_alive)
        worker.stop()
        starts = json.loads(record.read_text())
    finally:
        db.drop_schema(schema)
    return [(start - committed[job_id]) * 1000 for job_id, start in starts]


def run_pickup(ctx: Context) -> None:
    sizes, launcher = ctx.sizes, ctx.launcher
    for repeat in range(sizes.repeats):
        base_latencies = raw_pickup_once(ctx)
        peer_latencies = pgq_pickup_once(ctx)
        trioq_run = pickup_once(
            ctx,
            lambda schema: launcher.trioq_worker(schema, concurrency=sizes.concurrency),
            "trioq",
        )
        for pct in (50, 95, 99):
            ctx.results.add("baseline", f"pickup_p{pct}_ms", percentile(base_latencies, pct))
            ctx.results.add("peer", f"pickup_p{pct}_ms", percentile(peer_latencies, pct))
        latencies = record_pickup(ctx, *trioq_run)
        ctx.log(
            f"pickup repeat {repeat + 1}: {len(latencies)} jobs, p50 "
            f"{percentile(latencies, 50):.2f} ms, p95 {percentile(latencies, 95):.2f} ms, "
            f"p99 {percentile(latencies, 99):.2f} ms (raw loop p95 "
            f"{percentile(base_latencies, 95):.2f} ms, pgqueuer p95 "
            f"{percentile(peer_latencies, 95):.2f} ms)"
        )


def record_pickup(ctx: Context, committed: dict[int, float], rows: PickupRows) -> list[float]:
    """Commit -> handler start, and its two halves split at the claim statement's start
    (`started_at` is the claim's `now()`): wake-up before it, execution and hand-off after."""
    latencies, to_claim, claim_to_handler = [], [], []
    for job_id, handler_start, claim_start in rows:
        latencies.append((handler_start - committed[job_id]) * 1000)
        to_claim.append((claim_start - committed[job_id]) * 1000)
        claim_to_handler.append((handler_start - claim_start) * 1000)
    add = ctx.results.add
    for pct in (50, 95, 99):
        add("pickup_latency", f"p{pct}_ms", percentile(latencies, pct))
    add("pickup_latency", "max_ms", max(latencies))
    for pct in (50, 95):
        add("pickup_latency", f"commit_to_claim_p{pct}_ms", percentile(to_claim, pct))
        add("pickup_latency", f"claim_to_handler_p{pct}_ms", percentile(claim_to_handler, pct))
    return latencies


def refill_gaps(starts: list[float], ends: list[float], slots: int) -> list[float]:
    """How long each freed slot stayed empty: the k-th settle refills with the (k+slots)-th start.

    With at most `slots` jobs running, the (k+slots)-th start cannot come before the k-th end,
    so pairing them in order gives each slot's settle -> next start gap.
    """
    starts, ends = sorted(starts), sorted(ends)
    return [starts[k + slots] - ends[k] for k in range(len(starts) - slots)]


@attrs.frozen
class Refill:
    total_s: float  # COMMIT -> last `finished_at`
    gaps_ms: list[float]  # slot settle -> next handler start
    to_claim_ms: list[float]  # slot settle -> start of the claim statement that refilled it


def refill_once(
    ctx: Context, start_worker: Callable[[str], Process], label: str, system: System = TRIOQ
) -> Refill:
    """A backlog of 100 ms jobs, committed at once, through `refill_concurrency` slots."""
    db, sizes = ctx.db, ctx.sizes
    schema = db.fresh_schema()
    table = "raw_jobs" if system is RAW else "jobs"
    try:
        worker = start_worker(schema)
        time.sleep(SETTLE_SECONDS)
        t0 = system.enqueue(db, schema, "sleep_100ms", sizes.refill_jobs, db.reset_statements)
        db.wait_count(
            system.completed(schema), [], sizes.refill_jobs, sizes.timeout, worker.check_alive
        )
        ctx.results.note("refill_latency", f"{label}_statements", db.top_statements([worker.role]))
        rows = db.fetch(
            f"SELECT (result->>'start')::float8, (result->>'end')::float8, "
            f"extract(epoch FROM finished_at)::float8, extract(epoch FROM started_at)::float8"
            f" FROM {schema}.{table}"
        )
        worker.stop()
    finally:
        db.drop_schema(schema)
    starts, ends, finished, claimed = (list(column) for column in zip(*rows, strict=True))
    slots = sizes.refill_concurrency
    return Refill(
        total_s=max(finished) - t0,
        gaps_ms=[gap * 1000 for gap in refill_gaps(starts, ends, slots)],
        to_claim_ms=[gap * 1000 for gap in refill_gaps(claimed, ends, slots)],
    )


def run_refill(ctx: Context) -> None:
    sizes, launcher, add = ctx.sizes, ctx.launcher, ctx.results.add
    slots = sizes.refill_concurrency
    ideal = sizes.refill_jobs / slots * 0.1
    for repeat in range(sizes.repeats):
        base = refill_once(
            ctx,
            lambda schema: launcher.baseline_worker(
                schema, expect=sizes.refill_jobs, batch=slots, listen=True
            ),
            "baseline",
            RAW,
        )
        run = refill_once(
            ctx,
            lambda schema: launcher.trioq_worker(
                schema, concurrency=slots, poll_interval=sizes.refill_poll_interval
            ),
            "trioq",
        )
        add("refill_latency", "total_s", run.total_s)
        add("refill_latency", "total_vs_ideal", run.total_s / ideal)
        add("baseline", "refill_total_s", base.total_s)
        for scenario, prefix, result in (
            ("refill_latency", "", run),
            ("baseline", "refill_", base),
        ):
            add(scenario, f"{prefix}gap_p50_ms", percentile(result.gaps_ms, 50))
            add(scenario, f"{prefix}gap_p99_ms", percentile(result.gaps_ms, 99))
            add(scenario, f"{prefix}settle_to_claim_p50_ms", percentile(result.to_claim_ms, 50))
        ctx.log(
            f"refill repeat {repeat + 1}: {run.total_s:.3f} s for ideal {ideal:.1f} s, gap p50 "
            f"{percentile(run.gaps_ms, 50):.2f} ms, p99 {percentile(run.gaps_ms, 99):.2f} ms "
            f"(raw loop {base.total_s:.3f} s, gap p50 {percentile(base.gaps_ms, 50):.2f} ms)"
        )
