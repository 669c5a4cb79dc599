"""A driver that checks every change it sees in the jobs table against the state machine.

`CheckedDriver(inner)` passes each call to `inner` and reads every job's `(id, state)` before
and after it (memory: from its rows; PostgreSQL: one `job_states` statement on a pooled
connection of its own). Each row that changed must be an edge of `TRANSITIONS` that one of the
statements of the call may make (`METHOD_STATEMENTS`); a new row must be in a state that one of
those statements inserts (`INSERTED`); a vanished row must have been final and a statement that
deletes (`DELETED_BY`). A violation raises `TransitionViolation` from the call that saw it.

Calls that overlap in this process (a worker's claim loop, completer and lease renewal, a
transaction with calls inside it) are judged together: a change seen across one call may have
been made by any call that was in flight meanwhile, so the statements allowed are those of all
of them. A write this wrapper does not see breaks that: another process's worker, or raw SQL
outside a transaction of this driver (it would even be blamed on the next call, since a call's
second read serves as the next one's first). So use it only where the calls are serialized, or
all made through it: the conformance suite and the differential machines (serial calls), and
the runtime machine (one worker, every call of which goes through it). A transaction that runs
SQL of its own (`execute`, `fetch`) leaves itself and the calls overlapping it unchecked.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs

from .._core.states import (
    CLAIM,
    CLAIM_PLAIN,
    COMPLETE_PLAIN,
    DELETED_BY,
    DISCARD,
    INSERTED,
    SETTLE,
    TRANSITIONS,
    JobState,
)
from .._memory import MemoryDriver
from .._seam.driver import Driver

# Every Driver method that may change, insert or delete a jobs row -> the statements of
# queries.sql it runs that may do so (the memory driver mirrors them under the same names).
METHOD_STATEMENTS: dict[str, tuple[str, ...]] = {
    "job_insert_many": ("job_insert_many",),
    # queue_limit_spend: a limited claim's start time on the rows it claimed (no state change).
    # job_claim_rated: the full statement while key rates exist (the same edges).
    "job_claim": (CLAIM, "job_claim_rated", CLAIM_PLAIN, "queue_limit_spend"),
    "job_settle_many": (SETTLE, COMPLETE_PLAIN, DISCARD),
    "checkpoint_insert_many": ("checkpoint_insert_many", "checkpoint_insert_many_plain"),
    "lease_renew_many": ("lease_renew_many",),
    "job_result_watch": ("job_result_watch", "job_result_watch_run"),  # a waiter's flag
    "maintenance_pass": ("maintenance_pass", "job_epochs_rotate"),
    "job_cancel": ("job_cancel",),
    "job_cancel_with": ("job_cancel_with",),
    "event_emit": ("event_emit",),
    "job_wait_event": ("job_wait_event",),
    "job_spawn_many": ("job_spawn_many",),
    "job_wait_children": ("job_wait_children",),
    "job_cancel_children": ("job_cancel_children",),
    "job_retry": ("job_retry",),
    "job_purge": ("job_purge", "job_epochs_rotate"),
    "schedule_fire_due": ("schedule_fire_many",),
    "message_send": ("message_send",),
    "job_receive": ("job_receive",),
    "job_continue_as_new": ("job_continue_as_new",),
    # What a Transaction offers: job_insert_many, job_settle_many (the settle statement) and
    # event_emit. Its raw execute/fetch are the caller's SQL: a transaction that used them is
    # not checked (SqlClock's time travel is one).
    "transaction": ("job_insert_many", SETTLE, COMPLETE_PLAIN, DISCARD, "event_emit"),
}
# The Driver methods that change no jobs row (a test checks the two lists cover the protocol).
NO_JOB_WRITES = frozenset(
    {
        "checkpoint_list",
        "concurrency_key_status",
        "concurrency_limit_list",
        "concurrency_limit_set",
        "concurrency_rate_list",
        "concurrency_rate_set",
        "concurrency_rate_status",
        "is_connection_lost",
        "is_transient",
        "job_attempts",
        "job_descendants",
        "job_explain",
        "job_get",
        "job_list",
        "job_trace_context",
        "job_unroutable",
        "job_value_get",
        "job_value_set_many",
        "job_values",
        "leader_elect",
        "leader_resign",
        "migrate",
        "notify_send",
        "open_listener",
        "queue_demand",
        "queue_limit_list",
        "queue_limit_set",
        "queue_limits_changed",
        "queue_limits_notified",
        "queue_pause",
        "queue_pause_list",
        "queue_resume",
        "queue_status",
        "ready_channels",
        "ready_sweep",  # truncates the ready ring's drained slots; no job row
        "schedule_delete",
        "schedule_list",
        "schedule_next_due",
        "schedule_upsert_many",
        "statistics",
        "status_health",
        "task_history_kinds",
        "task_status",
        "worker_list",
        "worker_register",
        "worker_unregister",
        "workflow_list",
    }
)

# Checked too, with no statement allowed to change a row (so a write that a method not in
# METHOD_STATEMENTS makes fails). Not migrate (an unmigrated schema has no jobs table to
# read), nor the calls that are not coroutines.
_CHECKED_CALLS = (set(METHOD_STATEMENTS) | NO_JOB_WRITES) - {
    "transaction",
    "migrate",
    "statistics",
    "is_connection_lost",
    "is_transient",
    "open_listener",
    "queue_limits_changed",
    "queue_limits_notified",
}


class TransitionViolation(AssertionError):
    """A driver call changed a job row in a way the state machine does not allow."""


def transition_errors(
    before: dict[int, str], after: dict[int, str], statements: frozenset[str]
) -> list[str]:
    """What is wrong with the change from `before` to `after`, if `statements` made it."""
    found = []
    for job_id, state in after.items():
        source = before.get(job_id)
        if source is None:
            allowed = set(INSERTED.get(JobState(state), ()))
            if not allowed & statements:
                found.append(f"job {job_id} inserted as {state} (inserted so by {sorted(allowed)})")
        elif source != state:
            allowed = set(TRANSITIONS.get((JobState(source), JobState(state)), ()))
            if not allowed & statements:
                edge = f"{source} -> {state}"
                found.append(f"job {job_id}: {edge} (TRANSITIONS allows it to {sorted(allowed)})")
    for job_id, source in before.items():
        deleters = set(DELETED_BY.get(JobState(source), ()))
        if job_id not in after and not deleters & statements:
            found.append(f"job {job_id} deleted while {source} (deleted so by {sorted(deleters)})")
    return found


async def read_job_states(driver: Driver) -> dict[int, str]:
    """Every job's state: from the memory driver's rows, or the `job_states` statement."""
    if isinstance(driver, MemoryDriver):
        return {job_id: row.state for job_id, row in driver._state.rows.items()}
    # psycopg only when a PostgreSQL driver is checked
    from .._pg.driver import PgDriver
    from .._pg.driver import read_job_states as read_pg

    assert isinstance(driver, PgDriver), f"no way to read the jobs of {type(driver).__name__}"
    return await read_pg(driver)


@attrs.define(eq=False)
class _Call:
    """One call in flight, and the methods of every call that overlapped it."""

    method: str
    seen: set[str]
    unchecked: bool = False  # it overlapped SQL of the caller's own (a transaction's execute)


@attrs.define(eq=False)
class CheckedDriver:
    """`inner`, with every call's row changes checked (see the module docstring)."""

    inner: Driver
    # edge ("a -> b", "insert STATE", "delete STATE") -> the methods seen making it
    seen_edges: dict[str, set[str]] = attrs.field(factory=dict)
    violations: list[str] = attrs.field(factory=list)  # every TransitionViolation raised
    _in_flight: dict[int, _Call] = attrs.field(factory=dict)
    _ids: itertools.count[int] = attrs.field(factory=itertools.count)
    # The last call's second read, while no call has begun since: the next call's first read
    # (every write goes through this wrapper, so nothing has changed). Halves the reads.
    _last: dict[int, str] | None = None

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name in _CHECKED_CALLS:
            return functools.partial(self._checked, name, value)
        return value

    @property
    def schema(self) -> str:
        return self.inner.schema

    def _begin(self, method: str) -> tuple[int, _Call]:
        others = self._in_flight.values()
        call = _Call(method, {method} | {other.method for other in others})
        call.unchecked = any(other.unchecked for other in others)
        for other in others:
            other.seen.add(method)
        token = next(self._ids)
        self._in_flight[token] = call
        return token, call

    async def _first_read(self) -> dict[int, str]:
        last, self._last = self._last, None  # stale from now on: this call may write
        if last is not None and len(self._in_flight) == 1:
            return last
        return await read_job_states(self.inner)

    async def _checked(
        self, method: str, function: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
    ) -> Any:
        # In flight from before the first read to after the second, so that every call that
        # may have written between the two reads is among those the change is judged against.
        token, call = self._begin(method)
        try:
            before = await self._first_read()
            try:
                result = await function(*args, **kwargs)
            except Exception:
                # A failed call may have written (a reply lost after the commit): check it
                # too, then let its own error through.
                await self._check(call, before)
                raise
            await self._check(call, before)
            return result
        finally:
            del self._in_flight[token]

    async def _check(self, call: _Call, before: dict[int, str]) -> None:
        after = await read_job_states(self.inner)
        if call.unchecked:
            return
        if len(self._in_flight) == 1:  # this call alone: nothing else may have written since
            self._last = after
        statements = frozenset(s for method in call.seen for s in METHOD_STATEMENTS.get(method, ()))
        found = transition_errors(before, after, statements)
        if found:
            others = sorted(call.seen - {call.method})
            message = f"{call.method} (overlapping {others}): " + "; ".join(found)
            # Kept as well as raised: a worker's loop may catch the error and retry.
            self.violations.append(message)
            raise TransitionViolation(message)
        overlapped = len(call.seen) > 1
        self._record(before, after, f"{call.method} (overlapped)" if overlapped else call.method)

    def _record(self, before: dict[int, str], after: dict[int, str], method: str) -> None:
        for job_id, state in after.items():
            source = before.get(job_id)
            if source != state:
                edge = f"insert {state}" if source is None else f"{source} -> {state}"
                self.seen_edges.setdefault(edge, set()).add(method)
        for job_id, source in before.items():
            if job_id not in after:
                self.seen_edges.setdefault(f"delete {source}", set()).add(method)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        """The inner transaction, checked from before it opens to after it ends."""
        token, call = self._begin("transaction")
        try:
            before = await self._first_read()
            try:
                async with self.inner.transaction() as tx:
                    yield _CheckedTransaction(tx, self)
            except Exception:
                await self._check(call, before)
                raise
            await self._check(call, before)
        finally:
            del self._in_flight[token]


@attrs.define(eq=False)
class _CheckedTransaction:
    """A transaction that leaves every call in flight unchecked once the caller runs SQL of
    their own."""

    inner: Any
    driver: CheckedDriver

    def __getattr__(self, name: str) -> Any:
        if name in ("execute", "fetch"):
            for call in self.driver._in_flight.values():
                call.unchecked = True
        return getattr(self.inner, name)
