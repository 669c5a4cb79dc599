"""Test helpers for applications built on trioq (like `Oban.Testing` and `rivertest`).

- `run_job(app, task, payload)`: run one job through a real worker on a private in-memory
  driver (a real `Context`, retries, durable primitives) and return its result.
- `drain(app, queues)`: run the queues' work on the app's open client until what is left waits
  on time (a sleep, a delay) or on something outside the drain.
- `enqueued_jobs(client, ...)` / `assert_enqueued(client, ...)` / `refute_enqueued(...)`: what
  the code under test enqueued.

Every wait is bounded by `timeout` and woken by the worker's hooks, never by sleeping.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from .._core.errors import ConfigurationError, JobFailed
from .._core.states import TERMINAL_IN_ORDER, JobState
from .._enqueue.rows import TaskDeclaration
from .._memory import MemoryDriver
from .._runtime.job.claim_loop import WorkerHooks
from .._seam.admin import JobFilter
from .._seam.driver import Driver, JobRecord
from ..app import App
from ..client import Client


async def run_job(
    app: App,
    task: str | TaskDeclaration,
    payload: Any = None,
    *,
    driver: Driver | None = None,
    timeout: float = 30.0,
    **options: Any,
) -> Any:
    """Enqueue one job and run it to a final state; return its result, or raise `JobFailed`
    (its message and notes carry the handler's error and traceback).

    The job runs on `driver` (default: a fresh `MemoryDriver`, so no database is needed), on a
    worker serving the job's queue, with the task's retry policy: a handler that fails and then
    succeeds on a retry returns the result. Durable sleeps run on the driver's clock: under
    pytest-trio's `autojump_clock` fixture an hour-long `ctx.sleep` takes no real time.
    """
    async with app.isolated_client(driver or MemoryDriver(schema=app.schema)) as client:
        job = await client.enqueue(task, payload, **options)
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(
                functools.partial(
                    app.run_worker, [job.queue], 1, grace_seconds=0, poll_interval=0.05
                )
            )
            try:
                record = await client.wait_final(job.id, timeout=timeout)
            finally:
                worker.request_drain()
    if record.state != JobState.COMPLETED:
        raise _job_failed(record)
    return record.result


def _job_failed(record: JobRecord) -> JobFailed:
    error = record.error if isinstance(record.error, dict) else {}
    summary = f"{error.get('type', 'error')}: {error.get('message', record.error)}"
    failed = JobFailed(f"job {record.id} ({record.task}) ended {record.state}: {summary}", record)
    if error.get("traceback"):
        failed.add_note(str(error["traceback"]))
    return failed


@attrs.frozen
class DrainResult:
    """What `drain` ran: job ids by final state (jobs still retrying are not counted)."""

    completed: tuple[int, ...]
    failed: tuple[int, ...]
    cancelled: tuple[int, ...]


async def drain(
    app: App,
    queues: str | Sequence[str] | None = None,
    *,
    concurrency: int = 10,
    timeout: float = 30.0,
    schedules: bool = False,
) -> DrainResult:
    """Run the work of `queues` (default: every queue the app's tasks use) on the app's open
    client until what is left waits on time or on something outside the drain.

    It returns once no job of those queues is due, running, or about to be woken by another
    drained job: jobs the drained jobs enqueue and spawn run too, a workflow whose children all
    finished or whose event was emitted resumes, a sleep or wait whose time has come resumes.
    Left alone: sleeps, waits, delays and retry backoffs that are not due yet, and work waiting
    on jobs of queues that are not drained. `schedules=True` stores the app's declared schedules
    and fires those that come due while it runs; by default no schedule fires, so counts in a
    test see only the jobs it enqueued. Raises `TimeoutError` naming the queues when they do
    not go idle within `timeout`.
    """
    client = _open_client(app)
    names = [queues] if isinstance(queues, str) else list(queues or _app_queues(app))
    ended: dict[str, list[int]] = {state: [] for state in TERMINAL_IN_ORDER}
    idle = _IdleWatch(client.driver, tuple(names))

    def on_job_end(job: Any, outcome: str) -> None:
        if outcome in ended:
            ended[outcome].append(job.id)

    hooks = WorkerHooks(on_round=idle.on_round, on_job_end=on_job_end)
    worker = functools.partial(
        app.run_worker, names, concurrency, hooks=hooks, grace_seconds=0, run_scheduler=schedules
    )
    with trio.move_on_after(timeout) as scope:
        async with trio.open_nursery() as nursery:
            idle.worker = await nursery.start(worker)
            await idle.wait()
            idle.worker.request_drain()
    if scope.cancelled_caught:
        raise TimeoutError(
            f"drain: queues {', '.join(names)} still had due or running jobs after {timeout}s "
            f"(jobs of tasks this app does not register are never claimed, nor jobs of a paused "
            f"queue or of a partition key held by a job that is not drained)"
        )
    return DrainResult(*(tuple(ended[state]) for state in TERMINAL_IN_ORDER))


@attrs.define(eq=False)
class _IdleWatch:
    """Idle = a round claimed less than it asked for while no loop owned anything, confirmed
    by the database: no job of the queues is running or due. Due counts work whose time has
    come but that no claim has promoted yet (a finished sleep, a workflow its last child or an
    event woke), so a round of one queue that runs before another queue's promotion does not
    end the drain early."""

    driver: Driver
    queues: tuple[str, ...]
    worker: Any = None
    _candidate: trio.Event = attrs.field(factory=trio.Event)

    def on_round(self, queue: str, requested: int, claimed: int) -> None:
        if claimed < requested and self.worker is not None and self._nothing_owned():
            self._candidate.set()

    def _nothing_owned(self) -> bool:
        return all(
            loop.running == 0 and loop.pending_writes == 0
            for loop in self.worker.statistics().loops
        )

    async def wait(self) -> None:
        while True:
            await self._candidate.wait()
            self._candidate = trio.Event()
            demand = await self.driver.queue_demand()
            busy = [d for d in demand if d.queue in self.queues and (d.due_now or d.running)]
            if not busy and self._nothing_owned():
                return


def _open_client(app: App) -> Client:
    client = app.current_client()
    if client is None:
        raise ConfigurationError("drain: open `app.client()` first (or use the trioq_app fixture)")
    return client


def _app_queues(app: App) -> list[str]:
    return sorted({spec.queue for spec in app.tasks.values()})


async def enqueued_jobs(
    client: Client,
    task: str | TaskDeclaration | None = None,
    *,
    queue: str | None = None,
    states: Iterable[str] | None = None,
    payload: Mapping[str, Any] | None = None,
    limit: int = 1000,
) -> list[JobRecord]:
    """Jobs in the database, oldest first, filtered by task, queue, states and a payload
    *subset* (`payload={"user": 7}` matches any payload with user 7)."""
    name = task.name if isinstance(task, TaskDeclaration) else task
    records = await client.driver.job_list(
        JobFilter(
            states=None if states is None else tuple(states),
            tasks=None if name is None else (name,),
            queues=None if queue is None else (queue,),
            limit=limit,
        )
    )
    return [record for record in reversed(records) if _contains(record.payload, payload)]


def _contains(actual: Any, expected: Any) -> bool:
    if expected is None:
        return True
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and all(
            key in actual and _contains(actual[key], value) for key, value in expected.items()
        )
    return bool(actual == expected)


async def assert_enqueued(
    client: Client,
    task: str | TaskDeclaration | None = None,
    *,
    queue: str | None = None,
    states: Iterable[str] | None = (JobState.SCHEDULED, JobState.READY),
    payload: Mapping[str, Any] | None = None,
    count: int | None = None,
) -> list[JobRecord]:
    """Assert jobs matching the filters are waiting to run (`count`: exactly that many; default
    at least one); returns them. The failure message lists what *was* enqueued."""
    found = await enqueued_jobs(client, task, queue=queue, states=states, payload=payload)
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    everything = await enqueued_jobs(client, states=states)
    wanted = f"{count if count is not None else 'at least 1'} job(s)"
    listing = "\n".join(f"  {r.id} {r.task} queue={r.queue} {r.payload!r}" for r in everything)
    raise AssertionError(
        f"expected {wanted} of task={_name(task)} queue={queue} payload⊇{payload!r}, found "
        f"{len(found)}; enqueued ({', '.join(states or ['any state'])}):\n{listing or '  none'}"
    )


async def refute_enqueued(
    client: Client,
    task: str | TaskDeclaration | None = None,
    *,
    queue: str | None = None,
    states: Iterable[str] | None = (JobState.SCHEDULED, JobState.READY),
    payload: Mapping[str, Any] | None = None,
) -> None:
    """Assert no job matching the filters is waiting to run."""
    await assert_enqueued(client, task, queue=queue, states=states, payload=payload, count=0)


def _name(task: str | TaskDeclaration | None) -> str | None:
    return task.name if isinstance(task, TaskDeclaration) else task
