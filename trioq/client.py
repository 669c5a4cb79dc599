"""The producer side: enqueue jobs (alone, in bulk, inside your transaction), wait for results,
cancel, and read status. Everything is validated before any SQL runs."""

from __future__ import annotations

import datetime
import math
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from ._core.channels import job_ids_of, result_channel
from ._core.concurrency import validate_limit, validate_pattern
from ._core.errors import JobFailed, JobNotFound, ResultTimeout
from ._core.explain import Explanation, explain
from ._core.identifiers import validate_job_id, validate_key, validate_name
from ._core.limits import Rate, parse_global_limit, parse_rate
from ._core.states import TERMINAL_STATES, JobState
from ._enqueue.rows import (
    FINISHED_STATES,
    UNFINISHED_STATES,
    ClientTransaction,
    EnqueueOptions,
    Enqueuer,
    Job,
    TaskDeclaration,
    build_event,
    build_jobs,
    build_message,
    message_refused,
    seconds_option,
    to_jobs,
)
from ._seam.admin import (
    AttemptRecord,
    CancelJob,
    ConcurrencyKeyStatus,
    ConcurrencyLimit,
    ConcurrencyRate,
    Descendant,
    HealthReport,
    JobFilter,
    JobPurge,
    KeyRateStatus,
    QueueDemand,
    QueueLimit,
    QueueLimitSet,
    QueuePause,
    QueueStatus,
    WorkerInfo,
    WorkflowFilter,
)
from ._seam.driver import Driver, EventOutcome, JobRecord, Listener, WorkflowValue
from ._seam.schedules import ScheduleRecord
from ._seam.workflow import Checkpoint
from .schedules import new_schedule
from .workflow_view import WORKFLOW_STATES, WorkflowView

RESULT_POLL_SECONDS = 1.0  # safety net under the result notifications


@attrs.frozen
class ResultWatcherStatistics:
    own_listener: bool  # this client opened a LISTEN connection of its own
    borrowed_listener: bool  # it uses a running worker's


@attrs.define(eq=False)
class _ResultWatcher:
    """Wakes `wait_result` callers by job id from result notifications.

    Inside a worker's process it borrows the worker's LISTEN connection (the worker calls
    `adopt`/`release`), so handlers that wait for results cost no connection; otherwise it opens
    one listener per client, on the first wait."""

    driver: Driver
    nursery: trio.Nursery
    listener: Listener | None = None
    borrowed: Listener | None = None
    waiters: dict[int, list[trio.Event]] = attrs.field(factory=dict)
    _opening: trio.Lock = attrs.field(factory=trio.Lock)

    def statistics(self) -> ResultWatcherStatistics:
        return ResultWatcherStatistics(
            own_listener=self.listener is not None, borrowed_listener=self.borrowed is not None
        )

    async def watch(self, job_id: int) -> trio.Event:
        listener = self.borrowed
        if listener is None:
            async with self._opening:
                if self.listener is None:
                    self.listener = await self.nursery.start(self._run)
            listener = self.listener
        await listener.listen(result_channel(self.driver.schema, job_id))
        # Registered after the last await: a cancelled watch leaves no waiter behind. The caller
        # reads the job's state after this returns, so a notification sent before it is not lost.
        event = trio.Event()
        self.waiters.setdefault(job_id, []).append(event)
        return event

    def forget(self, job_id: int, event: trio.Event) -> None:
        events = self.waiters.get(job_id, [])
        if event in events:
            events.remove(event)
        if not events:
            self.waiters.pop(job_id, None)

    async def _run(
        self, *, task_status: trio.TaskStatus[Listener] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with self.driver.open_listener(self._on_notify, self._wake_all) as listener:
            task_status.started(listener)
            await trio.sleep_forever()

    # --- borrowing a worker's listener (see ListenerGuest) ----------------------------------

    def adopt(self, listener: Listener) -> None:
        if self.listener is None:  # a client already listening keeps its own connection
            self.borrowed = listener

    def release(self, listener: Listener) -> None:
        if self.borrowed is listener:
            self.borrowed = None
            self._wake_all()  # waiters re-subscribe, on a listener of their own

    def on_notify(self, channel: str, payload: str) -> None:
        if self.borrowed is not None:
            self._on_notify(channel, payload)

    def on_reconnect(self) -> None:
        if self.borrowed is not None:
            self._wake_all()

    def _on_notify(self, channel: str, payload: str) -> None:
        for job_id in job_ids_of(payload):
            for event in self.waiters.get(job_id, []):
                event.set()

    def _wake_all(self) -> None:
        for events in self.waiters.values():
            for event in events:
                event.set()


@attrs.define(eq=False)
class Client:
    """Opened by `app.client()`; safe to share between tasks."""

    driver: Driver
    _enqueuer: Enqueuer
    _watcher: _ResultWatcher

    @property
    def enqueuer(self) -> Enqueuer:
        return self._enqueuer

    async def enqueue(
        self,
        task: str | TaskDeclaration,
        payload: Any = None,
        *,
        queue: str | None = None,
        run_at: datetime.datetime | None = None,
        delay: datetime.timedelta | float | None = None,
        priority: int = 0,
        partition_key: str | None = None,
        dedup_key: str | None = None,
        max_attempts: int | None = None,
        unique_for: datetime.timedelta | float | None = None,
        unique_states: Iterable[str] | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        deadline: datetime.datetime | datetime.timedelta | None = None,
    ) -> Job:
        """Insert one job (one statement) and wake the queue's workers on commit.

        `dedup_key` makes the job unique among unfinished jobs of that key; `unique_for` and
        `unique_states` extend that to finished ones (docs/uniqueness.md). When the key is
        taken, the existing job is returned with `created=False` and nothing is written.
        `concurrency_key` (with `concurrency_limit`, else the task's) caps how many jobs of
        that key run at once, cluster-wide (docs/flow-control.md).
        `deadline` (an aware datetime, or a timedelta from now) bounds the whole workflow: when
        it passes, the job and its children are cancelled (docs/flow-control.md).
        """
        options = EnqueueOptions(
            queue,
            run_at,
            delay,
            priority,
            partition_key,
            dedup_key,
            max_attempts,
            unique_for,
            unique_states,
            concurrency_key,
            concurrency_limit,
            deadline,
        )
        jobs = build_jobs(self._enqueuer.spec(task), [payload], options, single=True)
        return to_jobs(jobs, await self.driver.job_insert_many(jobs))[0]

    async def enqueue_many(
        self,
        task: str | TaskDeclaration,
        payloads: Iterable[Any],
        *,
        queue: str | None = None,
        run_at: datetime.datetime | None = None,
        delay: datetime.timedelta | float | None = None,
        priority: int = 0,
        partition_key: str | None = None,
        max_attempts: int | None = None,
        dedup_keys: Sequence[str | None] | None = None,
        unique_for: datetime.timedelta | float | None = None,
        unique_states: Iterable[str] | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        deadline: datetime.datetime | datetime.timedelta | None = None,
    ) -> list[Job]:
        """Insert a whole batch in ONE statement; results are in the order of `payloads`.

        `dedup_keys` gives each payload its own unique key (or None), as `dedup_key` does for
        `enqueue`; a key repeated in the batch creates one job.
        """
        options = EnqueueOptions(
            queue,
            run_at,
            delay,
            priority,
            partition_key,
            None,
            max_attempts,
            unique_for,
            unique_states,
            concurrency_key,
            concurrency_limit,
            deadline,
        )
        jobs = build_jobs(self._enqueuer.spec(task), list(payloads), options, dedup_keys=dedup_keys)
        return to_jobs(jobs, await self.driver.job_insert_many(jobs)) if jobs else []

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[ClientTransaction]:
        """BEGIN ... COMMIT on one connection: enqueue inside your own transaction.

        An exception rolls back everything, the enqueues included (no job, no notification).
        Cancellation rolls back too; a cancel during COMMIT is shielded, so the outcome is known.
        """
        async with self.driver.transaction() as tx:
            yield ClientTransaction(tx, self._enqueuer)

    async def get_job(self, job_id: int) -> JobRecord:
        record = await self.driver.job_get(validate_job_id(job_id))
        if record is None:
            raise JobNotFound(f"job_id: no job {job_id}")
        return record

    async def attempts(self, job_id: int) -> list[AttemptRecord]:
        return await self.driver.job_attempts(validate_job_id(job_id))

    async def wait_result(self, job_id: int, timeout: float | None = 30.0) -> Any:
        """Wait until the job is final; return its result, or raise JobFailed.

        Registers the wait on the job's row first (a job nobody waits for is finished without
        a notification), then is woken by the job's result notification; a slow poll covers
        lost notifications.
        Raises ResultTimeout after `timeout` seconds (the job itself is not affected).
        """
        record = await self.wait_final(job_id, timeout)
        if record.state != JobState.COMPLETED:
            raise JobFailed(f"job {job_id} ended {record.state}: {record.error}", record)
        return record.result

    async def wait_final(self, job_id: int, timeout: float | None = 30.0) -> JobRecord:
        """Wait until the job reaches a final state and return its record."""
        validate_job_id(job_id)
        if timeout is not None and not (isinstance(timeout, int | float) and timeout >= 0):
            raise ValueError(f"timeout: {timeout!r} must be None or a number of seconds >= 0")
        deadline = math.inf if timeout is None else trio.current_time() + timeout
        event = await self._watcher.watch(job_id)
        try:
            # LISTEN, then register, then read: the job's end is notified or seen by the read.
            await self.driver.job_result_watch(job_id)
            while True:
                record = await self.get_job(job_id)
                if record.state in TERMINAL_STATES:
                    return record
                if trio.current_time() >= deadline:
                    raise ResultTimeout(f"job {job_id} is still {record.state} after {timeout}s")
                with trio.move_on_at(min(deadline, trio.current_time() + RESULT_POLL_SECONDS)):
                    await event.wait()
                if event.is_set():
                    self._watcher.forget(job_id, event)
                    event = await self._watcher.watch(job_id)
        finally:
            self._watcher.forget(job_id, event)

    async def emit_event(self, key: str, payload: Any = None) -> EventOutcome:
        """Store the event `key` with `payload` and wake every job waiting for it (one
        statement, committed on return). The first emit of a key wins: later emits change
        nothing and return `first=False`. A job that waits for `key` after this returns gets
        the payload at once, without suspending. Safe to retry. Returns a `trioq.EventOutcome`
        (`first`, `woken`), as the producers and the SQL function do."""
        return await self.driver.event_emit(build_event(key, payload))

    async def cancel(self, job_id: int, *, tree: bool = False) -> str:
        """Cancel a job: a ready job at once; a running one through its handler's cancel scope
        (its worker records `cancelled`). Returns the state after the request. A workflow's
        children follow the `on_parent_cancel` policy of their spawn (cancel, abandon, wait);
        `tree=True` cancels every descendant whatever its policy."""
        job_id = validate_job_id(job_id)
        if not isinstance(tree, bool):
            raise TypeError(f"tree: {tree!r} must be True or False")
        outcome = await (
            self.driver.job_cancel_with(CancelJob(job_id, tree=True))
            if tree
            else self.driver.job_cancel(job_id)
        )
        if outcome is None:
            raise JobNotFound(f"job_id: no job {job_id}")
        return outcome.state

    async def descendants(self, job_id: int) -> list[Descendant]:
        """The job's descendants (children, their children, ...) with their states, by id."""
        return await self.driver.job_descendants(validate_job_id(job_id))

    # --- inspection and operations (`trioq jobs`, `purge`, `queue`) ----------------------

    async def jobs(
        self,
        *,
        states: Iterable[str] | None = None,
        task: str | None = None,
        queue: str | None = None,
        partition_key: str | None = None,
        older_than: datetime.timedelta | float | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[JobRecord]:
        """Jobs newest first, filtered (None: any); page on with `before_id=` the last id."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise ValueError(f"limit: {limit!r} must be an integer in [1, 10000]")
        return await self.driver.job_list(
            JobFilter(
                states=_states(states),
                tasks=None if task is None else (validate_name("task", task),),
                queues=None if queue is None else (validate_name("queue", queue),),
                partition_key=validate_key("partition_key", partition_key),
                older_than_seconds=_seconds("older_than", older_than),
                before_id=None if before_id is None else validate_job_id(before_id),
                limit=limit,
            )
        )

    async def purge(
        self,
        *,
        states: Iterable[str],
        older_than: datetime.timedelta | float,
        task: str | None = None,
        queue: str | None = None,
    ) -> int:
        """Delete finished jobs in `states` that finished over `older_than` ago (in batches);
        returns how many were deleted."""
        wanted = _states(states) or ()
        if not wanted or set(wanted) - set(FINISHED_STATES):
            raise ValueError(
                f"states: {states!r} must name finished states ({', '.join(FINISHED_STATES)})"
            )
        age = _seconds("older_than", older_than)
        assert age is not None
        params = JobPurge(
            states=wanted,
            older_than_seconds=age,
            tasks=None if task is None else (validate_name("task", task),),
            queues=None if queue is None else (validate_name("queue", queue),),
        )
        deleted = 0
        while True:
            batch = await self.driver.job_purge(params)
            deleted += batch
            if batch < params.limit:
                return deleted

    async def history(self, job_id: int) -> list[Checkpoint]:
        """The job's checkpoints in order (step results, sleeps, events...); empty for a job
        that used no durable primitive."""
        return await self.driver.checkpoint_list(validate_job_id(job_id))

    async def retry(self, job_id: int) -> str:
        """Redrive a failed or cancelled job now, keeping its history (attempts, checkpoints);
        it gets at least one more attempt. Returns the state after the request (a job in any
        other state is left alone and its state returned)."""
        outcome = await self.driver.job_retry(validate_job_id(job_id))
        if outcome is None:
            raise JobNotFound(f"job_id: no job {job_id}")
        return outcome.state

    async def pause_queue(self, queue: str) -> bool:
        """Workers stop claiming `queue` (running jobs finish; enqueue still works). False if it
        was paused already."""
        return await self.driver.queue_pause(validate_name("queue", queue))

    async def resume_queue(self, queue: str) -> bool:
        """Workers claim `queue` again (woken at once). False if it was not paused."""
        return await self.driver.queue_resume(validate_name("queue", queue))

    async def paused_queues(self) -> list[QueuePause]:
        return await self.driver.queue_pause_list()

    async def set_key_limit(self, pattern: str, limit: int | None) -> bool:
        """Cap the running jobs of each concurrency key matching `pattern` (a whole key, or a
        prefix ending in `*`); None removes the pattern's limit. Workers apply it from their
        next claim (within one poll interval). Returns False when None found no limit."""
        validate_pattern(pattern)
        if limit is not None:
            validate_limit("limit", limit)
        return await self.driver.concurrency_limit_set(pattern, limit)

    async def key_limits(self) -> list[ConcurrencyLimit]:
        return await self.driver.concurrency_limit_list()

    async def key_status(self, keys: Iterable[str] | None = None) -> list[ConcurrencyKeyStatus]:
        """Concurrency keys with running jobs: running count and the limit that applies."""
        wanted = None if keys is None else [validate_key("key", key) or "" for key in keys]
        return await self.driver.concurrency_key_status(wanted)

    async def set_key_rate(self, pattern: str, rate: str | Rate | None) -> bool:
        """At most N starts of each concurrency key matching `pattern` (a whole key, or a
        prefix ending in `*`) in any window of PERIOD ("10/s", "100/m"; None or "none":
        remove the pattern's rate), across every queue and worker, from their next claim
        (within a second). Bad values raise ValueError and change nothing. Returns False when
        None found no rate."""
        validate_pattern(pattern)
        return await self.driver.concurrency_rate_set(pattern, parse_rate("rate", rate))

    async def key_rates(self) -> list[ConcurrencyRate]:
        return await self.driver.concurrency_rate_list()

    async def key_rate_status(self) -> list[KeyRateStatus]:
        """Rated keys with starts in their window now, and when the next start is allowed."""
        return await self.driver.concurrency_rate_status()

    async def set_queue_limit(self, queue: str, limit: int | str | None) -> None:
        """At most `limit` jobs of `queue` running at once across every worker (None or
        "none": no global limit). Workers apply it from their next claim, within a second;
        running jobs are never stopped. Bad values raise ValueError and change nothing."""
        change = QueueLimitSet(
            validate_name("queue", queue),
            set_limit=True,
            global_limit=parse_global_limit("limit", limit),
        )
        await self.driver.queue_limit_set(change)

    async def set_queue_rate(self, queue: str, rate: str | Rate | None) -> None:
        """At most N starts of `queue`'s jobs in any window of PERIOD ("100/m", "5/s"; None
        or "none": no rate limit), across every worker, from their next claim."""
        change = QueueLimitSet(
            validate_name("queue", queue), set_rate=True, rate=parse_rate("rate", rate)
        )
        await self.driver.queue_limit_set(change)

    async def queue_limits(self) -> list[QueueLimit]:
        """Each queue with a cluster-wide limit, against it now."""
        return await self.driver.queue_limit_list()

    async def explain(self, job_id: int) -> Explanation:
        """Why the job is (not) running: its claim gates in order, the first blocking one first
        in `verdict` (`trioq explain JOB_ID`)."""
        facts = await self.driver.job_explain(validate_job_id(job_id))
        if facts is None:
            raise JobNotFound(f"job_id: no job {job_id}")
        queue = facts.job["queue"]
        for limit in await self.driver.queue_limit_list():  # one row per limited queue
            if limit.queue == queue:
                rate = None if limit.rate is None else str(limit.rate)
                row = {**attrs.asdict(limit, recurse=False), "rate": rate}
                facts = attrs.evolve(facts, limits=row)
        return explain(facts)

    async def status_health(self) -> HealthReport:
        return await self.driver.status_health()

    async def queue_demand(self) -> list[QueueDemand]:
        return await self.driver.queue_demand()

    async def queue_status(self) -> list[QueueStatus]:
        return await self.driver.queue_status()

    async def workers(self) -> list[WorkerInfo]:
        return await self.driver.worker_list()

    # --- schedules --------------------------------------------------------------------------

    async def schedule(
        self,
        name: str,
        task: str,
        *,
        cron: str,
        timezone: str = "UTC",
        payload: Any = None,
        misfire: str = "latest",
        catchup_limit: int = 100,
    ) -> bool:
        """Create or replace the schedule `name` (True: created). The elected scheduler picks
        it up at once; keeping the cron and time zone of an existing schedule keeps its next
        fire time, changing them re-times it from now."""
        declared = new_schedule(
            name,
            self._enqueuer.spec(task),
            cron=cron,
            timezone=timezone,
            payload=payload,
            misfire=misfire,
            catchup_limit=catchup_limit,
        )
        return bool(await self.driver.schedule_upsert_many([declared]))

    async def unschedule(self, name: str) -> bool:
        """Remove the schedule `name` (False: there was none). Jobs it enqueued are kept. A
        schedule declared in code comes back when a worker of that code starts."""
        return await self.driver.schedule_delete(name)

    async def schedules(self) -> list[ScheduleRecord]:
        return await self.driver.schedule_list()

    # --- messages, workflow values and the workflow view ---------------------------------

    async def send(self, job_id: int, topic: str, payload: Any = None) -> int:
        """Send a message to the unfinished job `job_id` under `topic` (one statement,
        committed on return) and wake it if it waits in `ctx.receive(topic)`. Messages to one
        job are received in send order, each once. Returns the message id. Raises
        `trioq.JobNotFound` for an unknown job and `trioq.JobFinished` for a final one. Not
        retried on a lost connection (a retry could deliver the message twice)."""
        message = build_message(job_id, topic, payload)
        outcome = await self.driver.message_send(message)
        if outcome.message_id is None:
            raise message_refused(job_id, outcome.state)
        return outcome.message_id

    async def get_value(
        self, job_id: int, key: str, *, wait: datetime.timedelta | float | None = None
    ) -> Any:
        """The value the workflow `job_id` last published under `key` (`ctx.set_value`),
        in any state, during and after its run.

        With `wait` (seconds or a timedelta), wait up to that long for the key to be set;
        woken by the job's result notifications (a value write sends one), with a slow poll
        under them. Raises `trioq.ValueNotSet` when the key is not set (by then, or when the
        job ended without setting it) and `trioq.JobNotFound` for an unknown job."""
        validate_job_id(job_id)
        if key is None:
            raise ValueError("key: a value needs a key (a non-empty string)")
        validate_key("key", key)
        seconds = _seconds("wait", wait)
        if seconds is None:
            return (await self.driver.job_value_get(job_id, key)).answer(job_id, key, None)
        deadline = trio.current_time() + seconds
        event = await self._watcher.watch(job_id)
        try:
            await self.driver.job_result_watch(job_id)  # its end is notified too (see wait_final)
            while True:
                read = await self.driver.job_value_get(job_id, key)
                if read.found or read.state in TERMINAL_STATES or read.state is None:
                    return read.answer(job_id, key, seconds)
                if trio.current_time() >= deadline:
                    return read.answer(job_id, key, seconds)
                with trio.move_on_at(min(deadline, trio.current_time() + RESULT_POLL_SECONDS)):
                    await event.wait()
                if event.is_set():
                    self._watcher.forget(job_id, event)
                    event = await self._watcher.watch(job_id)
        finally:
            self._watcher.forget(job_id, event)

    async def values(self, job_id: int) -> list[WorkflowValue]:
        """Every value the job published, by key (`trioq job ID` shows them)."""
        return await self.driver.job_values(validate_job_id(job_id))

    async def workflows(
        self,
        *,
        states: Iterable[str] | None = None,
        task: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[WorkflowView]:
        """Unfinished workflows (running with history, sleeping, waiting), newest first, each
        with what it waits on (`trioq workflows`); page on with `before_id=` the last id."""
        wanted = None if states is None else _states(states)
        if wanted is not None and set(wanted) - set(WORKFLOW_STATES):
            raise ValueError(f"states: {states!r} must name states of {', '.join(WORKFLOW_STATES)}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise ValueError(f"limit: {limit!r} must be an integer in [1, 10000]")
        records = await self.driver.workflow_list(
            WorkflowFilter(
                states=wanted,
                tasks=None if task is None else (validate_name("task", task),),
                before_id=None if before_id is None else validate_job_id(before_id),
                limit=limit,
            )
        )
        return [WorkflowView.of(record) for record in records]


def _states(states: Iterable[str] | None) -> tuple[str, ...] | None:
    if states is None:
        return None
    if isinstance(states, str):
        raise ValueError(f"states: {states!r} must be a list of state names, not a string")
    names = tuple(states)
    for name in names:
        if name not in FINISHED_STATES + UNFINISHED_STATES:
            raise ValueError(f"states: {name!r} is not a job state")
    return names


def _seconds(field: str, value: datetime.timedelta | float | None) -> float | None:
    return seconds_option(field, value)
