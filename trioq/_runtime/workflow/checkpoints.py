"""Group commit of workflow checkpoints: one statement for the checkpoints of every handler that
wrote one while the previous statement was in flight.

Hand-written because the batching is trio-specific and tiny: a handler appends its write and
waits on an event; one flusher task takes everything pending, lets the tasks that are runnable
in the same scheduler tick join (one checkpoint), writes the batch with
`checkpoint_insert_many` and wakes the writers. There is no timer: while a statement is in
flight, the next batch accumulates, so the batch grows with concurrency and a lone writer pays
one round trip, no added delay.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import trio

from ..._seam.driver import Driver
from ..._seam.workflow import CheckpointWrite

log = logging.getLogger("trioq.worker")

MAX_BATCH = 500


class CheckpointLost(Exception):
    """The write's fence did not hold: another attempt owns the job now."""


class CheckpointWriteFailed(Exception):
    """The database did not answer the write (connection lost): the outcome is unknown."""


@attrs.define(eq=False)
class _Pending:
    """One write and its writer, parked until the write's batch has an answer. The writer
    task is rescheduled directly, not through a trio.Event per write: the Event's creation,
    wait and set were 10% of a 3-step workflow's runtime CPU on a stub driver."""

    write: CheckpointWrite
    writer: trio.lowlevel.Task | None  # None once woken, or when its wait was cancelled
    value: Any = None
    error: BaseException | None = None

    def abort(self, _: object) -> trio.lowlevel.Abort:
        """The writer was cancelled while waiting: it stops waiting, the write stays in its
        batch (it may still commit)."""
        self.writer = None
        return trio.lowlevel.Abort.SUCCEEDED

    def wake(self) -> None:
        if self.writer is not None:
            trio.lowlevel.reschedule(self.writer)
            self.writer = None


@attrs.define(eq=False)
class CheckpointWriter:
    driver: Driver
    _pending: list[_Pending] = attrs.field(factory=list)
    _wake: trio.Event = attrs.field(factory=trio.Event)
    _batches: int = 0
    _writes: int = 0

    async def write(self, write: CheckpointWrite) -> Any:
        """Record `write` (committed when this returns) and return the stored value.

        Raises `CheckpointLost` when the lease no longer holds, `CheckpointWriteFailed` when
        the database could not be reached.
        """
        entry = _Pending(write, trio.lowlevel.current_task())
        self._pending.append(entry)
        self._wake.set()
        await trio.lowlevel.wait_task_rescheduled(entry.abort)
        if entry.error is not None:
            raise entry.error
        return entry.value

    def statistics(self) -> tuple[int, int]:
        """(statements, checkpoints written) since start."""
        return self._batches, self._writes

    async def run(self) -> None:
        """The flusher: runs until cancelled (pending writers are then failed)."""
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                await trio.lowlevel.checkpoint()  # writers runnable in this tick join the batch
                while self._pending:
                    batch = self._pending[:MAX_BATCH]
                    del self._pending[:MAX_BATCH]
                    await self._flush(batch)
        finally:
            for entry in self._pending:
                entry.error = CheckpointWriteFailed("the worker is stopping")
                entry.wake()
            self._pending.clear()

    async def _flush(self, batch: list[_Pending]) -> None:
        try:
            written = await self.driver.checkpoint_insert_many([entry.write for entry in batch])
        except BaseException as exc:
            error: BaseException = (
                CheckpointWriteFailed(f"checkpoint write failed: {exc}")
                if isinstance(exc, Exception) and self.driver.is_connection_lost(exc)
                else exc
            )
            for entry in batch:
                entry.error = (
                    error
                    if isinstance(error, Exception)
                    else CheckpointWriteFailed("checkpoint write interrupted")
                )
                entry.wake()
            if not isinstance(exc, Exception):
                raise
            if error is exc:
                log.error("checkpoint write failed: %r", exc)
            return
        self._batches += 1
        self._writes += len(written)
        stored = {(row.job_id, row.position): row.value for row in written}
        for entry in batch:
            key = (entry.write.lease.id, entry.write.position)
            if key in stored:
                entry.value = stored[key]
            else:
                entry.error = CheckpointLost(
                    f"job {entry.write.lease.id}: lease lost before checkpoint "
                    f"{entry.write.position} was written"
                )
            entry.wake()
