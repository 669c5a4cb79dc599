"""Group commit of `ctx.spawn`: the spawns of every handler of a worker that spawn at the same
time go to the database in ONE `job_spawn_many` statement (a fan-out of 25 parents x 10
children costs ~10 statements, not 250).

Hand-written because it is trio-specific and tiny, and it needs no background task (so no
service to wire into the worker): the first spawner of a batch is its flusher. It lets the
tasks runnable in the same scheduler tick join, sends the batch, and hands each spawner its
outcome; spawners arriving while a statement is in flight wait for it and form the next batch,
so the batch grows with concurrency and a lone spawner pays one round trip, no added delay.

Cancellation: a flusher cancelled (or failing) mid-statement leaves its batch's outcome unknown;
the others put their spawns back and the next one flushes again. That is safe because a spawn
is idempotent per (parent, position): a retried spawn returns the child the first one made.
"""

from __future__ import annotations

import weakref

import attrs
import trio

from ..._seam.driver import Driver
from ..._seam.workflow import Spawn, SpawnOutcome

MAX_BATCH = 500


@attrs.define(eq=False)
class _Pending:
    spawn: Spawn
    outcome: SpawnOutcome | None = None
    error: BaseException | None = None


@attrs.define(eq=False)
class Spawner:
    driver: Driver
    _pending: list[_Pending] = attrs.field(factory=list)
    _flushing: bool = False
    _flushed: trio.Event = attrs.field(factory=trio.Event)
    statements: int = 0

    async def spawn(self, spawn: Spawn) -> SpawnOutcome:
        """Insert the child (fenced, committed on return) and return the outcome."""
        entry = _Pending(spawn)
        self._pending.append(entry)
        try:
            while entry.outcome is None and entry.error is None:
                if self._flushing:
                    await self._flushed.wait()
                else:
                    await self._flush()
        finally:
            if entry in self._pending:  # cancelled before it was sent: never send it
                self._pending.remove(entry)
        if entry.error is not None:
            raise entry.error
        assert entry.outcome is not None
        return entry.outcome

    async def _flush(self) -> None:
        self._flushing = True
        batch: list[_Pending] = []
        try:
            await trio.lowlevel.checkpoint()  # spawners runnable in this tick join the batch
            batch = self._pending[:MAX_BATCH]
            del self._pending[:MAX_BATCH]
            outcomes = await self.driver.job_spawn_many([entry.spawn for entry in batch])
            self.statements += 1
            for entry, outcome in zip(batch, outcomes, strict=True):
                entry.outcome = outcome
        except Exception as exc:
            for entry in batch:
                entry.error = exc
        except BaseException:
            self._pending[:0] = batch  # outcome unknown: someone else sends them again
            raise
        finally:
            self._flushing = False
            self._flushed.set()
            self._flushed = trio.Event()


_SPAWNERS: weakref.WeakKeyDictionary[Driver, Spawner] = weakref.WeakKeyDictionary()


def spawner_for(driver: Driver) -> Spawner:
    """The spawner of `driver` (one per driver: per worker, as the pool is)."""
    spawner = _SPAWNERS.get(driver)
    if spawner is None:
        spawner = _SPAWNERS[driver] = Spawner(driver)
    return spawner
