"""Concurrency inside one workflow: `async with ctx.parallel() as p:` (docs/workflows.md,
"Parallel blocks").

Every primitive of a block takes its history position when the block's code CALLS it (in the
order of the code, so the same on every execution), not when it finishes: the history records
each primitive under that stable identity whatever the interleaving, and the usual kind/name
check (`NondeterminismError`) applies at the call. The work runs when the block ends:

1. steps, spawns and sleeps concurrently, in one trio nursery. Their writes go through the
   group commits that already exist (`CheckpointWriter` for steps and sleeps, `Spawner` for
   spawns), so primitives that finish together share one statement. The first step that fails
   cancels its siblings (nursery semantics); the block raises the failure of the lowest
   position among those that failed.
2. If a sleep's wake time is still ahead, the execution suspends until the latest one (each
   sleep of the block is over when the block returns).
3. Event waits, one after another in the order of the code (each is decided by its own fenced
   statement, and a job waits on one key at a time): a block with waits returns when every
   event has arrived or timed out; a timeout is kept in its handle (`.result` raises it).

Positions already in history are resolved from it at the call, without any work.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import attrs
import trio

from ..._core.errors import EventTimeout
from ..._core.retry import RetryPolicy
from ..._core.states import JobState
from ..._seam.workflow import Checkpoint
from ..job.run import SLEEP, STEP, Run, _check_name, _wake_at
from . import waits

_UNSET: Any = object()


@attrs.define(eq=False)
class Pending:
    """A primitive called in a parallel block; `result` once the block has ended."""

    kind: str
    name: str
    position: int
    _value: Any = _UNSET
    _error: BaseException | None = None
    _work: Callable[[], Awaitable[Any]] | None = attrs.field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self._value is not _UNSET or self._error is not None

    @property
    def result(self) -> Any:
        """The primitive's value: a step's result, a child's id, None for a sleep, an event's
        payload (or its `trioq.EventTimeout`, raised here)."""
        if self._error is not None:
            raise self._error
        if self._value is _UNSET:
            raise RuntimeError(
                f"{self.kind} {self.name!r}: read `.result` after its parallel block ends"
            )
        return self._value


@attrs.define(eq=False)
class Parallel:
    """The handle of one `ctx.parallel()` block."""

    _run: Run
    _items: list[Pending] = attrs.field(factory=list)
    _waits: list[tuple[Pending, Checkpoint | None, datetime.timedelta]] = attrs.field(factory=list)
    _wakes: list[datetime.datetime] = attrs.field(factory=list)
    _open: bool = False

    async def __aenter__(self) -> Parallel:
        self._open = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._open = False
        if exc is None:
            await self._finish()

    # --- registration (synchronous: the position is taken at the call) ------------------

    def step(
        self, name: str, fn: Callable[..., Any], *args: Any, retry: RetryPolicy | None = None
    ) -> Pending:
        """Like `ctx.step`, run when the block ends, beside the block's other primitives."""
        _check_name("step", name)
        position, entry = self._take(STEP, name)
        item = Pending(STEP, name, position)
        if entry is not None:
            item._value = entry.value
        else:
            item._work = lambda: self._run.run_step(position, name, fn, args, retry)
        return self._add(item)

    def spawn(self, task: Any, payload: Any = None, **options: Any) -> Pending:
        """Like `ctx.spawn`; `.result` is the child's id (every spawn of a block shares one
        statement)."""
        run = self._run
        self._check_open()
        name, child, policy = waits.prepare_spawn(run, task, payload, options)
        position, entry = self._take(waits.SPAWN, name)
        item = Pending(waits.SPAWN, name, position)
        item._work = lambda: waits.spawn_at(run, position, entry, name, child, policy)
        return self._add(item)

    def sleep(self, name: str, duration: datetime.timedelta) -> Pending:
        """Like `ctx.sleep`: the block returns once its wake time has passed."""
        _check_name("sleep", name)
        if not isinstance(duration, datetime.timedelta):
            raise TypeError(f"sleep {name!r}: duration must be a datetime.timedelta")
        position, entry = self._take(SLEEP, name)
        item = Pending(SLEEP, name, position)
        if entry is not None:
            self._wakes.append(_wake_at(entry.value))
            item._value = None
        else:
            seconds = max(0.0, duration.total_seconds())
            item._work = lambda: self._sleep(position, name, seconds)
        return self._add(item)

    def wait_for_event(self, key: str, *, timeout: datetime.timedelta) -> Pending:
        """Like `ctx.wait_for_event`, decided after the block's steps, spawns and sleeps."""
        waits.check_event_wait(key, timeout)
        position, entry = self._take(waits.EVENT, key)
        item = Pending(waits.EVENT, key, position)
        self._waits.append((item, entry, timeout))
        return self._add(item)

    def _take(self, kind: str, name: str) -> tuple[int, Checkpoint | None]:
        self._check_open()
        return self._run.replay(kind, name)

    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError("ctx.parallel(): call its primitives inside `async with`")

    def _add(self, item: Pending) -> Pending:
        self._items.append(item)
        return item

    # --- the block's end ----------------------------------------------------------------

    async def _sleep(self, position: int, name: str, seconds: float) -> None:
        value = await self._run.record(position, SLEEP, name, "{}", wake_in_seconds=seconds)
        self._wakes.append(_wake_at(value))

    async def _finish(self) -> None:
        run = self._run
        work = [item for item in self._items if item._work is not None and not item.done]
        if len(work) == 1:
            await self._do(work[0], None)
        elif work:
            async with trio.open_nursery() as nursery:
                for item in work:
                    nursery.start_soon(self._do, item, nursery.cancel_scope)
        failed = [item for item in work if item._error is not None]
        if failed:
            first = min(failed, key=lambda item: item.position)
            if first.kind == STEP:
                run.failed_step = (first.position, first.name)
            assert first._error is not None
            raise first._error
        latest = max(self._wakes, default=None)
        if latest is not None and latest > run.now:
            await run.suspend_unless_cancelled(JobState.SLEEPING, latest)
        for item, entry, timeout in self._waits:
            try:
                item._value = await waits.wait_event_at(
                    run, item.position, entry, item.name, timeout
                )
            except EventTimeout as exc:
                item._error = exc

    async def _do(self, item: Pending, siblings: trio.CancelScope | None) -> None:
        assert item._work is not None
        try:
            value = await item._work()
        except trio.Cancelled:
            raise
        except BaseException as exc:  # kept per item: the block raises one, chosen by position
            item._error = exc
            if siblings is not None:
                siblings.cancel()
            return
        item._value = value
