"""The seam's operator statements: the schema's migrations, and the reads and writes of the
CLI, the dashboard and `Client`'s inspection (job lists, status, limits, cancel, retry, purge).
None of them is on a job's way from enqueue to its outcome (docs/life-of-a-job.md).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs

from .._core.explain import ExplainFacts
from .._core.limits import Rate
from .._core.states import TERMINAL_STATES
from .records import JobRecord
from .services import QueueAdmission
from .workflow import Checkpoint


@attrs.frozen
class JobFilter:
    """Which jobs `job_list` returns (None: any), newest first, keyset-paged by `before_id`."""

    states: tuple[str, ...] | None = None
    tasks: tuple[str, ...] | None = None
    queues: tuple[str, ...] | None = None
    partition_key: str | None = None
    older_than_seconds: float | None = None  # created more than this long ago
    before_id: int | None = None  # the page after the one that ended with this id
    limit: int = 50


@attrs.frozen
class JobPurge:
    """Which finished jobs `job_purge` deletes: at most `limit` per call, oldest first."""

    states: tuple[str, ...]
    older_than_seconds: float
    tasks: tuple[str, ...] | None = None
    queues: tuple[str, ...] | None = None
    limit: int = 1000

    @property
    def whole_days(self) -> bool:
        """Whether every finished job older than the cutoff goes (every final state, no task
        or queue named): then whole days older than it are dropped first, as retention drops
        them (trioq/_core/retention.py), and only the rest is deleted row by row."""
        return set(self.states) >= TERMINAL_STATES and self.tasks is None and self.queues is None


@attrs.frozen
class CancelJob:
    """Cancel `id` and its descendants; `tree`: every descendant, whatever its spawn's
    `on_parent_cancel` policy."""

    id: int
    tree: bool = False


@attrs.frozen
class WorkflowFilter:
    states: tuple[str, ...] | None = None  # of running, sleeping, waiting (None: all three)
    tasks: tuple[str, ...] | None = None
    before_id: int | None = None
    limit: int = 50


@attrs.frozen
class CancelOutcome:
    previous_state: str
    state: str


@attrs.frozen
class Descendant:
    id: int
    state: str


@attrs.frozen
class AttemptRecord:
    attempt: int
    outcome: str
    error_type: str | None
    error_message: str | None
    traceback: str | None
    worker_id: uuid.UUID | None
    started_at: datetime.datetime | None
    finished_at: datetime.datetime
    trace_id: str | None = None  # the execution's trace id (the otel extra, when configured)


@attrs.frozen
class QueueStatus:
    queue: str
    ready: int
    scheduled: int
    running: int
    expired_leases: int
    completed: int
    failed: int
    cancelled: int
    oldest_ready_seconds: float | None
    sleeping: int = 0
    waiting: int = 0


@attrs.frozen
class TaskStatus:
    """How many jobs of one (queue, task, version) are in one state."""

    queue: str
    task: str
    version: int
    state: str
    jobs: int
    retried: int  # of those, jobs that needed more than one attempt


@attrs.frozen
class TaskHistoryKind:
    """How many jobs of `task` recorded at least one checkpoint of `kind`."""

    task: str
    kind: str
    jobs: int


@attrs.frozen
class UnroutableJobs:
    """Jobs waiting to run (not running, not final) that no live worker serves: none of the
    workers that heartbeat recently serves this (queue, task, version)."""

    queue: str
    task: str
    version: int
    jobs: int
    states: tuple[str, ...]


@attrs.frozen
class QueueDemand:
    """One queue's demand (`queue_demand()`): the replica-scaling signal."""

    queue: str
    ready: int
    oldest_ready_seconds: float | None
    running: int
    scheduled: int
    sleeping: int
    waiting: int
    due_now: int  # ready, plus future work whose time has come but is not promoted yet


@attrs.frozen
class HealthReport:
    """`trioq status`'s incident health list (counts) and database pressure figures. The
    database figures are None on a driver without a server (the in-memory one)."""

    ready_backlog: int
    expired_ownership: int  # running rows whose lease has expired, not recovered yet
    sleeping_due: int  # sleeping work whose wake-up time has passed, not promoted yet
    stale_running: int  # running rows whose worker has no live heartbeat
    active_waits: int
    due_wait_timeouts: int
    waiting_locks: int | None = None  # pg_locks not granted
    deadlocks: int | None = None  # pg_stat_database, since the statistics reset
    backends: Mapping[str, int] = attrs.field(factory=dict)  # this database's, by state
    lock_waits: int | None = None  # backends waiting on a lock
    cache_hit_ratio: float | None = None
    jobs_table_bytes: int | None = None
    jobs_index_bytes: int | None = None
    dead_tuples: int | None = None
    live_tuples: int | None = None
    last_autovacuum: datetime.datetime | None = None


@attrs.frozen
class WorkerInfo:
    id: uuid.UUID
    hostname: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    state: str
    started_at: datetime.datetime
    heartbeat_at: datetime.datetime
    running: int
    task_versions: tuple[str, ...] = ()
    # The queues whose effective limit this worker's admission control reduced, as its last
    # heartbeat wrote them (migration 0008); `reduced_for_seconds` as of this read.
    admission: tuple[QueueAdmission, ...] = ()
    # The slots of each queue in `queues`, in order (migration 0018; empty for older rows).
    queue_concurrency: tuple[int, ...] = ()
    # The longest gap it promised between heartbeats (None: registered by an older version),
    # and the age of its last heartbeat as of this read (database time).
    heartbeat_seconds: float | None = None
    heartbeat_age_seconds: float | None = None

    def slots(self, queue: str) -> int:
        """This worker's slots for `queue` (its total for a row from before per-queue slots)."""
        if self.queue_concurrency and queue in self.queues:
            return self.queue_concurrency[self.queues.index(queue)]
        return self.concurrency


@attrs.frozen
class QueueLimitSet:
    """`trioq queue limit` / `trioq queue rate`: change one or both of a queue's cluster-wide
    limits (`set_limit`/`set_rate` say which; a None value removes that limit). A queue left
    with neither has no row, and its claim pays nothing for limits."""

    queue: str
    set_limit: bool = False
    global_limit: int | None = None
    set_rate: bool = False
    rate: Rate | None = None


@attrs.frozen
class QueueLimit:
    """A queue's cluster-wide limits and where it stands against them now."""

    queue: str
    global_limit: int | None
    rate: Rate | None
    running: int  # the queue's running jobs, across workers
    recent_starts: int  # starts within the rate's current window (0 without a rate)
    rate_limited_until: datetime.datetime | None  # no start before this (None: one may start)


@attrs.frozen
class QueuePause:
    queue: str
    paused_at: datetime.datetime


@attrs.frozen
class ConcurrencyLimit:
    """A limit set for a concurrency key or a `prefix*` pattern (concurrency_limits)."""

    pattern: str
    max_running: int
    updated_at: datetime.datetime


@attrs.frozen
class ConcurrencyRate:
    """A rate set for a concurrency key or a `prefix*` pattern (concurrency_rates)."""

    pattern: str
    rate: Rate
    updated_at: datetime.datetime


@attrs.frozen
class KeyRateStatus:
    """A rated key with starts in its window now, and when the next is allowed (None: now)."""

    key: str
    rate: Rate
    recent_starts: int
    rate_limited_until: datetime.datetime | None


@attrs.frozen
class ConcurrencyKeyStatus:
    """A concurrency key with running jobs: how many, and the limit that applies to it."""

    key: str
    running: int
    limit: int

    @property
    def saturated(self) -> bool:
        return self.running >= self.limit


@attrs.frozen
class WorkflowRecord:
    """One unfinished workflow and what it waits on (`trioq workflows`)."""

    id: int
    task: str
    queue: str
    state: str  # running, sleeping or waiting
    run_at: datetime.datetime | None  # sleeping: the wake time; waiting: the deadline
    checkpoints: int
    wait_event_key: str | None
    wait_topic: str | None
    waits_for_children: bool
    children_settled: int
    children_total: int | None
    created_at: datetime.datetime


class AdminStatements(Protocol):
    """Migrations and the operator's statements, part of `Driver`."""

    async def migrate(self) -> list[int]: ...

    async def job_cancel(self, job_id: int) -> CancelOutcome | None: ...

    async def job_attempts(self, job_id: int) -> list[AttemptRecord]: ...

    async def job_list(self, params: JobFilter) -> list[JobRecord]: ...

    async def checkpoint_list(self, job_id: int) -> list[Checkpoint]: ...

    async def job_retry(self, job_id: int) -> CancelOutcome | None: ...

    async def job_purge(self, params: JobPurge) -> int: ...

    async def queue_pause(self, queue: str) -> bool: ...

    async def queue_resume(self, queue: str) -> bool: ...

    async def queue_pause_list(self) -> list[QueuePause]: ...

    async def concurrency_limit_set(self, pattern: str, max_running: int | None) -> bool: ...

    async def concurrency_limit_list(self) -> list[ConcurrencyLimit]: ...

    async def concurrency_key_status(
        self, keys: Sequence[str] | None = None
    ) -> list[ConcurrencyKeyStatus]: ...

    async def concurrency_rate_set(self, pattern: str, rate: Rate | None) -> bool: ...

    async def concurrency_rate_list(self) -> list[ConcurrencyRate]: ...

    async def concurrency_rate_status(self) -> list[KeyRateStatus]: ...

    async def queue_limit_set(self, params: QueueLimitSet) -> None: ...

    async def queue_limit_list(self) -> list[QueueLimit]: ...

    async def queue_status(self) -> list[QueueStatus]: ...

    async def worker_list(self) -> list[WorkerInfo]: ...

    async def queue_demand(self) -> list[QueueDemand]: ...

    async def job_explain(self, job_id: int) -> ExplainFacts | None: ...

    async def status_health(self) -> HealthReport: ...

    async def task_status(self) -> list[TaskStatus]: ...

    async def task_history_kinds(self) -> list[TaskHistoryKind]: ...

    async def job_unroutable(self, stale_seconds: float = 120.0) -> list[UnroutableJobs]: ...

    async def workflow_list(self, params: WorkflowFilter) -> list[WorkflowRecord]: ...

    async def job_cancel_with(self, params: CancelJob) -> CancelOutcome | None: ...

    async def job_descendants(self, job_id: int) -> list[Descendant]:
        """Every descendant of the job (children, their children, ...) with its state, by id:
        `trioq cancel --tree` reads them before and after to say what it cancelled."""
        ...
