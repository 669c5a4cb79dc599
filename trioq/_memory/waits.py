"""Events and child jobs for `MemoryDriver`, with the semantics of migration 0003 and the
`event_*`/`job_wait_*`/`job_spawn`/`job_cancel_children` statements of queries.sql.

Plain functions over the driver's tables, each called from one `MemoryDriver` method after its
statement checkpoint, so each runs atomically (no interleaving is possible in memory, which is
why the lock-order reasoning lives in the SQL and its interleaving tests).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from .._core.states import TERMINAL_STATES
from .._driver import (
    CancelChildren,
    CancelOutcome,
    ChildOutcome,
    ChildrenWaitOutcome,
    EmitEvent,
    EmitOutcome,
    EventWaitOutcome,
    Spawn,
    SpawnOutcome,
    WaitChildren,
    WaitEvent,
)

if TYPE_CHECKING:
    from .driver import MemoryDriver, _Outbox, _Row

FINAL = TERMINAL_STATES
_SECOND = datetime.timedelta(seconds=1)


@attrs.define
class EventRow:
    """One row of the events table (`emitted_at` None: only waited for so far)."""

    payload_json: str | None
    emitted_at: datetime.datetime | None
    created_at: datetime.datetime


def prune_events(driver: MemoryDriver, before: datetime.datetime, limit: int) -> int:
    """Retention (maintenance_pass): events older than `before` that no job waits for."""
    waited = {row.wait_event_key for row in driver._rows.values() if row.state == "waiting"}
    old = sorted(
        (event.emitted_at or event.created_at, key)
        for key, event in driver._events.items()
        if (event.emitted_at or event.created_at) < before
    )[:limit]
    pruned = [key for _, key in old if key not in waited]
    for key in pruned:
        del driver._events[key]
    return len(pruned)


def _owned(driver: MemoryDriver, lease: Any) -> _Row | None:
    row = driver._rows.get(lease.id)
    return row if row is not None and row.holds(lease) else None


def _checkpoint(
    driver: MemoryDriver, row: _Row, position: int, kind: str, name: str, value: Any
) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING; True when written."""
    history = driver._checkpoints.setdefault(row.id, {})
    row.checkpoint_count = max(row.checkpoint_count, position + 1)
    if position in history:
        return False
    history[position] = (kind, name, json.dumps(value))
    return True


# --- events ---------------------------------------------------------------------------------


def emit(
    driver: MemoryDriver, params: EmitEvent, now: datetime.datetime, outbox: _Outbox
) -> EmitOutcome:
    json.loads(params.payload_json)
    event = driver._events.setdefault(params.key, EventRow(None, None, now))
    first = event.emitted_at is None
    if first:
        event.payload_json, event.emitted_at = params.payload_json, now
    woken = [
        row
        for row in driver._rows.values()
        if row.state == "waiting" and row.wait_event_key == params.key
    ]
    stored = event.payload_json
    for row in woken:
        _wake(driver, row, now, outbox)
        row.wait_event_key = None
        history = driver._checkpoints.get(row.id, {})
        for position, (kind, name, value) in list(history.items()):
            if kind == "event" and name == params.key and "deadline" in json.loads(value or "{}"):
                payload = None if stored is None else json.loads(stored)
                history[position] = (kind, name, json.dumps({"payload": payload}))
    return EmitOutcome(first=first, woken=len(woken))


def wait_event(driver: MemoryDriver, params: WaitEvent, now: datetime.datetime) -> EventWaitOutcome:
    event = driver._events.setdefault(params.key, EventRow(None, None, now))
    payload_json, emitted_at = event.payload_json, event.emitted_at
    deadline = params.deadline or now + params.timeout_seconds * _SECOND
    payload = None if payload_json is None else json.loads(payload_json)
    if emitted_at is not None:
        state, value = "received", {"payload": payload}
    elif deadline <= now:
        state, value = "timeout", {"timeout": True}
    else:
        state, value = "waiting", {"deadline": deadline.isoformat()}
    row = _owned(driver, params.lease)
    if row is None:
        return EventWaitOutcome("lost", payload, deadline)
    history = driver._checkpoints.setdefault(row.id, {})
    stored = history.get(params.position)
    if stored is not None and "deadline" in json.loads(stored[2] or "null"):
        del history[params.position]  # the pending wait is resolved (or renewed)
    _checkpoint(driver, row, params.position, "event", params.key, value)
    row.wait_children = None
    row.wait_event_key = None
    if state == "waiting":
        _suspend(row, deadline)
        row.wait_event_key = params.key
    return EventWaitOutcome(state, payload, deadline)


def _suspend(row: _Row, until: datetime.datetime | None) -> None:
    row.state = "waiting"
    row.run_at = until
    row.attempt -= 1
    row.end_lease()


def _wake(driver: MemoryDriver, row: _Row, now: datetime.datetime, outbox: _Outbox) -> None:
    row.state = "ready"
    row.run_at = now
    outbox.add(driver._ready_channel(row.queue), row.queue)


# --- children -------------------------------------------------------------------------------


def spawn(driver: MemoryDriver, params: Spawn, now: datetime.datetime) -> tuple[SpawnOutcome, Any]:
    """The outcome, and the new row to commit (None when nothing was inserted)."""
    from .driver import _new_row, _validate_new_job

    _validate_new_job(params.child)
    parent = _owned(driver, params.lease)
    if parent is None or parent.cancel_requested:
        cancelling = parent is not None
        return SpawnOutcome(None, False, cancelling), None
    for row in driver._rows.values():
        if row.parent_id == parent.id and row.parent_position == params.position:
            _checkpoint(
                driver, parent, params.position, "spawn", params.child.task, {"child_id": row.id}
            )
            return SpawnOutcome(row.id, False), None
    child = _new_row(next(driver._ids), params.child, now)
    child.parent_id = parent.id
    child.parent_position = params.position
    child.on_parent_cancel = params.on_parent_cancel
    _checkpoint(driver, parent, params.position, "spawn", params.child.task, {"child_id": child.id})
    return SpawnOutcome(child.id, True), child


def wait_children(driver: MemoryDriver, params: WaitChildren) -> ChildrenWaitOutcome:
    parent = _owned(driver, params.lease)
    if parent is None:
        return ChildrenWaitOutcome("lost")
    rows = [driver._rows.get(child_id) for child_id in params.child_ids]
    children = tuple(
        ChildOutcome(child_id, None, None, None)
        if row is None
        else ChildOutcome(child_id, row.state, _loads(row.result_json), _loads(row.error_json))
        for child_id, row in zip(params.child_ids, rows, strict=True)
    )
    if any(row is None or row.parent_id != parent.id for row in rows):
        return ChildrenWaitOutcome("unknown", children)
    pending = [child.id for child in children if child.state not in FINAL]
    if not pending:
        if params.record:
            value = {"children": [[c.id, c.state, c.result, c.error] for c in children]}
            _checkpoint(driver, parent, params.position, params.kind, params.name, value)
        return ChildrenWaitOutcome("done", children)
    if params.stop_on_failure and any(c.state in ("failed", "cancelled") for c in children):
        return ChildrenWaitOutcome("failed", children)
    _suspend(parent, None)
    parent.wait_children = tuple(pending)
    parent.wait_event_key = None
    return ChildrenWaitOutcome("waiting")


def children_finished(
    driver: MemoryDriver, rows: Iterable[_Row], now: datetime.datetime, outbox: _Outbox
) -> None:
    """Rows that just became final tell their parents (parents_notify in migration 0003)."""
    by_parent: dict[int, list[_Row]] = {}
    for row in rows:
        if row.parent_id is not None and row.state in FINAL:
            by_parent.setdefault(row.parent_id, []).append(row)
    for parent_id, children in sorted(by_parent.items()):
        parent = driver._rows.get(parent_id)
        if parent is None or parent.state in FINAL:
            continue
        parent.children_settled += len(children)
        waited = set(parent.wait_children or ())
        ids = {child.id for child in children}
        if parent.state != "waiting" or not waited & ids:
            continue
        failed = {child.id for child in children if child.state != "completed"}
        parent.wait_children = tuple(i for i in parent.wait_children or () if i not in ids)
        if waited <= ids or waited & failed:
            _wake(driver, parent, now, outbox)


def cancel_tree(
    driver: MemoryDriver,
    root_ids: Iterable[int],
    now: datetime.datetime,
    outbox: _Outbox,
    control_channel: str,
    *,
    tree: bool = False,
) -> dict[int, CancelOutcome]:
    """job_cancel_tree: cancel jobs and their descendants (see migrations 0003 and 0017): a
    child spawned with on_parent_cancel="abandon" is left out, one with "wait" is left running
    and its parent waits for it; `tree` cancels every descendant whatever its policy."""
    roots = [driver._rows[i] for i in root_ids if i in driver._rows]
    plan: dict[int, tuple[str, str]] = {}
    kept: set[int] = set()

    def visit(row: _Row) -> bool:
        """Plan `row`'s subtree; True when it has a job its parent must wait for."""
        blocking = False
        for child in [r for r in driver._rows.values() if r.parent_id == row.id]:
            policy = "cancel" if tree else child.on_parent_cancel
            if policy == "abandon":
                continue
            if policy == "wait":
                kept.add(child.id)
                plan[child.id] = (child.state, child.state)
                blocking = blocking or child.state not in FINAL
            else:
                blocking = visit(child) or blocking
        if row.state in FINAL or row.state == "running":
            new = row.state
        elif blocking:
            new = "waiting"
        else:  # a suspended workflow runs once more, cancelled, for its cleanup steps
            new = "ready" if row.state in ("sleeping", "waiting") else "cancelled"
        plan[row.id] = (row.state, new)
        return blocking or row.state == "running"

    for root in roots:
        visit(root)
    for job_id, (old, new) in plan.items():
        row = driver._rows[job_id]
        if old in FINAL or job_id in kept:
            continue
        row.cancel_requested = True
        row.wait_event_key = None
        if new == "running":
            outbox.add(control_channel, str(row.id))
        elif new == "waiting":
            row.state, row.run_at = "waiting", None
            row.wait_children = tuple(
                r.id
                for r in driver._rows.values()
                if r.parent_id == row.id and r.id in plan and plan[r.id][1] not in FINAL
            )
        elif new == "ready":
            row.wait_children = None
            _wake(driver, row, now, outbox)
        else:
            driver._finish(row, "cancelled", now)
            outbox.add(driver._result_channel(row.id), str(row.id))
    children_finished(driver, roots, now, outbox)
    return {root.id: CancelOutcome(*plan[root.id]) for root in roots}


def cancel_children(
    driver: MemoryDriver,
    params: CancelChildren,
    now: datetime.datetime,
    outbox: _Outbox,
    control_channel: str,
) -> bool:
    parent = _owned(driver, params.lease)
    if parent is None:
        return False
    _checkpoint(
        driver, parent, params.position, params.kind, params.name, json.loads(params.value_json)
    )
    mine = [
        i for i in params.child_ids if (row := driver._rows.get(i)) and row.parent_id == parent.id
    ]
    cancel_tree(driver, mine, now, outbox, control_channel)
    return True


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
