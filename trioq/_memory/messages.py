"""Messages and workflow values for `MemoryDriver`, with the semantics of migrations 0016 and
0025 and the `message_send`, `job_receive`, `job_value_*` and `workflow_list` statements of
queries.sql.

Plain functions over the tables of a `MemoryState` (`db`), each called from one `MemoryDriver`
method after its statement checkpoint, so each runs atomically (the lock order that makes a
send and a receive meet lives in the SQL and its interleaving tests).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable

from .._seam.admin import WorkflowFilter, WorkflowRecord
from .._seam.driver import MessageSend, ValueRead, WorkflowValue
from .._seam.workflow import Receive, ReceiveOutcome, SendOutcome, ValueSet
from .state import FINISHED_STATES as FINAL
from .state import SECOND, MemoryState, Outbox, Row
from .state import SUSPENDED_OR_SCHEDULED as SUSPENDED


def send(
    db: MemoryState, params: MessageSend, now: datetime.datetime, outbox: Outbox
) -> SendOutcome:
    json.loads(params.payload_json)
    row = db.rows.get(params.job_id)
    if row is None or row.state in FINAL:
        return SendOutcome(None if row is None else row.state, None)
    table = db.messages
    message_id = next(table.ids)
    if _deliver(db, row, params):
        row.state, row.run_at, row.wait_topic, row.wait_position = "ready", now, None, None
        outbox.add(db.ready_channel(row.queue), row.queue)
        return SendOutcome("waiting", message_id)
    table.queued.setdefault(row.id, {}).setdefault(params.topic, []).append(
        (message_id, params.payload_json)
    )
    state = row.state
    if row.state == "waiting" and row.wait_topic == params.topic:
        row.state, row.run_at, row.wait_topic, row.wait_position = "ready", now, None, None
    # As send() in migration 0020: a claim may have skipped a ready or due job under the
    # send's row lock, so its queue is woken (the database delivers it at commit).
    if row.state == "ready" or (
        row.state in SUSPENDED and row.run_at is not None and row.run_at <= now
    ):
        outbox.add(db.ready_channel(row.queue), row.queue)
    return SendOutcome(state, message_id)


def _deliver(db: MemoryState, row: Row, params: MessageSend) -> bool:
    """As send() in migration 0025: a job waiting for this topic at a known position gets the
    message as that receive's checkpoint (replacing the pending deadline); True if it did."""
    if row.state != "waiting" or row.wait_topic != params.topic or row.wait_position is None:
        return False
    history = db.checkpoints.get(row.id, {})
    stored = history.get(row.wait_position)
    if stored is None or stored[:2] != ("receive", params.topic):
        return False
    value = json.loads(stored[2] or "null")
    if "deadline" not in value or "messages" in value:
        return False
    messages = {"messages": [json.loads(params.payload_json)]}
    history[row.wait_position] = ("receive", params.topic, json.dumps(messages))
    return True


def receive(
    db: MemoryState, params: Receive, now: datetime.datetime, outbox: Outbox
) -> ReceiveOutcome:
    deadline = params.deadline or now + params.timeout_seconds * SECOND
    row = db.rows.get(params.lease.id)
    if row is None or not row.holds(params.lease):
        return ReceiveOutcome("lost", (), deadline)
    row.checkpoint_count = max(row.checkpoint_count, params.position + 1)
    write_values(db, row.id, params.values, now, outbox)
    history = db.checkpoints.setdefault(row.id, {})
    stored = history.get(params.position)
    if stored is not None:
        value = json.loads(stored[2] or "null")
        if "messages" in value:
            return ReceiveOutcome("received", tuple(value["messages"]), deadline)
    by_topic = db.messages.queued.get(row.id, {})
    queue = by_topic.get(params.topic, [])
    taken, queue[:] = queue[: params.limit], queue[params.limit :]
    if not queue:
        by_topic.pop(params.topic, None)
    messages = [json.loads(payload) for _, payload in taken]
    if messages or deadline <= now:
        value = {"messages": messages}
        history[params.position] = ("receive", params.topic, json.dumps(value))
        row.wait_topic = row.wait_position = None
        return ReceiveOutcome("received" if messages else "timeout", tuple(messages), deadline)
    if stored is None:
        pending = {"deadline": deadline.isoformat()}
        history[params.position] = ("receive", params.topic, json.dumps(pending))
    row.state, row.run_at = "waiting", deadline
    row.attempt -= 1
    row.end_lease()
    row.wait_topic, row.wait_event_key, row.wait_children = params.topic, None, None
    row.wait_position = params.position
    return ReceiveOutcome("waiting", (), deadline)


def write_values(
    db: MemoryState,
    job_id: int,
    values: Iterable[tuple[str, str]],
    now: datetime.datetime,
    outbox: Outbox | None = None,
) -> None:
    written = False
    for key, value_json in values:
        json.loads(value_json)
        db.messages.values.setdefault(job_id, {})[key] = (value_json, now)
        written = True
    if written and outbox is not None:
        outbox.add(db.result_channel(job_id), str(job_id))


def set_values(db: MemoryState, params: ValueSet, now: datetime.datetime, outbox: Outbox) -> bool:
    row = db.rows.get(params.lease.id)
    if row is None or not row.holds(params.lease):
        return False
    write_values(db, row.id, params.values, now, outbox)
    return True


def get_value(db: MemoryState, job_id: int, key: str) -> ValueRead:
    row = db.rows.get(job_id)
    if row is None:
        return ValueRead(None, False, None)
    stored = db.messages.values.get(job_id, {}).get(key)
    if stored is None:
        return ValueRead(row.state, False, None)
    return ValueRead(row.state, True, json.loads(stored[0]))


def job_values(db: MemoryState, job_id: int) -> list[WorkflowValue]:
    stored = db.messages.values.get(job_id, {})
    return [
        WorkflowValue(key, json.loads(value), updated_at)
        for key, (value, updated_at) in sorted(stored.items())
    ]


def workflows(db: MemoryState, params: WorkflowFilter) -> list[WorkflowRecord]:
    found = []
    for row in sorted(db.rows.values(), key=lambda row: -row.id):
        if not _listed(row, params):
            continue
        found.append(_record(db, row))
        if len(found) == params.limit:
            break
    return found


def _listed(row: Row, params: WorkflowFilter) -> bool:
    if row.state not in ("running", "sleeping", "waiting"):
        return False
    if row.state == "running" and row.checkpoint_count == 0:
        return False
    return (
        (params.states is None or row.state in params.states)
        and (params.tasks is None or row.task in params.tasks)
        and (params.before_id is None or row.id < params.before_id)
    )


def _record(db: MemoryState, row: Row) -> WorkflowRecord:
    waiting = row.state == "waiting"
    on_children = waiting and row.wait_children is not None
    total = (
        sum(1 for other in db.rows.values() if other.parent_id == row.id) if on_children else None
    )
    return WorkflowRecord(
        id=row.id,
        task=row.task,
        queue=row.queue,
        state=row.state,
        run_at=row.run_at,
        checkpoints=row.checkpoint_count,
        wait_event_key=row.wait_event_key,
        wait_topic=row.wait_topic if waiting else None,
        waits_for_children=on_children,
        children_settled=row.children_settled,
        children_total=total,
        created_at=row.created_at,
    )
