"""The seam's workflow statements: checkpoints, durable waits, spawns, messages and values,
each fenced by the running job's lease (the primitives behind `ctx`, trioq/_runtime/workflow/).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from .lease import Lease
from .records import MessageSend, NewJob, ValueRead, WorkflowValue


@attrs.frozen
class CheckpointWrite:
    """One checkpoint to record for a running job (fenced by its lease).

    The stored value is `value_json`; with `wake_in_seconds`, it is that JSON object (or `{}`)
    with "wake_at" = database now + wake_in_seconds merged in (durable sleeps).
    """

    lease: Lease
    position: int
    kind: str
    name: str
    value_json: str | None
    wake_in_seconds: float | None = None
    # ctx.set_value: (key, value JSON) pairs set since the job's last checkpoint, written in
    # the same statement (the last of a key wins).
    values: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class WaitEvent:
    """A running job waits for `key` until `deadline` (a replay passes the stored one) or, on
    the first wait, `timeout_seconds` from database time."""

    lease: Lease
    position: int
    key: str
    timeout_seconds: float
    deadline: datetime.datetime | None = None


@attrs.frozen
class Spawn:
    """A running job enqueues `child` exactly once for its checkpoint `position`."""

    lease: Lease
    position: int
    child: NewJob
    # What cancelling the parent does to the child: cancel it, abandon it (it runs on, the
    # parent does not wait), or wait for it (it runs on, the parent is final after it).
    on_parent_cancel: str = "cancel"


@attrs.frozen
class WaitChildren:
    """A running job waits until its `child_ids` are final (or, with `stop_on_failure`, one
    failed); with `record`, their outcomes become checkpoint `position` (`kind`, `name`)."""

    lease: Lease
    position: int
    child_ids: tuple[int, ...]
    stop_on_failure: bool = False
    record: bool = True
    kind: str = "children"
    name: str = ""


@attrs.frozen
class CancelChildren:
    """gather's fail-fast: record checkpoint `position`, then cancel `child_ids` (and their
    children) that are not final."""

    lease: Lease
    position: int
    kind: str
    name: str
    value_json: str
    child_ids: tuple[int, ...]


@attrs.frozen
class ContinueAsNew:
    """A running workflow ends its history and starts again, same job id, with `payload_json`."""

    lease: Lease
    payload_json: str


@attrs.frozen
class Receive:
    """A running job takes up to `limit` messages of `topic` as checkpoint `position`, or
    waits for them until `deadline` (a replay passes the stored one) or, on the first wait,
    `timeout_seconds` from database time. `values` as in `CheckpointWrite`."""

    lease: Lease
    position: int
    topic: str
    timeout_seconds: float
    deadline: datetime.datetime | None = None
    limit: int = 1000
    values: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class ValueSet:
    """Write a running job's values (key, value JSON) now, fenced by its lease."""

    lease: Lease
    values: tuple[tuple[str, str], ...]


@attrs.frozen
class Checkpoint:
    """One entry of a job's history (`value` is the decoded JSON)."""

    position: int
    kind: str
    name: str
    value: Any


@attrs.frozen
class WrittenCheckpoint:
    """A checkpoint write that held its fence; `value` is what is stored at that position."""

    job_id: int
    position: int
    value: Any


@attrs.frozen
class EventWaitOutcome:
    state: str  # "received", "timeout", "waiting" (suspended), "lost" (lease lost)
    payload: Any
    deadline: datetime.datetime


@attrs.frozen
class SpawnOutcome:
    child_id: int | None  # None: refused (the parent's lease is lost, or it is cancelling)
    created: bool
    cancelling: bool = False  # refused because the parent's cancel was requested


@attrs.frozen
class ChildOutcome:
    id: int
    state: str | None  # None: no such job
    result: Any
    error: Any


@attrs.frozen
class ChildrenWaitOutcome:
    # "done", "failed" (stop_on_failure), "waiting" (suspended), "changed" (a child finished
    # while deciding: ask again), "unknown" (an id is not a child of this job), "lost"
    state: str
    children: tuple[ChildOutcome, ...] = ()


@attrs.frozen
class SendOutcome:
    state: str | None  # the job's state as seen (None: no such job)
    message_id: int | None  # None: not sent (unknown or final job)


@attrs.frozen
class ReceiveOutcome:
    state: str  # "received", "timeout" (nothing came), "waiting" (suspended), "lost"
    messages: tuple[Any, ...]
    deadline: datetime.datetime


class WorkflowStatements(Protocol):
    """The statements behind a workflow's `ctx`, part of `Driver`."""

    async def checkpoint_insert_many(
        self, writes: Sequence[CheckpointWrite]
    ) -> list[WrittenCheckpoint]: ...

    async def job_wait_event(self, params: WaitEvent) -> EventWaitOutcome: ...

    async def job_spawn_many(self, spawns: Sequence[Spawn]) -> list[SpawnOutcome]: ...

    async def job_wait_children(self, params: WaitChildren) -> ChildrenWaitOutcome: ...

    async def job_cancel_children(self, params: CancelChildren) -> bool: ...

    async def message_send(self, params: MessageSend) -> SendOutcome: ...

    async def job_receive(self, params: Receive) -> ReceiveOutcome: ...

    async def job_value_set_many(self, params: ValueSet) -> bool: ...

    async def job_value_get(self, job_id: int, key: str) -> ValueRead: ...

    async def job_values(self, job_id: int) -> list[WorkflowValue]: ...

    async def job_continue_as_new(self, params: ContinueAsNew) -> str:
        """ "continued" (history gone, the job ready again with the new payload), "cancelling"
        (its cancel was requested: nothing changed) or "lost" (the lease no longer holds)."""
        ...
