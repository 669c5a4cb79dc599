"""Many workers on one backlog, and prefetch on vs off.

`scaling`: one backlog drained by 1, 2, 4 and 8 `trioq worker` processes at the bench's
concurrency each (the counts interleaved within each repeat). Per count: aggregate jobs/s and
its ratio to the best count of the same repeat; p99 of the claim statement's latency from the
workers' own histograms (`trioq_claim_statement_seconds`, scraped from /metrics before they
stop, so a bucket's upper bound); the jobs each worker ran (the smallest share vs a fair one:
starvation); and what a sampler session saw every `SAMPLE_SECONDS` during the drain: backends of
the workers waiting on a heavyweight lock (`wait_event_type = 'Lock'`) or an LWLock, ungranted
`pg_locks` rows, and autovacuum: vacuums that ran on the schema's tables (pg_stat_user_tables)
and samples in which one was in progress or waited on a lock (pg_stat_progress_vacuum,
pg_stat_activity).

`prefetch`: the one-worker and two-worker drains and the pickup latency with `--prefetch 0`
against one slot count ahead (`--prefetch` = concurrency), interleaved in each repeat. The
default (`DEFAULT_PREFETCH`) is whichever of the two these figures favour.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator

import attrs
import psycopg
from psycopg import sql

from bench.harness import Process
from bench.jobs import TRIOQ
from bench.scenarios import Context
from bench.scenarios.latency import pickup_once
from bench.scenarios.throughput import drain
from bench.stats import percentile

WORKER_COUNTS = (1, 2, 4, 8)
SAMPLE_SECONDS = 0.02
CLAIM_METRIC = "trioq_claim_statement_seconds_bucket"


@attrs.define(eq=False)
class Samples:
    """What the sampler saw during one drain (counts of samples, or maxima)."""

    samples: int = 0
    lock_waits: int = 0  # worker backends waiting on a heavyweight lock, summed over samples
    lwlock_waits: int = 0
    ungranted_peak: int = 0  # most ungranted pg_locks rows in one sample
    vacuum_in_progress: int = 0  # samples with a vacuum running on the schema's tables
    vacuum_lock_waits: int = 0  # samples with an autovacuum worker waiting on a lock
    autovacuums: int = 0  # autovacuum runs on the schema's tables during the drain
    autoanalyzes: int = 0
    lock_events: dict[str, int] = attrs.field(factory=dict)  # Lock wait_event -> backends summed
    notifications: int = 0  # received on the schema's 64 result and 64 ready channels


def _listen_to_every_channel(conn: psycopg.Connection[tuple[int, int]], schema: str) -> None:
    for kind in ("result", "ready"):
        for shard in range(64):
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(f"{schema}_{kind}_{shard}")))


def _count_notifications(
    conn: psycopg.Connection[tuple[int, int]], found: Samples, stop: threading.Event
) -> None:
    """Count every notification the listening session receives until `stop`."""
    while not stop.is_set():
        for _ in conn.notifies(timeout=SAMPLE_SECONDS):
            found.notifications += 1
    for _ in conn.notifies(timeout=0.2):  # the last flush's, sent as the drain was seen done
        found.notifications += 1


def _vacuum_counts(conn: psycopg.Connection[tuple[int, int]], schema: str) -> tuple[int, int]:
    row = conn.execute(
        "SELECT coalesce(sum(autovacuum_count), 0)::int, coalesce(sum(autoanalyze_count), 0)::int"
        " FROM pg_stat_user_tables WHERE schemaname = %s",
        (schema,),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


@contextlib.contextmanager
def sampling(ctx: Context, schema: str, roles: list[str]) -> Iterator[Samples]:
    """Sample lock waits and vacuum activity on a session of its own until the block ends."""
    role = ctx.db.new_role("bench_s")
    conn = psycopg.connect(ctx.db.conninfo(role), autocommit=True)
    found = Samples()
    stop = threading.Event()
    before = _vacuum_counts(conn, schema)

    def sample() -> None:
        while not stop.wait(SAMPLE_SECONDS):
            row = conn.execute(
                "SELECT"
                " count(*) FILTER (WHERE usename = ANY(%s) AND wait_event_type = 'Lock'),"
                " count(*) FILTER (WHERE usename = ANY(%s) AND wait_event_type = 'LWLock'),"
                " count(*) FILTER (WHERE backend_type = 'autovacuum worker'"
                "                  AND wait_event_type = 'Lock'),"
                " (SELECT count(*) FROM pg_locks WHERE NOT granted),"
                " (SELECT count(*) FROM pg_stat_progress_vacuum v JOIN pg_class c"
                "    ON c.oid = v.relid JOIN pg_namespace n ON n.oid = c.relnamespace"
                "   WHERE n.nspname = %s),"
                " coalesce(array_agg(wait_event) FILTER (WHERE usename = ANY(%s)"
                "                   AND wait_event_type = 'Lock'), '{}')"
                " FROM pg_stat_activity",
                (roles, roles, schema, roles),
            ).fetchone()
            assert row is not None
            locks, lwlocks, vacuum_locks, ungranted, vacuums, events = row
            for event in events:
                found.lock_events[event] = found.lock_events.get(event, 0) + 1
            found.samples += 1
            found.lock_waits += locks
            found.lwlock_waits += lwlocks
            found.ungranted_peak = max(found.ungranted_peak, ungranted)
            found.vacuum_in_progress += vacuums > 0
            found.vacuum_lock_waits += vacuum_locks > 0

    listener = psycopg.connect(ctx.db.conninfo(role), autocommit=True)
    _listen_to_every_channel(listener, schema)  # before the backlog is enqueued
    thread = threading.Thread(target=sample, daemon=True)
    counter = threading.Thread(
        target=_count_notifications, args=(listener, found, stop), daemon=True
    )
    counter.start()
    thread.start()
    try:
        yield found
    finally:
        stop.set()
        thread.join()
        counter.join()
        after = _vacuum_counts(conn, schema)
        found.autovacuums, found.autoanalyzes = after[0] - before[0], after[1] - before[1]
        conn.close()
        listener.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def claim_buckets(port: int) -> dict[float, float]:
    """The worker's cumulative claim latency buckets (upper bound in s -> count)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(CLAIM_METRIC):
            labels, value = line.rsplit(" ", 1)
            bound = labels.split('le="', 1)[1].split('"', 1)[0]
            upper = float("inf") if bound == "+Inf" else float(bound)
            buckets[upper] = buckets.get(upper, 0.0) + float(value)
    return buckets


def bucket_percentile(buckets: dict[float, float], pct: float) -> float:
    """The upper bound of the bucket holding the `pct` percentile (the histogram's resolution)."""
    total = buckets.get(float("inf"), 0.0)
    for upper in sorted(buckets):
        if total and buckets[upper] >= total * pct / 100:
            return upper
    return float("nan")


@attrs.frozen
class ScaledDrain:
    workers: int
    jobs_per_s: float
    claim_p99_ms: float
    smallest_share: float  # the least-busy worker's jobs vs a fair share (1.0: even)
    samples: Samples
    statements_per_job: float
    notifications_per_job: float


def scaled_drain(ctx: Context, workers: int, prefetch: int | None = None) -> ScaledDrain:
    launcher, sizes = ctx.launcher, ctx.sizes
    started: list[tuple[Process, int]] = []
    merged: dict[float, float] = {}
    spread: list[int] = []
    watch: dict[str, Samples] = {}

    def start(schema: str) -> list[Process]:
        for _ in range(workers):
            port = free_port()
            process = launcher.trioq_worker(
                schema, concurrency=sizes.concurrency, prefetch=prefetch, health_port=port
            )
            started.append((process, port))
        return [process for process, _ in started]

    @contextlib.contextmanager
    def observe(schema: str) -> Iterator[None]:
        roles = [process.role for process, _ in started]
        with sampling(ctx, schema, roles) as found:
            watch["found"] = found
            yield

    def before_stop(schema: str) -> None:
        for _, port in started:
            for upper, count in claim_buckets(port).items():
                merged[upper] = merged.get(upper, 0.0) + count
        rows = ctx.db.fetch(
            f"SELECT count(*) FROM {schema}.jobs j JOIN {schema}.workers w"
            " ON w.id = j.worker_id GROUP BY w.id"
        )
        spread.extend(row[0] for row in rows)

    result = drain(
        ctx,
        start,
        "noop",
        sizes.throughput_jobs,
        TRIOQ,
        observe=observe,
        before_stop=before_stop,
    )
    fair = sizes.throughput_jobs / workers
    smallest = (min(spread) if len(spread) == workers else 0) / fair
    return ScaledDrain(
        workers,
        result.jobs_per_s,
        bucket_percentile(merged, 99) * 1000,
        smallest,
        watch["found"],
        result.statements_per_job,
        watch["found"].notifications / sizes.throughput_jobs,
    )


def run(ctx: Context) -> None:
    add = ctx.results.add
    for repeat in range(ctx.sizes.repeats):
        runs = [scaled_drain(ctx, count) for count in WORKER_COUNTS]
        best = max(run_.jobs_per_s for run_ in runs)
        for run_ in runs:
            name = f"{run_.workers}_workers"
            add("scaling", f"{name}_jobs_per_s", run_.jobs_per_s)
            add("scaling", f"{name}_vs_best", run_.jobs_per_s / best)
            add("scaling", f"{name}_claim_p99_ms", run_.claim_p99_ms)
            add("scaling", f"{name}_smallest_share", run_.smallest_share)
            add("scaling", f"{name}_lock_wait_samples", run_.samples.lock_waits)
            # 'object': the database-wide lock a commit that sent a NOTIFY takes
            add(
                "scaling",
                f"{name}_object_lock_wait_samples",
                run_.samples.lock_events.get("object", 0),
            )
            add("scaling", f"{name}_statements_per_job", run_.statements_per_job)
            add("scaling", f"{name}_notifications_per_job", run_.notifications_per_job)
            add("scaling", f"{name}_lwlock_wait_samples", run_.samples.lwlock_waits)
            add("scaling", f"{name}_ungranted_locks_peak", run_.samples.ungranted_peak)
            add("scaling", f"{name}_autovacuums", run_.samples.autovacuums)
            add("scaling", f"{name}_vacuum_running_samples", run_.samples.vacuum_in_progress)
            add("scaling", f"{name}_vacuum_lock_wait_samples", run_.samples.vacuum_lock_waits)
            if repeat == 0:
                ctx.results.note("scaling", f"{name}_lock_wait_events", run_.samples.lock_events)
        ctx.log(
            f"scaling repeat {repeat + 1}: "
            + ", ".join(
                f"{r.workers}w {r.jobs_per_s:.0f}/s ({r.jobs_per_s / best:.2f}x best, claim p99"
                f" {r.claim_p99_ms:g} ms, least {r.smallest_share:.2f} of fair, lock waits"
                f" {r.samples.lock_waits}/{r.samples.samples}"
                f" (object {r.samples.lock_events.get('object', 0)}), autovacuums"
                f" {r.samples.autovacuums}, {r.statements_per_job:.3f} stmt/job,"
                f" {r.notifications_per_job:.3f} notify/job)"
                for r in runs
            )
        )


def run_prefetch(ctx: Context) -> None:
    """Prefetch 0 vs one slot count ahead, interleaved: drains of one and two workers, pickup
    p95."""
    add, sizes, launcher = ctx.results.add, ctx.sizes, ctx.launcher
    settings = {"off": 0, "on": sizes.concurrency}

    def workers(count: int, prefetch: int) -> Callable[[str], list[Process]]:
        return lambda schema: [
            launcher.trioq_worker(schema, concurrency=sizes.concurrency, prefetch=prefetch)
            for _ in range(count)
        ]

    for repeat in range(sizes.repeats):
        line = []
        for label, prefetch in settings.items():
            one = drain(ctx, workers(1, prefetch), "noop", sizes.throughput_jobs)
            two = drain(ctx, workers(2, prefetch), "noop", sizes.throughput_jobs)
            committed, rows = pickup_once(
                ctx,
                lambda schema, p=prefetch: launcher.trioq_worker(
                    schema, concurrency=sizes.concurrency, prefetch=p
                ),
                f"prefetch_{label}",
            )
            latencies = [
                (handler_start - committed[job_id]) * 1000 for job_id, handler_start, _ in rows
            ]
            p95 = percentile(latencies, 95)
            add("prefetch", f"{label}_one_worker_jobs_per_s", one.jobs_per_s)
            add("prefetch", f"{label}_two_workers_jobs_per_s", two.jobs_per_s)
            add("prefetch", f"{label}_pickup_p95_ms", p95)
            line.append(
                f"prefetch {prefetch}: 1w {one.jobs_per_s:.0f}/s, 2w {two.jobs_per_s:.0f}/s,"
                f" pickup p95 {p95:.2f} ms"
            )
        values = ctx.results.values["prefetch"]
        for metric in ("one_worker_jobs_per_s", "two_workers_jobs_per_s", "pickup_p95_ms"):
            add(
                "prefetch",
                f"{metric}_on_vs_off",
                values[f"on_{metric}"][-1] / values[f"off_{metric}"][-1],
            )
        ctx.log(f"prefetch repeat {repeat + 1}: " + "; ".join(line))
