"""The memory driver's tables and row types, shared by every module of `_memory/`.

`MemoryState` is the whole database of one `MemoryDriver`: the job rows and their indexes, the
attempts, checkpoints, events, messages, values, schedules, workers, the leader seat, the paused
queues and the listeners. `driver.py`, `waits.py` and `messages.py` are functions and methods
over one state; none of them imports another, so this module is the only shared dependency.
"""

from __future__ import annotations

import collections
import datetime
import itertools
import json
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import trio

from .._core.channels import CHANNEL_SHARDS, result_channel
from .._core.deadlines import SET_AT_ENQUEUE, own_deadline
from .._core.identifiers import validate_key, validate_name
from .._core.limits import Rate
from .._core.retry import DEFAULT_MAX_ATTEMPTS, applied_max_attempts
from .._core.states import SUSPENDED_STATES, TERMINAL_STATES, JobState
from .._seam.admin import AttemptRecord, ConcurrencyLimit, ConcurrencyRate
from .._seam.driver import NewJob
from .._seam.lease import Lease
from .._seam.services import WorkerRegistration
from .schedules import ScheduleTable

EPOCH = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
"""The memory clock's zero: `clock()` seconds after this instant is "now"."""

FINISHED_STATES = TERMINAL_STATES
SUSPENDED_OR_SCHEDULED = SUSPENDED_STATES | {JobState.SCHEDULED}
SECOND = datetime.timedelta(seconds=1)


@attrs.define(eq=False)
class QueueLimitRow:
    """One queue's cluster-wide limits; `recent_starts` is the rate's log, oldest first."""

    global_limit: int | None = None
    rate: Rate | None = None
    recent_starts: tuple[datetime.datetime, ...] = ()


@attrs.define(eq=False)
class Row:
    """One job, mutable; JSON columns are kept as text so every read returns fresh objects."""

    id: int
    queue: str
    task: str
    payload_json: str
    priority: int
    run_at: datetime.datetime | None
    partition_key: str | None
    dedup_key: str | None
    max_attempts: int | None  # None: the task's declaration decides (task_defaults)
    created_at: datetime.datetime
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    unique_states: tuple[str, ...] = ()
    unique_until: datetime.datetime | None = None
    state: str = "ready"
    checkpoint_count: int = 0
    attempt: int = 0
    executions: int = 0
    lease_token: uuid.UUID | None = None
    traced: bool = False  # migration 0022: the claiming worker traces (its span id = the token)
    lease_expires_at: datetime.datetime | None = None
    worker_id: uuid.UUID | None = None
    cancel_requested: bool = False
    result_json: str | None = None
    error_json: str | None = None
    started_at: datetime.datetime | None = None
    finished_at: datetime.datetime | None = None
    trace_context: str | None = None
    version: int = 1  # the handler version the job was enqueued for
    # events and children (migration 0003)
    parent_id: int | None = None
    parent_position: int | None = None
    wait_event_key: str | None = None
    wait_children: tuple[int, ...] | None = None
    children_settled: int = 0
    on_parent_cancel: str = "cancel"  # migration 0017: cancel, abandon or wait
    wait_topic: str | None = None  # messages (migration 0016)
    wait_position: int | None = None  # the suspended receive's position (migration 0025)
    deadline_at: datetime.datetime | None = None  # migration 0021
    deadline_source: str | None = None
    result_watched: bool = False  # migration 0031: a waiter registered (job_result_watch)

    @property
    def claim_order(self) -> tuple[int, datetime.datetime, int]:
        assert self.run_at is not None  # only ready rows are ordered, and they are due
        return (self.priority, self.run_at, self.id)

    def holds(self, lease: Lease) -> bool:
        """The fence every write after a claim passes through."""
        return (
            self.state == "running"
            and self.attempt == lease.attempt
            and self.lease_token == lease.lease_token
        )

    def holds_key(self, now: datetime.datetime) -> bool:
        """Whether this row still holds its dedup key (the `released` CTE's condition)."""
        if self.state not in FINISHED_STATES:
            return True
        return self.state in self.unique_states and (
            self.unique_until is None or self.unique_until > now
        )

    def end_lease(self) -> None:
        self.lease_token = None
        self.lease_expires_at = None


@attrs.define(eq=False)
class Worker:
    registration: WorkerRegistration
    started_at: datetime.datetime
    heartbeat_at: datetime.datetime
    state: str = "running"
    admission: dict[str, dict[str, Any]] | None = None  # the heartbeat's snapshot (0008)


@attrs.frozen
class LeaderSeat:
    leader_id: uuid.UUID
    scheduler: bool
    elected_at: datetime.datetime
    expires_at: datetime.datetime


@attrs.define
class EventRow:
    """One row of the events table (`emitted_at` None: only waited for so far)."""

    payload_json: str | None
    emitted_at: datetime.datetime | None
    created_at: datetime.datetime


@attrs.define
class MessageTable:
    """The messages and workflow_values tables."""

    # job id -> topic -> [(message id, payload JSON)] in send order
    queued: dict[int, dict[str, list[tuple[int, str]]]] = attrs.field(factory=dict)
    # job id -> key -> (value JSON, updated_at)
    values: dict[int, dict[str, tuple[str, datetime.datetime]]] = attrs.field(factory=dict)
    ids: Any = attrs.field(factory=lambda: itertools.count(1))

    def forget(self, job_id: int) -> None:
        """ON DELETE CASCADE from the job row."""
        self.queued.pop(job_id, None)
        self.values.pop(job_id, None)


@attrs.define(eq=False)
class Outbox:
    """The notifications of one commit; Postgres collapses identical (channel, payload) pairs."""

    items: dict[tuple[str, str], None] = attrs.field(factory=dict)

    def add(self, channel: str, payload: str) -> None:
        self.items[(channel, payload)] = None

    def add_grouped(self, ids: Iterable[int], channel_of: Callable[[int], str]) -> None:
        """One notification per channel, its payload the comma-joined ids (job results)."""
        by_channel: dict[str, list[str]] = collections.defaultdict(list)
        for job_id in ids:
            by_channel[channel_of(job_id)].append(str(job_id))
        for channel, id_texts in by_channel.items():
            self.add(channel, ",".join(id_texts))


@attrs.define(eq=False)
class MemoryListener:
    """A listener on the memory driver; it never disconnects, so `on_reconnect` never runs."""

    _send: trio.MemorySendChannel[tuple[str, str]]
    _channels: set[str] = attrs.field(factory=set)

    @property
    def connected(self) -> bool:
        return True

    async def listen(self, channel: str) -> None:
        """Subscribe; notifications committed after this returns are delivered."""
        await trio.lowlevel.checkpoint()
        self._channels.add(channel)

    async def unlisten(self, channel: str) -> None:
        await trio.lowlevel.checkpoint()
        self._channels.discard(channel)

    def offer(self, channel: str, payload: str) -> None:
        if channel in self._channels:
            self._send.send_nowait((channel, payload))


@attrs.define(eq=False)
class MemoryState:
    """Every table of one memory database, and the few rules more than one module applies."""

    schema: str
    clock: Callable[[], float]
    rows: dict[int, Row] = attrs.field(factory=dict)
    open_by_queue: dict[str, set[int]] = attrs.field(factory=dict)
    dedup: dict[str, int] = attrs.field(factory=dict)
    # dedup key -> (the reserving transaction's end event, job id): a key enqueued in an open
    # transaction, which other enqueues of that key wait for
    reserved: dict[str, tuple[trio.Event, int]] = attrs.field(factory=dict)
    attempts: dict[int, list[AttemptRecord]] = attrs.field(factory=dict)
    # job id -> position -> (kind, name, value JSON): the checkpoints table
    checkpoints: dict[int, dict[int, tuple[str, str, str | None]]] = attrs.field(factory=dict)
    # (queue, partition key) -> the job holding it: the partition_locks table
    key_locks: dict[tuple[str, str], int] = attrs.field(factory=dict)
    # event key -> (payload JSON, emitted_at; None: only waited for): the events table
    events: dict[str, EventRow] = attrs.field(factory=dict)
    workers: dict[uuid.UUID, Worker] = attrs.field(factory=dict)
    # (task, version) -> max_attempts, as workers register them (the task_defaults table)
    task_defaults: dict[tuple[str, int], int] = attrs.field(factory=dict)
    # (task, version) -> its deadline in seconds, as workers register them (migration 0029)
    task_deadlines: dict[tuple[str, int], float] = attrs.field(factory=dict)
    paused: dict[str, datetime.datetime] = attrs.field(factory=dict)
    # pattern -> its limit: the concurrency_limits table (migration 0027)
    concurrency_limits: dict[str, ConcurrencyLimit] = attrs.field(factory=dict)
    # pattern -> its rate: the concurrency_rates table (migration 0028)
    concurrency_rates: dict[str, ConcurrencyRate] = attrs.field(factory=dict)
    # key -> its newest start times, oldest first (the SQL spreads them over slot rows, for
    # its racing claimers: concurrency_rate_starts; one claim at a time needs only the log)
    key_starts: dict[str, tuple[datetime.datetime, ...]] = attrs.field(factory=dict)
    # queue -> its cluster-wide limits (the queue_limits table, migration 0023)
    limits: dict[str, QueueLimitRow] = attrs.field(factory=dict)
    listeners: set[MemoryListener] = attrs.field(factory=set)
    ids: Iterator[int] = attrs.field(factory=lambda: itertools.count(1))
    migrated: bool = False
    calls: collections.Counter[str] = attrs.field(factory=collections.Counter)
    schedules: ScheduleTable = attrs.field(factory=ScheduleTable)
    leader: LeaderSeat | None = None  # the leader table
    # the messages and workflow_values tables (migration 0016)
    messages: MessageTable = attrs.field(factory=MessageTable)

    def now(self) -> datetime.datetime:
        return EPOCH + datetime.timedelta(seconds=self.clock())

    async def statement(self, name: str) -> datetime.datetime:
        """Checkpoint, count the statement by its queries.sql name and return its `now`."""
        await trio.lowlevel.checkpoint()
        self.calls[name] += 1
        return self.now()

    def deliver(self, outbox: Outbox) -> None:
        for channel, payload in outbox.items:
            for listener in self.listeners:
                listener.offer(channel, payload)

    def ready_channel(self, queue: str) -> str:
        return f"{self.schema}_ready_{zlib.crc32(queue.encode()) % CHANNEL_SHARDS}"

    def result_channel(self, job_id: int) -> str:
        return result_channel(self.schema, job_id)

    def announce_results(self, rows: Iterable[Row], outbox: Outbox) -> None:
        """The result notifications of the final rows a waiter registered for (the settle,
        plain completion and recovery statements' rule)."""
        watched = (row.id for row in rows if row.state in FINISHED_STATES and row.result_watched)
        outbox.add_grouped(watched, self.result_channel)

    def owned(self, lease: Lease) -> Row | None:
        """The row `lease` still holds, else None (the fence of every write after a claim)."""
        row = self.rows.get(lease.id)
        return row if row is not None and row.holds(lease) else None

    def max_attempts(self, row: Row) -> int:
        """The row's max_attempts, else its task's registered declaration, else 5."""
        declared = self.task_defaults.get((row.task, row.version), DEFAULT_MAX_ATTEMPTS)
        return applied_max_attempts(row.max_attempts, declared)

    def task_deadline(self, job: NewJob) -> float | None:
        """The deadline, in seconds, the workers of `job`'s (task, version) registered, when
        the enqueuer asks for it (`NewJob.task_deadline`)."""
        return self.task_deadlines.get((job.task, job.version)) if job.task_deadline else None

    def finish(self, row: Row, state: str, now: datetime.datetime) -> None:
        row.state = state
        row.finished_at = now
        row.end_lease()
        self.unlock_partition(row)
        self.open_by_queue[row.queue].discard(row.id)

    def unlock_partition(self, row: Row) -> None:
        if row.partition_key is None:
            return
        key = (row.queue, row.partition_key)
        if self.key_locks.get(key) == row.id:
            del self.key_locks[key]

    def commit_rows(self, rows: Iterable[Row]) -> None:
        """Make inserted rows visible, and wake their queues, as their commit does."""
        outbox = Outbox()
        for row in rows:
            self.rows[row.id] = row
            self.open_by_queue.setdefault(row.queue, set()).add(row.id)
            if row.dedup_key is not None:
                self.dedup[row.dedup_key] = row.id
            # A delayed job wakes its queue too: the round finds it not due and sets its timer
            # to the job's run_at (as the SQL does).
            outbox.add(self.ready_channel(row.queue), row.queue)
        self.deliver(outbox)


def validate_new_job(job: NewJob) -> None:
    validate_name("queue", job.queue)
    validate_name("task", job.task)
    validate_key("partition_key", job.partition_key)
    validate_key("dedup_key", job.dedup_key)
    validate_key("concurrency_key", job.concurrency_key)
    if job.partition_key is not None and job.concurrency_key is not None:
        raise ValueError("concurrency_key: give a partition_key or a concurrency_key, not both")
    if job.max_attempts is not None and job.max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    json.loads(job.payload_json)


# NewJob's fields a row stores as they are (the others are derived in `new_row`): a field added
# to both is stored without a line here.
_STORED_AS_GIVEN = tuple(
    field.name
    for field in attrs.fields(NewJob)
    if field.name in attrs.fields_dict(Row)
    and field.name not in {"run_at", "deadline_at", "deadline_source"}
)


def new_row(
    job_id: int, job: NewJob, now: datetime.datetime, task_deadline: float | None = None
) -> Row:
    """The row an insert writes; `task_deadline` is the task's registered deadline in seconds
    (task_defaults), for a job without one of its own. Derived as queries.sql's job_insert
    derives them: the due time and state, the key's hold, the deadline."""
    if job.run_at is not None:
        run_at = job.run_at if job.run_at.tzinfo else job.run_at.replace(tzinfo=datetime.UTC)
    else:
        run_at = now + (job.delay_seconds or 0.0) * SECOND
    deadline = own_deadline(
        job.deadline_at, job.deadline_seconds, job.deadline_source, job.task, task_deadline, now
    )
    return Row(
        id=job_id,
        **{name: getattr(job, name) for name in _STORED_AS_GIVEN},
        run_at=run_at,
        created_at=now,
        unique_until=None
        if job.unique_for_seconds is None or job.dedup_key is None
        else now + job.unique_for_seconds * SECOND,
        state="scheduled" if run_at > now else "ready",
        deadline_at=None if deadline is None else deadline.at,
        deadline_source=None if deadline is None else deadline.source,
    )


def deadline_error(row: Row) -> str:
    """deadline_error() (migration 0021): the stored error of a job whose deadline passed."""
    assert row.deadline_at is not None
    at = row.deadline_at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    source = row.deadline_source or SET_AT_ENQUEUE
    return json.dumps(
        {"type": "DeadlineExceeded", "message": f"deadline passed at {at} ({source})"}
    )


def before(moment: datetime.datetime | None, limit: datetime.datetime) -> bool:
    return moment is not None and moment < limit


def before_or_at(moment: datetime.datetime | None, limit: datetime.datetime) -> bool:
    return moment is not None and moment <= limit


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
