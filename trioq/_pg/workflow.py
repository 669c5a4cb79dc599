"""The workflow primitives' statements on PostgreSQL: checkpoints (group-committed by the
runtime), durable waits, spawns, messages and values, continue-as-new; each fenced by a lease.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from .._core.channels import control_channel
from .._core.codec import Undecodable
from .._seam.driver import (
    MessageSend,
    ValueRead,
    WorkflowValue,
)
from .._seam.workflow import (
    CancelChildren,
    CheckpointWrite,
    ChildOutcome,
    ChildrenWaitOutcome,
    ContinueAsNew,
    EventWaitOutcome,
    Receive,
    ReceiveOutcome,
    SendOutcome,
    Spawn,
    SpawnOutcome,
    ValueSet,
    WaitChildren,
    WaitEvent,
    WrittenCheckpoint,
)
from .inserts import insert_params
from .inserts import quoted as _quoted
from .replies import (
    CheckpointWritten,
    ChildrenCancelled,
    ChildrenWait,
    ContinuedAsNew,
    EventWait,
    MessageSent,
    Received,
    Spawned,
    ValuesSet,
)
from .statements import (
    QUOTED_NULL,
    Params,
    PgStatements,
    array_element,
    lease_arrays,
    lease_params,
    quoted_kind,
    quoted_name,
    results_element,
)


def checkpoint_params(writes: Sequence[CheckpointWrite]) -> Params:
    """The parameters of checkpoint_insert_many(_plain): one array literal per column, as the
    settlements' are. psycopg's list dumper took 120-280 us per batch of 25 writes here (five
    lists, element by element in Python), paid between two steps of every workflow in the
    batch; these joins take 23 us."""
    return {
        **lease_arrays([write.lease for write in writes]),
        "positions": "{" + ",".join([str(write.position) for write in writes]) + "}",
        "kinds": "{" + ",".join([quoted_kind(write.kind) for write in writes]) + "}",
        "names": "{" + ",".join([quoted_name(write.name) for write in writes]) + "}",
        "values": "{"
        + ",".join(
            [
                QUOTED_NULL if (v := write.value_json) == "null" else results_element(v)
                for write in writes
            ]
        )
        + "}",
        "wake_ins": "{"
        + ",".join(
            [
                "NULL" if (w := write.wake_in_seconds) is None else array_element(w)
                for write in writes
            ]
        )
        + "}",
    }


def _value_arrays(writes: Sequence[CheckpointWrite]) -> Params:
    """The values carried by a batch of checkpoint writes, as three parallel arrays."""
    carried = [(write.lease.id, key, value) for write in writes for key, value in write.values]
    return {  # array literals, as checkpoint_params' (cast to bigint[], text[], text[])
        "value_ids": "{" + ",".join([str(job_id) for job_id, _, _ in carried]) + "}",
        "value_keys": "{" + ",".join([_quoted(key) for _, key, _ in carried]) + "}",
        "value_values": "{" + ",".join([_quoted(value) for _, _, value in carried]) + "}",
    }


class PgWorkflowStatements(PgStatements):
    """`seam.workflow.WorkflowStatements` on PostgreSQL, part of `PgDriver`."""

    __slots__ = ()

    async def checkpoint_insert_many(
        self, writes: Sequence[CheckpointWrite]
    ) -> list[WrittenCheckpoint]:
        """Retried on a lost connection: a repeated write finds its position taken and its
        fence still held, so it reports the write without storing it twice."""
        params = checkpoint_params(writes)
        if any(write.values for write in writes):
            rows = await self._retrying(
                "checkpoint_insert_many", {**params, **_value_arrays(writes)}
            )
        else:  # a plain workflow's batch: no ctx.set_value to carry
            rows = await self._retrying("checkpoint_insert_many_plain", params)
        return [
            WrittenCheckpoint(
                job_id=row[CheckpointWritten.id],
                position=row[CheckpointWritten.position],
                value=row[CheckpointWritten.value],
            )
            for row in rows
        ]

    async def job_wait_event(self, params: WaitEvent) -> EventWaitOutcome:
        """Retried: if the lost reply had suspended the job, the retry finds the lease gone
        ("lost"), which ends the execution exactly as the suspension would."""
        rows = await self._retrying(
            "job_wait_event",
            {
                **lease_params(params.lease),
                "position": params.position,
                "key": params.key,
                "timeout_seconds": params.timeout_seconds,
                "deadline": params.deadline,
            },
        )
        row = rows[0]
        return EventWaitOutcome(
            row[EventWait.state] if row[EventWait.owned] else "lost",
            row[EventWait.payload],
            row[EventWait.deadline],
        )

    async def job_spawn_many(self, spawns: Sequence[Spawn]) -> list[SpawnOutcome]:
        """Retried: the (parent, position) key returns the child a lost reply had inserted."""
        children = [spawn.child for spawn in spawns]
        rows = await self._retrying(
            "job_spawn_many",
            {
                **lease_arrays([spawn.lease for spawn in spawns]),
                "positions": [spawn.position for spawn in spawns],
                "on_parent_cancels": [spawn.on_parent_cancel for spawn in spawns],
                **insert_params(children),
            },
        )
        outcome = Spawned.child_id  # a SpawnOutcome from here on
        return [SpawnOutcome(*row[outcome:]) for row in rows]

    async def job_wait_children(self, params: WaitChildren) -> ChildrenWaitOutcome:
        rows = await self._retrying(
            "job_wait_children",
            {
                **lease_params(params.lease),
                "position": params.position,
                "child_ids": list(params.child_ids),
                "stop_on_failure": params.stop_on_failure,
                "record": params.record,
                "kind": params.kind,
                "name": params.name,
            },
        )
        child = ChildrenWait.id  # a ChildOutcome from here on
        children = tuple(ChildOutcome(*row[child:]) for row in rows if row[child] is not None)
        return ChildrenWaitOutcome(rows[0][ChildrenWait.outcome], children)

    async def job_cancel_children(self, params: CancelChildren) -> bool:
        rows = await self._retrying(
            "job_cancel_children",
            {
                **lease_params(params.lease),
                "position": params.position,
                "kind": params.kind,
                "name": params.name,
                "value": params.value_json,
                "child_ids": list(params.child_ids),
                "control_channel": control_channel(self.schema),
            },
        )
        return bool(rows[0][ChildrenCancelled.owned])

    async def message_send(self, params: MessageSend) -> SendOutcome:
        """Not retried on a lost connection: a send is not idempotent (a retry after a lost
        reply would queue the message twice), so the caller sees the error."""
        values = {"id": params.job_id, "topic": params.topic, "payload": params.payload_json}
        try:
            rows = await self._fetch("message_send", values)
        except (psycopg.errors.RaiseException, psycopg.errors.NoDataFound):
            # The job became final (or was deleted) between the statement's unlocked read and
            # the function's lock: read again, which now names its state.
            rows = await self._fetch("message_send", values)
        return SendOutcome(rows[0][MessageSent.state], rows[0][MessageSent.message_id])

    async def job_receive(self, params: Receive) -> ReceiveOutcome:
        """Retried: a repeated receive of a recorded position returns what it recorded, and
        one whose lost reply had suspended the job finds the lease gone ("lost")."""
        rows = await self._retrying(
            "job_receive",
            {
                **lease_params(params.lease),
                "position": params.position,
                "topic": params.topic,
                "timeout_seconds": params.timeout_seconds,
                "deadline": params.deadline,
                "limit": params.limit,
                "value_keys": [key for key, _ in params.values],
                "value_values": [value for _, value in params.values],
            },
        )
        row = rows[0]
        messages = row[Received.messages] or ()
        # The messages arrive as one JSON array: one message too deep to decode makes the
        # whole array undecodable, which the receive raises as that job's PayloadError.
        received = (messages,) if type(messages) is Undecodable else tuple(messages)
        return ReceiveOutcome(row[Received.state], received, row[Received.deadline])

    async def job_value_set_many(self, params: ValueSet) -> bool:
        """Retried: writing the same values again changes nothing."""
        rows = await self._retrying(
            "job_value_set_many",
            {
                **lease_params(params.lease),
                "keys": [key for key, _ in params.values],
                "values": [value for _, value in params.values],
            },
        )
        return bool(rows[0][ValuesSet.owned])

    async def job_value_get(self, job_id: int, key: str) -> ValueRead:
        rows = await self._retrying("job_value_get", {"id": job_id, "key": key})
        return ValueRead(*rows[0])

    async def job_values(self, job_id: int) -> list[WorkflowValue]:
        rows = await self._retrying("job_values", {"id": job_id})
        return [WorkflowValue(*row) for row in rows]

    async def job_continue_as_new(self, params: ContinueAsNew) -> str:
        """Retried: if a lost reply had continued the job, the retry finds the lease gone
        ("lost"), which ends the execution as the continuation would."""
        rows = await self._retrying(
            "job_continue_as_new",
            {**lease_params(params.lease), "payload": params.payload_json},
        )
        return str(rows[0][ContinuedAsNew.outcome])
