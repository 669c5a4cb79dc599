"""The per-run object: everything one execution of one job holds (its lease, the driver, the
loaded history, the cancel scope, the checkpoint writer), and the durable primitives.

`trioq.Context` is a thin public view over a `Run`. Every primitive follows one protocol
(docs/workflows.md): take the next history position; if a checkpoint is stored there, check its
kind and name (`NondeterminismError` on a mismatch) and use the stored value; otherwise do the
work and record it (fenced by the lease, committed before the primitive returns). A primitive
that must wait durably records what it waits for, then calls `suspend`, which ends the
execution: the claim loop settles it as sleeping/waiting and frees the slot.

Extension point (events, children): a new primitive is a method here using `replay`, `record`
and `suspend`, and a thin method on `Context`.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

import attrs
import trio

from ..._core import codec
from ..._core.errors import HistoryLimitExceeded, NondeterminismError
from ..._core.identifiers import validate_key
from ..._core.retry import DEFAULT_STEP_ATTEMPTS, RetryPolicy, applied_max_attempts
from ..._core.states import JobState
from ..._seam.driver import ClaimedJob, Driver
from ..._seam.lease import Lease
from ..._seam.workflow import Checkpoint, CheckpointWrite
from ..workflow.checkpoints import CheckpointLost, CheckpointWriteFailed, CheckpointWriter
from .outcome import Suspended
from .tasks import TaskSpec

log = logging.getLogger("trioq.worker")

# Checkpoint kinds recorded by this module (docs/workflows.md lists every kind).
STEP = "step"
SLEEP = "sleep"
PATCH = "patch"


class SuspendExecution(BaseException):
    """Raised by a primitive that suspended the job: unwinds the handler. A BaseException so
    that `except Exception` in handler code does not swallow it; the executor reads the
    suspension from the run, so even a handler that swallows it still suspends."""


class LeaseLost(BaseException):
    """Raised into a handler whose checkpoint write was rejected: its attempt no longer owns
    the job (the scope is cancelled too, so the executor reports the run as lost)."""


@attrs.define(eq=False)
class SharedTimers:
    """Deadlines shared by many waiters, with ONE trio timer per distinct deadline.

    The jobs a claim took early are held until their run_at, and a burst (200 workflows whose
    sleeps end together) shares one deadline: 200 `sleep_until`s would expire 200 cancel scopes
    in one scheduler tick (about 3 ms here before the first of them runs); one timer setting
    one Event wakes them all at the cost of a reschedule each. A cancelled waiter just stops
    waiting; its timer fires at its deadline anyway (at most the claim's lookahead away)."""

    nursery: trio.Nursery
    _events: dict[float, trio.Event] = attrs.field(factory=dict)

    async def wait_until(self, deadline: float) -> None:
        if deadline <= trio.current_time():
            await trio.lowlevel.checkpoint()
            return
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled waiter starts no timer
        event = self._events.get(deadline)
        if event is None:
            event = self._events[deadline] = trio.Event()
            self.nursery.start_soon(self._fire, deadline, event)
        await event.wait()

    async def _fire(self, deadline: float, event: trio.Event) -> None:
        await trio.sleep_until(deadline)
        del self._events[deadline]
        event.set()


@attrs.define(eq=False)
class Run:
    job: ClaimedJob
    spec: TaskSpec
    driver: Driver
    worker_id: uuid.UUID
    checkpoints: CheckpointWriter
    now: datetime.datetime  # database time of the claim
    # When the database last confirmed this lease (claim or renewal), on trio's clock, taken
    # *before* the confirming statement was sent: the lease runs at least this long from here.
    confirmed_at: float
    # Every task of the app, by name: ctx.spawn validates a child against its task's spec.
    tasks: Mapping[str, TaskSpec] = attrs.field(factory=dict)
    # The trio time by which the job's run_at has surely passed (dbclock.py), for a job claimed
    # before its run_at (the claim's lookahead): it is held until then, never starting early.
    due_at: float | None = None
    timers: SharedTimers | None = None  # the claim loop's, for `hold_until_due`
    # The otel extra is configured (a real tracer provider): asked once per claim round, not
    # per job (the check reads the environment, which showed at saturation).
    traced: bool = False
    # The claim loop's threads for plain `def` handlers, sized by the queue's slots (trio's
    # default limiter has 40 threads for the whole process, shared with the database adapter).
    thread_limiter: trio.CapacityLimiter | None = None
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    cancel_reason: str | None = None  # "lost", "unconfirmed", "cancelled", "drain"
    suspension: Suspended | None = None
    # A statement that may end this execution durably (continue_as_new, a wait that suspends in
    # place) is in flight: once it commits, the job can be ready again and come back to this
    # worker's claim before the reply does (found by the soak, seed 2). Such a run is not
    # cancelled as lost: its reply ends it (suspended), or its fenced write fails (lost).
    ending: bool = False
    failed_step: tuple[int, str] | None = None  # (position, name) of the step that raised
    trace_id: str | None = None  # the handler's span (otel extra), for the failure line
    # Set once the handler's own transaction that completed the job has committed.
    completed_in_transaction: bool = False
    # Children spawned by this job (replayed or new) not yet known to be final: waits.py keeps
    # it, and a handler that returns waits for them before the job completes.
    unfinished_children: list[int] = attrs.field(factory=list)
    # Of those, the ones not spawned with on_parent_cancel="abandon": a cancelled run waits
    # for them ("wait" ones to finish, "cancel" ones to unwind).
    kept_children: list[int] = attrs.field(factory=list)
    # ctx.set_value: key -> value JSON set since the last write (messages.py carries them).
    pending_values: dict[str, str] = attrs.field(factory=dict)
    # The job's checkpoints by position, built at the first primitive (`_stored`): most jobs
    # call none, and building it (and the warning's position) with every Run took 1.17 -> 1.03
    # us per Run here (medians of 7 x 50,000).
    _history: dict[int, Checkpoint] | None = None
    _position: int = 0
    _warn_at: int = 0  # the position that logs the 80% warning (set with `_history`)
    _warned: bool = False

    def _stored(self) -> dict[int, Checkpoint]:
        history = self._history
        if history is None:
            history = self._history = {entry.position: entry for entry in self.job.history}
            self._warn_at = (self.spec.history_limit * 4) // 5
        return history

    @property
    def lease(self) -> Lease:
        return self.job.lease

    @property
    def max_attempts(self) -> int:
        """The job's own max_attempts, else its task's declaration on this worker."""
        return applied_max_attempts(self.job.max_attempts, self.spec.max_attempts)

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.scope.cancel()

    # --- the primitive protocol ----------------------------------------------------------

    def replay(self, kind: str, name: str) -> tuple[int, Checkpoint | None]:
        """Take the next position; return it with its stored checkpoint (None: first run)."""
        if self.suspension is not None:
            raise SuspendExecution  # a handler that swallowed the suspension goes no further
        position = self._position
        self._position += 1
        entry = self._stored().get(position)
        if entry is None:
            if position >= self._warn_at:
                self._check_history_limit(position)
        elif (entry.kind, entry.name) != (kind, name):
            raise NondeterminismError(position, (entry.kind, entry.name), (kind, name))
        return position, entry

    def _check_history_limit(self, position: int) -> None:
        limit = self.spec.history_limit
        if position >= limit:
            raise HistoryLimitExceeded(limit)
        if not self._warned:
            self._warned = True
            log.warning(
                "job %d (%s): history at %d of its %d-checkpoint limit; a workflow that loops "
                "should call ctx.continue_as_new(payload)",
                self.job.id, self.job.task, position, limit,
            )  # fmt: skip

    def replaying(self) -> bool:
        """Whether history holds a checkpoint at or after the next position: the code is
        re-running a stretch an earlier execution already passed."""
        history = self._stored()
        return bool(history) and max(history) >= self._position

    async def record(
        self,
        position: int,
        kind: str,
        name: str,
        value_json: str | None,
        wake_in_seconds: float | None = None,
    ) -> Any:
        """Store a checkpoint at `position` (fenced, committed on return); the stored value."""
        write = CheckpointWrite(
            self.lease, position, kind, name, value_json, wake_in_seconds, self.take_values()
        )
        try:
            value = await self.checkpoints.write(write)
        except (CheckpointLost, CheckpointWriteFailed) as exc:
            self.cancel("lost")
            raise LeaseLost(str(exc)) from None
        self._stored()[position] = Checkpoint(position, kind, name, value)
        return value

    def take_values(self) -> tuple[tuple[str, str], ...]:
        """ctx.set_value's pending values, handed to the write about to be made (they ride on
        the next checkpoint: group commit)."""
        if not self.pending_values:
            return ()
        values = tuple(self.pending_values.items())
        self.pending_values.clear()
        return values

    @contextlib.contextmanager
    def ending_statement(self) -> Iterator[None]:
        """Around a statement that may end this execution durably (see `ending`)."""
        self.ending = True
        try:
            yield
        finally:
            self.ending = False

    def suspended_in_place(self, until: datetime.datetime | None) -> NoReturn:
        """End this execution: the primitive's own fenced statement has already made the job
        `waiting` (until `until`, or until woken), so nothing is left to settle."""
        self.suspension = Suspended(JobState.WAITING, until, written=True)
        raise SuspendExecution

    def continued(self) -> NoReturn:
        """End this execution: `job_continue_as_new` already made the job ready again."""
        self.suspension = Suspended("continued", None, written=True)
        raise SuspendExecution

    def suspend(self, state: str, until: datetime.datetime | None) -> NoReturn:
        """End this execution durably suspended (sleeping/waiting until `until`)."""
        self.suspension = Suspended(state, until)
        raise SuspendExecution

    # --- primitives ----------------------------------------------------------------------

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        shielded: bool = False,
    ) -> Any:
        _check_name("step", name)
        position, entry = self.replay(STEP, name)
        if entry is not None:
            return entry.value
        if not shielded:
            return await self.run_step(position, name, fn, args, retry)
        # Cleanup: runs (and records) even while the job is being cancelled, so `finally`
        # blocks can undo what the workflow did. The checkpoint fence still holds: a cancelled
        # job stays `running` (flagged) until its worker records the outcome.
        with trio.CancelScope(shield=True):
            return await self.run_step(position, name, fn, args, retry)

    async def run_step(
        self,
        position: int,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        retry: RetryPolicy | None,
    ) -> Any:
        """Call `fn` (retried in place with `retry`) and record its result at `position`."""
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled run starts no new step
        tries = 1 if retry is None else retry.max_attempts or DEFAULT_STEP_ATTEMPTS
        for attempt in range(1, tries + 1):
            try:
                result = fn(*args)
                if type(result) not in _NOT_AWAITABLE and inspect.isawaitable(result):
                    result = await result
                break
            except Exception:
                if attempt == tries:
                    self.failed_step = (position, name)
                    raise
                assert retry is not None
                await trio.sleep(retry.delay(attempt))
        value_json = codec.encode(result, root=f"step {name!r}")
        return await self.record(position, STEP, name, value_json)

    async def patched(self, name: str) -> bool:
        """Temporal's patch marker: False where an earlier execution passed this point without
        the marker (keep the old code path), else True, recording the marker the first time."""
        _check_name("patched", name)
        if self.suspension is not None:
            raise SuspendExecution
        entry = self._stored().get(self._position)
        if entry is not None and (entry.kind, entry.name) == (PATCH, name):
            self._position += 1
            return True
        if self.replaying():
            return False  # the marker takes no position in histories written before the patch
        position, _ = self.replay(PATCH, name)
        await self.record(position, PATCH, name, "null")
        return True

    def deprecate_patch(self, name: str) -> None:
        """Once no unfinished job predates the patch: consume its marker where one is stored,
        so the old branch can be deleted while workflows that recorded the marker replay."""
        _check_name("deprecate_patch", name)
        entry = self._stored().get(self._position)
        if entry is not None and (entry.kind, entry.name) == (PATCH, name):
            self._position += 1

    async def hold_until_due(self) -> bool:
        """A job claimed before its run_at (a sleep's wake time, a delay or backoff ending
        within the claim's lookahead) waits in-process until then; afterwards the run's
        database time is its run_at, so the replayed sleep finds itself over. True if it
        waited. The claim loop sets `due_at` exactly for the jobs claimed before their run_at."""
        if self.due_at is None:
            return False
        if self.timers is None:
            await trio.sleep_until(self.due_at)
        else:
            await self.timers.wait_until(self.due_at)
        self.now = self.job.run_at
        return True

    async def sleep(self, name: str, duration: datetime.timedelta) -> None:
        _check_name("sleep", name)
        if not isinstance(duration, datetime.timedelta):
            raise TypeError(f"sleep {name!r}: duration must be a datetime.timedelta")
        position, entry = self.replay(SLEEP, name)
        if entry is None:
            seconds = max(0.0, duration.total_seconds())
            value = await self.record(position, SLEEP, name, "{}", wake_in_seconds=seconds)
            if seconds == 0:
                return
        else:
            value = entry.value
        await self._sleep_until(_wake_at(value))

    async def sleep_until(self, name: str, when: datetime.datetime) -> None:
        _check_name("sleep_until", name)
        if not isinstance(when, datetime.datetime) or when.tzinfo is None:
            raise ValueError(
                f"sleep_until {name!r}: the wake time must be a timezone-aware datetime"
            )
        position, entry = self.replay(SLEEP, name)
        if entry is None:
            value_json = json.dumps({"wake_at": when.astimezone(datetime.UTC).isoformat()})
            value = await self.record(position, SLEEP, name, value_json)
        else:
            value = entry.value
        await self._sleep_until(_wake_at(value))

    async def _sleep_until(self, wake_at: datetime.datetime) -> None:
        # The claim's database time decides: a job that woke early (recovered after a crash
        # during its sleep) sleeps again until the ORIGINAL wake time.
        if wake_at > self.now:
            await self.suspend_unless_cancelled(JobState.SLEEPING, wake_at)

    async def suspend_unless_cancelled(
        self, state: str, until: datetime.datetime | None
    ) -> NoReturn:
        """`suspend`, except in a cancelled run (woken to clean up): raise `trio.Cancelled`
        there, so the handler's cleanup runs rather than the job going back to sleep."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self.suspend(state, until)


def _wake_at(value: Any) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value["wake_at"])


# Step results of these types are never awaited: inspect.isawaitable's three isinstance checks
# (one an ABC's) were 3.5% of a 3-step workflow's runtime CPU on a stub driver.
_NOT_AWAITABLE = frozenset({type(None), bool, int, float, str, dict, list})

# Names already validated: a workflow names the same few steps in every run, and validating
# each again (`validate_key` encodes the name) was 4.8% of a 3-step workflow's runtime CPU on
# a stub driver. Bounded, so generated names cannot grow it without limit.
_VALID_NAMES: set[str] = set()
_VALID_NAMES_MAX = 4096


def _check_name(primitive: str, name: Any) -> None:
    if type(name) is str and name in _VALID_NAMES:
        return
    if not isinstance(name, str):
        raise TypeError(f"{primitive}: the name must be a str, not {type(name).__name__}")
    validate_key(f"{primitive} name", name)
    if type(name) is str:
        if len(_VALID_NAMES) >= _VALID_NAMES_MAX:
            _VALID_NAMES.clear()
        _VALID_NAMES.add(name)
