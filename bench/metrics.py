"""What each recorded metric means: label, unit, its baseline counterpart and its target.

Targets are the project's (2-core machine, PostgreSQL on the same machine, same run). The
backlog flatness bound is "per-job cost flat from 3,000 to 100,000 backlog (within 15%)"
(it was a looser 1.25 here before session 6, which marked 1.19x as met).
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import attrs

from bench.config import Sizes


@attrs.frozen
class Target:
    text: str
    compare: Callable[[float, float], bool]
    bound: float
    on_ratio: bool = False  # checked against the ratio to the baseline, not the value
    peer_bound: float | None = None  # also checked against the ratio to PgQueuer

    def met(
        self, median: float, ratio: float | None, peer_ratio: float | None = None
    ) -> bool | None:
        value = ratio if self.on_ratio else median
        if value is None:
            return None
        if self.peer_bound is None:
            return self.compare(value, self.bound)
        if peer_ratio is None:
            return None
        return self.compare(value, self.bound) and self.compare(peer_ratio, self.peer_bound)


def at_least(
    bound: float, text: str, *, on_ratio: bool = False, peer_bound: float | None = None
) -> Target:
    return Target(text, operator.ge, bound, on_ratio, peer_bound)


def at_most(bound: float, text: str, *, on_ratio: bool = False) -> Target:
    return Target(text, operator.le, bound, on_ratio)


@attrs.frozen
class Metric:
    scenario: str
    key: str
    label: str
    unit: str
    baseline: str | None = None  # metric key in the "baseline" scenario
    target: Target | None = None
    peer: bool = False  # PgQueuer recorded the same key in the "peer" scenario


def metrics(sizes: Sizes) -> list[Metric]:
    """Every metric, in report order."""
    n, (shallow, deep), c = sizes.throughput_jobs, sizes.depths, sizes.concurrency
    jobs = f"{n:,} jobs"
    return [
        Metric(
            "throughput",
            "one_worker_jobs_per_s",
            f"1 worker, c={c}, noop, {jobs}",
            "jobs/s",
            "jobs_per_s",
            at_least(0.7, ">= 0.7x raw and >= 1.5x PgQueuer", on_ratio=True, peer_bound=1.5),
            peer=True,
        ),
        Metric(
            "throughput",
            "two_workers_jobs_per_s",
            f"2 workers, c={c} each, noop, {jobs}",
            "jobs/s",
            "jobs_per_s",
        ),
        Metric(
            "throughput",
            "two_vs_one_worker",
            "2 workers / 1 worker (same repeat)",
            "x",
            target=at_least(1.0, ">= 1.0"),
        ),
        Metric(
            "throughput",
            "sleep_1ms_jobs_per_s",
            f"1 worker, c={c}, 1 ms async handler (baseline: noop)",
            "jobs/s",
            "jobs_per_s",
        ),
        Metric(
            "throughput",
            "shallow_backlog_jobs_per_s",
            f"1 worker, backlog {shallow:,}",
            "jobs/s",
            "jobs_per_s",
        ),
        Metric(
            "throughput",
            "deep_backlog_jobs_per_s",
            f"1 worker, backlog {deep:,}",
            "jobs/s",
            "jobs_per_s",
        ),
        Metric(
            "throughput",
            "deep_vs_shallow_cost_per_job",
            f"cost per job, backlog {deep:,} / {shallow:,}",
            "x",
            target=at_most(1.15, "<= 1.15 (flat within 15%)"),
        ),
        Metric(
            "enqueue",
            "single_per_s",
            "client.enqueue, sequential, one process",
            "jobs/s",
            "enqueue_single_per_s",
            at_least(0.8, ">= 0.8x raw", on_ratio=True),
            peer=True,
        ),
        Metric(
            "enqueue",
            "bulk_rows_per_s",
            f"client.enqueue_many, {sizes.bulk_rows:,} rows",
            "rows/s",
            "enqueue_bulk_rows_per_s",
            at_least(0.5, ">= 0.5x raw", on_ratio=True),
            peer=True,
        ),
        *[
            Metric(
                "pickup_latency",
                f"{p}_ms",
                f"idle worker, enqueue call -> handler start {p}",
                "ms",
                baseline=None if p == "max" else f"pickup_{p}_ms",
                target=at_most(1.3, "<= 1.3x raw", on_ratio=True) if p == "p95" else None,
                peer=p != "max",
            )
            for p in ("p50", "p95", "p99", "max")
        ],
        *[
            Metric("pickup_latency", f"{part}_{p}_ms", f"{label} {p}", "ms")
            for part, label in (
                ("commit_to_claim", "  enqueue call -> claim statement start"),
                ("claim_to_handler", "  claim statement start -> handler"),
            )
            for p in ("p50", "p95")
        ],
        Metric(
            "refill_latency",
            "total_s",
            f"{sizes.refill_jobs} x 100 ms jobs, c={sizes.refill_concurrency}, "
            f"poll {sizes.refill_poll_interval:g} s",
            "s",
            "refill_total_s",
        ),
        Metric(
            "refill_latency",
            "total_vs_ideal",
            "total / ideal",
            "x",
            target=at_most(1.15, "<= 1.15"),
        ),
        Metric(
            "refill_latency",
            "gap_p50_ms",
            "slot settle -> next handler start p50",
            "ms",
            "refill_gap_p50_ms",
        ),
        Metric(
            "refill_latency",
            "gap_p99_ms",
            "slot settle -> next handler start p99",
            "ms",
            "refill_gap_p99_ms",
        ),
        Metric(
            "refill_latency",
            "settle_to_claim_p50_ms",
            "  slot settle -> start of the refilling claim statement p50",
            "ms",
            "refill_settle_to_claim_p50_ms",
        ),
        Metric(
            "database_load",
            "statements_per_job",
            f"statements per completed job, 1 worker ({jobs})",
            "stmt/job",
            "statements_per_job",
            at_most(0.1, "<= 0.1"),
            peer=True,
        ),
        Metric(
            "database_load",
            "statements_per_job_two_workers",
            "statements per completed job, 2 workers",
            "stmt/job",
            "statements_per_job",
        ),
        Metric(
            "database_load",
            "db_us_per_job",
            "server execution time per job, 1 worker",
            "us",
            "db_us_per_job",
        ),
        Metric(
            "database_load",
            "server_cpu_us_per_job",
            "server CPU (user+sys of every cluster process) per job, 1 worker",
            "us",
            "server_cpu_us_per_job",
            at_most(1.5, "<= 1.5x raw", on_ratio=True),
            peer=True,
        ),
        Metric(
            "database_load",
            "db_us_per_job_shallow_backlog",
            f"server execution time per job, backlog {shallow:,}",
            "us",
            "db_us_per_job",
        ),
        Metric(
            "database_load",
            "db_us_per_job_deep_backlog",
            f"server execution time per job, backlog {deep:,}",
            "us",
            "db_us_per_job",
        ),
        Metric(
            "database_load",
            "idle_one_queue_statements_per_s",
            f"idle worker, {c} slots, 1 queue, poll 1 s",
            "stmt/s",
            "idle_statements_per_s",
            target=at_most(1.0, "<= 1.0"),
            peer=True,
        ),
        Metric(
            "database_load",
            "idle_four_queues_statements_per_s",
            f"idle worker, {c} slots, 4 queues, poll 1 s",
            "stmt/s",
        ),
        Metric(
            "worker_cost",
            "cpu_s_per_10k_jobs",
            "worker CPU (user+sys) per 10,000 noop jobs",
            "s",
            "cpu_s_per_10k_jobs",
            at_most(1.5, "<= 1.5x raw", on_ratio=True),
            peer=True,
        ),
        Metric(
            "worker_cost",
            "peak_rss_mb",
            f"worker peak RSS (VmHWM), c={c}",
            "MB",
            "peak_rss_mb",
            at_most(120.0, "<= 120 MB"),
        ),
        Metric(
            "partition_fairness", "small_key_wait_p50_s", "small keys: commit -> start p50", "s"
        ),
        Metric(
            "partition_fairness", "small_key_wait_p95_s", "small keys: commit -> start p95", "s"
        ),
        Metric("partition_fairness", "small_keys_drained_s", "all small keys drained after", "s"),
        Metric(
            "partition_fairness",
            "big_key_jobs_done_meanwhile",
            f"big key jobs done by then (of {sizes.fairness_big_key_jobs:,})",
            "jobs",
        ),
        *[
            Metric(
                "event_latency",
                f"{p}_ms",
                f"{sizes.event_waiters} waiting workflows, emit_event COMMIT -> resume {p}",
                "ms",
                baseline=f"pickup_{p}_ms",
                target=at_most(10.0, "<= 10 ms") if p == "p95" else None,
            )
            for p in ("p50", "p95", "p99")
        ],
        Metric(
            "fanout",
            "parents_per_s",
            f"{sizes.fanout_parents} parents x {sizes.fanout_children} children "
            f"(spawn + gather), c={c}",
            "parents/s",
            target=at_least(90.0, ">= 90 parents/s"),
        ),
        Metric(
            "fanout",
            "jobs_per_s",
            "  the same, as jobs (parents + children) per second",
            "jobs/s",
            "jobs_per_s",
        ),
        *[
            Metric(
                "message_latency",
                f"{p}_ms",
                f"{sizes.message_waiters} workflows in ctx.receive, client.send COMMIT -> "
                f"resume {p}",
                "ms",
                baseline=f"pickup_{p}_ms",
                target=at_most(10.0, "<= 10 ms") if p == "p95" else None,
            )
            for p in ("p50", "p95", "p99")
        ],
        Metric(
            "message_drain",
            "messages_per_s",
            f"{sizes.drain_messages} messages queued for one workflow, drained by receive",
            "msg/s",
            target=at_least(5_000.0, ">= 5,000 messages/s"),
        ),
        *[
            Metric(
                "get_value",
                f"{p}_ms",
                f"client.get_value of a running workflow, {sizes.value_reads} calls, {p}",
                "ms",
                target=at_most(5.0, "<= 5 ms") if p == "p95" else None,
            )
            for p in ("p50", "p95")
        ],
        *scaling_metrics(sizes),
        *prefetch_metrics(sizes),
        Metric(
            "baseline",
            "jobs_per_s",
            f"raw asyncio+asyncpg loop (own table, pipelined completion), {c} slots, {jobs}",
            "jobs/s",
        ),
        Metric("baseline", "idle_statements_per_s", "raw loop idle (LISTEN + 1 s poll)", "stmt/s"),
        Metric("baseline", "statements_per_job", "raw loop statements per job", "stmt/job"),
        Metric("baseline", "db_us_per_job", "raw loop server execution time per job", "us"),
        Metric("baseline", "server_cpu_us_per_job", "raw loop server CPU per job", "us"),
        Metric("baseline", "cpu_s_per_10k_jobs", "raw loop CPU per 10,000 jobs", "s"),
        Metric("baseline", "peak_rss_mb", "raw loop peak RSS", "MB"),
        *[
            Metric(
                "baseline",
                f"pickup_{p}_ms",
                f"raw loop (LISTEN), enqueue call -> handler start {p}",
                "ms",
            )
            for p in ("p50", "p95", "p99")
        ],
        Metric("baseline", "refill_total_s", "raw loop (batch of 5), 100 ms jobs, total", "s"),
        *[
            Metric(
                "baseline", f"refill_gap_{p}_ms", f"raw loop, slot settle -> next start {p}", "ms"
            )
            for p in ("p50", "p99")
        ],
        Metric(
            "baseline",
            "refill_settle_to_claim_p50_ms",
            "raw loop, slot settle -> claim statement start p50",
            "ms",
        ),
        Metric("baseline", "enqueue_single_per_s", "raw single-row INSERT, sequential", "jobs/s"),
        Metric(
            "baseline", "enqueue_bulk_rows_per_s", "raw INSERT ... unnest, one statement", "rows/s"
        ),
        Metric(
            "workflows",
            "three_step_workflows_per_s",
            f"1 worker, c={c}, {sizes.workflow_jobs:,} workflows of 3 no-op steps",
            "workflows/s",
            "jobs_per_s",
            at_least(1000, ">= 1,000/s"),
        ),
        Metric(
            "workflows",
            "statements_per_step",
            "worker statements per step (claims, checkpoints, settles)",
            "stmt/step",
            target=at_most(0.25, "<= 0.25"),
        ),
        Metric(
            "workflows",
            "sleep_resume_p50_ms",
            f"{sizes.sleep_workflows} x 1 s durable sleep, wake time -> resume p50",
            "ms",
        ),
        Metric(
            "workflows",
            "sleep_resume_p95_ms",
            "durable sleep, wake time -> resume p95",
            "ms",
            target=at_most(10, "<= 10 ms"),
        ),
        Metric(
            "workflows",
            "suspended_load_jobs_per_s",
            f"noop drain of {sizes.suspended_drain_jobs:,} with {sizes.suspended_sleeping:,} "
            f"sleeping + {sizes.suspended_delayed:,} better-priority delayed in the table",
            "jobs/s",
            "jobs_per_s",
        ),
        Metric(
            "workflows",
            "empty_table_jobs_per_s",
            "the same drain on an empty table (same repeat)",
            "jobs/s",
            "jobs_per_s",
        ),
        Metric(
            "workflows",
            "suspended_vs_empty",
            "suspended load / empty table, throughput",
            "x",
            target=at_least(0.9, ">= 0.9 (within 10%)"),
        ),
        Metric(
            "workflows",
            "suspended_vs_empty_db_cost",
            "empty / suspended load, server time per job",
            "x",
            target=at_least(0.9, ">= 0.9 (within 10%)"),
        ),
        Metric("peer", "jobs_per_s", f"PgQueuer 1.6, batch {c}, noop, {jobs}", "jobs/s"),
        Metric("peer", "statements_per_job", "PgQueuer statements per job", "stmt/job"),
        Metric("peer", "db_us_per_job", "PgQueuer server execution time per job", "us"),
        Metric("peer", "server_cpu_us_per_job", "PgQueuer server CPU per job", "us"),
        Metric("peer", "cpu_s_per_10k_jobs", "PgQueuer CPU per 10,000 jobs", "s"),
        Metric("peer", "peak_rss_mb", "PgQueuer peak RSS", "MB"),
        *[
            Metric("peer", f"pickup_{p}_ms", f"PgQueuer, enqueue call -> handler start {p}", "ms")
            for p in ("p50", "p95", "p99")
        ],
        Metric("peer", "enqueue_single_per_s", "PgQueuer enqueue, sequential", "jobs/s"),
        Metric("peer", "enqueue_bulk_rows_per_s", "PgQueuer enqueue of a list", "rows/s"),
        Metric("peer", "idle_statements_per_s", f"PgQueuer idle, batch {c}", "stmt/s"),
    ]


def scaling_metrics(sizes: Sizes) -> list[Metric]:
    """One backlog drained by 1-8 worker processes (bench/scenarios/scaling.py)."""
    n, c = sizes.throughput_jobs, sizes.concurrency
    found = []
    for workers in (1, 2, 4, 8):
        w = f"{workers} worker{'s' if workers > 1 else ''}"
        name = f"{workers}_workers"
        found += [
            Metric("scaling", f"{name}_jobs_per_s", f"{w}, c={c} each, {n:,} noop jobs", "jobs/s"),
            Metric(
                "scaling",
                f"{name}_vs_best",
                f"{w} / the best count (same repeat)",
                "x",
                target=at_least(0.9, ">= 0.9") if workers == 8 else None,
            ),
            Metric("scaling", f"{name}_claim_p99_ms", f"{w}: claim statement p99 (bucket)", "ms"),
            Metric(
                "scaling",
                f"{name}_smallest_share",
                f"{w}: least-busy worker's jobs / fair share",
                "x",
            ),
            Metric(
                "scaling",
                f"{name}_lock_wait_samples",
                f"{w}: worker backends in a Lock wait, summed over 20 ms samples",
                "",
            ),
            Metric(
                "scaling",
                f"{name}_object_lock_wait_samples",
                f"{w}: of those, waits on 'object' (the NOTIFY commit lock)",
                "",
            ),
            Metric(
                "scaling",
                f"{name}_lwlock_wait_samples",
                f"{w}: worker backends in an LWLock wait, summed over samples",
                "",
            ),
            Metric("scaling", f"{name}_statements_per_job", f"{w}: worker statements per job", ""),
            Metric(
                "scaling",
                f"{name}_notifications_per_job",
                f"{w}: notifications per job (result and ready channels)",
                "",
            ),
            Metric("scaling", f"{name}_ungranted_locks_peak", f"{w}: most ungranted pg_locks", ""),
            Metric("scaling", f"{name}_autovacuums", f"{w}: autovacuum runs during the drain", ""),
            Metric(
                "scaling",
                f"{name}_vacuum_running_samples",
                f"{w}: samples with a vacuum in progress",
                "",
            ),
            Metric(
                "scaling",
                f"{name}_vacuum_lock_wait_samples",
                f"{w}: samples with autovacuum waiting on a lock",
                "",
            ),
        ]
    return found


def prefetch_metrics(sizes: Sizes) -> list[Metric]:
    """Prefetch 0 vs one slot count ahead, interleaved (bench/scenarios/scaling.py)."""
    c = sizes.concurrency
    found = []
    for label in ("off", "on"):
        found += [
            Metric(
                "prefetch",
                f"{label}_one_worker_jobs_per_s",
                f"prefetch {label}: 1 worker, c={c}",
                "jobs/s",
            ),
            Metric(
                "prefetch",
                f"{label}_two_workers_jobs_per_s",
                f"prefetch {label}: 2 workers",
                "jobs/s",
            ),
            Metric(
                "prefetch", f"{label}_pickup_p95_ms", f"prefetch {label}: pickup p95, c={c}", "ms"
            ),
        ]
    found += [
        Metric("prefetch", f"{metric}_on_vs_off", f"prefetch {c} / prefetch 0: {metric}", "x")
        for metric in ("one_worker_jobs_per_s", "two_workers_jobs_per_s", "pickup_p95_ms")
    ]
    return found
