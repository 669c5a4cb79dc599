"""The workflow view: unfinished workflows with what each waits on (`client.workflows`,
`trioq workflows`), and a job's history as a timeline (`trioq job ID`)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ._core.states import JobState

if TYPE_CHECKING:  # annotations only: the CLI's parser imports this module
    from ._seam.admin import WorkflowRecord
    from ._seam.workflow import Checkpoint

WORKFLOW_STATES = (JobState.RUNNING, JobState.SLEEPING, JobState.WAITING)


@attrs.frozen
class WorkflowView:
    """One unfinished workflow. `waits_on` says what it waits on, for a person: `event KEY`,
    `message TOPIC`, `sleeping until T`, `children 3/10 done` (empty while it runs)."""

    id: int
    task: str
    queue: str
    state: str
    waits_on: str
    # sleeping: the wake time; waiting: the deadline (None: until woken)
    until: datetime.datetime | None
    checkpoints: int
    created_at: datetime.datetime
    wait_event_key: str | None = None
    wait_topic: str | None = None
    children_done: int | None = None
    children_total: int | None = None

    @classmethod
    def of(cls, record: WorkflowRecord) -> WorkflowView:
        on_children = record.waits_for_children
        return cls(
            id=record.id,
            task=record.task,
            queue=record.queue,
            state=record.state,
            waits_on=describe_wait(record),
            until=record.run_at if record.state in (JobState.SLEEPING, JobState.WAITING) else None,
            checkpoints=record.checkpoints,
            created_at=record.created_at,
            wait_event_key=record.wait_event_key if record.state == JobState.WAITING else None,
            wait_topic=record.wait_topic,
            children_done=record.children_settled if on_children else None,
            children_total=record.children_total if on_children else None,
        )

    def as_json(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        for field in ("until", "created_at"):
            if out[field] is not None:
                out[field] = out[field].isoformat()
        return out


def describe_wait(record: WorkflowRecord) -> str:
    if record.state == JobState.SLEEPING:
        return f"sleeping until {_when(record.run_at)}"
    if record.state != JobState.WAITING:
        return ""
    deadline = "" if record.run_at is None else f" (until {_when(record.run_at)})"
    if record.wait_topic is not None:
        return f"message {record.wait_topic!r}{deadline}"
    if record.wait_event_key is not None:
        return f"event {record.wait_event_key!r}{deadline}"
    if record.waits_for_children:
        return f"children {record.children_settled}/{record.children_total} done"
    return f"waiting{deadline}"


def _when(moment: datetime.datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def timeline(history: Sequence[Checkpoint]) -> list[str]:
    """The history as one line per checkpoint: position, kind, name and what it recorded."""
    return [
        f"{entry.position:>4}  {entry.kind:<8} {entry.name}  {_outcome(entry)}" for entry in history
    ]


def _outcome(entry: Checkpoint) -> str:
    value = entry.value
    if isinstance(value, dict):
        if entry.kind == "receive" and "messages" in value:
            count = len(value["messages"])
            return "timed out" if count == 0 else f"received {count}: {_short(value['messages'])}"
        if "deadline" in value:
            return f"waiting until {value['deadline']}"
        if entry.kind == "sleep" and "wake_at" in value:
            return f"until {value['wake_at']}"
        if entry.kind == "event":
            return "timed out" if value.get("timeout") else f"-> {_short(value.get('payload'))}"
        if entry.kind == "spawn":
            return f"child {value.get('child_id')}"
    return f"-> {_short(value)}"


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
