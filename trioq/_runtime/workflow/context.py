"""What a handler sees: `ctx.job` (who am I), a logger, and the durable primitives.

`Context` is a thin view over the runtime's per-run object (`trioq._runtime.job.run.Run`); it holds
no state of its own beyond a lazily built logger. Re-exported as `trioq.Context`.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, NoReturn, cast

import attrs
import trio

from ..._core.errors import ConfigurationError
from ..._core.retry import RetryPolicy
from ..._enqueue.rows import TaskDeclaration
from ..job.active import ACTIVE_CLIENT
from ..job.job_transaction import JobTransaction, open_job_transaction
from ..job.run import Run
from . import messages, waits
from .parallel import Parallel

if TYPE_CHECKING:  # the public client is above the runtime: named for types only
    from ...client import Client


@attrs.frozen
class JobInfo:
    id: int
    task: str
    queue: str
    attempt: int
    max_attempts: int
    partition_key: str | None
    priority: int
    created_at: datetime.datetime
    version: int = 1  # the handler version this job was enqueued for
    concurrency_key: str | None = None  # at most its limit of this key's jobs run at once


class Context:
    """Passed to every handler as its first argument.

    `job` describes the attempt being run. `logger` carries the job id, attempt and worker id in
    every record (`extra`); it is built on first use, so handlers that do not log pay nothing.
    The durable primitives (`step`, `sleep`, `sleep_until`) are described in docs/workflows.md.
    """

    __slots__ = ("_job", "_logger", "_run")

    def __init__(self, run: Run) -> None:
        self._run = run
        self._job: JobInfo | None = None
        self._logger: logging.LoggerAdapter[logging.Logger] | None = None

    @property
    def job(self) -> JobInfo:
        """The attempt being run (built on first use: handlers that never look pay nothing)."""
        if self._job is None:
            job = self._run.job
            self._job = JobInfo(
                id=job.id,
                task=job.task,
                queue=job.queue,
                attempt=job.attempt,
                max_attempts=self._run.max_attempts,
                partition_key=job.partition_key,
                priority=job.priority,
                created_at=job.created_at,
                version=job.version,
                concurrency_key=job.concurrency_key,
            )
        return self._job

    @property
    def worker_id(self) -> uuid.UUID:
        return self._run.worker_id

    @property
    def client(self) -> Client:
        """The worker's own `Client` (its pool: no extra connections): enqueue follow-up jobs,
        read jobs, emit events from a handler."""
        client = ACTIVE_CLIENT.get()
        if client is None:
            raise ConfigurationError(
                "ctx.client: this worker was not started inside `app.client()`"
            )
        return cast("Client", client)

    def transaction(self) -> AbstractAsyncContextManager[JobTransaction]:
        """Your SQL, enqueues and (with `tx.complete(result)`) this job's completion in ONE
        transaction on the worker's pool; see docs/producers.md ("Transactional completion")."""
        return open_job_transaction(self._run, self.client)

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        if self._logger is None:
            self._logger = logging.LoggerAdapter(
                logging.getLogger(f"trioq.task.{self.job.task}"),
                {
                    "job_id": self.job.id,
                    "attempt": self.job.attempt,
                    "worker_id": str(self.worker_id),
                },
            )
        return self._logger

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        shielded: bool = False,
    ) -> Any:
        """Run `fn(*args)` (sync or async) once for this job and return its JSON result.

        The result is stored as the job's next checkpoint before this returns; every later
        execution of the job returns the stored result without calling `fn`. With `retry`, a
        raising `fn` is retried in place up to `retry.max_attempts` times; then the execution
        fails like a handler error, its stored error naming the step. A sync `fn` runs in the
        trio thread: wrap blocking work in `trio.to_thread.run_sync`. `shielded=True`: the step
        runs even while the job is being cancelled (cleanup in a `finally` block).
        """
        return await self._run.step(name, fn, *args, retry=retry, shielded=shielded)

    async def sleep(self, name: str, duration: datetime.timedelta) -> None:
        """Sleep durably: the wake time (database now + duration) is stored, the execution ends
        and frees its slot, and the job resumes here after the wake time, on any worker."""
        await self._run.sleep(name, duration)

    async def sleep_until(self, name: str, when: datetime.datetime) -> None:
        """Like `sleep`, until the timezone-aware instant `when` (database time)."""
        await self._run.sleep_until(name, when)

    async def wait_for_event(self, key: str, *, timeout: datetime.timedelta) -> Any:  # noqa: ASYNC109 (a durable deadline, not a cancel scope)
        """Return the payload of the event `key` (`client.emit_event`), waiting durably for it.

        An event emitted before the wait is returned at once. Otherwise the execution ends (no
        slot, lease or connection held; no attempt consumed) and the emit wakes the job, which
        resumes here. After `timeout` (from the first wait, in database time) this raises
        `trioq.EventTimeout`. Either outcome is recorded, so replays return or raise the same.
        """
        return await waits.wait_for_event(self._run, key, timeout)

    async def emit_event(self, key: str, payload: Any = None) -> None:
        """Emit the event `key` from this workflow, as a step: a replay does not emit again."""
        await waits.emit_event(self._run, key, payload)

    async def spawn(self, task: str | TaskDeclaration, payload: Any = None, **options: Any) -> int:
        """Enqueue a child job (options as for `client.enqueue`, except dedup_key) exactly once
        for this point of the workflow, and return its id (the same id on every replay)."""
        return await waits.spawn(self._run, task, payload, options)

    async def wait_result(self, child_id: int) -> Any:
        """Wait durably until the child `child_id` is final; return its result, or raise
        `trioq.JobFailed` carrying its stored error (`.error`). Waiting holds no slot."""
        return await waits.wait_result(self._run, child_id)

    async def gather(self, *child_ids: int) -> list[Any]:
        """Wait durably for every child; return their results in order. On the first child
        that fails, cancel the unfinished siblings, wait until they are final, and raise its
        `trioq.JobFailed` (nursery semantics; the same on every replay)."""
        return await waits.gather(self._run, child_ids)

    # --- concurrency, continue-as-new, patches (docs/workflows.md) --------------------------

    def parallel(self) -> Parallel:
        """`async with ctx.parallel() as p:` — `p.step`, `p.spawn`, `p.sleep` and
        `p.wait_for_event` take their history position when called (in code order, the same
        on every replay) and run concurrently when the block ends; each returns a handle whose
        `.result` is read after the block."""
        return Parallel(self._run)

    async def continue_as_new(self, payload: Any = None) -> NoReturn:
        """End this workflow's history and run it again from the top with `payload`, as the
        same job (its id, partition key and waiters are kept; its history and attempt count
        start afresh). Unfinished children are awaited first. Does not return."""
        await waits.continue_as_new(self._run, payload)

    async def patched(self, name: str) -> bool:
        """A patch point (Temporal's model): False when an earlier execution of this job
        already passed here without the patch (keep the old code), else True (take the new
        code; recorded, so every replay answers the same). See docs/versions.md."""
        return await self._run.patched(name)

    def deprecate_patch(self, name: str) -> None:
        """Replaces `patched(name)` once no job that predates the patch is unfinished: the old
        branch can go, and jobs that recorded the marker still replay."""
        self._run.deprecate_patch(name)

    # --- messages and readable state (messages.py) --------------------------------------

    async def receive(
        self,
        topic: str,
        *,
        timeout: datetime.timedelta,  # noqa: ASYNC109 (a durable deadline, not a cancel scope)
        limit: int = 1000,
    ) -> list[Any]:
        """Return the messages sent to this workflow under `topic` (`client.send`), oldest
        first, waiting durably for at least one.

        Messages sent before the receive are queued: it takes them all (up to `limit`) at once.
        Otherwise the execution ends (no slot, lease or connection held; no attempt consumed)
        and the first send wakes the job and becomes this receive's result: it resumes here
        with that one message (later sends are queued for the next receive). After `timeout`
        (from the first wait, in database time) it returns `[]`. The messages are recorded as
        this point's checkpoint in the statement that takes (or delivers) them, so each is
        delivered once and every replay returns the same list.
        """
        return await messages.receive(self._run, topic, timeout, limit)

    async def set_value(self, key: str, value: Any) -> None:
        """Publish `value` (JSON) under `key` for `client.get_value` and `trioq job ID`.

        No statement of its own: the value is written with the job's next checkpoint (or
        receive, wait or completion), so a loop that sets progress costs nothing extra. The
        newest value per key wins; it stays readable after the job ends."""
        await messages.set_value(self._run, key, value)

    # --- plain `def` handlers (docs/handlers.md) -------------------------------------------

    def cancelled(self) -> bool:
        """True once this execution was cancelled (its timeout passed, the worker drains, a
        cancel was requested, the lease was lost). A plain `def` handler, which trio cannot
        interrupt, checks it between units of work and returns or raises to stop; its outcome
        is then the cancellation's (a timeout fails the attempt, a drain releases the job).
        Callable from the handler's thread and from the trio thread."""
        try:
            trio.from_thread.check_cancelled()
        except trio.Cancelled:
            return True
        except RuntimeError:  # not a trio worker thread: the trio thread itself
            return self._run.cancel_reason is not None or self._run.scope.cancel_called
        return False

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """From a plain `def` handler's thread: run `await fn(*args)` in the trio thread and
        return its result, e.g. `ctx.call(ctx.step, "charge", charge, order)` or
        `ctx.call(ctx.client.enqueue, "mail", {...})`. Raises what `fn` raises (a durable
        sleep or wait ends the execution by raising through the handler: do not catch it)."""
        return trio.from_thread.run(fn, *args)

    def __repr__(self) -> str:
        return f"Context(job={self.job!r}, worker_id={self.worker_id!r})"
