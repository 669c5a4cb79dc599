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

Pipelining (`WorkerConfig.pipeline`, off by default): up to two rounds are in flight at once
(each on its own pooled connection), so the handlers' work and the next statement overlap
instead of alternating. A round in flight holds
`max(outcomes it settles, jobs it may claim)` slots until its reply arrives: the outcomes are
owned until its commit, the claimed rows from it. The next round claims only what is left, so
the two together never own more than the slots. When nothing is in flight and a large batch
is pending, it is split in two rounds sent together, which starts the alternation.

Errors: a round that fails because the connection was lost is retried with backoff (outcomes
kept); any other error is a bug or a broken schema and stops the worker with it. On the way
out, however the loop ends (a hard stop included), buffered outcomes are written once more,
shielded and bounded by `write_timeout`.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping

import attrs
import trio

from .. import _tracing as tracing
from .._core.capacity import claim_size
from .._driver import (
    DEFAULT_KEY_WINDOW,
    ClaimedJob,
    Driver,
    Lease,
    SettleAndClaim,
    SettleAndClaimResult,
    Settlement,
)
from .checkpoints import CheckpointWriter
from .dbclock import DatabaseClock
from .executor import execute
from .metrics import JobTally
from .outcome import outcome_name, settlement_of
from .run import Run, SharedTimers
from .settle import SettleBuffer
from .tasks import TaskSpec

log = logging.getLogger("trioq.worker")

# A claim that used its whole partition-key window and still left slots open runs again at once,
# on the next window, up to this many times in a row (then the poll timer takes over): free slots
# do not wait a poll interval while keys further round have ready work, and an all-busy key set
# costs a bounded burst, not a spin.
MAX_WINDOW_ROUNDS = 8

# Unkeyed sleeping or scheduled jobs due within CLAIM_LOOKAHEAD_SECONDS are claimed early and
# held in-process until their run_at (`Run.hold_until_due`): a burst of wake-ups (200 workflows
# whose sleeps end together: a claim of 200 rows with their history and the start of 200
# handlers take tens of ms here) then resumes at its wake time instead of that much later. The
# timer fires TIMER_EARLY_SECONDS before the next due time, less than the lookahead, so the due
# row is inside the claim's window with room to spare. Such a job holds its slot at most the
# lookahead before it runs; ready work sorts before it (claim order is priority, run_at, id).
CLAIM_LOOKAHEAD_SECONDS = 0.25
TIMER_EARLY_SECONDS = 0.2

# Rounds in flight at once with pipelining on (`WorkerConfig.pipeline`; off by default: one),
# and the smallest half of a batch worth its own statement: a split costs one statement more,
# worth it only when each half still carries a real batch. Measured on the durable benchmark
# cluster (2 cores shared by PostgreSQL and the workers, 20,000 no-op jobs, concurrency 25),
# with one worker: 1.15x and 1.07x the jobs/s of one round at a time in two alternating A/B
# runs, 0.85x and 1.10x in two full benchmark runs (bench/RESULTS.md); with two workers
# 0.65x-0.72x (four statements at once on two cores); twice the statements per job either way.
# The overlap of the worker's CPU with the server's work pays only when the database has CPU to
# spare, so it is off unless asked for.
PIPELINED_IN_FLIGHT = 2
MIN_SPLIT = 8


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
class _Flight:
    """A round in flight: the slots it holds until its reply (see the module docstring)."""

    batch: tuple[Settlement, ...]
    frees_key: bool
    limit: int

    @property
    def holds(self) -> int:
        return max(len(self.batch), self.limit)


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
    tally: JobTally | None = None  # the worker's metrics of finished jobs
    write_timeout: float = 30.0
    key_window: int = DEFAULT_KEY_WINDOW
    # The (task, version) pairs served; a job runs on the handler of its own version.
    versions: Mapping[tuple[str, int], TaskSpec] = attrs.field(factory=dict)
    # Admission control: the slots this queue may fill now (None: all of `concurrency`).
    admitted: Callable[[], int] | None = None
    # Rounds in flight at once: 1, or PIPELINED_IN_FLIGHT with pipelining on.
    max_in_flight: int = 1
    running: dict[int, Run] = attrs.field(factory=dict)
    _settle: SettleBuffer = attrs.field(factory=SettleBuffer)
    _wake: trio.Event = attrs.field(factory=trio.Event)
    _settled: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _stopping: bool = False
    _rounds: int = 0
    _claimed_total: int = 0
    _db_healthy: bool = True
    _key_cursor: str = ""
    _window_rounds: int = 0
    _next_due_at: float | None = None  # trio time of the queue's next due row, if sooner
    _flights: list[_Flight] = attrs.field(factory=list)
    _deferred: bool = False  # a wake-up came while max_in_flight rounds were in flight
    _backoff: float = 0.1
    # Poll sharing (polls.py): when the idle poll is due, its time before a probe held it, and
    # the wait's timer while the loop waits (a round in flight may move it: a sooner due time).
    _poll_at: float = 0.0
    _held_poll_at: float | None = None
    _timer: trio.CancelScope | None = None
    _timers: SharedTimers | None = None  # holds early-claimed jobs (Run.hold_until_due)
    _db_clock: DatabaseClock = attrs.field(factory=DatabaseClock)
    # Plain `def` handlers run in threads, as many at once as the queue has slots (executor.py).
    _thread_limiter: trio.CapacityLimiter = attrs.field(
        default=attrs.Factory(lambda self: trio.CapacityLimiter(self.concurrency), takes_self=True)
    )

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
            await self._settled.park()

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
                self._timers = SharedTimers(handlers)
                await self._loop(handlers)
        finally:
            await self._final_flush()

    async def _loop(self, handlers: trio.Nursery) -> None:
        self._wake.set()  # the first round runs at once: work may be waiting already
        async with trio.open_nursery() as rounds:
            while not (self._stopping and self.owned() == 0 and not self._flights):
                await self._wait_for_wake()
                if self.running:
                    # Let handlers that finish in this same scheduler tick join the batch
                    # (with none running, nothing can: a notification's round goes at once).
                    await trio.lowlevel.checkpoint()
                while len(self._flights) >= self.max_in_flight or (
                    self._flights and self._settle.pending < MIN_SPLIT
                ):
                    # A second round in flight only for a real batch; else wait (no timer:
                    # its reason is served by the next round) until the round in flight
                    # returns, or enough outcomes are pending, as a serial loop would.
                    self._deferred = True
                    await self._wake.wait()
                    self._wake = trio.Event()
                    await trio.lowlevel.checkpoint()
                first = self._plan(handlers, split=self.max_in_flight > 1 and not self._flights)
                if first is None:
                    continue
                if self.max_in_flight == 1:
                    # One round at a time: run it here, not in a task of its own (a spawn and a
                    # scheduling round less between a wake-up and the statement's send).
                    await self._fly(handlers, first)
                    continue
                rounds.start_soon(self._fly, handlers, first)
                if len(self._flights) < self.max_in_flight and self._settle.pending:
                    second = self._plan(handlers, split=False)
                    if second is not None:
                        rounds.start_soon(self._fly, handlers, second)

    async def _fly(self, handlers: trio.Nursery, flight: _Flight) -> None:
        """Send one planned round; on a lost connection keep its outcomes and back off (the
        slot in flight stays taken meanwhile, so retries are spaced); any other error is a bug
        or a broken schema and stops the worker."""
        try:
            await self._send(handlers, flight)
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
                "queue %s: round failed (%s); retrying in %.1fs", self.queue, exc, self._backoff
            )
            await trio.sleep(self._backoff * (1 + random.random()))
            self._backoff = min(self._backoff * 2, 5.0)
            self._wake.set()
        else:
            self._db_healthy = True
            self._backoff = 0.1
        finally:
            self._flights.remove(flight)
            if self._deferred or self._stopping:
                self._deferred = False
                self._wake.set()

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
            next_due_at -= TIMER_EARLY_SECONDS  # as after a round: early, within the lookahead
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
                flight = self._plan(None, split=False)
                if flight is not None:
                    await self._send(None, flight)
                    self._flights.remove(flight)
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

    def _plan(self, handlers: trio.Nursery | None, *, split: bool) -> _Flight | None:
        """Take a batch and decide how many jobs the round may claim; the round is in flight
        from here (its slots are held). None: nothing to write and no slot to fill. With
        `handlers` None (the final flush), it only settles."""
        pending = self._settle.pending
        take = pending // 2 if split and pending >= 2 * MIN_SPLIT else None
        batch, frees_key = self._settle.take(take)
        # Admission control only lowers what is claimed; running handlers are never touched.
        slots = (
            self.concurrency if self.admitted is None else min(self.concurrency, self.admitted())
        )
        held = sum(flight.holds for flight in self._flights)
        owned = len(self.running) + self._settle.pending
        limit = 0 if self._stopping or handlers is None else claim_size(slots, owned, held, slots)
        if limit == 0 and not batch:
            # Every slot is busy: the next due time is no reason to wake (a settling slot wakes
            # the loop, and its round learns the next due time again).
            self._next_due_at = None
            return None
        flight = _Flight(batch, frees_key, limit)
        self._flights.append(flight)
        return flight

    async def _send(self, handlers: trio.Nursery | None, flight: _Flight) -> None:
        """One settle-and-claim statement for a planned round."""
        self._rounds += 1
        batch, limit = flight.batch, flight.limit
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
                    lookahead_seconds=CLAIM_LOOKAHEAD_SECONDS,
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
        self._after_round(result, limit, flight.frees_key, sent_at)
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
            wait = (result.next_due - result.now).total_seconds() - TIMER_EARLY_SECONDS
            self._next_due_at = sent_at + max(0.0, wait)
        self._reset_timer()
        self._claimed_total += len(result.claimed)
        if self.hooks.on_round:
            self.hooks.on_round(self.queue, limit, len(result.claimed))

    def _start(self, handlers: trio.Nursery, result: SettleAndClaimResult, sent: float) -> None:
        received = trio.current_time() if result.replied_at is None else result.replied_at
        self._db_clock.observe(result.now, sent, received)
        traced = tracing.enabled() if result.claimed else False
        running, versions, tasks, now = self.running, self.versions, self.tasks, result.now
        for job in result.claimed:
            stale = running.get(job.id)
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
                spec=versions.get((job.task, job.version)) or tasks[job.task],
                tasks=tasks,
                driver=self.driver,
                worker_id=self.worker_id,
                checkpoints=self.checkpoints,
                now=now,
                confirmed_at=sent,
                due_at=self._db_clock.to_trio(job.run_at) if job.run_at > now else None,
                timers=self._timers,
                traced=traced,
                thread_limiter=self._thread_limiter,
            )
            running[job.id] = run
            handlers.start_soon(self._run_job, run, name=f"trioq job {job.id}")

    def _task_versions(self) -> tuple[str, ...]:
        return tuple(sorted(spec.pair for spec in self.versions.values()))

    # --- one job -------------------------------------------------------------------------

    async def _run_job(self, run: Run) -> None:
        job = run.job
        hooks, tally = self.hooks, self.tally
        if hooks.on_job_start:
            hooks.on_job_start(job)
        started = time.perf_counter()  # the handler's run time, for metrics: real seconds
        try:
            outcome = await execute(run)
            settlement = settlement_of(run.lease, outcome, plain=job.plain)
            if settlement is not None:
                self._settle.add(settlement, keyed=job.partition_key is not None)
        finally:
            if self.running.get(job.id) is run:  # a newer attempt may have replaced it
                del self.running[job.id]
            self._wake.set()
            if self._settled:  # someone waits for no handler running (an Event would be per job)
                self._settled.unpark_all()
        if tally is not None or hooks.on_job_end:
            name = outcome_name(outcome)
            if tally is not None:
                tally.ended(job.task, job.queue, name, time.perf_counter() - started)
            if hooks.on_job_end:
                hooks.on_job_end(job, name)


__all__ = ["ClaimLoop", "WorkerHooks"]
