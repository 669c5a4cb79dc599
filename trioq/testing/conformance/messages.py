"""Conformance checks of messages and workflow values (registered in the same `CHECKS`).

Both drivers must agree on: a send to an unknown or final job is refused, naming its state;
queued messages are received in send order, once, as the receive's checkpoint; a repeated
receive of a recorded position returns the same messages and takes no more; a receive with
nothing queued suspends (waiting, lease dropped, attempt restored) and the first send of its
topic wakes it and becomes its checkpoint, later sends (queued) and other topics do not; a
receive past its deadline records the timeout; a job a cancel took out of a receive (waiting
for its children, or for an event in its cleanup) is not woken by that topic's send; values
ride on checkpoint writes and on their own fenced write, the newest per key wins, and stay
readable after the job ends; the workflow list says what each job waits on.
"""

from __future__ import annotations

import json

from ..._seam.admin import WorkflowFilter
from ..._seam.driver import Driver, MessageSend
from ..._seam.lease import Lease
from ..._seam.workflow import CheckpointWrite, Receive, Spawn, ValueSet, WaitEvent
from .harness import (
    DriverClock,
    claim,
    claim_due,
    complete,
    conformance_check,
    enqueue,
    expect,
    new_job,
    record,
)

HOUR = 3600.0


async def _running(driver: Driver, n: int = 0) -> Lease:
    await enqueue(driver, new_job(n))
    [job] = await claim(driver, 1)
    return job.lease


async def _send(driver: Driver, job_id: int, topic: str, payload: object) -> int | None:
    return (await driver.message_send(MessageSend(job_id, topic, json.dumps(payload)))).message_id


@conformance_check
async def check_send_to_an_unknown_or_final_job_is_refused_naming_its_state(
    driver: Driver, clock: DriverClock
) -> None:
    outcome = await driver.message_send(MessageSend(10**12, "t", "1"))
    expect((outcome.state, outcome.message_id), (None, None), "unknown job")
    lease = await _running(driver)
    expect(await complete(driver, lease), (lease.id,), "completed")
    outcome = await driver.message_send(MessageSend(lease.id, "t", "1"))
    expect((outcome.state, outcome.message_id), ("completed", None), "final job")
    [ready] = await enqueue(driver, new_job(1))
    outcome = await driver.message_send(MessageSend(ready, "t", "1"))
    expect(outcome.state, "ready", "a job not started yet takes messages")
    expect(outcome.message_id is not None, True, "queued")


@conformance_check
async def check_queued_messages_are_received_once_in_send_order(
    driver: Driver, clock: DriverClock
) -> None:
    lease = await _running(driver)
    for n in range(3):
        await _send(driver, lease.id, "a", n)
    await _send(driver, lease.id, "b", "other topic")
    first = await driver.job_receive(Receive(lease, 0, "a", HOUR, limit=2))
    expect((first.state, first.messages), ("received", (0, 1)), "the oldest two")
    again = await driver.job_receive(Receive(lease, 0, "a", HOUR, limit=2))
    expect((again.state, again.messages), ("received", (0, 1)), "a repeated receive")
    second = await driver.job_receive(Receive(lease, 1, "a", HOUR))
    expect(second.messages, (2,), "the rest")
    other = await driver.job_receive(Receive(lease, 2, "b", HOUR))
    expect(other.messages, ("other topic",), "the other topic")
    history = await driver.checkpoint_list(lease.id)
    expect(
        [(c.position, c.kind, c.name, c.value) for c in history],
        [
            (0, "receive", "a", {"messages": [0, 1]}),
            (1, "receive", "a", {"messages": [2]}),
            (2, "receive", "b", {"messages": ["other topic"]}),
        ],
        "the receives are checkpoints",
    )
    expect((await record(driver, lease.id)).state, "running", "never suspended")


@conformance_check
async def check_receive_suspends_and_the_first_send_of_its_topic_wakes_it(
    driver: Driver, clock: DriverClock
) -> None:
    lease = await _running(driver)
    waited = await driver.job_receive(Receive(lease, 0, "go", HOUR))
    expect(waited.state, "waiting", "nothing queued: the receive suspends")
    row = await record(driver, lease.id)
    expect((row.state, row.attempt), ("waiting", lease.attempt - 1), "suspended, no attempt")
    lost = await driver.job_receive(Receive(lease, 0, "go", HOUR))
    expect(lost.state, "lost", "the suspended attempt no longer owns the job")
    await _send(driver, lease.id, "other", 0)
    expect(await claim(driver), [], "another topic does not wake it")
    for n in range(3):
        await _send(driver, lease.id, "go", n)
    [woken] = await claim(driver)
    expect(woken.id, lease.id, "the first send woke it")
    history = [(c.position, c.kind, c.name, c.value) for c in woken.history]
    expect(history, [(0, "receive", "go", {"messages": [0]})], "the waking send is the checkpoint")
    again = await driver.job_receive(Receive(woken.lease, 0, "go", HOUR, waited.deadline))
    expect((again.state, again.messages), ("received", (0,)), "a repeat takes nothing more")
    got = await driver.job_receive(Receive(woken.lease, 1, "go", HOUR))
    expect((got.state, got.messages), ("received", (1, 2)), "the rest of the burst in one receive")
    row = await record(driver, lease.id)
    expect(row.state, "running", "the next receive did not suspend")


@conformance_check
async def check_receive_past_its_deadline_records_the_timeout(
    driver: Driver, clock: DriverClock
) -> None:
    lease = await _running(driver)
    waited = await driver.job_receive(Receive(lease, 0, "go", 60.0))
    expect(waited.state, "waiting", "suspended until the deadline")
    await clock.advance(61)
    [woken] = await claim_due(driver)
    expect(woken.id, lease.id, "woken by its deadline")
    late = await driver.job_receive(Receive(woken.lease, 0, "go", 60.0, waited.deadline))
    expect((late.state, late.messages), ("timeout", ()), "nothing came")
    await _send(driver, lease.id, "go", "late")
    replay = await driver.job_receive(Receive(woken.lease, 0, "go", 60.0, waited.deadline))
    expect((replay.state, replay.messages), ("received", ()), "the timeout is recorded")
    immediate = await driver.job_receive(Receive(woken.lease, 1, "go", 0.0))
    expect(immediate.messages, ("late",), "a later receive takes the late message")


@conformance_check
async def check_values_ride_on_writes_newest_wins_and_outlive_the_job(
    driver: Driver, clock: DriverClock
) -> None:
    lease = await _running(driver)
    read = await driver.job_value_get(lease.id, "stage")
    expect((read.state, read.found), ("running", False), "not set yet")
    write = CheckpointWrite(lease, 0, "step", "s", "1", values=(("stage", '"one"'),))
    await driver.checkpoint_insert_many([write])
    expect((await driver.job_value_get(lease.id, "stage")).value, "one", "with the checkpoint")
    values = (("stage", '"two"'), ("pct", "50"))
    await driver.job_receive(Receive(lease, 1, "t", 0.0, values=values))
    expect((await driver.job_value_get(lease.id, "pct")).value, 50, "with the receive")
    written = await driver.job_value_set_many(ValueSet(lease, (("stage", '"three"'),)))
    expect(written, True, "a fenced write of its own")
    expect(await complete(driver, lease), (lease.id,), "completed")
    stale = await driver.job_value_set_many(ValueSet(lease, (("stage", '"stale"'),)))
    expect(stale, False, "fenced: the job is no longer running")
    read = await driver.job_value_get(lease.id, "stage")
    expect((read.state, read.found, read.value), ("completed", True, "three"), "after the end")
    listed = [(v.key, v.value) for v in await driver.job_values(lease.id)]
    expect(listed, [("pct", 50), ("stage", "three")], "every value, by key")
    unknown = await driver.job_value_get(10**12, "stage")
    expect((unknown.state, unknown.found), (None, False), "unknown job")


@conformance_check
async def check_workflow_list_says_what_each_job_waits_on(
    driver: Driver, clock: DriverClock
) -> None:
    on_topic, on_event, plain = [await _running(driver, n) for n in range(3)]
    await driver.job_receive(Receive(on_topic, 0, "go", HOUR))
    await driver.job_wait_event(WaitEvent(on_event, 0, "ev", HOUR))
    listed = {w.id: w for w in await driver.workflow_list(WorkflowFilter())}
    expect(plain.id in listed, False, "a running job without history is not a workflow")
    expect((listed[on_topic.id].state, listed[on_topic.id].wait_topic), ("waiting", "go"), "topic")
    expect(listed[on_event.id].wait_event_key, "ev", "event key")
    expect(listed[on_event.id].wait_topic, None, "no topic")
    await _send(driver, on_topic.id, "go", 1)
    listed = {w.id: w for w in await driver.workflow_list(WorkflowFilter(states=("waiting",)))}
    expect(sorted(listed), [on_event.id], "the woken job is no longer waiting")
    paged = await driver.workflow_list(WorkflowFilter(before_id=on_event.id))
    expect(paged, [], "paged by id: nothing older is suspended")
    other_task = await driver.workflow_list(WorkflowFilter(tasks=("nope",)))
    expect(other_task, [], "filtered by task")


async def _receive_checkpoint(driver: Driver, job_id: int, position: int) -> object:
    history = {c.position: c.value for c in await driver.checkpoint_list(job_id)}
    return history.get(position)


@conformance_check
async def check_a_cancelled_receive_waiting_for_its_children_is_not_woken_by_a_send(
    driver: Driver, clock: DriverClock
) -> None:
    """A cancel turns a job waiting in a receive into one waiting for its 'wait' children:
    a send of the receive's topic then queues (the job waits for the children, not for it)."""
    parent = await _running(driver)
    [spawned] = await driver.job_spawn_many([Spawn(parent, 0, new_job(1), on_parent_cancel="wait")])
    waited = await driver.job_receive(Receive(parent, 1, "go", HOUR))
    expect(waited.state, "waiting", "suspended in the receive")
    outcome = await driver.job_cancel(parent.id)
    expect(outcome and outcome.state, "waiting", "now waiting for its child")
    sent = await driver.message_send(MessageSend(parent.id, "go", "1"))
    expect((sent.state, sent.message_id is not None), ("waiting", True), "queued")
    row = await record(driver, parent.id)
    expect(row.state, "waiting", "the send does not wake a job waiting for its children")
    pending = await _receive_checkpoint(driver, parent.id, 1)
    expect(isinstance(pending, dict) and sorted(pending), ["deadline"], "still pending")
    listed = {w.id: w for w in await driver.workflow_list(WorkflowFilter())}
    expect(listed[parent.id].wait_topic, None, "it waits for no topic")
    [child] = await claim(driver)
    expect(child.id, spawned.child_id, "only the child is claimable")


@conformance_check
async def check_a_receive_left_by_a_cancel_does_not_make_a_later_wait_a_receive(
    driver: Driver, clock: DriverClock
) -> None:
    """A cancel wakes a job suspended in a receive for its cleanup, which waits for an event
    instead: a send of the abandoned receive's topic queues and wakes nothing."""
    lease = await _running(driver)
    await driver.job_receive(Receive(lease, 0, "go", HOUR))
    outcome = await driver.job_cancel(lease.id)
    expect(outcome and outcome.state, "ready", "woken for its cleanup")
    [job] = await claim(driver)
    expect((job.id, job.cancel_requested), (lease.id, True), "claimed, flagged")
    waited = await driver.job_wait_event(WaitEvent(job.lease, 1, "ev", HOUR))
    expect(waited.state, "waiting", "the cleanup waits for an event")
    sent = await driver.message_send(MessageSend(lease.id, "go", "1"))
    expect((sent.state, sent.message_id is not None), ("waiting", True), "queued")
    row = await record(driver, lease.id)
    expect(row.state, "waiting", "the send does not wake the event wait")
    pending = await _receive_checkpoint(driver, lease.id, 0)
    expect(isinstance(pending, dict) and sorted(pending), ["deadline"], "not delivered")
    listed = {w.id: w for w in await driver.workflow_list(WorkflowFilter())}
    expect((listed[lease.id].wait_topic, listed[lease.id].wait_event_key), (None, "ev"), "what")
