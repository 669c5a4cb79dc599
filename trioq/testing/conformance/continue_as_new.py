"""Conformance checks of continue-as-new and of cancellation policies (registered in `CHECKS`).

Both drivers must agree on: `job_continue_as_new` is fenced, deletes the history, replaces the
payload, restores the attempts budget and makes the job ready again (same id), detaching its
children from their positions; a job whose cancel was requested does not continue.
`job_cancel_with` follows each child's `on_parent_cancel` policy (cancel, abandon, wait), and
with `tree` cancels every descendant; a cancelled sleeping or waiting workflow is woken,
flagged, so that its handler runs its cleanup.
"""

from __future__ import annotations

import datetime
import json

from ..._seam.admin import CancelJob
from ..._seam.driver import Driver, Settlement
from ..._seam.workflow import CheckpointWrite, ContinueAsNew, Spawn
from .harness import (
    DriverClock,
    claim,
    complete,
    conformance_check,
    expect,
    fail,
    new_job,
    record,
    settle,
)
from .waits import running

FAR = datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC)


@conformance_check
async def check_continue_as_new_starts_the_same_job_afresh(
    driver: Driver, clock: DriverClock
) -> None:
    lease = await running(driver)
    await driver.checkpoint_insert_many([CheckpointWrite(lease, 0, "step", "a", "1")])
    child = (await driver.job_spawn_many([Spawn(lease, 1, new_job(5))]))[0]
    [claimed_child] = await claim(driver, 1)
    await complete(driver, claimed_child.lease)
    state = await driver.job_continue_as_new(ContinueAsNew(lease, json.dumps({"n": 2})))
    expect(state, "continued", "continue_as_new")
    again = await driver.job_continue_as_new(ContinueAsNew(lease, json.dumps({"n": 3})))
    expect(again, "lost", "the old lease no longer holds")
    expect(await driver.checkpoint_list(lease.id), [], "history after continue_as_new")
    [job] = await claim(driver, 1)
    expect((job.id, job.attempt, job.payload, job.history), (lease.id, 1, {"n": 2}, ()), "job")
    assert child.child_id is not None
    replayed = (await driver.job_spawn_many([Spawn(job.lease, 1, new_job(6))]))[0]
    expect(replayed.created, True, "a spawn at a reused position makes a new child")


@conformance_check
async def check_a_job_being_cancelled_does_not_continue(driver: Driver, clock: DriverClock) -> None:
    lease = await running(driver)
    await driver.job_cancel(lease.id)
    state = await driver.job_continue_as_new(ContinueAsNew(lease, json.dumps({"n": 2})))
    expect(state, "cancelling", "continue_as_new of a job being cancelled")
    expect((await record(driver, lease.id)).payload, {"n": 0}, "the payload is unchanged")


@conformance_check
async def check_cancel_follows_each_childs_policy_unless_the_whole_tree_is_asked(
    driver: Driver, clock: DriverClock
) -> None:
    ids: dict[str, int] = {}
    for root_tree in (False, True):
        parent = await running(driver, 100 if root_tree else 0)
        for position, policy in enumerate(("cancel", "abandon", "wait")):
            spawned = await driver.job_spawn_many(
                [Spawn(parent, position, new_job(position + 1), on_parent_cancel=policy)]
            )
            assert spawned[0].child_id is not None
            ids[policy] = spawned[0].child_id
        outcome = await driver.job_cancel_with(CancelJob(parent.id, tree=root_tree))
        states = {policy: (await record(driver, i)).state for policy, i in ids.items()}
        if root_tree:
            expect(states, dict.fromkeys(ids, "cancelled"), "tree=True: every child")
            expect(outcome and outcome.state, "running", "the parent, flagged")
            continue
        expect(
            states,
            {"cancel": "cancelled", "abandon": "ready", "wait": "ready"},
            "children by policy",
        )
        expect(outcome and outcome.state, "running", "the parent, flagged")
        wait_child = await record(driver, ids["wait"])
        expect(wait_child.state, "ready", "a 'wait' child is not flagged")
        await complete(driver, parent)  # its worker records the parent (the runtime waits first)
        for job in await claim(driver, 10):
            await complete(driver, job.lease)


@conformance_check
async def check_cancelling_a_sleeping_workflow_wakes_it_flagged_for_its_cleanup(
    driver: Driver, clock: DriverClock
) -> None:
    lease = await running(driver)
    await driver.checkpoint_insert_many([CheckpointWrite(lease, 0, "step", "a", "1")])
    await settle(driver, Settlement(lease, "sleep", wake_at=FAR))
    expect((await record(driver, lease.id)).state, "sleeping", "before the cancel")
    outcome = await driver.job_cancel(lease.id)
    expect(outcome and (outcome.previous_state, outcome.state), ("sleeping", "ready"), "cancel")
    [job] = await claim(driver, 1)
    expect((job.id, job.cancel_requested, len(job.history)), (lease.id, True, 1), "claimed")
    await fail(driver, job.lease, None, final_state="cancelled")
    expect((await record(driver, lease.id)).state, "cancelled", "after its cleanup")
