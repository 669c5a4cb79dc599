"""The claim loop: ONE per queue per worker, owning that queue's slots.

It waits for the first of: a slot settling, a ready notification for its queue, the poll
timer. Then, in one statement, it writes the queue's finished results and claims at most the
open slots (`job_complete_and_claim`), and starts a handler per claimed job. Failures and drain
releases are written first, in one batched statement each. The loop never spins: after a
round it waits for the next wake-up.

Capacity: a job is owned from its claim until the statement that records its outcome commits
(running, or finished and waiting to be written). The claim asks for `concurrency - owned`
rows, counting the results the same statement writes as freed, so this worker never owns more
running rows in the database than its slots, even for an instant.
"""

from __future__ import annotations

import logging
import random
import traceback
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import attrs
import trio

from .._core import codec
from .._core.capacity import claim_size
from .._core.retry import should_retry
from .._driver import (
    DEFAULT_KEY_WINDOW,
    ClaimedJob,
    CompleteAndClaim,
    Completion,
    Driver,
    Failure,
    Lease,
)
from ..context import Context, JobInfo
from .logs import log_job_failure
from .tasks import TaskSpec

log = logging.getLogger("trioq.worker")
T = TypeVar("T")

# A claim that used its whole partition-key window and still left slots open runs again at once,
# on the next window, up to this many times in a row (then the poll timer takes over): free slots
# do not wait a poll interval while keys further round have ready work, and an all-busy key set
# costs a bounded burst, not a spin.
MAX_WINDOW_ROUNDS = 8

MAX_TRACEBACK_CHARS = 20_000


@attrs.define(eq=False)
class WorkerHooks:
    """Optional test hooks (River's testsignal): called synchronously, never awaited."""

    on_round: Callable[[str, int, int], None] | None = None  # queue, requested, claimed
    on_job_start: Callable[[ClaimedJob], None] | None = None
    on_job_end: Callable[[ClaimedJob, str], None] | None = None  # outcome
    on_poll: Callable[[str], None] | None = None  # queue: a round started by the poll timer


@attrs.define(eq=False)
class RunningJob:
    job: ClaimedJob
    scope: trio.CancelScope
    # When the database last confirmed this lease (claim or renewal), on trio's clock, taken
    # *before* the confirming statement was sent: the lease runs at least this long from here.
    confirmed_at: float
    cancel_reason: str | None = None  # "lost", "cancelled", "drain"

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.scope.cancel()


@attrs.frozen
class ClaimLoopStatistics:
    queue: str
    concurrency: int
    running: int
    pending_writes: int
    rounds: int
    claimed_total: int


@attrs.define(eq=False)
class ClaimLoop:
    queue: str
    concurrency: int
    driver: Driver
    tasks: Mapping[str, TaskSpec]
    worker_id: uuid.UUID
    lease_seconds: float
    poll_interval: float
    hooks: WorkerHooks
    key_window: int = DEFAULT_KEY_WINDOW
    # The (task, version) pairs served; a job runs on the handler of its own version.
    versions: Mapping[tuple[str, int], TaskSpec] = attrs.field(factory=dict)
    # Admission control: the slots this queue may fill now (None: all of `concurrency`).
    admitted: Callable[[], int] | None = None
    running: dict[int, RunningJob] = attrs.field(factory=dict)
    _completions: list[Completion] = attrs.field(factory=list)
    _failures: list[Failure] = attrs.field(factory=list)
    _releases: list[Lease] = attrs.field(factory=list)
    _writing: list[Lease] = attrs.field(factory=list)
    _wake: trio.Event = attrs.field(factory=trio.Event)
    _settled: trio.Event = attrs.field(factory=trio.Event)
    _stopping: bool = False
    _rounds: int = 0
    _claimed_total: int = 0
    _db_healthy: bool = True
    _key_cursor: str = ""
    _keyed_completions: int = 0
    _window_rounds: int = 0

    # --- state the rest of the worker reads ---------------------------------------------

    def owned_leases(self) -> list[Lease]:
        """Every lease this loop still holds in the database (running or not yet written)."""
        return (
            [entry.job.lease for entry in self.running.values()]
            + [completion.lease for completion in self._completions]
            + [failure.lease for failure in self._failures]
            + list(self._releases)
            + list(self._writing)
        )

    def owned(self) -> int:
        return len(self.owned_leases())

    @property
    def db_healthy(self) -> bool:
        return self._db_healthy

    def statistics(self) -> ClaimLoopStatistics:
        return ClaimLoopStatistics(
            queue=self.queue,
            concurrency=self.concurrency,
            running=len(self.running),
            pending_writes=self.owned() - len(self.running),
            rounds=self._rounds,
            claimed_total=self._claimed_total,
        )

    def wake(self) -> None:
        """Ask for a round now (a notification arrived, or a slot settled)."""
        self._wake.set()

    async def wait_no_running(self) -> None:
        """Wait until no handler of this queue is running (safe to cancel: leaves nothing)."""
        while self.running:
            await self._settled.wait()

    def stop_claiming(self) -> None:
        """Drain: claim nothing more; the loop exits once every owned job is written."""
        self._stopping = True
        self._wake.set()

    # --- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until stopped and every owned job is settled and written.

        Cancelling it cancels the running handlers; their rows keep their leases, which expire
        and are recovered (a hard stop; the graceful path is `stop_claiming`).
        """
        backoff = 0.1
        self._wake.set()  # the first round runs at once: work may be waiting already
        async with trio.open_nursery() as handlers:
            while not (self._stopping and self.owned() == 0):
                with trio.move_on_after(self.poll_interval) as timer:
                    await self._wake.wait()
                if timer.cancelled_caught and self.hooks.on_poll:
                    self.hooks.on_poll(self.queue)
                self._wake = trio.Event()
                # Let handlers that finish in this same scheduler tick join the batch.
                await trio.lowlevel.checkpoint()
                try:
                    await self._round(handlers)
                except Exception as exc:  # the database is away: keep results, retry later
                    self._db_healthy = False
                    log.warning(
                        "queue %s: round failed (%s); retrying in %.1fs", self.queue, exc, backoff
                    )
                    await trio.sleep(backoff * (1 + random.random()))
                    backoff = min(backoff * 2, 5.0)
                    self._wake.set()
                else:
                    self._db_healthy = True
                    backoff = 0.1

    async def _round(self, handlers: trio.Nursery) -> None:
        self._rounds += 1
        await self._flush(self._failures, self.driver.job_fail_many, lambda f: f.lease)
        await self._flush(self._releases, self.driver.job_release_many, lambda lease: lease)
        completions, self._completions = self._completions, []
        keyed, self._keyed_completions = self._keyed_completions, 0
        # The completions written by this statement free their slots in the same commit.
        # Admission control only lowers what is claimed; running handlers are never touched.
        slots = (
            self.concurrency if self.admitted is None else min(self.concurrency, self.admitted())
        )
        limit = (
            0
            if self._stopping
            else claim_size(
                slots, len(self.running) + len(self._failures) + len(self._releases), 0, slots
            )
        )
        if limit == 0 and not completions:
            return
        self._writing.extend(completion.lease for completion in completions)
        sent_at = trio.current_time()
        try:
            result = await self.driver.job_complete_and_claim(
                CompleteAndClaim(
                    queue=self.queue,
                    tasks=tuple(dict.fromkeys(name for name, _ in self.versions) or self.tasks),
                    limit=limit,
                    lease_seconds=self.lease_seconds,
                    worker_id=self.worker_id,
                    completions=tuple(completions),
                    key_cursor=self._key_cursor,
                    key_window=self.key_window,
                    task_versions=self._task_versions() if self.versions else None,
                )
            )
        except BaseException:
            self._completions[:0] = completions  # nothing committed (or unknown): keep them
            self._keyed_completions += keyed
            raise
        finally:
            self._writing.clear()
        lost = len(completions) - len(result.completed_ids)
        if lost:
            log.warning(
                "queue %s: %d results not written: their leases were lost", self.queue, lost
            )
        if limit:  # a completion-only round visits no keys: keep the round-robin position
            self._key_cursor = result.key_cursor or ""
        short = len(result.claimed) < limit
        if keyed and short:
            # This statement's snapshot still saw the completed jobs' keys as held: the next
            # job of those keys becomes claimable in the next round, so run it now.
            self._wake.set()
        window_full = limit > 0 and result.keys_visited >= self.key_window
        if window_full and short and self._window_rounds < MAX_WINDOW_ROUNDS:
            self._window_rounds += 1
            self._wake.set()
        elif not (window_full and short):
            self._window_rounds = 0
        self._claimed_total += len(result.claimed)
        if self.hooks.on_round:
            self.hooks.on_round(self.queue, limit, len(result.claimed))
        for job in result.claimed:
            stale = self.running.get(job.id)
            if stale is not None:
                # Our earlier attempt's lease ran out while its handler still ran and the job
                # came back to us: that handler no longer owns anything.
                log.warning(
                    "job %d attempt %d reclaimed as attempt %d while still running here: "
                    "cancelling the old attempt",
                    job.id,
                    stale.job.attempt,
                    job.attempt,
                )
                stale.cancel("lost")
            entry = RunningJob(job, trio.CancelScope(), confirmed_at=sent_at)
            self.running[job.id] = entry
            handlers.start_soon(self._run_job, entry, name=f"trioq job {job.id}")

    async def _flush(
        self,
        pending: list[T],
        write: Callable[[list[T]], Awaitable[object]],
        lease_of: Callable[[T], Lease],
    ) -> None:
        if not pending:
            return
        batch = pending[:]
        pending.clear()
        self._writing.extend(lease_of(item) for item in batch)
        try:
            await write(batch)
        except BaseException:
            pending[:0] = batch
            raise
        finally:
            self._writing.clear()

    # --- one job -------------------------------------------------------------------------

    async def _run_job(self, entry: RunningJob) -> None:
        job = entry.job
        spec = self.versions.get((job.task, job.version)) or self.tasks[job.task]
        if spec.timeout is not None:
            entry.scope.deadline = trio.current_time() + spec.timeout
        if self.hooks.on_job_start:
            self.hooks.on_job_start(job)
        outcome = "completed"
        try:
            with entry.scope:
                if job.cancel_requested:
                    entry.cancel("cancelled")
                result = await spec.handler(self._context(job), spec.load_payload(job.payload))
                result_json = codec.encode(result, root="result")
        except Exception as exc:
            outcome = self._record_failure(entry, spec, exc)
        else:
            if entry.scope.cancelled_caught:
                outcome = self._record_cancellation(entry, spec)
            else:
                self._completions.append(Completion(job.lease, result_json))
                self._keyed_completions += job.partition_key is not None
        finally:
            if self.running.get(job.id) is entry:  # a newer attempt may have replaced it
                del self.running[job.id]
            self._wake.set()
            self._settled.set()
            self._settled = trio.Event()
        if self.hooks.on_job_end:
            self.hooks.on_job_end(job, outcome)

    def _task_versions(self) -> tuple[str, ...]:
        return tuple(sorted(spec.pair for spec in self.versions.values()))

    def _context(self, job: ClaimedJob) -> Context:
        info = JobInfo(
            id=job.id,
            task=job.task,
            queue=job.queue,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            partition_key=job.partition_key,
            priority=job.priority,
            created_at=job.created_at,
            version=job.version,
        )
        return Context(info, self.worker_id)

    def _record_cancellation(self, entry: RunningJob, spec: TaskSpec) -> str:
        reason = entry.cancel_reason
        if reason == "lost":
            return "lost"  # another worker owns it now: write nothing
        if reason == "drain":
            self._releases.append(entry.job.lease)
            return "released"
        if reason == "cancelled":
            self._failures.append(
                Failure(
                    entry.job.lease,
                    _error_json("Cancelled", "cancelled on request", None),
                    None,
                    "cancelled",
                )
            )
            return "cancelled"
        return self._record_failure(
            entry, spec, TimeoutError(f"task {spec.name!r} exceeded its {spec.timeout}s timeout")
        )

    def _record_failure(self, entry: RunningJob, spec: TaskSpec, exc: Exception) -> str:
        job = entry.job
        if entry.cancel_reason is not None:
            # Cancelled on purpose and the handler turned it into another error: the reason
            # decides (lost: write nothing; drain: release; cancelled: record it).
            return self._record_cancellation(entry, spec)
        error_type = f"{type(exc).__module__}.{type(exc).__qualname__}"
        error_json = _error_json(
            error_type, str(exc), "".join(traceback.format_exception(exc))[-MAX_TRACEBACK_CHARS:]
        )
        delay = (
            spec.retry.delay(job.attempt) if should_retry(job.attempt, job.max_attempts) else None
        )
        log_job_failure(
            job_id=job.id, attempt=job.attempt, max_attempts=job.max_attempts, task=job.task,
            queue=job.queue, worker_id=self.worker_id, error_type=error_type, message=str(exc),
            retry_in=delay,
        )  # fmt: skip
        if delay is not None:
            self._failures.append(Failure(job.lease, error_json, delay))
            return "retried"
        self._failures.append(Failure(job.lease, error_json, None, "failed"))
        return "failed"


def _storable(text: str) -> str:
    """Error text as Postgres can store it (no NUL, no lone surrogates)."""
    return text.replace("\x00", "\\0").encode("utf-8", "replace").decode("utf-8")


def _error_json(error_type: str, message: str, tb: str | None) -> str:
    error = {
        "type": _storable(error_type),
        "message": _storable(message[:4000]),
        "traceback": None if tb is None else _storable(tb),
    }
    return codec.encode(error, root="error")


__all__ = ["ClaimLoop", "RunningJob", "WorkerHooks"]
