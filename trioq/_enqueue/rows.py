"""What every producer shares: task declarations, enqueue options, and the one validation and
encoding path from (task, payloads, options) to the batch the insert statements write
(`job_insert_batch` without dedup keys, else `job_insert_many`).

The trio `Client`, the sync and asyncio producers (`trioq.producer`) and the test helpers all
build their rows here, so a payload or option refused by one is refused by all, with the same
message, before any SQL runs.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from .._core import codec
from .._core import concurrency as concurrency_keys
from .._core.errors import JobFinished, JobNotFound, PayloadError, UnknownTask
from .._core.identifiers import validate_job_id, validate_key, validate_name
from .._core.states import TERMINAL_IN_ORDER, UNFINISHED_IN_ORDER, JobState
from .._seam.records import EmitEvent, EventOutcome, InsertedJob, MessageSend, NewJob, NewJobs
from .._seam.tracing import current_traceparent

if TYPE_CHECKING:
    from .._seam.driver import Transaction

# A bound well inside PostgreSQL's interval and timestamptz ranges: a larger delay would fail in
# SQL ("interval out of range"), aborting the caller's transaction.
MAX_DELAY_SECONDS = 100 * 366 * 86400.0
FINISHED_STATES = TERMINAL_IN_ORDER
UNFINISHED_STATES = UNFINISHED_IN_ORDER
# With `unique_for` and no `unique_states`, a key stays taken by a *completed* job for the
# period (Oban's default too): a failed or cancelled job never blocks doing the work again.
DEFAULT_UNIQUE_FOR_STATES = (JobState.COMPLETED,)
NO_UNIQUE_STATES: tuple[str, ...] = ()


class TaskLike(Protocol):
    """What enqueueing needs to know about a task (a `TaskDeclaration` or a registered task)."""

    @property
    def name(self) -> str: ...

    @property
    def queue(self) -> str: ...

    @property
    def max_attempts(self) -> int | None: ...

    @property
    def payload_type(self) -> Any: ...


@attrs.frozen
class TaskDeclaration:
    """A task's name, queue and defaults without its handler.

    Declare it once in a module both sides import: the worker registers the handler with
    `@app.task(SEND_REPLY)`, and a producer enqueues with `producer.enqueue(SEND_REPLY, ...)`
    without importing the worker's code. `payload_type` (an attrs class) makes producers refuse
    payloads that would not structure into it.

    `max_attempts=None` (the default) leaves the number to the worker: jobs enqueued with this
    declaration store none, and the worker applies its own task declaration (5 if that sets
    none either). A number given here is stored with each job and wins over the worker's
    (docs/producers.md, "Which option wins").
    """

    name: str = attrs.field(validator=lambda _, __, value: validate_name("task", value))
    queue: str = attrs.field(
        default="default", validator=lambda _, __, value: validate_name("queue", value)
    )
    max_attempts: int | None = None
    payload_type: Any = None
    # The handler version new jobs are for (docs/versions.md): a producer of a task whose worker
    # serves version 2 declares version=2.
    version: int = 1
    # Each job's concurrency key, from its payload ("tenant:{tenant_id}" or a callable), and
    # the most of one key's jobs that run at once (docs/flow-control.md).
    concurrency_key: concurrency_keys.KeyTemplate | None = None
    concurrency_limit: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.max_attempts is not None:
            _check_max_attempts(self.max_attempts)
        concurrency_keys.validate_template(self.concurrency_key)
        if self.concurrency_limit is not None:
            concurrency_keys.validate_limit("concurrency_limit", self.concurrency_limit)
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"version: {self.version!r} must be a positive integer")
        if self.payload_type is not None and not (
            isinstance(self.payload_type, type) and attrs.has(self.payload_type)
        ):
            raise TypeError(f"payload_type: {self.payload_type!r} is not an attrs class")


def declare_task(
    name: str,
    *,
    queue: str = "default",
    max_attempts: int | None = None,
    payload_type: Any = None,
    version: int = 1,
    concurrency_key: concurrency_keys.KeyTemplate | None = None,
    concurrency_limit: int | None = None,
) -> TaskDeclaration:
    """A `TaskDeclaration` (see there); the name reads well at module level."""
    return TaskDeclaration(
        name, queue, max_attempts, payload_type, version, concurrency_key, concurrency_limit
    )


@attrs.frozen
class Job:
    """An enqueued job. `created` is False when its unique key returned an existing job."""

    id: int
    task: str
    queue: str
    created: bool = True


@attrs.frozen
class EnqueueOptions:
    queue: str | None = None
    run_at: datetime.datetime | None = None
    delay: datetime.timedelta | float | None = None
    priority: int = 0
    partition_key: str | None = None
    dedup_key: str | None = None
    max_attempts: int | None = None
    unique_for: datetime.timedelta | float | None = None
    unique_states: Iterable[str] | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    deadline: datetime.datetime | datetime.timedelta | None = None


def build_jobs(
    spec: TaskLike,
    payloads: Sequence[Any],
    options: EnqueueOptions,
    *,
    single: bool = False,
    dedup_keys: Sequence[str | None] | None = None,
) -> NewJobs:
    """Validate options and encode payloads; raises before anything is written.

    Errors name the field: `$.a.b` for a single payload, `[3].a.b` inside a batch. `dedup_keys`
    gives each payload of a batch its own unique key (None: no key for that one).
    """
    queue = validate_name("queue", spec.queue if options.queue is None else options.queue)
    _check_priority(options.priority)
    # Stored only when the caller or the declaration it passed says so; otherwise the row has
    # none and the worker's task declaration decides (docs/producers.md, "Which option wins").
    # A registered task (the app's own TaskSpec) is the worker's declaration: not copied.
    max_attempts = options.max_attempts
    if max_attempts is None and isinstance(spec, TaskDeclaration):
        max_attempts = spec.max_attempts
    if max_attempts is not None:
        _check_max_attempts(max_attempts)
    if options.run_at is not None and options.delay is not None:
        raise ValueError("run_at, delay: give one or the other, not both")
    if options.run_at is not None and options.run_at.tzinfo is None:
        raise ValueError("run_at: must be timezone-aware (database time is UTC)")
    delay = _seconds("delay", options.delay)
    deadline_at, deadline_seconds, deadline_source = _deadline(spec, options.deadline)
    partition_key = validate_key("partition_key", options.partition_key)
    concurrency_key, per_payload, concurrency_limit = _concurrency(spec, payloads, options, single)
    if partition_key is not None and (concurrency_key is not None or per_payload is not None):
        raise ValueError(
            "concurrency_key: give a partition_key or a concurrency_key, not both "
            "(a partition key is the ordered, one-at-a-time case)"
        )
    if (
        dedup_keys is None
        and options.dedup_key is None
        and options.unique_for is None
        and options.unique_states is None
    ):  # no uniqueness at all (most calls): nothing of it to validate
        keys: list[str | None] = []
        unique_for, unique_states = None, NO_UNIQUE_STATES
    else:
        keys = _dedup_keys(options.dedup_key, dedup_keys, len(payloads), single)
        unique_for = _seconds("unique_for", options.unique_for)
        unique_states = _unique_states(options.unique_states, unique_for, any(keys))
    if spec.payload_type is not None:  # most tasks take plain JSON: no per-payload call
        for index, payload in enumerate(payloads):
            check_payload_type(spec, payload, "$" if single else f"[{index}]")
    template = NewJob(
        queue=queue,
        task=spec.name,
        payload_json="null",  # each job's own is in `payloads`
        priority=options.priority,
        run_at=options.run_at,
        delay_seconds=delay,
        partition_key=partition_key,
        max_attempts=max_attempts,
        unique_for_seconds=unique_for,
        unique_states=unique_states,
        version=getattr(spec, "version", 1),
        trace_context=current_traceparent(),  # None unless the otel extra is configured
        concurrency_key=concurrency_key,
        concurrency_limit=concurrency_limit,
        deadline_at=deadline_at,
        deadline_seconds=deadline_seconds,
        deadline_source=deadline_source,
        # A task this app registers has its deadline (or none) in its own declaration.
        task_deadline=isinstance(spec, TaskDeclaration),
    )
    return NewJobs(
        template, _encode_all(payloads, single), keys if _any_key(keys) else None, per_payload
    )


def _concurrency(
    spec: TaskLike, payloads: Sequence[Any], options: EnqueueOptions, single: bool
) -> tuple[str | None, list[str | None] | None, int | None]:
    """The batch's concurrency key (given at enqueue), or each payload's (the task's key
    template), and the limit stored with the jobs (given, else the task's)."""
    template = getattr(spec, "concurrency_key", None)
    limit = options.concurrency_limit
    if limit is None:
        limit = getattr(spec, "concurrency_limit", None)
    if limit is not None:
        concurrency_keys.validate_limit("concurrency_limit", limit)
    if options.concurrency_key is not None or template is None:
        key = validate_key("concurrency_key", options.concurrency_key)
        return key, None, limit if key is not None else None
    keys = [
        concurrency_keys.key_of(template, payload, "$" if single else f"[{index}]")
        for index, payload in enumerate(payloads)
    ]
    return None, keys, limit


def check_deadline(value: object) -> datetime.datetime | float | None:
    """A deadline option as an aware datetime or seconds from now, or a ValueError naming it."""
    if value is None:
        return None
    form = "an aware datetime in the future or a positive timedelta"
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"deadline: {value!r} is naive (give {form})")
        if value <= datetime.datetime.now(datetime.UTC):
            raise ValueError(f"deadline: {value.isoformat()} has passed (give {form})")
        return value
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
        if not 0 < seconds <= MAX_DELAY_SECONDS:
            raise ValueError(f"deadline: {value!r} is not positive (give {form})")
        return seconds
    raise ValueError(f"deadline: {value!r} is not a datetime or timedelta (give {form})")


def _deadline(
    spec: TaskLike, option: datetime.datetime | datetime.timedelta | None
) -> tuple[datetime.datetime | None, float | None, str | None]:
    """(deadline_at, deadline_seconds, source): the enqueue's own, else the task's."""
    value, source = check_deadline(option), "set at enqueue"
    if value is None:
        value = getattr(spec, "deadline", None)
        source = f"set by task {spec.name}"
    if value is None:
        return None, None, None
    if isinstance(value, datetime.datetime):
        return value, None, source
    return None, float(value), source


def _any_key(keys: Sequence[str | None]) -> bool:
    return any(key is not None for key in keys)


def _encode_all(payloads: Sequence[Any], single: bool) -> list[str]:
    if single:
        return [codec.encode(payload) for payload in payloads]
    encode = codec.encode
    try:
        return [encode(payload) for payload in payloads]
    except PayloadError:
        pass
    # Encoded again to name the payload's index (`[3].a.b`), which costs nothing per row above.
    return [encode(payload, root=f"[{index}]") for index, payload in enumerate(payloads)]


def _check_priority(priority: object) -> None:
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not -32768 <= priority <= 32767
    ):
        raise ValueError(f"priority: {priority!r} must be an integer in [-32768, 32767]")


def _check_max_attempts(max_attempts: object) -> None:
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= 1000
    ):
        raise ValueError(f"max_attempts: {max_attempts!r} must be an integer in [1, 1000]")


def seconds_option(field: str, value: datetime.timedelta | float | None) -> float | None:
    """A duration option in seconds (a timedelta or a number), or a ValueError naming it."""
    return _seconds(field, value)


def _seconds(field: str, value: datetime.timedelta | float | None) -> float | None:
    seconds: Any = value.total_seconds() if isinstance(value, datetime.timedelta) else value
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"{field}: {value!r} must be a timedelta or a number of seconds")
    if not 0 <= seconds <= MAX_DELAY_SECONDS:  # also rejects NaN
        raise ValueError(f"{field}: {value!r} must be a non-negative duration of at most 100 years")
    return float(seconds)


def _dedup_keys(
    one: str | None, many: Sequence[str | None] | None, count: int, single: bool
) -> list[str | None]:
    if many is None:
        key = validate_key("dedup_key", one)
        if key is not None and count > 1:
            raise ValueError(
                "dedup_key: one key cannot be shared by a batch of several jobs "
                "(give each its own with dedup_keys=[...])"
            )
        return [key] * count
    if one is not None:
        raise ValueError("dedup_key, dedup_keys: give one or the other, not both")
    keys = list(many)
    if len(keys) != count:
        raise ValueError(f"dedup_keys: {len(keys)} keys for {count} payloads (one each)")
    return [
        validate_key("dedup_key" if single else f"dedup_keys[{index}]", key)
        for index, key in enumerate(keys)
    ]


def _unique_states(
    states: Iterable[str] | None, unique_for: float | None, has_key: bool
) -> tuple[str, ...]:
    """The FINISHED states in which a job keeps its key (unfinished states always do)."""
    for field, value in (("unique_for", unique_for), ("unique_states", states)):
        if value is not None and not has_key:
            raise ValueError(f"{field}: applies to a dedup_key, and none was given")
    if states is None:
        return DEFAULT_UNIQUE_FOR_STATES if unique_for is not None else ()
    if isinstance(states, str):
        raise ValueError(f"unique_states: {states!r} must be a list of state names, not a string")
    names = list(states)
    for name in names:
        if name not in FINISHED_STATES + UNFINISHED_STATES:
            raise ValueError(
                f"unique_states: {name!r} is not a job state "
                f"(finished states: {', '.join(FINISHED_STATES)})"
            )
    return tuple(state for state in FINISHED_STATES if state in names)


def check_payload_type(spec: TaskLike, payload: Any, root: str) -> None:
    """A task whose payload is an attrs class refuses, at enqueue, JSON that would not structure
    into it (the handler would only fail later, attempt after attempt), naming every path."""
    cls = spec.payload_type
    if cls is None or isinstance(payload, cls):
        return
    if payload is None:
        required = [field.name for field in attrs.fields(cls) if field.default is attrs.NOTHING]
        if not required:
            return  # the handler gets the class built from its defaults
        raise PayloadError(
            root,
            f"task {spec.name!r} needs a {cls.__name__} payload (required: {', '.join(required)}); "
            f"none was given",
        )
    problems = codec.structure_problems(codec.to_json_value(payload), cls, root=root)
    if problems:
        raise PayloadError(root, f"does not fit {cls.__name__}: {'; '.join(problems)}")


def to_jobs(jobs: Sequence[NewJob], inserted: Sequence[InsertedJob]) -> list[Job]:
    if isinstance(jobs, NewJobs):  # one task and queue for all: no NewJob built per row
        task, queue = jobs.template.task, jobs.template.queue
        if len(inserted) != len(jobs):
            raise ValueError(f"{len(inserted)} inserted rows for {len(jobs)} jobs")
        # Indexed, not by name: 20,000 rows of a bulk enqueue, 9.5 ms against 11.4 ms.
        return [Job(row[0], task, queue, row[1]) for row in inserted]
    return [
        Job(id=row.id, task=job.task, queue=job.queue, created=row.created)
        for job, row in zip(jobs, inserted, strict=True)
    ]


@attrs.define(eq=False)
class Enqueuer:
    """Resolves what an enqueue names (a registered task, or a declaration) for the client,
    its transactions and a job's transaction."""

    tasks: Mapping[str, TaskLike]

    def spec(self, task: str | TaskDeclaration) -> TaskLike:
        """A registered task by name, or a declaration (a task of another app, say)."""
        if isinstance(task, TaskDeclaration):
            return task
        if not isinstance(task, str):  # a dict or list would fail the lookup with a TypeError
            raise UnknownTask(f"task: {task!r} is not a task name or a trioq.TaskDeclaration")
        spec = self.tasks.get(task)
        if spec is None:
            raise UnknownTask(
                f"task: {task!r} is not registered with this app (register it, or enqueue "
                f"a trioq.TaskDeclaration naming its queue)"
            )
        return spec


def build_event(key: str, payload: Any) -> EmitEvent:
    """Validate an event before any SQL: the key like a dedup key, the payload as JSON."""
    if key is None:
        raise ValueError("key: an event needs a key (a non-empty string)")
    validate_key("key", key)
    return EmitEvent(key, codec.encode(payload, root="payload"))


def build_message(job_id: int, topic: str, payload: Any) -> MessageSend:
    """Validate a message before any SQL: the job id, the topic like an event key, the
    payload as JSON."""
    validate_job_id(job_id)
    if topic is None:
        raise ValueError("topic: a message needs a topic (a non-empty string)")
    validate_key("topic", topic)
    return MessageSend(job_id, topic, codec.encode(payload, root="payload"))


def message_refused(job_id: int, state: str | None) -> Exception:
    """The error for a send that found no job to take it."""
    if state is None:
        return JobNotFound(f"job_id: no job {job_id} (a message needs an unfinished job)")
    return JobFinished(f"job_id: job {job_id} is {state}: a final job receives no messages")


@attrs.define(eq=False)
class ClientTransaction:
    """Your SQL and trioq's enqueues in one transaction: they commit or roll back together."""

    _tx: Transaction
    _enqueuer: Enqueuer

    async def execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> None:
        await self._tx.execute(sql, params)

    async def fetch(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        return await self._tx.fetch(sql, params)

    async def enqueue(
        self, task: str | TaskDeclaration, payload: Any = None, **options: Any
    ) -> Job:
        """Like `Client.enqueue`, inside this transaction."""
        jobs = build_jobs(
            self._enqueuer.spec(task), [payload], EnqueueOptions(**options), single=True
        )
        return to_jobs(jobs, await self._tx.job_insert_many(jobs))[0]

    async def enqueue_many(
        self,
        task: str | TaskDeclaration,
        payloads: Iterable[Any],
        *,
        dedup_keys: Sequence[str | None] | None = None,
        **options: Any,
    ) -> list[Job]:
        """Like `Client.enqueue_many`, inside this transaction."""
        jobs = build_jobs(
            self._enqueuer.spec(task),
            list(payloads),
            EnqueueOptions(**options),
            dedup_keys=dedup_keys,
        )
        return to_jobs(jobs, await self._tx.job_insert_many(jobs)) if jobs else []

    async def emit_event(self, key: str, payload: Any = None) -> EventOutcome:
        """Emit inside this transaction: stored, and its waiters woken, only if it commits
        (see `Client.emit_event`; `woken` counts the waiters this transaction made ready).
        The transaction must be READ COMMITTED (the default)."""
        return await self._tx.event_emit(build_event(key, payload))
