"""Events and child jobs for `MemoryDriver`, with the semantics of migration 0003 and the
`event_*`/`job_wait_*`/`job_spawn`/`job_cancel_children` statements of queries.sql.

Plain functions over the tables of a `MemoryState` (`db`), each called from one `MemoryDriver`
method after its statement checkpoint, so each runs atomically (no interleaving is possible
in memory, which is why the lock-order reasoning lives in the SQL and its interleaving tests).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable
from typing import Any

from .._core.deadlines import Deadline, child_deadline
from .._seam.admin import CancelOutcome
from .._seam.driver import EmitEvent, EmitOutcome
from .._seam.workflow import (
    CancelChildren,
    ChildOutcome,
    ChildrenWaitOutcome,
    EventWaitOutcome,
    Spawn,
    SpawnOutcome,
    WaitChildren,
    WaitEvent,
)
from .state import (
    FINISHED_STATES as FINAL,
)
from .state import (
    SECOND,
    EventRow,
    MemoryState,
    Outbox,
    Row,
    loads,
    new_row,
    validate_new_job,
)


def prune_events(db: MemoryState, before: datetime.datetime, limit: int) -> int:
    """Retention (maintenance_pass): events older than `before` that no job waits for."""
    waited = {row.wait_event_key for row in db.rows.values() if row.state == "waiting"}
    old = sorted(
        (event.emitted_at or event.created_at, key)
        for key, event in db.events.items()
        if (event.emitted_at or event.created_at) < before
    )[:limit]
    pruned = [key for _, key in old if key not in waited]
    for key in pruned:
        del db.events[key]
    return len(pruned)


def _checkpoint(db: MemoryState, row: Row, position: int, kind: str, name: str, value: Any) -> bool:
    """Record the checkpoint at `position` unless one is there already (as the statement's ON
    CONFLICT DO NOTHING does); True when written."""
    history = db.checkpoints.setdefault(row.id, {})
    row.checkpoint_count = max(row.checkpoint_count, position + 1)
    if position in history:
        return False
    history[position] = (kind, name, json.dumps(value))
    return True


# --- events ---------------------------------------------------------------------------------


def emit(db: MemoryState, params: EmitEvent, now: datetime.datetime, outbox: Outbox) -> EmitOutcome:
    json.loads(params.payload_json)
    event = db.events.setdefault(params.key, EventRow(None, None, now))
    first = event.emitted_at is None
    if first:
        event.payload_json, event.emitted_at = params.payload_json, now
    woken = [
        row
        for row in db.rows.values()
        if row.state == "waiting" and row.wait_event_key == params.key
    ]
    stored = event.payload_json
    for row in woken:
        _wake(db, row, now, outbox)
        row.wait_event_key = None
        history = db.checkpoints.get(row.id, {})
        for position, (kind, name, value) in list(history.items()):
            if kind == "event" and name == params.key and "deadline" in json.loads(value or "{}"):
                payload = None if stored is None else json.loads(stored)
                history[position] = (kind, name, json.dumps({"payload": payload}))
    return EmitOutcome(first=first, woken=len(woken))


def wait_event(db: MemoryState, params: WaitEvent, now: datetime.datetime) -> EventWaitOutcome:
    event = db.events.setdefault(params.key, EventRow(None, None, now))
    payload_json, emitted_at = event.payload_json, event.emitted_at
    deadline = params.deadline or now + params.timeout_seconds * SECOND
    payload = None if payload_json is None else json.loads(payload_json)
    if emitted_at is not None:
        state, value = "received", {"payload": payload}
    elif deadline <= now:
        state, value = "timeout", {"timeout": True}
    else:
        state, value = "waiting", {"deadline": deadline.isoformat()}
    row = db.owned(params.lease)
    if row is None:
        return EventWaitOutcome("lost", payload, deadline)
    history = db.checkpoints.setdefault(row.id, {})
    stored = history.get(params.position)
    if stored is not None and "deadline" in json.loads(stored[2] or "null"):
        del history[params.position]  # the pending wait is resolved (or renewed)
    _checkpoint(db, row, params.position, "event", params.key, value)
    row.wait_children = None
    row.wait_event_key = None
    row.wait_topic = row.wait_position = None  # it waits for an event, not for a topic
    if state == "waiting":
        _suspend(row, deadline)
        row.wait_event_key = params.key
    return EventWaitOutcome(state, payload, deadline)


def _suspend(row: Row, until: datetime.datetime | None) -> None:
    row.state = "waiting"
    row.run_at = until
    row.attempt -= 1
    row.end_lease()


def _wake(db: MemoryState, row: Row, now: datetime.datetime, outbox: Outbox) -> None:
    row.state = "ready"
    row.run_at = now
    outbox.add(db.ready_channel(row.queue), row.queue)


# --- children -------------------------------------------------------------------------------


def spawn(db: MemoryState, params: Spawn, now: datetime.datetime) -> tuple[SpawnOutcome, Any]:
    """The outcome, and the new row to commit (None when nothing was inserted)."""
    validate_new_job(params.child)
    parent = db.owned(params.lease)
    if parent is None or parent.cancel_requested:
        cancelling = parent is not None
        return SpawnOutcome(None, False, cancelling), None
    for row in db.rows.values():
        if row.parent_id == parent.id and row.parent_position == params.position:
            _checkpoint(
                db, parent, params.position, "spawn", params.child.task, {"child_id": row.id}
            )
            return SpawnOutcome(row.id, False), None
    child = new_row(next(db.ids), params.child, now, db.task_deadline(params.child))
    child.parent_id = parent.id
    child.parent_position = params.position
    child.on_parent_cancel = params.on_parent_cancel
    # The earlier of the child's own deadline and its workflow's (migration 0029).
    own = None if child.deadline_at is None else Deadline(child.deadline_at, child.deadline_source)
    deadline = child_deadline(own, parent.deadline_at, parent.id)
    if deadline is not None:
        child.deadline_at, child.deadline_source = deadline.at, deadline.source
    _checkpoint(db, parent, params.position, "spawn", params.child.task, {"child_id": child.id})
    return SpawnOutcome(child.id, True), child


def wait_children(db: MemoryState, params: WaitChildren) -> ChildrenWaitOutcome:
    parent = db.owned(params.lease)
    if parent is None:
        return ChildrenWaitOutcome("lost")
    rows = [db.rows.get(child_id) for child_id in params.child_ids]
    children = tuple(
        ChildOutcome(child_id, None, None, None)
        if row is None
        else ChildOutcome(child_id, row.state, loads(row.result_json), loads(row.error_json))
        for child_id, row in zip(params.child_ids, rows, strict=True)
    )
    if any(row is None or row.parent_id != parent.id for row in rows):
        return ChildrenWaitOutcome("unknown", children)
    pending = [child.id for child in children if child.state not in FINAL]
    if not pending:
        parent.wait_topic = parent.wait_position = None
        if params.record:
            value = {"children": [[c.id, c.state, c.result, c.error] for c in children]}
            _checkpoint(db, parent, params.position, params.kind, params.name, value)
        return ChildrenWaitOutcome("done", children)
    if params.stop_on_failure and any(c.state in ("failed", "cancelled") for c in children):
        return ChildrenWaitOutcome("failed", children)
    _suspend(parent, None)
    parent.wait_children = tuple(pending)
    parent.wait_event_key = None
    parent.wait_topic = parent.wait_position = None
    return ChildrenWaitOutcome("waiting")


def children_finished(
    db: MemoryState, rows: Iterable[Row], now: datetime.datetime, outbox: Outbox
) -> None:
    """Rows that just became final tell their parents (parents_notify in migration 0030)."""
    by_parent: dict[int, list[Row]] = {}
    for row in rows:
        if row.parent_id is not None and row.state in FINAL:
            by_parent.setdefault(row.parent_id, []).append(row)
    for parent_id, children in sorted(by_parent.items()):
        parent = db.rows.get(parent_id)
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
            _wake(db, parent, now, outbox)


def cancel_tree(
    db: MemoryState,
    root_ids: Iterable[int],
    now: datetime.datetime,
    outbox: Outbox,
    control_channel: str,
    *,
    tree: bool = False,
) -> dict[int, CancelOutcome]:
    """job_cancel_tree: cancel jobs and their descendants (see migrations 0003 and 0017): a
    child spawned with on_parent_cancel="abandon" is left out, one with "wait" is left running
    and its parent waits for it; `tree` cancels every descendant whatever its policy."""
    roots = [db.rows[i] for i in root_ids if i in db.rows]
    plan: dict[int, tuple[str, str]] = {}
    kept: set[int] = set()

    def visit(row: Row) -> bool:
        """Plan `row`'s subtree; True when it has a job its parent must wait for."""
        blocking = False
        for child in [r for r in db.rows.values() if r.parent_id == row.id]:
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
        row = db.rows[job_id]
        if old in FINAL or job_id in kept:
            continue
        row.cancel_requested = True
        row.wait_event_key = None
        # Whatever receive it was suspended in is over: a send of that topic must not wake
        # the job (now waiting for its children, or woken for its cleanup).
        row.wait_topic = row.wait_position = None
        if new == "running":
            outbox.add(control_channel, str(row.id))
        elif new == "waiting":
            row.state, row.run_at = "waiting", None
            row.wait_children = tuple(
                r.id
                for r in db.rows.values()
                if r.parent_id == row.id and r.id in plan and plan[r.id][1] not in FINAL
            )
        elif new == "ready":
            row.wait_children = None
            _wake(db, row, now, outbox)
        else:
            db.finish(row, "cancelled", now)
            outbox.add(db.result_channel(row.id), str(row.id))
    children_finished(db, roots, now, outbox)
    return {root.id: CancelOutcome(*plan[root.id]) for root in roots}


def cancel_children(
    db: MemoryState,
    params: CancelChildren,
    now: datetime.datetime,
    outbox: Outbox,
    control_channel: str,
) -> bool:
    parent = db.owned(params.lease)
    if parent is None:
        return False
    _checkpoint(
        db, parent, params.position, params.kind, params.name, json.loads(params.value_json)
    )
    mine = [i for i in params.child_ids if (row := db.rows.get(i)) and row.parent_id == parent.id]
    cancel_tree(db, mine, now, outbox, control_channel)
    return True
