"""The records of an enqueue and of a producer's reads: the rows to insert, what an insert or an
event emit returned, a job as read back. Apart from `_driver` (which re-exports them) so that
`trioq.producer` builds these few attrs classes, not the driver seam's ~60 (bench/RESULTS.md,
"Import costs")."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, overload

import attrs

from .._core.errors import JobNotFound, ValueNotSet
from .._core.states import TERMINAL_STATES


# Not slotted: its __dict__ is the fast insert's parameters as they are (trioq/_pg/inserts.py:
# a copy is 0.2 us a call, a getter over the fields and a dict of them 2.3 us), and a frozen
# attrs class with a __dict__ is also built faster (0.6 against 1.5 us a row).
@attrs.frozen(slots=False)
class NewJob:
    """One row to insert; `payload_json` is already validated and encoded by the codec."""

    queue: str
    task: str
    payload_json: str
    priority: int = 0
    run_at: datetime.datetime | None = None
    delay_seconds: float | None = None
    partition_key: str | None = None
    dedup_key: str | None = None
    max_attempts: int | None = None  # None: the task's declaration on the worker decides
    # Uniqueness (only with a dedup_key): the key is held while the job is unfinished, and also
    # in `unique_states` (finished states) for `unique_for_seconds` after enqueue (None: until
    # the job is pruned). See docs/uniqueness.md.
    unique_for_seconds: float | None = None
    unique_states: tuple[str, ...] = ()
    version: int = 1  # the handler version this job is for (the enqueuing app's highest)
    trace_context: str | None = None  # the enqueuer's W3C traceparent (the otel extra)
    # At most `concurrency_limit` jobs of one concurrency key run at once, cluster-wide (a
    # limit set for a matching pattern wins; none at all: 1). Never with a partition_key.
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    # The whole-workflow deadline: an absolute time, or seconds from the database's now; and who
    # set it ("set at enqueue", "set by task X"), for the error stored when it passes.
    deadline_at: datetime.datetime | None = None
    deadline_seconds: float | None = None
    deadline_source: str | None = None
    # Without a deadline of its own, the insert gives it the one its task's workers registered
    # (task_defaults, migration 0029). False when the enqueuing app registers the task itself:
    # its declaration decides, and the insert reads nothing.
    task_deadline: bool = True


@attrs.frozen
class NewJobs(Sequence[NewJob]):
    """The jobs of one enqueue call: each is `template` with its own payload (and dedup key).

    A `Sequence[NewJob]` (any driver can iterate it), built without a `NewJob` per row; the
    PostgreSQL driver inserts a batch without keys through its fast statement from `template`
    and `payloads` alone. `dedup_keys` is None when no job has a key; a job without a key has
    no `unique_for_seconds` or `unique_states` either (as `build_jobs` always made them).
    """

    template: NewJob  # its payload_json and dedup_key are unused
    payloads: Sequence[str]
    dedup_keys: Sequence[str | None] | None = None
    # Each payload's own concurrency key (a task's key template); None: the template's.
    concurrency_keys: Sequence[str | None] | None = None

    def __len__(self) -> int:
        return len(self.payloads)

    @overload
    def __getitem__(self, index: int) -> NewJob: ...

    @overload
    def __getitem__(self, index: slice) -> list[NewJob]: ...

    def __getitem__(self, index: int | slice) -> NewJob | list[NewJob]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        return self._job(
            self.payloads[index],
            None if self.dedup_keys is None else self.dedup_keys[index],
            self.template.concurrency_key
            if self.concurrency_keys is None
            else self.concurrency_keys[index],
        )

    def __iter__(self) -> Iterator[NewJob]:
        count = len(self.payloads)
        keys = self.dedup_keys if self.dedup_keys is not None else [None] * count
        concurrency = self.concurrency_keys
        if concurrency is None:
            concurrency = [self.template.concurrency_key] * count
        for payload, key, concurrency_key in zip(self.payloads, keys, concurrency, strict=True):
            yield self._job(payload, key, concurrency_key)

    def _job(self, payload: str, key: str | None, concurrency_key: str | None) -> NewJob:
        job, keyed = self.template, key is not None
        return NewJob(
            job.queue,
            job.task,
            payload,
            job.priority,
            job.run_at,
            job.delay_seconds,
            job.partition_key,
            key,
            job.max_attempts,
            job.unique_for_seconds if keyed else None,
            job.unique_states if keyed else (),
            job.version,
            job.trace_context,
            concurrency_key,
            job.concurrency_limit,
            job.deadline_at,
            job.deadline_seconds,
            job.deadline_source,
            job.task_deadline,
        )


@attrs.frozen
class EmitEvent:
    """Store the event `key` (the first emit wins) and wake its waiters."""

    key: str
    payload_json: str


@attrs.frozen
class MessageSend:
    """Queue a message for the job `job_id` under `topic` and wake it if it waits for it."""

    job_id: int
    topic: str
    payload_json: str


class InsertedJob(NamedTuple):
    """One inserted (or deduplicated) row. A named tuple, not a frozen attrs class: a bulk
    enqueue builds one per row, in half the time (bench/RESULTS.md, "Design decisions")."""

    id: int
    created: bool  # False when a dedup key returned an existing job


@attrs.frozen
class EventOutcome:
    """What `emit_event` did, from `Client`, `ClientTransaction`, both producers and the SQL
    function `event_emit` (its columns `emitted_first`, `woken_count`) alike."""

    first: bool  # this emit stored the payload (False: the key was emitted before)
    woken: int  # waiting jobs made ready

    def __bool__(self) -> bool:
        # `if await client.emit_event(...)` would always be true: say which field is meant.
        raise TypeError(
            "EventOutcome has no truth value: test .first (this emit stored the "
            "event) or .woken (the waiting jobs it made ready)"
        )


EmitOutcome = EventOutcome  # the drivers' name for it


@attrs.frozen
class JobRecord:
    """A whole job as the readers see it. PostgreSQL's readers build it positionally from the
    view `job_records` (migration 0036), whose columns are these fields in this order."""

    id: int
    queue: str
    task: str
    payload: Any
    state: str
    priority: int
    run_at: datetime.datetime | None  # None: waiting without a deadline
    partition_key: str | None
    dedup_key: str | None
    attempt: int
    max_attempts: int
    worker_id: uuid.UUID | None
    result: Any
    error: Any
    created_at: datetime.datetime
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    # Claims so far (migration 0019); `attempt` leaves out a workflow's suspended executions.
    executions: int = 0
    # When the whole job must be finished, and who set it (migration 0021; None: no deadline).
    deadline_at: datetime.datetime | None = None
    deadline_source: str | None = None


@attrs.frozen
class ValueRead:
    state: str | None  # the job's state (None: no such job)
    found: bool
    value: Any

    def answer(self, job_id: int, key: str, waited: float | None) -> Any:
        """The value, or the error every reader (`Client`, the producers) raises for it."""
        if self.found:
            return self.value
        if self.state is None:
            raise JobNotFound(f"job_id: no job {job_id}")
        within = "" if waited is None or self.state in TERMINAL_STATES else f" within {waited}s"
        raise ValueNotSet(f"job {job_id} ({self.state}) has not set {key!r}{within}")


@attrs.frozen
class WorkflowValue:
    key: str
    value: Any
    updated_at: datetime.datetime
