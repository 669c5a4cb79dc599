"""The worker's Prometheus metrics: one `CollectorRegistry` per worker (two workers in one
process never share or collide), exposed by the health server's `/metrics`.

Counts come from four places, none of them a hand-written exposition:
- the claim loops' hooks (claims, claimed jobs, poll wake-ups);
- `JobTally`, called by the claim loop once per finished job: outcomes and handler duration
  by task, counted in plain ints and floats and turned into prometheus-client metric families
  when scraped (a custom collector, prometheus-client's own extension point);
- `instrument_driver`, a thin proxy around the worker's driver that times the claim statement,
  counts checkpoint writes and database errors (also the admission controller's signals);
- gauges set from `Worker.statistics()` when `/metrics` is scraped (open slots, effective
  limit and its reason, listener, leadership, queue demand), so nothing polls while nobody
  scrapes;
- prometheus-client's process and platform collectors (CPU, memory, file descriptors, Python).

The database-wide gauges (`trioq_queue_demand`, `trioq_queue_oldest_ready_seconds`) come from
the leader alone: every replica would read the same rows, and a sum across replicas would
multiply them. Every queue the worker knows (its own, and any seen in the database since it
started) is exported with every kind, zeros included, so a queue that empties reads 0.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import inspect
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import attrs
import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from ..._seam.admin import QueueDemand
from ..._seam.driver import ClaimResult, Driver
from ..._seam.workflow import (
    ChildrenWaitOutcome,
    EventWaitOutcome,
    SpawnOutcome,
    WaitChildren,
    WaitEvent,
)

# Claim statements are a few ms; a slow one is a database under pressure.
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HANDLER_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
# `/metrics` reads `queue_demand()` (every unfinished row) at most this often: a scrape within
# the window exports the last read, so the scan's cost does not grow with scrapers or scrapes.
DEMAND_CACHE_SECONDS = 15.0
# The columns of `queue_demand()` exported as `trioq_queue_demand{kind=...}`.
DEMAND_KINDS = ("ready", "running", "scheduled", "sleeping", "waiting", "due_now")
LISTENER_STATES = ("ok", "down", "polling", "off")


def _metrics_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


@attrs.define(eq=False)
class WorkerMetrics:
    registry: CollectorRegistry = attrs.field(factory=_metrics_registry)
    claims: Counter = attrs.field(init=False)
    claimed_jobs: Counter = attrs.field(init=False)
    claim_statements: Counter = attrs.field(init=False)
    claim_seconds: Histogram = attrs.field(init=False)
    notifications: Counter = attrs.field(init=False)
    poll_wakeups: Counter = attrs.field(init=False)
    open_slots: Gauge = attrs.field(init=False)
    held_by_limit: Gauge = attrs.field(init=False)
    # Queues whose claims a cluster-wide limit has held back: only their rounds set the gauge
    # (a queue that never met a limit pays no gauge update per round).
    limited_queues: set[str] = attrs.field(init=False, factory=set)
    queue_concurrency: Gauge = attrs.field(init=False)
    effective_limit: Gauge = attrs.field(init=False)
    admission_reason: Gauge = attrs.field(init=False)
    admission_changes: Counter = attrs.field(init=False)
    lease_renewals: Counter = attrs.field(init=False)
    lost_leases: Counter = attrs.field(init=False)
    recovered_jobs: Counter = attrs.field(init=False)
    jobs: JobTally = attrs.field(init=False)  # outcomes and handler seconds, per job
    # Labelled children of the per-round metrics, by (metric, labels): `labels()` takes a lock
    # and builds its key on every call, and prometheus-client returns the same child each time.
    _children: dict[tuple[int, tuple[str, ...]], Any] = attrs.field(init=False, factory=dict)
    checkpoints: Counter = attrs.field(init=False)
    database_errors: Counter = attrs.field(init=False)
    queue_demand: Gauge = attrs.field(init=False)
    oldest_ready: Gauge = attrs.field(init=False)
    listener_connected: Gauge = attrs.field(init=False)
    listener_state: Gauge = attrs.field(init=False)
    leader: Gauge = attrs.field(init=False)
    # Every queue exported by the demand gauges so far: one that empties keeps its series, at 0.
    known_queues: set[str] = attrs.field(init=False, factory=set)
    demand_reads: DemandReads = attrs.field(init=False, factory=lambda: DemandReads())

    def __attrs_post_init__(self) -> None:
        r = self.registry
        self.claims = Counter(
            "trioq_claims", "Claim rounds that asked for jobs", ["queue"], registry=r
        )
        self.claimed_jobs = Counter("trioq_claimed_jobs", "Jobs claimed", ["queue"], registry=r)
        self.claim_statements = Counter(
            "trioq_claim_statements", "Complete-and-claim statements sent", ["queue"], registry=r
        )
        self.claim_seconds = Histogram(
            "trioq_claim_statement_seconds",
            "Latency of the complete-and-claim statement",
            ["queue"],
            buckets=CLAIM_BUCKETS,
            registry=r,
        )
        self.notifications = Counter(
            "trioq_notifications_received", "Ready notifications received", registry=r
        )
        self.poll_wakeups = Counter(
            "trioq_poll_wakeups", "Claim rounds started by the poll timer", ["queue"], registry=r
        )
        self.open_slots = Gauge(
            "trioq_open_slots", "Slots not owned by a job", ["queue"], registry=r
        )
        self.held_by_limit = Gauge(
            "trioq_queue_held_by_limit",
            "1 while the queue's last claim here was held back by its cluster-wide limit "
            "(limit: global or rate)",
            ["queue", "limit"],
            registry=r,
        )
        self.queue_concurrency = Gauge(
            "trioq_queue_concurrency", "Slots the worker has for the queue", ["queue"], registry=r
        )
        self.effective_limit = Gauge(
            "trioq_effective_limit",
            "Slots admission control lets the queue use",
            ["queue"],
            registry=r,
        )
        self.admission_reason = Gauge(
            "trioq_admission_reason",
            "1 for the reason of the current effective limit",
            ["queue", "reason"],
            registry=r,
        )
        self.admission_changes = Counter(
            "trioq_admission_changes", "Effective limit changes", ["queue", "reason"], registry=r
        )
        self.lease_renewals = Counter(
            "trioq_lease_renewals", "Lease renewal statements that succeeded", registry=r
        )
        self.lost_leases = Counter("trioq_lost_leases", "Leases found lost", registry=r)
        # Counted by the leader that recovers them: the worker that lost them may be dead
        # (kill -9 counted nothing on trioq_lost_leases_total, so its alert could not fire).
        self.recovered_jobs = Counter(
            "trioq_recovered_jobs",
            "Jobs whose expired lease this worker recovered as the leader",
            registry=r,
        )
        self.jobs = JobTally(self.lost_leases)
        r.register(self.jobs)
        self.checkpoints = Counter(
            "trioq_checkpoints_written", "Workflow checkpoints written", registry=r
        )
        self.database_errors = Counter(
            "trioq_database_errors", "Driver calls that raised", ["statement"], registry=r
        )
        self.queue_demand = Gauge(
            "trioq_queue_demand",
            "Jobs per queue and kind, database-wide (queue_demand()); exported by the leader only",
            ["queue", "kind"],
            registry=r,
        )
        self.oldest_ready = Gauge(
            "trioq_queue_oldest_ready_seconds",
            "Age of the oldest due ready job per queue (0: none); exported by the leader only",
            ["queue"],
            registry=r,
        )
        self.listener_connected = Gauge(
            "trioq_listener_connected",
            "1 while the LISTEN connection is up (0 when down, or in poll-only mode)",
            registry=r,
        )
        self.listener_state = Gauge(
            "trioq_listener_state",
            "1 for the listener's state: ok, down, polling (self-probe failed), off (poll-only)",
            ["state"],
            registry=r,
        )
        self.leader = Gauge("trioq_leader", "1 while this worker holds the leader seat", registry=r)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)

    def set_demand(self, served: Sequence[str], demand: Sequence[QueueDemand]) -> None:
        """Set the database-wide gauges from one `queue_demand()` read (the leader's)."""
        by_queue = {row.queue: row for row in demand}
        self.known_queues.update(served, by_queue)
        for queue in sorted(self.known_queues):
            row = by_queue.get(queue)
            for kind in DEMAND_KINDS:
                self.queue_demand.labels(queue, kind).set(0 if row is None else getattr(row, kind))
            oldest = None if row is None else row.oldest_ready_seconds
            self.oldest_ready.labels(queue).set(oldest or 0.0)

    def clear_demand(self) -> None:
        """A worker that is not the leader exports no database-wide gauge (and reads the
        demand afresh on its first scrape as the leader again)."""
        self.queue_demand.clear()
        self.oldest_ready.clear()
        self.demand_reads.forget()

    def set_listener(self, connected: bool, state: str) -> None:
        self.listener_connected.set(1 if connected else 0)
        for known in LISTENER_STATES:
            self.listener_state.labels(known).set(1 if known == state else 0)

    # --- claim loop hooks (synchronous, cheap) ------------------------------------------

    def on_round(self, queue: str, requested: int, claimed: int) -> None:
        if requested:
            self.child(self.claims, queue).inc()
        if claimed:
            self.child(self.claimed_jobs, queue).inc(claimed)

    def held(self, queue: str, result: ClaimResult) -> None:
        """A limited queue's claim: whether its global or rate limit held it back."""
        self.limited_queues.add(queue)
        self.held_by_limit.labels(queue, "global").set(1 if result.at_global_limit else 0)
        rate_held = result.rate_limited_until is not None
        self.held_by_limit.labels(queue, "rate").set(1 if rate_held else 0)

    def child(self, metric: Counter | Histogram, *labels: str) -> Any:
        """`metric.labels(*labels)`, looked up once (for the metrics updated every round)."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child


@attrs.define(eq=False)
class DemandReads:
    """When the leader's demand gauges were last read, and the read in flight: `/metrics`
    asks `read_due()` and reads only when it says so; concurrent scrapes wait for the one
    read in flight (`wait_read`) instead of starting their own."""

    max_age: float = DEMAND_CACHE_SECONDS
    _read_at: float = -math.inf
    _in_flight: trio.Event | None = None

    def read_due(self) -> bool:
        return self._in_flight is None and trio.current_time() - self._read_at >= self.max_age

    async def wait_read(self) -> None:
        """Wait for the read in flight, if any (cancel-safe: nothing is left behind)."""
        if self._in_flight is not None:
            await self._in_flight.wait()

    def forget(self) -> None:
        self._read_at = -math.inf

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Around one read: a failed, timed-out or cancelled read counts as a read too (the
        gauges keep their last values until the next window), so a database in trouble gets
        one scan per window, not one per scrape."""
        self._in_flight = done = trio.Event()
        try:
            yield
        finally:
            self._read_at = trio.current_time()
            self._in_flight = None
            done.set()


# The `le` label of each handler bucket, as prometheus-client writes it ("+Inf" last).
_HANDLER_LE: tuple[str, ...] = tuple(
    floatToGoString(bound)  # type: ignore[no-untyped-call]
    for bound in (*HANDLER_BUCKETS, float("inf"))
)


class _Durations:
    """One task's handler-duration histogram: per-bucket counts (not cumulative) and the sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(HANDLER_BUCKETS) + 1)  # the last one is +Inf
        self.total = 0.0


class JobTally:
    """Finished jobs by (queue, outcome) and handler run time by task: `trioq_job_outcomes`
    and `trioq_handler_seconds`.

    Counted in plain Python per job (a bisect and three additions, ~0.4 us; prometheus-client's
    labelled Counter.inc plus Histogram.observe take a lock each and cost ~1.8 us, a tenth of a
    no-op job's whole runtime CPU) and exposed through prometheus-client's custom-collector
    interface, which builds the same families when `/metrics` is scraped. Only the trio thread
    writes; a scrape from another thread reads ints and floats (a count may lag its sum by one
    job, as with prometheus-client's own per-value locks). The `_created` series of these two
    families are not exposed."""

    def __init__(self, lost_leases: Counter) -> None:
        self._lost_leases = lost_leases
        self._outcomes: dict[tuple[str, str], int] = {}
        self._outcomes_created: dict[tuple[str, str], float] = {}
        self._durations: dict[str, _Durations] = {}

    def ended(self, task: str, queue: str, outcome: str, seconds: float) -> None:
        """One finished execution (the claim loop calls it for every job)."""
        durations = self._durations.get(task)
        if durations is None:
            durations = self._durations[task] = _Durations()
        # `le` buckets: the first bound >= seconds (bisect_left), past the end for +Inf.
        durations.counts[bisect.bisect_left(HANDLER_BUCKETS, seconds)] += 1
        durations.total += seconds
        key = (queue, outcome)
        count = self._outcomes.get(key)
        if count is None:
            self._outcomes_created[key] = time.time()
            count = 0
        self._outcomes[key] = count + 1
        if outcome == "lost":
            self._lost_leases.inc()

    def outcome_count(self, queue: str, outcome: str) -> int:
        return self._outcomes.get((queue, outcome), 0)

    def describe(self) -> list[Metric]:
        return list(self._families(empty=True))

    def collect(self) -> Iterator[Metric]:
        return self._families(empty=False)

    def _families(self, *, empty: bool) -> Iterator[Metric]:
        outcomes = CounterMetricFamily(
            "trioq_job_outcomes",
            "Finished attempts by outcome (completed, retried, failed, cancelled, released, lost)",
            labels=["queue", "outcome"],
        )
        handler = HistogramMetricFamily(
            "trioq_handler_seconds", "Handler run time by task", labels=["task"]
        )
        if not empty:
            for key, count in list(self._outcomes.items()):
                outcomes.add_metric(key, count, created=self._outcomes_created.get(key))
            for task, durations in list(self._durations.items()):
                counts, running = list(durations.counts), 0
                buckets: list[tuple[str, float]] = []
                for le, count in zip(_HANDLER_LE, counts, strict=True):
                    running += count
                    buckets.append((le, running))
                handler.add_metric([task], buckets, durations.total)
        yield outcomes
        yield handler


# --- the driver proxy -----------------------------------------------------------------------

DriverErrorSink = Callable[[str, BaseException], None]
ClaimLatencySink = Callable[[str, float], None]


@attrs.define(eq=False)
class _InstrumentedDriver:
    """Delegates every attribute to the real driver; its coroutine methods are wrapped to
    time the claim statement and count errors and checkpoint writes. A proxy (not a subclass)
    so that driver methods added later are instrumented without edits here."""

    _inner: Driver
    _metrics: WorkerMetrics
    _on_error: DriverErrorSink | None
    _on_claim: ClaimLatencySink | None
    _on_success: Callable[[], None] | None = None
    _wrapped: dict[str, Any] = attrs.field(factory=dict)

    def __getattr__(self, name: str) -> Any:
        wrapped = self._wrapped.get(name)
        if wrapped is not None:
            return wrapped
        value = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(value):
            return value
        wrapped = self._wrap(name, value)
        self._wrapped[name] = wrapped
        return wrapped

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        metrics, on_error, on_claim = self._metrics, self._on_error, self._on_claim
        on_success = self._on_success
        is_claim = name == "job_claim"
        is_maintenance = name == "maintenance_pass"
        written = CHECKPOINTS_WRITTEN.get(name)

        @functools.wraps(method)
        async def call(*args: Any, **kwargs: Any) -> Any:
            started = trio.current_time()
            try:
                result = await method(*args, **kwargs)
            except Exception as exc:
                metrics.database_errors.labels(name).inc()
                if on_error is not None:
                    on_error(name, exc)
                raise
            if on_success is not None:
                on_success()
            if is_claim:
                queue = args[0].queue
                elapsed = trio.current_time() - started
                metrics.child(metrics.claim_statements, queue).inc()
                metrics.child(metrics.claim_seconds, queue).observe(elapsed)
                if on_claim is not None:
                    on_claim(queue, elapsed)
                if args[0].limit and (
                    result.at_global_limit
                    or result.rate_limited_until is not None
                    or queue in metrics.limited_queues
                ):
                    metrics.held(queue, result)
            elif is_maintenance:
                if result.recovered:
                    metrics.recovered_jobs.inc(len(result.recovered))
            elif written is not None:
                count = written(args[0], result)
                if count:
                    metrics.checkpoints.inc(count)
            return result

        return call


# How many new checkpoint rows each statement that writes history wrote, from its params and
# its result: every primitive's own statement, not only the step writer's (counting those alone
# left the metric short by the events, spawns and gathers of every workflow).
def _written_by_checkpoint_insert(writes: Any, result: Sequence[Any]) -> int:
    return len(result)  # only the writes that held their fence come back


def _written_by_event_wait(params: WaitEvent, result: EventWaitOutcome) -> int:
    # The first wait at a position inserts its row (the event, the timeout, or the pending
    # deadline); a replay passes the stored deadline and only updates that row.
    return int(params.deadline is None and result.state != "lost")


def _written_by_spawn(spawns: Any, result: Sequence[SpawnOutcome]) -> int:
    return sum(1 for outcome in result if outcome.created)


def _written_by_children_wait(params: WaitChildren, result: ChildrenWaitOutcome) -> int:
    return int(params.record and result.state == "done")


def _written_by_cancel_children(params: Any, result: bool) -> int:
    return int(result)


CHECKPOINTS_WRITTEN: dict[str, Callable[[Any, Any], int]] = {
    "checkpoint_insert_many": _written_by_checkpoint_insert,
    "job_wait_event": _written_by_event_wait,
    "job_spawn_many": _written_by_spawn,
    "job_wait_children": _written_by_children_wait,
    "job_cancel_children": _written_by_cancel_children,
}


def instrument_driver(
    driver: Driver,
    metrics: WorkerMetrics,
    *,
    on_error: DriverErrorSink | None = None,
    on_claim: ClaimLatencySink | None = None,
    on_success: Callable[[], None] | None = None,
) -> Driver:
    return cast(Driver, _InstrumentedDriver(driver, metrics, on_error, on_claim, on_success))


__all__ = ["WorkerMetrics", "instrument_driver"]
