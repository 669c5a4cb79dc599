"""The completer: ONE per claim loop, writing the outcomes of that queue's finished executions
in batches while the loop claims (River's BatchCompleter).

A handler that returns hands its outcome over (`hand_over_or_hold`) and its slot opens at
once: capacity counts running handlers, not unwritten outcomes. When the backlog is full the
outcome is held (`held`) and keeps its handler's slot taken until a batch leaves room for it;
the handler's task ends meanwhile (a parked task cost a reschedule and a task step more: 2.07
-> 1.12 task steps per job where the flush is the bottleneck, bench.runtime_cpu; in a durable
one-worker drain 6% of outcomes found the backlog full). The completer sends one batch at a
time, on a pooled connection of its own, while the claim loop's statements run on others. A
batch leaves as soon as `batch_size` outcomes are pending, or `flush_delay` seconds after the
first of them (handlers that end in the same moment share a statement).

Bounds: at most `max_backlog` outcomes wait to be sent, and one batch of at most `batch_size`
is in flight, so the completer never holds more than `capacity` outcomes in them; an outcome
that finds the backlog full is held (its slot stays taken: no new job starts on it) until a
batch leaves.

Ownership: an outcome's job stays owned, in the database and in `leases()` (which the lease
renewer extends), until the statement carrying it commits. Every write is fenced (id,
attempt, lease_token); an outcome whose lease was lost meanwhile changes nothing. A partition
key stays held in the database until its holder's outcome commits, so a key's next job never
starts before that.

Errors: a batch whose statement fails on a lost connection is kept, ahead of newer outcomes,
and sent again with backoff. Any other error is a bug or a broken schema and stops the worker.
On the way out (a hard stop included) what is left is written once more, shielded and
bounded by `write_timeout`: the backlog and the held outcomes with it (their handlers have
finished; left to lease expiry, their jobs would run again). A hand-over still waiting then
was cancelled with its task and is left to lease expiry.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import attrs
import trio

from ..._core.outcomes import frees_key
from ..._seam.driver import Driver, Settlement, SettleResult
from ..._seam.lease import Lease

log = logging.getLogger("trioq.worker")

# A partial batch waits this long after its first outcome for others to join it. The statement
# costs about the same for 1 outcome as for 25, so a short wait saves statements under load
# and costs an idle worker's single completion no more than this.
DEFAULT_FLUSH_DELAY = 0.002


@attrs.frozen
class CompleterStatistics:
    pending: int  # outcomes waiting to be sent
    writing: int  # outcomes in the batch in flight
    flushes: int  # batches written (committed)
    written: int  # outcomes those batches carried
    lost: int  # outcomes whose lease was lost before their batch committed
    retries: int  # batches sent again after a lost connection
    held: int = 0  # outcomes waiting for room in the backlog, each keeping its slot taken


# Called after each batch commits: the batch, whether it freed a partition key, the reply,
# and trio's clock when the statement was sent.
OnWritten = Callable[[tuple[Settlement, ...], bool, SettleResult, float], None]


class _Held:
    """The key of a held outcome among the hand-overs waiting for room (a task is the key of
    a waiting `hand_over`)."""

    __slots__ = ()


@attrs.define(eq=False)
class Completer:
    driver: Driver
    queue: str
    max_backlog: int
    batch_size: int
    flush_delay: float = DEFAULT_FLUSH_DELAY
    write_timeout: float = 30.0
    on_written: OnWritten | None = None
    # Tests delay or fail a flush here: awaited before each statement is sent.
    before_flush: Callable[[tuple[Settlement, ...]], Awaitable[None]] | None = None
    _pending: list[Settlement] = attrs.field(factory=list)  # oldest first
    _frees: list[bool] = attrs.field(factory=list)  # per pending outcome: it frees a key
    _writing: tuple[Settlement, ...] = ()
    _has_pending: trio.Event = attrs.field(factory=trio.Event)
    _batch_full: trio.Event = attrs.field(factory=trio.Event)
    # Called when held outcomes entered the backlog: their slots are open now.
    on_room: Callable[[], None] | None = None
    # Hand-overs waiting for room, oldest first: task (`hand_over`) or a `_Held` key
    # (`hand_over_or_hold`) -> (outcome, frees a key). When a batch leaves, the completer
    # itself moves the oldest of them into the backlog, rescheduling a waiting task (which
    # returns at once: no retry, no extra checkpoint) or opening a held outcome's slot.
    _waiting: dict[trio.lowlevel.Task | _Held, tuple[Settlement, bool]] = attrs.field(factory=dict)
    _held: int = 0  # of `_waiting`, the held outcomes
    _flushes: int = 0
    _written: int = 0
    _lost: int = 0
    _retries: int = 0
    _backoff: float = 0.1
    healthy: bool = True  # the last flush succeeded (or none has failed yet)

    def __attrs_post_init__(self) -> None:
        if self.max_backlog < 1 or self.batch_size < 1:
            raise ValueError("completer: max_backlog and batch_size must be >= 1")

    # --- what the claim loop and the lease renewer read ----------------------------------

    @property
    def capacity(self) -> int:
        """The most outcomes the completer ever holds: a full backlog and a batch in flight."""
        return self.max_backlog + self.batch_size

    @property
    def held(self) -> int:
        """Outcomes whose handler ended while the backlog was full: each keeps its slot taken
        until it enters the backlog."""
        return self._held

    def leases(self) -> list[Lease]:
        """The leases of every outcome not yet written: waiting for room (held, or a task in
        `hand_over`), pending or in flight. A task waiting in `hand_over` is a drain handing
        a prefetched job back (handlers hold instead): that job is in neither the buffer nor
        the running handlers any more, so its lease is renewed from here, or it could run out
        while a slow flush keeps the backlog full and cost the job an attempt it never ran."""
        leases = [s.lease for s in self._pending] + [s.lease for s in self._writing]
        if self._waiting:
            leases += [s.lease for s, _ in self._waiting.values()]
        return leases

    def __len__(self) -> int:
        """Outcomes not yet written: waiting for room, pending or in flight."""
        return len(self._pending) + len(self._writing) + len(self._waiting)

    def statistics(self) -> CompleterStatistics:
        return CompleterStatistics(
            pending=len(self._pending),
            writing=len(self._writing),
            flushes=self._flushes,
            written=self._written,
            lost=self._lost,
            retries=self._retries,
            held=self._held,
        )

    # --- handing outcomes over -----------------------------------------------------------

    def hand_over_nowait(self, settlement: Settlement, *, keyed: bool) -> None:
        """Take `settlement` into the backlog; raises `trio.WouldBlock` when it is full (or
        when earlier hand-overs wait for room: they go first)."""
        if len(self._pending) >= self.max_backlog or self._waiting:
            raise trio.WouldBlock
        self._take(settlement, keyed and frees_key(settlement.kind))

    def hand_over_or_hold(self, settlement: Settlement, *, keyed: bool) -> bool:
        """Take `settlement` into the backlog (True), or, when it is full (or earlier
        hand-overs wait for room), hold it until a batch leaves room (False): the caller's
        slot stays taken until then (`held`, `on_room`). Never waits."""
        frees = keyed and frees_key(settlement.kind)
        if len(self._pending) >= self.max_backlog or self._waiting:
            self._waiting[_Held()] = (settlement, frees)
            self._held += 1
            return False
        self._take(settlement, frees)
        return True

    def _take(self, settlement: Settlement, frees: bool) -> None:
        self._pending.append(settlement)
        self._frees.append(frees)
        if len(self._pending) == 1:
            self._has_pending.set()
        if len(self._pending) >= self.batch_size:
            self._batch_full.set()

    async def hand_over(self, settlement: Settlement, *, keyed: bool) -> None:
        """Take `settlement`, waiting while the backlog is full. Safe to cancel: a cancelled
        hand-over leaves nothing behind (the outcome is not written; its lease expires)."""
        try:
            self.hand_over_nowait(settlement, keyed=keyed)
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.checkpoint()
            return
        task = trio.lowlevel.current_task()
        self._waiting[task] = (settlement, keyed and frees_key(settlement.kind))

        def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            del self._waiting[task]  # still waiting, so not taken: nothing is left behind
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _admit_waiting(self, *, unbounded: bool = False) -> None:
        """Move the oldest waiting hand-overs into the room a batch just left (`unbounded`:
        all of them, past the backlog's bound, for the last write)."""
        waiting = self._waiting
        opened = False
        while waiting and (unbounded or len(self._pending) < self.max_backlog):
            key = next(iter(waiting))
            self._take(*waiting.pop(key))
            if isinstance(key, _Held):
                self._held -= 1
                opened = True
            else:
                trio.lowlevel.reschedule(key)
        if opened and self.on_room is not None:
            self.on_room()

    # --- the service ---------------------------------------------------------------------

    async def run(self) -> None:
        """Send batches until cancelled (see the module docstring for retries and errors)."""
        while True:
            await self._wait_batch()
            await self._flush_retrying()

    async def _wait_batch(self) -> None:
        while not self._pending:
            await self._has_pending.wait()
            self._has_pending = trio.Event()
        if len(self._pending) < self.batch_size and self.flush_delay > 0:
            with trio.move_on_after(self.flush_delay):
                await self._batch_full.wait()
        self._batch_full = trio.Event()

    async def _flush_retrying(self) -> None:
        try:
            await self._flush()
        except Exception as exc:
            # A lost connection, or a flush the database rolled back (a statement timeout, a
            # deadlock): the batch is written again, fenced.
            if not (self.driver.is_connection_lost(exc) or self.driver.is_transient(exc)):
                log.error(
                    "queue %s: writing outcomes failed with an unexpected error, stopping the "
                    "worker: %r",
                    self.queue,
                    exc,
                )
                raise
            self.healthy = False
            self._retries += 1
            log.warning(
                "queue %s: writing %d outcomes failed (%s); retrying in %.1fs",
                self.queue,
                len(self._pending),
                exc,
                self._backoff,
            )
            await trio.sleep(self._backoff * (1 + random.random()))
            self._backoff = min(self._backoff * 2, 5.0)
        else:
            self.healthy = True
            self._backoff = 0.1

    async def _flush(self, limit: int | None = None) -> None:
        """Send one batch (the oldest `limit` pending outcomes; None: `batch_size`). On any
        error or cancellation the batch goes back to the front of the backlog: nothing was
        committed, or it is unknown, and writing it again is fenced."""
        take = self.batch_size if limit is None else limit
        batch, frees = tuple(self._pending[:take]), self._frees[:take]
        del self._pending[:take], self._frees[:take]
        self._writing = batch
        sent_at = trio.current_time()
        try:
            if self._waiting:
                self._admit_waiting()
            if self._pending:
                self._has_pending.set()
            if self.before_flush is not None:
                await self.before_flush(batch)
            # The handlers whose outcomes these are opened slots, and woke the claim loop too,
            # which sends its claim a checkpoint later. The claim goes first: the next handlers
            # wait for its reply, nothing waits for this batch's. The server then runs the claim
            # while this process builds the completion (one-worker drains, durable claims:
            # without these two lines 0.805x jobs/s, 8 pairs).
            await trio.lowlevel.cancel_shielded_checkpoint()
            await trio.lowlevel.cancel_shielded_checkpoint()
            result = await self.driver.job_settle_many(batch)
        except BaseException:
            self._pending[:0] = batch
            self._frees[:0] = frees
            self._has_pending.set()
            raise
        finally:
            self._writing = ()
        lost = len(batch) - len(result.settled)
        self._flushes += 1
        self._written += len(batch)
        if lost:
            self._lost += lost
            log.warning(
                "queue %s: %d outcomes not written: their leases were lost", self.queue, lost
            )
        if self.on_written is not None:
            self.on_written(batch, any(frees), result, sent_at)

    async def final_flush(self) -> None:
        """Write what is left, once, shielded and bounded by `write_timeout` (the way out):
        the backlog and every held outcome, past the backlog's bound (this is the last
        statement, and the jobs of held outcomes are finished)."""
        if self._waiting:
            # Held outcomes' slots open (`on_room`); the loop has ended, so nothing starts.
            self._admit_waiting(unbounded=True)
        if not self._pending:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(self.write_timeout) as scope:
            try:
                await self._flush(limit=len(self._pending))
            except Exception as exc:
                log.warning(
                    "queue %s: %d outcomes not written on the way out (%r); their jobs are "
                    "recovered when their leases expire",
                    self.queue,
                    len(self._pending),
                    exc,
                )
        if scope.cancelled_caught:
            log.warning(
                "queue %s: outcomes not written within %.0fs on the way out; their jobs are "
                "recovered when their leases expire",
                self.queue,
                self.write_timeout,
            )


@asynccontextmanager
async def open_completer(completer: Completer) -> AsyncIterator[Completer]:
    """Run `completer` for the body's duration. On the way out, however the body ends, what is
    left is written once more (`Completer.final_flush`)."""
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(completer.run, name=f"trioq completer {completer.queue}")
            yield completer
            nursery.cancel_scope.cancel()
    finally:
        await completer.final_flush()


__all__ = ["Completer", "CompleterStatistics", "open_completer"]
