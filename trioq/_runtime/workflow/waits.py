"""Durable waits: events and child jobs, the primitives behind `ctx.wait_for_event`,
`ctx.emit_event`, `ctx.spawn`, `ctx.wait_result` and `ctx.gather` (docs/workflows.md).

Each follows the run's primitive protocol (`Run.replay`: position, kind and name checked
against history). Unlike a sleep, a wait is decided AND suspended by one fenced statement of
its own (`job_wait_event`, `job_wait_children`): the decision "already emitted / already final
-> go on, else -> waiting" must be taken under the lock the waking side takes too (see "Lock
order" in docs/workflows.md), so it cannot wait for the claim round. When that statement
suspended the job, the execution ends with `Run.suspended_in_place` and the settle statement
writes nothing for it.

Checkpoint kinds and values written here:
  event   {"deadline": t} while waiting, then {"payload": p} or {"timeout": true}
  emit    {"first": bool}                      (ctx.emit_event, a step)
  spawn   {"child_id": id}
  child   {"children": [[id, state, result, error]]}                (wait_result)
  gather  {"children": [...]} or {"failed": [id, state, error]}     (fail-fast decision)
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any, NoReturn

import trio

from ..._core import codec
from ..._core.errors import EventTimeout, JobFailed, UnknownTask
from ..._core.identifiers import validate_key
from ..._core.states import TERMINAL_STATES, JobState
from ..._seam.driver import EmitEvent, NewJob
from ..._seam.workflow import (
    CancelChildren,
    Checkpoint,
    ChildOutcome,
    ChildrenWaitOutcome,
    ContinueAsNew,
    Spawn,
    WaitChildren,
    WaitEvent,
)
from ..job.run import LeaseLost, Run, SuspendExecution
from .messages import flush_values
from .spawner import spawner_for

EVENT = "event"
EMIT = "emit"
SPAWN = "spawn"
CHILD = "child"
GATHER = "gather"
FINAL = TERMINAL_STATES

# A wait that keeps meeting children that finish while it decides gives up after this many
# fresh snapshots (each retry means a child finished, so this is never reached in practice).
MAX_DECISION_ROUNDS = 100


# --- events ---------------------------------------------------------------------------------


async def wait_for_event(run: Run, key: str, timeout: datetime.timedelta) -> Any:  # noqa: ASYNC109
    check_event_wait(key, timeout)
    position, entry = run.replay(EVENT, key)
    return await wait_event_at(run, position, entry, key, timeout)


def check_event_wait(key: str, timeout: datetime.timedelta) -> None:
    _check_key("wait_for_event", key)
    if not isinstance(timeout, datetime.timedelta) or timeout.total_seconds() < 0:
        raise ValueError(f"wait_for_event {key!r}: timeout must be a non-negative timedelta")


async def wait_event_at(
    run: Run,
    position: int,
    entry: Checkpoint | None,
    key: str,
    timeout: datetime.timedelta,  # noqa: ASYNC109
) -> Any:
    """The event wait at `position` (its replayed checkpoint `entry`, or None)."""
    deadline = None
    if entry is not None:
        value = entry.value
        if "payload" in value:
            return value["payload"]
        if value.get("timeout"):
            raise EventTimeout(key)
        deadline = datetime.datetime.fromisoformat(value["deadline"])
    # A cancelled run (woken to clean up) does not wait again: its statement would suspend it.
    await trio.lowlevel.checkpoint_if_cancelled()
    if run.pending_values:  # this statement may suspend: ctx.set_value's values go first
        await flush_values(run)
    with run.ending_statement():  # an event emitted as it commits can make the job ready
        outcome = await run.driver.job_wait_event(
            WaitEvent(run.lease, position, key, timeout.total_seconds(), deadline)
        )
    if outcome.state == "received":
        if type(outcome.payload) is codec.Undecodable:  # stored by SQL, past every check
            raise outcome.payload.error(f"event {key!r}")
        return outcome.payload
    if outcome.state == "timeout":
        raise EventTimeout(key)
    if outcome.state == "waiting":
        run.suspended_in_place(outcome.deadline)
    _lost(run, f"wait_for_event {key!r}")


async def emit_event(run: Run, key: str, payload: Any) -> None:
    _check_key("emit_event", key)
    payload_json = codec.encode(payload, root=f"event {key!r}")
    position, entry = run.replay(EMIT, key)
    if entry is not None:
        return
    # Emit, then checkpoint: a crash in between emits again on replay, which changes nothing
    # (the first emit of a key wins).
    outcome = await run.driver.event_emit(EmitEvent(key, payload_json))
    await run.record(position, EMIT, key, json.dumps({"first": outcome.first}))


# --- children -------------------------------------------------------------------------------


async def spawn(run: Run, task: Any, payload: Any, options: dict[str, Any]) -> int:
    name, child, policy = prepare_spawn(run, task, payload, options)
    position, entry = run.replay(SPAWN, name)
    return await spawn_at(run, position, entry, name, child, policy)


ON_PARENT_CANCEL = ("cancel", "abandon", "wait")


def prepare_spawn(
    run: Run, task: Any, payload: Any, options: dict[str, Any]
) -> tuple[str, NewJob, str]:
    """Validate a child as `client.enqueue` would: (its task name, the row to insert, its
    on_parent_cancel policy)."""
    from ..._enqueue.rows import EnqueueOptions, TaskDeclaration, build_jobs  # the same validation

    options = dict(options)
    policy = options.pop("on_parent_cancel", "cancel")
    if policy not in ON_PARENT_CANCEL:
        raise ValueError(f"on_parent_cancel: {policy!r} is not one of 'cancel', 'abandon', 'wait'")

    if isinstance(task, TaskDeclaration):
        task = task.name
    spec = run.tasks.get(task)
    if spec is None:
        raise UnknownTask(f"spawn: task {task!r} is not registered with this app")
    if options.get("dedup_key") is not None:
        raise ValueError("dedup_key: a child is already enqueued once per parent position")
    [child] = build_jobs(spec, [payload], EnqueueOptions(**options), single=True)
    if child.partition_key is not None and (
        (child.queue, child.partition_key) == (run.job.queue, run.job.partition_key)
    ):
        raise ValueError(
            "partition_key: a child cannot share its parent's partition key (the parent "
            "holds it until it is final, so the child could never start)"
        )
    return task, child, policy


async def spawn_at(
    run: Run,
    position: int,
    entry: Checkpoint | None,
    task: str,
    child: NewJob,
    policy: str = "cancel",
) -> int:
    """The spawn at `position` (its replayed checkpoint `entry`, or None)."""
    if entry is not None:
        return _spawned(run, int(entry.value["child_id"]), policy)
    outcome = await spawner_for(run.driver).spawn(Spawn(run.lease, position, child, policy))
    if outcome.child_id is not None:
        return _spawned(run, outcome.child_id, policy)
    if outcome.cancelling:
        run.cancel("cancelled")  # the cancel notification is on its way: act on it now
        raise LeaseLost("spawn refused: this job is being cancelled")
    _lost(run, f"spawn {task!r}")


def _spawned(run: Run, child_id: int, policy: str) -> int:
    run.unfinished_children.append(child_id)
    if policy != "abandon":
        run.kept_children.append(child_id)
    return child_id


async def join_kept_children(run: Run) -> None:
    """A cancelled run waits (durably) for its children that the cancel does not set loose
    before its cancellation is recorded: "wait" children finish their work, "cancel" ones
    unwind from their own cancellation (a cleanup may take a while); only "abandon" children
    may outlive it. A parent is never final before those children."""
    ids = tuple(dict.fromkeys(run.kept_children))
    await _wait(run, 0, ids, kind="join", name="", record=False)
    run.kept_children.clear()


async def wait_result(run: Run, child_id: int) -> Any:
    _check_ids("wait_result", (child_id,))
    position, entry = run.replay(CHILD, str(child_id))
    if entry is not None:
        [child] = _stored_children(entry.value)
    else:
        [child] = await _wait(run, position, (child_id,), kind=CHILD, name=str(child_id))
    _finished(run, (child_id,))
    if child.state != JobState.COMPLETED:
        raise _failure(child)
    return child.result


async def gather(run: Run, child_ids: Sequence[int]) -> list[Any]:
    """Wait for every child; on the first failure cancel the unfinished siblings, wait until
    they are final, and raise that failure (trio nursery semantics, the same on replay)."""
    ids = tuple(child_ids)
    _check_ids("gather", ids)
    if not ids:
        return []
    name = ",".join(map(str, ids))
    position, entry = run.replay(GATHER, name)
    value = None if entry is None else entry.value
    try:
        return await _gather(run, position, ids, name, value)
    finally:
        _finished(run, ids)  # every exit of gather leaves its children final


async def _gather(
    run: Run, position: int, ids: tuple[int, ...], name: str, value: Any
) -> list[Any]:
    if value is None:
        children = await _wait(run, position, ids, kind=GATHER, name=name, stop_on_failure=True)
        failed = [
            child for child in children if child.state in (JobState.FAILED, JobState.CANCELLED)
        ]
        if not failed:
            return [child.result for child in children]
        if all(child.state in FINAL for child in children):
            raise _failure(failed[0])  # all final at once: recorded as the checkpoint
        first = failed[0]
        decision = {"failed": [first.id, first.state, first.error]}
        accepted = await run.driver.job_cancel_children(
            CancelChildren(run.lease, position, GATHER, name, json.dumps(decision), ids)
        )
        if not accepted:
            _lost(run, "gather")
        value = decision
    if "children" in value:
        stored = _stored_children(value)
        failed = [child for child in stored if child.state != JobState.COMPLETED]
        if failed:
            raise _failure(failed[0])
        return [child.result for child in stored]
    failed_id, failed_state, failed_error = value["failed"]
    await _wait(run, position, ids, kind=GATHER, name=name, record=False)
    raise _failure(ChildOutcome(failed_id, failed_state, None, failed_error))


async def join_children(run: Run) -> None:
    """Wait (durably) until every child this job spawned and did not await is final."""
    if run.unfinished_children:
        ids = tuple(dict.fromkeys(run.unfinished_children))
        await _wait(run, 0, ids, kind="join", name="", record=False)
        run.unfinished_children.clear()
        run.kept_children.clear()


async def continue_as_new(run: Run, payload: Any) -> NoReturn:
    """End the history and start the workflow again, same job id, with `payload`."""
    payload_json = codec.encode(payload, root="continue_as_new payload")
    run.spec.load_payload(json.loads(payload_json))  # a payload the handler cannot take fails here
    if run.suspension is not None:
        raise SuspendExecution
    await join_children(run)  # the nursery rule: no child outlives the history that spawned it
    with run.ending_statement():
        state = await run.driver.job_continue_as_new(ContinueAsNew(run.lease, payload_json))
    if state == "continued":
        run.continued()
    if state == "cancelling":
        run.cancel("cancelled")
        raise LeaseLost("continue_as_new refused: this job is being cancelled")
    _lost(run, "continue_as_new")


def _finished(run: Run, ids: Sequence[int]) -> None:
    done = set(ids)
    run.unfinished_children[:] = [i for i in run.unfinished_children if i not in done]
    if run.kept_children:
        run.kept_children[:] = [i for i in run.kept_children if i not in done]


async def _wait(
    run: Run,
    position: int,
    ids: tuple[int, ...],
    *,
    kind: str,
    name: str,
    stop_on_failure: bool = False,
    record: bool = True,
) -> tuple[ChildOutcome, ...]:
    params = WaitChildren(run.lease, position, ids, stop_on_failure, record, kind, name)
    await trio.lowlevel.checkpoint_if_cancelled()  # as for events (a shielded join goes on)
    if run.pending_values:  # this statement may suspend: ctx.set_value's values go first
        await flush_values(run)
    for _ in range(MAX_DECISION_ROUNDS):
        with run.ending_statement():  # a child finishing as it commits wakes the job
            outcome: ChildrenWaitOutcome = await run.driver.job_wait_children(params)
        if outcome.state in ("done", "failed"):
            return outcome.children
        if outcome.state == "waiting":
            run.suspended_in_place(None)
        if outcome.state == "unknown":
            raise ValueError(f"{kind}: job ids {list(ids)} must all be children of this job")
        if outcome.state == "lost":
            _lost(run, kind)
        # "changed": a child finished while we decided; decide again on a fresh snapshot
    raise RuntimeError(f"{kind}: children kept finishing during {MAX_DECISION_ROUNDS} decisions")


def _stored_children(value: Any) -> list[ChildOutcome]:
    return [ChildOutcome(*item) for item in value["children"]]


def _failure(child: ChildOutcome) -> JobFailed:
    return JobFailed(f"child job {child.id} ended {child.state}: {child.error}", child)


def _check_key(primitive: str, key: Any) -> None:
    if key is None:
        raise ValueError(f"{primitive}: the event key must be a non-empty string, not None")
    validate_key(f"{primitive} key", key)


def _check_ids(primitive: str, ids: Sequence[Any]) -> None:
    for child_id in ids:
        if isinstance(child_id, bool) or not isinstance(child_id, int) or child_id < 1:
            raise TypeError(f"{primitive}: {child_id!r} is not a job id (use spawn's result)")


def _lost(run: Run, what: str) -> NoReturn:
    run.cancel("lost")
    raise LeaseLost(f"{what}: this attempt no longer owns the job")
