"""Workload sizes: the full run the issue specifies, and the small `--quick` one for CI."""

from __future__ import annotations

import attrs


@attrs.frozen
class Sizes:
    repeats: int = 3
    throughput_jobs: int = 20_000
    depths: tuple[int, int] = (3_000, 100_000)
    concurrency: int = 25
    enqueue_seconds: float = 5.0
    bulk_rows: int = 20_000
    pickup_seconds: float = 10.0
    pickup_every: float = 0.020
    refill_jobs: int = 50
    refill_concurrency: int = 5
    refill_poll_interval: float = 5.0
    idle_seconds: float = 30.0
    fairness_big_key_jobs: int = 10_000
    fairness_small_keys: int = 100
    fairness_jobs_per_small_key: int = 10
    workflow_jobs: int = 5_000  # 3-step workflows
    sleep_workflows: int = 200  # 1 s durable sleeps, with a free slot each
    suspended_sleeping: int = 100_000  # suspended load: sleeping workflows in the table
    suspended_delayed: int = 50_000  # ... and jobs delayed an hour at a better priority
    suspended_drain_jobs: int = 10_000  # the no-op drain measured over them
    event_waiters: int = 500
    fanout_parents: int = 500
    fanout_children: int = 10
    message_waiters: int = 500  # workflows each waiting in ctx.receive
    drain_messages: int = 10_000  # messages queued for one workflow, then drained
    value_reads: int = 2_000  # client.get_value calls on a running workflow
    timeout: float = 600.0  # per wait; a run that hits it failed


FULL = Sizes()
QUICK = Sizes(
    repeats=1,
    throughput_jobs=500,
    depths=(300, 1_000),
    enqueue_seconds=0.5,
    bulk_rows=1_000,
    pickup_seconds=1.0,
    refill_jobs=20,
    idle_seconds=2.0,
    fairness_big_key_jobs=300,
    fairness_small_keys=10,
    fairness_jobs_per_small_key=5,
    workflow_jobs=50,
    sleep_workflows=5,
    suspended_sleeping=300,
    suspended_delayed=200,
    suspended_drain_jobs=100,
    event_waiters=50,
    fanout_parents=20,
    message_waiters=50,
    drain_messages=1_000,
    value_reads=200,
    timeout=60.0,
)
