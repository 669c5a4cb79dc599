"""The claim loop: ONE per queue per worker, owning that queue's slots.

It waits for the first of: a slot settling, a ready notification for its queue, its timer (the
poll interval, or the queue's next due time when that is sooner). Then, in one statement
(`job_settle_and_claim`), it records the outcomes of the queue's finished executions, promotes
due work, claims at most the open slots, and starts an executor per claimed job. The loop never
spins: after a round it waits for the next wake-up.

Capacity: a job is owned from its claim until the statement that records its outcome commits
(running, or finished and waiting in the settle buffer). The claim asks for `concurrency -
running` rows: the outcomes the same statement writes free their slots in the same commit, so
this worker never owns more running rows in the database than its slots, even for an instant.

Errors: a round that fails because the connection was lost is retried with backoff (outcomes
kept); any other error is a bug or a broken schema and stops the worker with it. On the way
out, however the loop ends (a hard stop included), buffered outcomes are written once more,
shielded and bounded by `write_timeout`.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Mapping

import attrs
import trio

from .._core.capacity import claim_size
from .._driver import (
    DEFAULT_KEY_WINDOW,
    ClaimedJob,
    Driver,
    Lease,
    SettleAndClaim,
    SettleAndClaimResult,
)
from .checkpoints import CheckpointWriter
from .executor import execute
from .outcome import outcome_name, settlement_of
from .run import Run
from .settle import SettleBuffer
from .tasks import TaskSpec

log = logging.getLogger("trioq.worker")

# A claim that used its whole partition-key window and still left slots open runs again at once,
# on the next window, up to this many times in a row (then the poll timer takes over): free slots
# do not wait a poll interval while keys further round have ready work, and an all-busy key set
# costs a bounded burst, not a spin.
MAX_WINDOW_ROUNDS = 8


@attrs.define(eq=False)
class WorkerHooks:
    """Optional test hooks (River's testsignal): called synchronously, never awaited."""

    on_round: Callable[[str, int, int], None] | None = None  # queue, requested, claimed
    on_job_start: Callable[[ClaimedJob], None] | None = None
    on_job_end: Callable[[ClaimedJob, str], None] | None = None  # outcome name
    on_poll: Callable[[str], None] | None = None  # queue: a round started by the poll timer


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
    checkpoints: CheckpointWriter
    write_timeout: float = 30.0
    key_window: int = DEFAULT_KEY_WINDOW
    # The (task, version) pairs served; a job runs on the handler of its own version.
    versions: Mapping[tuple[str, int], TaskSpec] = attrs.field(factory=dict)
    # Admission control: the slots this queue may fill now (None: all of `concurrency`).
    admitted: Callable[[], int] | None = None
    running: dict[int, Run] = attrs.field(factory=dict)
    _settle: SettleBuffer = attrs.field(factory=SettleBuffer)
    _wake: trio.Event = attrs.field(factory=trio.Event)
    _settled: trio.Event = attrs.field(factory=trio.Event)
    _stopping: bool = False
    _rounds: int = 0
    _claimed_total: int = 0
    _db_healthy: bool = True
    _key_cursor: str = ""
    _window_rounds: int = 0
    _next_due_at: float | None = None  # trio time of the queue's next due row, if sooner
    # Poll sharing (polls.py): when the idle poll is due, its time before a probe held it, and
    # the wait's timer while the loop waits.
    _poll_at: float = 0.0
    _held_poll_at: float | None = None
    _timer: trio.CancelScope | None = None

    # --- state the rest of the worker reads ---------------------------------------------

    def owned_leases(self) -> list[Lease]:
        """Every lease this loop still holds in the database (running or not yet written)."""
        return [run.lease for run in self.running.values()] + self._settle.leases()

    def owned(self) -> int:
        return len(self.owned_leases())

    def renewable_leases(self) -> list[Lease]:
        """The leases to extend: all owned ones except those of handlers already cancelled (a
        drain, a cancel request, a lost or unconfirmed lease). Those handlers should be gone
        within moments; one that ignores cancellation (a blocking call in a thread) must not
        keep its job from everyone else: its lease runs out and the job is recovered."""
        cancelled = {
            entry.job.lease for entry in self.running.values() if entry.cancel_reason is not None
        }
        return [lease for lease in self.owned_leases() if lease not in cancelled]

    @property
    def db_healthy(self) -> bool:
        return self._db_healthy

    def statistics(self) -> ClaimLoopStatistics:
        return ClaimLoopStatistics(
            queue=self.queue,
            concurrency=self.concurrency,
            running=len(self.running),
            pending_writes=len(self._settle),
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
        and are recovered (a hard stop; the graceful path is `stop_claiming`). Outcomes already
        buffered are written on the way out either way.
        """
        try:
            async with trio.open_nursery() as handlers:
                await self._loop(handlers)
        finally:
            await self._final_flush()

    async def _loop(self, handlers: trio.Nursery) -> None:
        backoff = 0.1
        self._wake.set()  # the first round runs at once: work may be waiting already
        while not (self._stopping and self.owned() == 0):
            await self._wait_for_wake()
            # Let handlers that finish in this same scheduler tick join the batch.
            await trio.lowlevel.checkpoint()
            try:
                await self._round(handlers)
            except Exception as exc:
                if not self.driver.is_connection_lost(exc):
                    log.error(
                        "queue %s: claim round failed with an unexpected error, stopping the "
                        "worker: %r",
                        self.queue,
                        exc,
                    )
                    raise
                self._db_healthy = False  # the database is away: keep outcomes, retry later
                log.warning(
                    "queue %s: round failed (%s); retrying in %.1fs", self.queue, exc, backoff
                )
                await trio.sleep(backoff * (1 + random.random()))
                backoff = min(backoff * 2, 5.0)
                self._wake.set()
            else:
                self._db_healthy = True
                backoff = 0.1

    async def _wait_for_wake(self) -> None:
        self._poll_at = trio.current_time() + self.poll_interval
        self._held_poll_at = None
        with trio.CancelScope(deadline=self._timer_deadline()) as timer:
            self._timer = timer
            try:
                await self._wake.wait()
            finally:
                self._timer = None
        if timer.cancelled_caught and self.hooks.on_poll:
            self.hooks.on_poll(self.queue)
        self._wake = trio.Event()

    def _timer_deadline(self) -> float:
        if self._next_due_at is None:
            return self._poll_at
        return min(self._poll_at, self._next_due_at)

    # --- poll sharing (polls.py) ---------------------------------------------------------

    def poll_due_at(self) -> float | None:
        """When this loop's idle poll is due, while it waits for one (else None, also once
        its timer has fired)."""
        if self._timer is None or self._timer.cancel_called:
            return None
        return self._poll_at

    def defer_poll(self, looked_at: float) -> None:
        """A statement that looks at this queue at `looked_at` (polls.py) is in flight: hold
        the poll until its answer (`observed`)."""
        if self._held_poll_at is None:
            self._held_poll_at = self._poll_at
        self._poll_at = max(self._poll_at, looked_at + self.poll_interval)
        self._reset_timer()

    def observed(self, *, nothing_due: bool, next_due_at: float | None) -> None:
        """The probe's answer. Nothing due: the probe was this interval's poll (the timer also
        follows `next_due_at`). Otherwise (work due, or no answer) the poll stays as it was."""
        if not nothing_due and self._held_poll_at is not None:
            self._poll_at = self._held_poll_at
        self._held_poll_at = None
        if next_due_at is not None:
            known = self._next_due_at
            self._next_due_at = next_due_at if known is None else min(known, next_due_at)
        self._reset_timer()

    def _reset_timer(self) -> None:
        if self._timer is not None:
            self._timer.deadline = self._timer_deadline()

    async def _final_flush(self) -> None:
        if not self._settle.pending:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(self.write_timeout) as scope:
            try:
                await self._round(None)
            except Exception as exc:
                log.warning(
                    "queue %s: %d outcomes not written on the way out (%r); their jobs are "
                    "recovered when their leases expire",
                    self.queue,
                    self._settle.pending,
                    exc,
                )
        if scope.cancelled_caught:
            log.warning(
                "queue %s: outcomes not written within %.0fs on the way out; their jobs are "
                "recovered when their leases expire",
                self.queue,
                self.write_timeout,
            )

    async def _round(self, handlers: trio.Nursery | None) -> None:
        """One settle-and-claim statement. With `handlers` None (the final flush), it only
        settles."""
        self._rounds += 1
        batch, frees_key = self._settle.take()
        # Admission control only lowers what is claimed; running handlers are never touched.
        slots = (
            self.concurrency if self.admitted is None else min(self.concurrency, self.admitted())
        )
        limit = (
            0
            if self._stopping or handlers is None
            else claim_size(slots, len(self.running), 0, slots)
        )
        if limit == 0 and not batch:
            # Every slot is busy: the next due time is no reason to wake (a settling slot wakes
            # the loop, and its round learns the next due time again).
            self._next_due_at = None
            return
        sent_at = trio.current_time()
        try:
            result = await self.driver.job_settle_and_claim(
                SettleAndClaim(
                    queue=self.queue,
                    tasks=tuple(dict.fromkeys(name for name, _ in self.versions) or self.tasks),
                    limit=limit,
                    lease_seconds=self.lease_seconds,
                    worker_id=self.worker_id,
                    settlements=batch,
                    key_cursor=self._key_cursor,
                    key_window=self.key_window,
                    task_versions=self._task_versions() if self.versions else None,
                )
            )
        except BaseException:
            self._settle.restore(batch)  # nothing committed (or unknown): keep them
            raise
        self._settle.written(batch)
        lost = len(batch) - len(result.settled)
        if lost:
            log.warning(
                "queue %s: %d outcomes not written: their leases were lost", self.queue, lost
            )
        self._after_round(result, limit, frees_key, sent_at)
        if handlers is not None:
            self._start(handlers, result, sent_at)

    def _after_round(
        self, result: SettleAndClaimResult, limit: int, frees_key: bool, sent_at: float
    ) -> None:
        if limit:  # a settle-only round visits no keys: keep the round-robin position
            self._key_cursor = result.key_cursor or ""
        short = len(result.claimed) < limit
        if (frees_key and short) or result.promoted:
            # This statement's snapshot still saw the freed keys as held and the promoted rows
            # as not due: they become claimable in the next round, so run it now.
            self._wake.set()
        window_full = limit > 0 and result.keys_visited >= self.key_window
        if window_full and short and self._window_rounds < MAX_WINDOW_ROUNDS:
            self._window_rounds += 1
            self._wake.set()
        elif not (window_full and short):
            self._window_rounds = 0
        self._next_due_at = None
        if result.next_due is not None:
            # From when the statement was sent (its database `now` is just after): the timer
            # fires at the due time or a little before, never a whole round trip late; a round
            # that comes early finds the row not due yet and sets the timer again.
            wait = max(0.0, (result.next_due - result.now).total_seconds())
            self._next_due_at = sent_at + wait
        self._claimed_total += len(result.claimed)
        if self.hooks.on_round:
            self.hooks.on_round(self.queue, limit, len(result.claimed))

    def _start(self, handlers: trio.Nursery, result: SettleAndClaimResult, sent: float) -> None:
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
            run = Run(
                job=job,
                spec=self.versions.get((job.task, job.version)) or self.tasks[job.task],
                tasks=self.tasks,
                driver=self.driver,
                worker_id=self.worker_id,
                checkpoints=self.checkpoints,
                now=result.now,
                confirmed_at=sent,
            )
            self.running[job.id] = run
            handlers.start_soon(self._run_job, run, name=f"trioq job {job.id}")

    def _task_versions(self) -> tuple[str, ...]:
        return tuple(sorted(spec.pair for spec in self.versions.values()))

    # --- one job -------------------------------------------------------------------------

    async def _run_job(self, run: Run) -> None:
        job = run.job
        if self.hooks.on_job_start:
            self.hooks.on_job_start(job)
        try:
            outcome = await execute(run)
            settlement = settlement_of(run.lease, outcome)
            if settlement is not None:
                self._settle.add(settlement, keyed=job.partition_key is not None)
        finally:
            if self.running.get(job.id) is run:  # a newer attempt may have replaced it
                del self.running[job.id]
            self._wake.set()
            self._settled.set()
            self._settled = trio.Event()
        if self.hooks.on_job_end:
            self.hooks.on_job_end(job, outcome_name(outcome))


__all__ = ["ClaimLoop", "WorkerHooks"]
