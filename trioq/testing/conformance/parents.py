"""Conformance checks of the parent wake-up: one rule, whichever statement ends the child.

A child that becomes final tells its parent, in the statement that ended it: the settle (a
completion, a failure, a cancellation its worker records), lease recovery (a child lost with
no attempt left) and the cancel statements (a child cancelled before it ran). A parent waiting
for children is woken when none it waits for is left, or when one of them did not complete;
a completed child of two only shortens the wait. Each way of ending a child must wake the
parent exactly alike.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence

from ..._seam.admin import CancelJob
from ..._seam.driver import Driver, Settlement
from ..._seam.lease import Lease
from ..._seam.services import MaintenancePass
from ..._seam.workflow import Spawn, WaitChildren, WaitEvent
from .harness import (
    DriverClock,
    claim,
    complete,
    conformance_check,
    enqueue,
    expect,
    fail,
    new_job,
    record,
    settle,
)

HOUR = 3600.0
# A sibling the parent also waits for, which never becomes due during a check.
NEVER_DUE = datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC)
# Every way a child ends, and the state it ends in. "lost" advances the clock past every lease,
# so a check that loops over these puts it last.
ENDINGS = {
    "complete": "completed",
    "fail": "failed",
    "cancel before it ran": "cancelled",
    "cancel the whole tree": "cancelled",
    "cancel recorded by its worker": "cancelled",
    "lost": "failed",
}


async def waiting_parent(driver: Driver, *, sibling: bool) -> tuple[Lease, list[int]]:
    """A parent waiting for a ready child (one attempt) and, with `sibling`, a second child
    that is never due; returns the parent's lease and the children's ids."""
    await enqueue(driver, new_job(0))
    [parent] = await claim(driver, 1)
    spawns = [Spawn(parent.lease, 0, new_job(1, max_attempts=1))]
    if sibling:
        spawns.append(Spawn(parent.lease, 1, new_job(2, run_at=NEVER_DUE)))
    children = [outcome.child_id for outcome in await driver.job_spawn_many(spawns)]
    assert None not in children, f"spawn refused: {children}"
    child_ids = [child_id for child_id in children if child_id is not None]
    waiting = await driver.job_wait_children(
        WaitChildren(parent.lease, len(spawns), tuple(child_ids))
    )
    expect(waiting.state, "waiting", "the parent suspends")
    return parent.lease, child_ids


async def end_child(driver: Driver, clock: DriverClock, child_id: int, how: str) -> None:
    """End the ready child `child_id` the way `how` (a key of ENDINGS) says."""
    if how == "cancel before it ran":
        outcome = await driver.job_cancel(child_id)
        expect(outcome and outcome.state, "cancelled", "a child cancelled before it ran")
        return
    if how == "cancel the whole tree":
        outcome = await driver.job_cancel_with(CancelJob(child_id, tree=True))
        expect(outcome and outcome.state, "cancelled", "a child cancelled with its tree")
        return
    [child] = await claim(driver, 1)
    expect(child.id, child_id, "the claimed child")
    if how == "complete":
        await complete(driver, child.lease, result=1)
    elif how == "fail":
        await fail(driver, child.lease, None)
    elif how == "cancel recorded by its worker":
        await driver.job_cancel(child_id)
        await fail(driver, child.lease, None, final_state="cancelled")
    else:
        await clock.advance(HOUR)
        report = await driver.maintenance_pass(MaintenancePass())
        expect(report.recovered, ((child_id, "failed"),), "the lost child has no attempt left")


async def parent_after(driver: Driver, parent: Lease) -> tuple[str, int, bool]:
    """The parent's state, attempt and whether it has a due time (a waiting one has none)."""
    row = await record(driver, parent.id)
    return row.state, row.attempt, row.run_at is not None


async def run_again(driver: Driver, parent: Lease, child_ids: Sequence[int]) -> list[str | None]:
    """Claim the woken parent, read its children's states as its replay would, and complete it
    (so that the next round's claims see only its own jobs)."""
    [again] = await claim(driver, 1)
    expect(again.id, parent.id, "the woken parent runs again")
    outcome = await driver.job_wait_children(
        WaitChildren(again.lease, len(child_ids), tuple(child_ids), stop_on_failure=True)
    )
    await complete(driver, again.lease)
    return [child.state for child in outcome.children]


@conformance_check
async def check_every_end_of_a_child_wakes_a_parent_waiting_for_it_alone(
    driver: Driver, clock: DriverClock
) -> None:
    for how, final_state in ENDINGS.items():
        parent, [child_id] = await waiting_parent(driver, sibling=False)
        await end_child(driver, clock, child_id, how)
        woken = ("ready", parent.attempt - 1, True)
        expect(await parent_after(driver, parent), woken, f"the parent after: {how}")
        expect(await run_again(driver, parent, [child_id]), [final_state], f"the child: {how}")


@conformance_check
async def check_a_child_that_did_not_complete_wakes_a_parent_waiting_for_others_too(
    driver: Driver, clock: DriverClock
) -> None:
    for how, final_state in ENDINGS.items():
        parent, [child_id, sibling_id] = await waiting_parent(driver, sibling=True)
        await end_child(driver, clock, child_id, how)
        if final_state == "completed":
            still = ("waiting", parent.attempt - 1, False)
            expect(await parent_after(driver, parent), still, "one completed child of two")
            continue
        woken = ("ready", parent.attempt - 1, True)
        expect(await parent_after(driver, parent), woken, f"the parent after: {how}")
        states = await run_again(driver, parent, [child_id, sibling_id])
        expect(states, [final_state, "scheduled"], f"the children: {how}")


@conformance_check
async def check_a_child_settled_right_before_the_claim_of_its_parent(
    driver: Driver, clock: DriverClock
) -> None:
    """A child's completion is written while its parent is due (its event wait timed out);
    the next claim promotes and claims the parent: claimed once, nothing else changes it."""
    await enqueue(driver, new_job(0))
    [parent] = await claim(driver, 1)
    [spawned] = await driver.job_spawn_many([Spawn(parent.lease, 0, new_job(1))])
    [child] = await claim(driver, 1)
    expect(child.id, spawned.child_id, "the claimed child")
    waiting = await driver.job_wait_event(WaitEvent(parent.lease, 1, "approval", 10.0))
    expect(waiting.state, "waiting", "the parent waits for an event")
    await clock.advance(11)
    done = Settlement(child.lease, "complete", result_json=json.dumps(1))
    await settle(driver, done)
    claimed = await claim(driver)
    expect([job.id for job in claimed], [parent.id], "the timed-out parent, claimed at once")
    expect((await record(driver, child.id)).state, "completed", "the child")
    [again] = claimed
    outcome = await driver.job_wait_children(WaitChildren(again.lease, 2, (child.id,)))
    expect([c.state for c in outcome.children], ["completed"], "the replay sees the child")
