"""The driver seam: one async method per named statement, each taking one attrs params object.

`trioq._pg.driver.PgDriver` implements it on PostgreSQL, `trioq._memory.MemoryDriver` in
memory; the conformance suite in `trioq.testing` runs the same checks against both, and a test
fails when their method sets differ from `DRIVER_METHODS`.

This module holds what a job's life crosses (docs/life-of-a-job.md): the insert, the claim
loop's `job_claim` and the completer's `job_settle_many`, with their records. `Driver` adds the
statements of the workflow primitives (`workflow.py`), the worker's services (`services.py`),
schedules (`schedules.py`) and the operator (`admin.py`), each a Protocol of its own module.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import attrs

from .._core import outcomes
from .admin import AdminStatements
from .lease import Lease
from .records import EmitEvent as EmitEvent
from .records import EmitOutcome as EmitOutcome
from .records import EventOutcome as EventOutcome
from .records import InsertedJob as InsertedJob
from .records import JobRecord as JobRecord
from .records import MessageSend as MessageSend
from .records import NewJob as NewJob
from .records import NewJobs as NewJobs
from .records import ValueRead as ValueRead
from .records import WorkflowValue as WorkflowValue
from .schedules import ScheduleStatements
from .services import ServiceStatements
from .workflow import Checkpoint, WorkflowStatements

# --- params ---------------------------------------------------------------------------------

DEFAULT_KEY_WINDOW = 200
DEFAULT_PROMOTE_LIMIT = 1000


# What a settlement may record; trioq/_core/outcomes.py holds what each kind does to its row.
SETTLE_KINDS = outcomes.SETTLE_KINDS


# Not frozen (STYLE's values are): every job's outcome builds one, and a frozen slotted class
# sets each of its 8 fields through object.__setattr__ (0.73 against 0.23 us a Settlement).
# Never assigned after it is built; equality and hash are the frozen class's (`unsafe_hash`).
@attrs.define(unsafe_hash=True)
class Settlement:
    """The recorded outcome of one execution, fenced by its lease (a value: never assigned).

    `kind` is one of `SETTLE_KINDS`: complete (`result_json`), retry (`error_json`, after
    `delay_seconds`), fail / cancel (`error_json`), release (drain: attempt restored), sleep
    (until `wake_at`, attempt restored, key kept), wait (until `wake_at` or, when None, until
    woken; attempt restored, key kept). `wake_at` is database time.
    """

    lease: Lease
    kind: str
    result_json: str | None = None
    error_json: str | None = None
    delay_seconds: float | None = None
    wake_at: datetime.datetime | None = None
    # The execution's job has no partition key and no parent (`ClaimedJob.plain`): its
    # completion releases no key and wakes no parent, so a driver may write it with a leaner
    # statement. False (the default) is always safe.
    plain: bool = False
    # False: a completion that deletes the job instead of keeping it (its task's `keep=False`;
    # never for a job with a parent, whose parent reads the outcome). Only for kind complete.
    keep: bool = True

    def __attrs_post_init__(self) -> None:
        if self.kind == "complete" and self.result_json is not None:
            return  # nearly every settlement: valid, and the rest of the checks cannot fail
        if not self.keep and self.kind != "complete":
            raise ValueError(f"a {self.kind} settlement is always kept (keep=False completes)")
        if self.kind not in SETTLE_KINDS:
            raise ValueError(f"settlement kind {self.kind!r} is not one of {sorted(SETTLE_KINDS)}")
        if self.kind == "complete" and self.result_json is None:
            raise ValueError("a complete settlement needs result_json")
        if self.kind in ("retry", "fail", "cancel") and self.error_json is None:
            raise ValueError(f"a {self.kind} settlement needs error_json")
        if self.kind == "retry" and self.delay_seconds is None:
            raise ValueError("a retry settlement needs delay_seconds")
        if self.kind == "sleep" and self.wake_at is None:
            raise ValueError("a sleep settlement needs wake_at")


@attrs.frozen
class Claim:
    """The claim loop's claim of up to `limit` ready jobs of `queue` (outcomes are not part of
    it: the completer writes them with `job_settle_many`)."""

    queue: str
    tasks: tuple[str, ...]
    limit: int
    lease_seconds: float
    worker_id: uuid.UUID
    key_cursor: str = ""  # partition keys: continue the round-robin after this key
    key_window: int = DEFAULT_KEY_WINDOW  # each kind of key: visit at most this many per claim
    concurrency_cursor: str = ""  # concurrency keys: continue the round-robin after this key
    # 'task@version' pairs this worker serves; None: any version of `tasks` (older callers).
    task_versions: tuple[str, ...] | None = None
    promote_limit: int = DEFAULT_PROMOTE_LIMIT  # due rows made ready per statement
    # Unkeyed sleeping or scheduled rows due within this many seconds are claimed early: the
    # executor holds them until their run_at, so they start on time instead of a statement and
    # a batch start-up late (0: only rows already due).
    lookahead_seconds: float = 0.0
    # The claiming worker traces its executions: their spans' trace ids are the lease tokens
    # (_seam/tracing.py), so a lost attempt's row can carry one (jobs.traced, migration 0022).
    traced: bool = False
    # The caller's choice, from the queue's last claim (`ClaimResult.plain_next`): try the
    # lean claim of unkeyed ready rows first. A driver claims exactly what the full claim would
    # either way (PgDriver falls back to it when keyed or due work shows up).
    plain: bool = False


# --- records --------------------------------------------------------------------------------


# Not frozen (STYLE's values are): a worker builds one per claimed job, and a frozen slotted
# class sets each of its 17 fields through object.__setattr__ (1.69 against 0.40 us a job, its
# Lease included). Never assigned after it is built; equality and hash are the frozen class's
# (`unsafe_hash`: by value, `lease` left out as before).
@attrs.define(unsafe_hash=True)
class ClaimedJob:
    """A job a claim took: its row as the handler sees it (a value: never assigned)."""

    id: int
    queue: str
    task: str
    payload: Any
    attempt: int
    max_attempts: int | None  # None: the task's declaration decides (Run.max_attempts)
    lease_token: uuid.UUID
    partition_key: str | None
    priority: int
    run_at: datetime.datetime
    created_at: datetime.datetime
    cancel_requested: bool
    version: int = 1
    history: tuple[Checkpoint, ...] = ()  # loaded by the claim when the job has any
    parent_id: int | None = None  # the workflow that spawned this job as a child
    concurrency_key: str | None = None  # its slot is released when it stops running
    # Built with the job (every claimed job's outcome carries it): a cached_property on this
    # slotted class cost more on first use than building it here.
    lease: Lease = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self.lease = Lease(self.id, self.attempt, self.lease_token)

    @property
    def plain(self) -> bool:
        """No partition key and no parent: settling it touches only its own row."""
        return self.partition_key is None and self.parent_id is None


@attrs.frozen
class ClaimResult:
    claimed: tuple[ClaimedJob, ...]
    now: datetime.datetime  # database time as the statement ended
    next_due: datetime.datetime | None = None  # the queue's next scheduled/sleeping/waiting run_at
    promoted: int = 0  # due rows this statement made ready (claimable from the next one)
    key_cursor: str | None = None  # the last partition key visited (None: no keyed work)
    # Keys the claim looked at, the larger of the two kinds (== key_window: a window was full).
    keys_visited: int = 0
    concurrency_cursor: str | None = None  # the last concurrency key visited
    # trio's clock when the reply arrived, before its rows were decoded (None: not measured;
    # the caller takes its own clock). The pair (now, replied_at) maps database time to trio's.
    replied_at: float | None = None
    # The queue's rate limit allows no start before this (database time; None: no rate limit
    # holds the claim back). The claim loop sleeps until then instead of asking again.
    rate_limited_until: datetime.datetime | None = None
    # The queue's global limit held this claim back (it claimed fewer than it asked for).
    at_global_limit: bool = False
    # A concurrency key's rate held some of its ready jobs back: its next start is allowed from
    # then (database time; the earliest among such keys). Other keys and slots are unaffected:
    # the claim loop's timer follows it, as it follows next_due.
    key_rate_limited_until: datetime.datetime | None = None
    # This claim saw no keyed or due work: the next may be a plain one (`Claim.plain`).
    plain_next: bool = False


@attrs.frozen
class SettleResult:
    settled: tuple[tuple[int, str], ...]  # (job id, new state) of each settlement that held
    now: datetime.datetime  # database time as the statement ended
    # The earliest new run_at of the rows suspended or scheduled by these outcomes (the claim
    # loop's timer takes it: a claim sent before this commit could not see them).
    next_due: datetime.datetime | None = None
    replied_at: float | None = None  # trio's clock when the reply arrived (None: not measured)

    @property
    def settled_ids(self) -> tuple[int, ...]:
        return tuple(job_id for job_id, _ in self.settled)


@attrs.frozen
class DriverStatistics:
    """Statement counts by name since the driver opened (tests and the benchmark read these)."""

    calls: Mapping[str, int]


NotifyCallback = Callable[[str, str], None]


# --- the protocol ---------------------------------------------------------------------------


class Listener(Protocol):
    @property
    def connected(self) -> bool: ...

    async def listen(self, channel: str) -> None: ...

    async def unlisten(self, channel: str) -> None: ...


class Transaction(Protocol):
    """A caller's transaction: their own SQL and trioq's enqueue commit or roll back together."""

    async def execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> None: ...

    async def fetch(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> list[tuple[Any, ...]]: ...

    async def job_insert_many(self, jobs: Sequence[NewJob]) -> list[InsertedJob]: ...

    async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
        """Settle running jobs (fenced) inside this transaction, with the completer's settle
        statement: the settlement commits with the caller's writes or not at all (a handler's
        transactional completion). `settled`: (id, new state) of the rows whose fence held."""
        ...

    async def event_emit(self, params: EmitEvent) -> EmitOutcome: ...


class Driver(WorkflowStatements, ServiceStatements, ScheduleStatements, AdminStatements, Protocol):
    schema: str

    def statistics(self) -> DriverStatistics: ...

    async def job_insert_many(self, jobs: Sequence[NewJob]) -> list[InsertedJob]: ...

    def is_connection_lost(self, exc: BaseException) -> bool:
        """True when `exc` means the database connection was lost (retry later), not a bug."""
        ...

    def is_transient(self, exc: BaseException) -> bool:
        """True when the database rolled the statement back whole for a reason that passes (a
        statement or lock timeout, a deadlock): send it again later; not a bug."""
        ...

    async def job_claim(self, params: Claim) -> ClaimResult:
        """The claim loop's claim: promote the queue's due work and claim up to `limit` ready
        jobs (fewer when a queue limit, a key or its limit holds them back). Not retried here:
        a claim whose reply was lost may have committed (its rows then wait for lease recovery)."""
        ...

    async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
        """The completer's flush: record finished executions' outcomes, fenced, in one statement
        (their keys released, history written, waiters and parents woken, ready rows'
        queues notified). Not retried here: the completer keeps the batch and writes it again
        (fenced: a batch that committed is not applied twice)."""
        ...

    async def job_get(self, job_id: int) -> JobRecord | None: ...

    async def job_result_watch(self, job_id: int) -> None:
        """Register interest in the job's final state before reading it: its result channel is
        notified when it ends only if somebody registered (queries.sql, job_result_watch)."""
        ...

    async def event_emit(self, params: EmitEvent) -> EmitOutcome: ...

    def queue_limits_changed(self, queue: str | None) -> None:
        """A 'limits:QUEUE' control notification arrived (None: the listener reconnected and
        may have missed some): the driver reads the queue's limits again at its next claim."""

    def queue_limits_notified(self, live: bool) -> None:
        """Whether this process's listener receives notifications (its self-probe arrived):
        then limit changes arrive as notifications instead of being polled for."""

    async def notify_send(self, channel: str, payload: str) -> None: ...

    async def job_trace_context(self, job_id: int) -> str | None: ...

    def transaction(self) -> AbstractAsyncContextManager[Transaction]: ...

    def open_listener(
        self, on_notify: NotifyCallback, on_reconnect: Callable[[], None]
    ) -> AbstractAsyncContextManager[Listener]: ...


# Every statement method of `Driver`, its own and its bases' (the Protocols of this package).
DRIVER_METHODS = frozenset(
    name
    for protocol in Driver.__mro__
    if protocol.__module__.startswith(__package__ or "trioq._seam")
    for name in vars(protocol)
    if not name.startswith("_") and name != "schema"
)

__all__ = ["DRIVER_METHODS", "AsyncIterator", "Driver"]
