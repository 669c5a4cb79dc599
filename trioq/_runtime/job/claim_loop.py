"""The claim loop: ONE per queue per worker, owning that queue's slots.

It waits for the first of: a slot opening, a ready notification for its queue, its timer (the
poll interval, or the queue's next due time when that is sooner). Then, in one statement
(`Driver.job_claim`), it promotes due work, claims at most the open slots,
and starts an executor per claimed job. The loop never spins: after a round it waits for the
next wake-up (a claim that comes back empty right after a full one is retried at once, once:
work is likely ready and rows another statement held for a moment were passed over by SKIP
LOCKED).

Capacity counts running handlers. A handler that returns hands its outcome to the queue's
completer (completer.py), which writes outcomes in batches on a connection of its own, and its
slot opens at once (when the completer's backlog is full the outcome is held there, its slot
taken until it enters the backlog; the handler's task ends either way). So: handlers running
(and held outcomes) <= slots; rows this worker owns <= slots + the completer's `capacity`; a
partition key's next job starts only once its holder's outcome has
committed (the key stays held in the database until then). Unwritten outcomes keep their
leases renewed (`owned_leases` includes them).

Bounded prefetch (`prefetch=N`, 0: off): a claim asks for the open slots plus the room in an
in-process buffer of claimed jobs, and a slot that opens takes the buffer's next job at once,
without a round trip. Once the buffer holds fewer than its low watermark a refill starts, with
up to `MAX_REFILLS_IN_FLIGHT` claim rounds in flight. Buffered jobs are owned: their leases are
renewed with the running ones, a buffered keyed job holds its key as a running one does, and
the bound becomes rows owned <= slots + prefetch + the completer's `capacity`. A drain hands
every buffered job back with a fenced release (ready again, attempt restored); a hard stop
leaves them to lease expiry, as it does running ones.

Errors: a round that fails because the connection was lost is retried with backoff; any other
error is a bug or a broken schema and stops the worker with it. On the way out, however the
loop ends (a hard stop included), the completer writes what it holds once more, shielded and
bounded by `write_timeout`.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping

import attrs
import trio

from ..._core.capacity import MAX_REFILLS_IN_FLIGHT, claim_size, low_watermark
from ..._seam import tracing
from ..._seam.driver import (
    DEFAULT_KEY_WINDOW,
    Claim,
    ClaimedJob,
    ClaimResult,
    Driver,
    Settlement,
    SettleResult,
)
from ..._seam.lease import Lease
from ..services.metrics import JobTally
from ..workflow.checkpoints import CheckpointWriter
from .completer import DEFAULT_FLUSH_DELAY, Completer, open_completer
from .dbclock import DatabaseClock
from .executor import COMPLETED_NULL, execute
from .outcome import Suspended, outcome_name, settlement_of
from .run import Run, SharedTimers
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

# The share of the lease after which a job whose lease the database has not confirmed is no
# longer ours to run: past it another worker may recover the job. The watchdog cancels running
# handlers at this point, and a buffered job this old is dropped instead of started.
LEASE_MARGIN = 0.9


@attrs.define(eq=False)
class Prefetched:
    """A claimed job waiting in the buffer for a slot; its lease is renewed meanwhile."""

    job: ClaimedJob
    now: datetime.datetime  # database time of its claim
    confirmed_at: float  # trio time its lease was last confirmed (the claim, then renewals)
    traced: bool


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
    prefetched: int = 0


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
    # Whether ready notifications reach this worker now (listener connected, self-probe not
    # failed). None or False: a slot that opens always claims again (polling mode: nothing
    # announces work enqueued after a short claim).
    notifications_live: Callable[[], bool] | None = None
    # The completer's backlog bound (None: the loop's slots) and its partial batches' wait.
    max_backlog: int | None = None
    flush_delay: float = DEFAULT_FLUSH_DELAY
    # Tests delay or fail the completer's flushes here (Completer.before_flush).
    before_flush: Callable[[tuple[Settlement, ...]], Awaitable[None]] | None = None
    # Claimed jobs kept ahead of the free slots (0: claim only for open slots).
    prefetch: int = 0
    running: dict[int, Run] = attrs.field(factory=dict)
    completer: Completer = attrs.field(init=False)
    _buffer: collections.deque[Prefetched] = attrs.field(factory=collections.deque)
    _in_flight: int = 0  # claim rounds sent and not yet answered
    _reserved: int = 0  # the jobs those rounds asked for
    _pending_wake: bool = False  # a wake-up came while no round could be sent
    # The last claim filled what it asked for: work is likely ready, so an empty claim (rows
    # another statement held for a moment, which SKIP LOCKED passes over) is retried at once,
    # once, instead of after the poll interval. (Not at start-up: an idle queue's first round
    # stays one statement.)
    _expect_work: bool = False
    # A slot that opens claims again only when work may be waiting: the last claim filled what
    # it asked for, met a limit or keyed work, served several tasks, or a wake-up (a
    # notification, the poll timer) came while every slot was busy, or notifications are not
    # live. After a short claim of one task's plain work nothing more was ready then, and
    # anything enqueued since notifies: an idle worker ran two claims per job before (the
    # second found nothing).
    _claim_wanted: bool = False
    _many_tasks: bool = attrs.field(init=False, default=False)
    # (the sizes of `tasks` and `versions`, then `_claim_names`' answer for them)
    _claim_names_cache: tuple[tuple[int, int], tuple[str, ...], tuple[str, ...] | None] | None = (
        None
    )
    _handlers: trio.Nursery | None = None
    _wake: trio.Event = attrs.field(factory=trio.Event)
    _settled: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _stopping: bool = False
    _rounds: int = 0
    _claimed_total: int = 0
    _db_healthy: bool = True
    _key_cursor: str = ""
    # The last claim saw no keyed or due work: the next asks for the plain claim first
    # (`Claim.plain`; PgDriver falls back to the full one when that work shows up).
    _plain: bool = False
    _concurrency_cursor: str = ""
    _window_rounds: int = 0
    _next_due_at: float | None = None  # trio time of the queue's next due row, if sooner
    # The earliest due time of rows the completer wrote into scheduled/sleeping/waiting, and
    # the rounds sent before that write committed (they could not see those rows).
    _written_due_at: float | None = None
    _written_before_round: int = 0
    # trio time before which the queue's rate limit allows no start: wake-ups before it run no
    # round (a stream of notifications would otherwise ask the gate again and again).
    _rate_limited_at: float | None = None
    _backoff: float = 0.1
    # Poll sharing (polls.py): when the idle poll is due, its time before a probe held it, and
    # the wait's timer while the loop waits (a round in flight may move it: a sooner due time).
    _poll_at: float = 0.0
    _held_poll_at: float | None = None
    _timer: trio.CancelScope | None = None
    _timers: SharedTimers | None = None  # holds early-claimed jobs (Run.hold_until_due)
    _db_clock: DatabaseClock = attrs.field(factory=DatabaseClock)
    # Plain `def` handlers run in threads, as many at once as the queue has slots (executor.py).
    _low_watermark: int = attrs.field(init=False, default=0)
    _thread_limiter: trio.CapacityLimiter = attrs.field(
        default=attrs.Factory(lambda self: trio.CapacityLimiter(self.concurrency), takes_self=True)
    )

    def __attrs_post_init__(self) -> None:
        # Serving several tasks, a claim locks up to its limit per task and claims its limit in
        # all: rows it passed over stay locked until it commits, and another worker's claim
        # that skipped them comes back short with work ready (no notification follows).
        self._many_tasks = len(self._served_tasks()) > 1
        self._low_watermark = low_watermark(self.prefetch)  # read as every handler ends
        backlog = self.concurrency if self.max_backlog is None else self.max_backlog
        self.completer = Completer(
            driver=self.driver,
            queue=self.queue,
            max_backlog=backlog,
            batch_size=min(backlog, self.concurrency),
            flush_delay=self.flush_delay,
            write_timeout=self.write_timeout,
            on_written=self._written,
            before_flush=self.before_flush,
            on_room=self._slots_opened,
        )

    # --- state the rest of the worker reads ---------------------------------------------

    def owned_leases(self) -> list[Lease]:
        """Every lease this loop still holds in the database (running or not yet written)."""
        return (
            [run.lease for run in self.running.values()]
            + [entry.job.lease for entry in self._buffer]
            + self.completer.leases()
        )

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

    def prefetched(self) -> list[Prefetched]:
        """The buffered jobs, oldest claim first."""
        return list(self._buffer)

    def drop_prefetched(self, entry: Prefetched) -> None:
        """The database no longer has `entry`'s lease (the renewer saw it lost): never start it."""
        with contextlib.suppress(ValueError):  # started or released meanwhile
            self._buffer.remove(entry)

    @property
    def db_healthy(self) -> bool:
        return self._db_healthy and self.completer.healthy

    def statistics(self) -> ClaimLoopStatistics:
        return ClaimLoopStatistics(
            queue=self.queue,
            concurrency=self.concurrency,
            running=len(self.running),
            pending_writes=len(self.completer),
            rounds=self._rounds,
            claimed_total=self._claimed_total,
            prefetched=len(self._buffer),
        )

    def wake(self) -> None:
        """Ask for a round now (a notification arrived, or a slot settled)."""
        if self._in_flight:
            self._pending_wake = True
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
        handed to the completer are written on the way out either way.
        """
        async with open_completer(self.completer):
            try:
                async with trio.open_nursery() as handlers:
                    self._timers = SharedTimers(handlers)
                    self._handlers = handlers
                    await self._loop(handlers)
            finally:
                # The completer's last write may still open held outcomes' slots
                # (`_slots_opened`): nothing starts on a closed nursery.
                self._handlers = None

    async def _loop(self, handlers: trio.Nursery) -> None:
        self._wake.set()  # the first round runs at once: work may be waiting already
        while not (self._stopping and self.owned() == 0 and self._in_flight == 0):
            await self._wait_for_wake()
            if self._stopping:
                await self._release_prefetched()
                continue
            if self.running:
                # Let handlers that finish in this same scheduler tick open their slots first
                # (with none running, nothing can: a notification's round goes at once).
                await trio.lowlevel.checkpoint()
            self._start_prefetched()
            if self._in_flight and not self._may_refill():
                self._pending_wake = True  # reconsider when a round in flight answers
                continue
            limit = self._claim_limit()
            if limit and self._rate_limited_at is not None:
                if trio.current_time() < self._rate_limited_at:
                    continue  # the timer fires when a start is allowed
                self._rate_limited_at = None
            if limit == 0:
                self._claim_wanted = True  # this wake-up claims when a slot opens
                if not self._in_flight:
                    # Every slot is busy: the next due time is no reason to wake (an opening
                    # slot wakes the loop, and its round learns the next due time again).
                    self._next_due_at = self._written_due_at = None
                else:
                    self._pending_wake = True  # the rounds out hold the room: wait for them
                continue
            if self.prefetch == 0:
                await self._round(handlers, limit)  # one round at a time, as it answers
            else:
                self._in_flight += 1
                self._reserved += limit
                handlers.start_soon(self._refill, handlers, limit, name="trioq claim round")

    def _slots_now(self) -> int:
        # Admission control only lowers what is claimed; running handlers are never touched.
        if self.admitted is None:
            return self.concurrency
        return min(self.concurrency, self.admitted())

    def _claim_limit(self) -> int:
        if self._stopping:
            return 0
        slots = self._slots_now()
        # Reduced by admission control, the buffer shrinks with the slots: it holds no more
        # than will start next.
        room = slots + (self.prefetch if slots == self.concurrency else min(self.prefetch, slots))
        held = len(self.running) + self.completer.held + len(self._buffer)
        return claim_size(room, held, self._reserved, room)

    def _may_refill(self) -> bool:
        """Another round may go while one is in flight: the buffer is below its low watermark
        and fewer than `MAX_REFILLS_IN_FLIGHT` are out."""
        return self._in_flight < MAX_REFILLS_IN_FLIGHT and len(self._buffer) < low_watermark(
            self.prefetch
        )

    async def _refill(self, handlers: trio.Nursery, limit: int) -> None:
        try:
            await self._round(handlers, limit)
        finally:
            self._in_flight -= 1
            self._reserved -= limit
            if self._pending_wake or self._stopping:
                self._pending_wake = False
                self._wake.set()

    def _start_prefetched(self) -> None:
        """Start buffered jobs on the free slots, oldest claim first."""
        buffer = self._buffer
        if not buffer or self._stopping:
            return
        handlers = self._handlers
        if handlers is None:  # the loop has ended (a hard stop): buffered jobs never start
            return
        slots = self._slots_now()
        deadline = trio.current_time() - LEASE_MARGIN * self.lease_seconds
        completer = self.completer
        while buffer and len(self.running) + completer.held < slots:
            entry = buffer.popleft()
            if entry.confirmed_at <= deadline:
                # Its lease went unconfirmed for most of its length while it waited: another
                # worker may recover it now, so running it here could overlap that run.
                log.warning(
                    "prefetched job %d attempt %d: lease not confirmed for %.1fs, not started",
                    entry.job.id,
                    entry.job.attempt,
                    trio.current_time() - entry.confirmed_at,
                )
                continue
            self._start_one(handlers, entry.job, entry.now, entry.confirmed_at, entry.traced)

    async def _release_prefetched(self) -> None:
        """Drain: hand every buffered job back (ready, attempt restored, fenced)."""
        while self._buffer:
            await self._release(self._buffer.popleft().job)

    async def _round(self, handlers: trio.Nursery, limit: int) -> None:
        """One claim round; on a lost connection, or a claim the database rolled back (a
        statement timeout, a deadlock), back off and wake again (any other error is a bug or
        a broken schema and stops the worker)."""
        try:
            await self._send(handlers, limit)
        except Exception as exc:
            if self.driver.is_transient(exc):
                # The claim took nothing (rolled back whole) and the connection is usable: a
                # claim that timed out under a pinned horizon is worth another try, not a
                # stopped worker.
                log.warning(
                    "queue %s: claim round rolled back (%s); retrying in %.1fs",
                    self.queue,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    self._backoff,
                )
            elif self.driver.is_connection_lost(exc):
                self._db_healthy = False  # the database is away: retry later
                log.debug(  # the worker's outage summary says it (services/outage.py)
                    "queue %s: round failed (%s); retrying in %.1fs",
                    self.queue,
                    exc,
                    self._backoff,
                )
            else:
                log.error(
                    "queue %s: claim round failed with an unexpected error, stopping the "
                    "worker: %r",
                    self.queue,
                    exc,
                )
                raise
            await trio.sleep(self._backoff * (1 + random.random()))
            self._backoff = min(self._backoff * 2, 5.0)
            self._wake.set()
        else:
            self._db_healthy = True
            self._backoff = 0.1

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
        deadline = self._poll_at
        if self._pending_wake and self._in_flight:
            # A round out (slow, or backing off from a lost connection for up to 5 s) wakes
            # the loop when it ends; a due time that passes meanwhile woke it at once, found
            # no room, and waited on the same past deadline again: a busy loop.
            return deadline
        for due_at in (self._next_due_at, self._written_due_at, self._rate_limited_at):
            if due_at is not None:
                deadline = min(deadline, due_at)
        return deadline

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

    def _served_tasks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for name, _ in self.versions) or self.tasks)

    def _claim_names(self) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
        """The claim's task names and (task, version) pairs (None: no versions), built again
        only when `tasks` or `versions` has grown (tasks are only ever added, under a new key).
        Built every round, they were ~0.5 us a job of a live drain's worker CPU (cProfile of one
        drain of 20,000 jobs, 25 a round: 3.9 of 345 us a job, everything inflated ~7x alike)."""
        sizes = (len(self.tasks), len(self.versions))
        cached = self._claim_names_cache
        if cached is None or cached[0] != sizes:
            pairs = self._task_versions() if self.versions else None
            cached = self._claim_names_cache = (sizes, self._served_tasks(), pairs)
        return cached[1], cached[2]

    async def _send(self, handlers: trio.Nursery, limit: int) -> None:
        """One claim statement (no outcomes: the completer writes those)."""
        self._rounds += 1
        round_number = self._rounds
        sent_at = trio.current_time()
        traced = tracing.enabled()
        tasks, task_versions = self._claim_names()
        result = await self.driver.job_claim(
            Claim(
                queue=self.queue,
                tasks=tasks,
                limit=limit,
                lease_seconds=self.lease_seconds,
                worker_id=self.worker_id,
                key_cursor=self._key_cursor,
                key_window=self.key_window,
                concurrency_cursor=self._concurrency_cursor,
                task_versions=task_versions,
                lookahead_seconds=CLAIM_LOOKAHEAD_SECONDS,
                # Lost attempts' trace ids: the claim records that spans take the token's id.
                traced=traced and tracing.ids_from_leases(),
                plain=self._plain,
            )
        )
        self._after_round(result, limit, sent_at, round_number)
        self._start(handlers, result, sent_at, traced)

    def _written(
        self,
        batch: tuple[Settlement, ...],
        frees_key: bool,
        result: SettleResult,
        sent_at: float,
    ) -> None:
        """The completer committed `batch`: a freed key may be claimable now, and rows it
        suspended or scheduled move the timer (a claim round sent before this commit could not
        see them)."""
        if frees_key or self._stopping:
            self._wake.set()
        if result.next_due is not None:
            wait = (result.next_due - result.now).total_seconds() - TIMER_EARLY_SECONDS
            self._written_due(sent_at + max(0.0, wait))

    def _suspended_until(self, until: datetime.datetime) -> None:
        """A primitive's own statement (an event or children wait) suspended a job until
        `until` (database time) and committed: the timer takes that due time, as after a
        completer's write. A round sent while the job still ran (a notification, another
        slot) could not see it, and its answer cleared the timer: the job then waited for the
        poll (seen as a workflow test stuck for its 30 s poll, 1 run in 5)."""
        self._written_due(self._db_clock.to_trio(until) - TIMER_EARLY_SECONDS)

    def _written_due(self, due_at: float) -> None:
        """A write outside the claim rounds made a row due at trio time `due_at`: the timer
        follows it until a round sent after now answers (its snapshot sees the row)."""
        known = self._written_due_at
        self._written_due_at = due_at if known is None else min(known, due_at)
        self._written_before_round = self._rounds
        self._reset_timer()

    def _after_round(
        self, result: ClaimResult, limit: int, sent_at: float, round_number: int
    ) -> None:
        self._key_cursor = result.key_cursor or ""
        self._plain = result.plain_next
        self._concurrency_cursor = result.concurrency_cursor or ""
        short = len(result.claimed) < limit
        if not result.claimed and limit > 0 and self._expect_work:
            self._expect_work = False
            self._wake.set()  # an empty claim right after a full one: retry once, at once
        else:
            self._expect_work = not short
        # Held back by a limit or by keys (a key or limit slot another worker frees notifies
        # no one): a slot that opens claims again, as before.
        self._claim_wanted = (
            not short
            or self._many_tasks
            or self.notifications_live is None
            or not self.notifications_live()
            or result.at_global_limit
            or result.rate_limited_until is not None
            or result.key_cursor is not None
            or result.concurrency_cursor is not None
        )
        if result.promoted:
            # This statement's snapshot saw the promoted rows as not due: they become
            # claimable in the next round, so run it now.
            self._wake.set()
        if self._written_due_at is not None and round_number > self._written_before_round:
            self._written_due_at = None  # this round saw the completer's rows: it knows
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
        if result.key_rate_limited_until is not None:
            # A key waits for its rate: a due time for that key only (slots, notifications
            # and other keys still drive rounds), with no early margin (a round before it
            # would find the key still held back).
            wait = (result.key_rate_limited_until - result.now).total_seconds()
            rate_at = sent_at + max(0.0, wait)
            known = self._next_due_at
            self._next_due_at = rate_at if known is None else min(known, rate_at)
        self._rate_limited_at = None
        if result.rate_limited_until is not None:
            wait = (result.rate_limited_until - result.now).total_seconds()
            if wait > 0:
                self._rate_limited_at = sent_at + wait
        self._reset_timer()
        self._claimed_total += len(result.claimed)
        if self.hooks.on_round:
            self.hooks.on_round(self.queue, limit, len(result.claimed))

    def _start(
        self, handlers: trio.Nursery, result: ClaimResult, sent: float, traced: bool
    ) -> None:
        received = trio.current_time() if result.replied_at is None else result.replied_at
        self._db_clock.observe(result.now, sent, received)
        if not result.claimed:
            return
        now = result.now
        if not self._buffer and not self.prefetch:
            for job in result.claimed:  # no buffer entry to build: each starts at once
                self._start_one(handlers, job, now, sent, traced)
            return
        # Buffered jobs were claimed earlier: they start first.
        self._buffer.extend(Prefetched(job, now, sent, traced) for job in result.claimed)
        if self._stopping:
            self._wake.set()  # the loop hands them back
        else:
            self._start_prefetched()
            self._release_excess(handlers)

    def _release_excess(self, handlers: trio.Nursery) -> None:
        """Jobs claimed for slots that admission control took away while their round was in
        flight cannot start, and the buffer holds at most `prefetch`: the rest go back (ready,
        attempt restored, fenced), newest first. Found by the runtime machine: a limit cut
        from 3 to 1 left 3 jobs in a buffer of 2."""
        while len(self._buffer) > self.prefetch:
            job = self._buffer.pop().job
            handlers.start_soon(self._release, job, name=f"trioq release {job.id}")

    async def _release(self, job: ClaimedJob) -> None:
        """Hand a claimed job that never started back (ready, attempt restored, fenced).
        Waiting for room in a full backlog, its lease is renewed (the completer counts
        waiting hand-overs among its owned leases)."""
        await self.completer.hand_over(
            Settlement(job.lease, "release"), keyed=job.partition_key is not None
        )

    def _start_one(
        self,
        handlers: trio.Nursery,
        job: ClaimedJob,
        now: datetime.datetime,
        confirmed_at: float,
        traced: bool,
    ) -> None:
        """Start `job` (claimed at database time `now`, its lease confirmed at trio time
        `confirmed_at`) on a slot."""
        running = self.running
        stale = running.get(job.id)
        # (A stale run that already suspended or continued durably is only finishing its
        # bookkeeping, and one whose ending statement is in flight is about to: the job is
        # legitimately back, nothing is lost.)
        if stale is not None and stale.suspension is None and not stale.ending:
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
        versions = self.versions
        # Positional, in Run's order: a class called with keywords gathers them into a dict
        # for its __init__, and these 12 took 0.47 us more a job (1.26 against 0.79 us a Run).
        run = Run(
            job,
            (versions and versions.get((job.task, job.version))) or self.tasks[job.task],
            self.driver,
            self.worker_id,
            self.checkpoints,
            now,
            confirmed_at,
            self.tasks,
            self._db_clock.to_trio(job.run_at) if job.run_at > now else None,  # due_at
            self._timers,
            traced,
            self._thread_limiter,
        )
        running[job.id] = run
        handlers.start_soon(self._run_job, run, name=f"trioq job {job.id}")

    def _task_versions(self) -> tuple[str, ...]:
        return tuple(sorted(spec.pair for spec in self.versions.values()))

    # --- one job -------------------------------------------------------------------------

    def _slots_opened(self) -> None:
        """A handler ended, or held outcomes entered the completer's backlog: start buffered
        jobs on the open slots, and claim for them (or refill below the low watermark)."""
        if self._buffer and not self._stopping:
            self._start_prefetched()  # the slot takes the next claimed job at once
        buffered = len(self._buffer)
        if self._stopping or (buffered < self._low_watermark if buffered else self._claim_wanted):
            self._wake.set()

    async def _run_job(self, run: Run) -> None:
        job = run.job
        hooks, tally = self.hooks, self.tally
        if hooks.on_job_start:
            hooks.on_job_start(job)
        started = time.perf_counter()  # the handler's run time, for metrics: real seconds
        opened = True  # the slot opens as the handler ends, unless its outcome is held
        try:
            outcome = await execute(run)
            if type(outcome) is Suspended and outcome.written and outcome.until is not None:
                self._suspended_until(outcome.until)
            keep = run.spec.keep or job.parent_id is not None  # a parent reads its children
            settlement = settlement_of(run.lease, outcome, plain=job.plain, keep=keep)
            if settlement is not None:
                # A key frees when the outcome commits: the loop runs again then.
                keyed = job.partition_key is not None or job.concurrency_key is not None
                # A full backlog holds the outcome, and the slot stays taken until a batch
                # leaves room for it (`_slots_opened`); this task ends either way.
                opened = self.completer.hand_over_or_hold(settlement, keyed=keyed)
        finally:
            if self.running.get(job.id) is run:  # a newer attempt may have replaced it
                del self.running[job.id]
            if opened:
                self._slots_opened()
            if self._settled:  # someone waits for no handler running (an Event would be per job)
                self._settled.unpark_all()
        if tally is not None or hooks.on_job_end:
            # Nearly every outcome of a drain is the executor's one shared Completed(None).
            name = "completed" if outcome is COMPLETED_NULL else outcome_name(outcome)
            if tally is not None:
                tally.ended(job.task, job.queue, name, time.perf_counter() - started)
            if hooks.on_job_end:
                hooks.on_job_end(job, name)


__all__ = ["ClaimLoop", "Prefetched", "WorkerHooks"]
