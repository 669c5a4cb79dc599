"""Conformance checks of events and child jobs (registered in the same `CHECKS` as the rest).

Both drivers must agree on: the first emit of a key wins; an event emitted before a wait is
received without suspending; a wait suspends (`waiting`, lease dropped, attempt restored) and
every waiter of a key is woken by its emit; spawns are exactly once per parent position and
fenced; a child's final outcome (settled, or lost by lease expiry) wakes a parent waiting for
it; gather's fail-fast cancels the unfinished siblings; cancelling a parent cancels its children.
"""

from __future__ import annotations

import datetime
import json

from ..._seam.driver import ClaimedJob, Driver, EmitEvent
from ..._seam.lease import Lease
from ..._seam.services import MaintenancePass
from ..._seam.workflow import CancelChildren, Spawn, WaitChildren, WaitEvent
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
)

HOUR = 3600.0


async def running(driver: Driver, n: int = 0) -> Lease:
    """Enqueue one job and claim it; returns its lease."""
    await enqueue(driver, new_job(n))
    [job] = await claim(driver, 1)
    return job.lease


async def emit(driver: Driver, key: str, payload: object) -> tuple[bool, int]:
    outcome = await driver.event_emit(EmitEvent(key, json.dumps(payload)))
    return outcome.first, outcome.woken


async def spawn_running_child(driver: Driver, parent: Lease, position: int, n: int) -> Lease:
    spawned = (await driver.job_spawn_many([Spawn(parent, position, new_job(n))]))[0]
    assert spawned.child_id is not None, "spawn refused"
    [child] = await claim(driver, 1)
    expect(child.id, spawned.child_id, "the claimed child")
    return child.lease


# --- events ---------------------------------------------------------------------------------


@conformance_check
async def check_event_emitted_before_the_wait_is_received_without_suspending(
    driver: Driver, clock: DriverClock
) -> None:
    expect(await emit(driver, "order:1", {"paid": True}), (True, 0), "first emit")
    expect(await emit(driver, "order:1", {"paid": False}), (False, 0), "second emit")
    lease = await running(driver)
    outcome = await driver.job_wait_event(WaitEvent(lease, 0, "order:1", HOUR))
    expect((outcome.state, outcome.payload), ("received", {"paid": True}), "the first emit wins")
    expect((await record(driver, lease.id)).state, "running", "state after receiving")


@conformance_check
async def check_event_wait_suspends_and_the_emit_wakes_every_waiter(
    driver: Driver, clock: DriverClock
) -> None:
    first, second = await running(driver, 1), await running(driver, 2)
    for lease in (first, second):
        outcome = await driver.job_wait_event(WaitEvent(lease, 3, "approval", HOUR))
        expect(outcome.state, "waiting", "the wait suspends")
        row = await record(driver, lease.id)
        expect((row.state, row.attempt), ("waiting", lease.attempt - 1), "suspended, no attempt")
    expect(await claim(driver), [], "a waiting job is not claimable")
    expect(await emit(driver, "approval", {"by": "ann"}), (True, 2), "both waiters woken")
    woken = await claim(driver)
    expect(sorted(job.id for job in woken), [first.id, second.id], "claimed after the emit")
    for job in woken:
        resolved = [(c.position, c.kind, c.value) for c in job.history]
        expect(resolved, [(3, "event", {"payload": {"by": "ann"}})], "resolved by the emit")
    for job in woken:
        outcome = await driver.job_wait_event(WaitEvent(job.lease, 3, "approval", HOUR))
        expect((outcome.state, outcome.payload), ("received", {"by": "ann"}), "same payload")


@conformance_check
async def check_event_wait_past_its_deadline_times_out(driver: Driver, clock: DriverClock) -> None:
    lease = await running(driver)
    waiting = await driver.job_wait_event(WaitEvent(lease, 0, "never", 10.0))
    expect(waiting.state, "waiting", "suspended until the deadline")
    await clock.advance(11)
    await emit(driver, "other", None)  # an unrelated emit wakes nothing
    expect((await record(driver, lease.id)).state, "waiting", "still waiting")
    [job] = await claim_after_promotion(driver, lease.id)
    outcome = await driver.job_wait_event(
        WaitEvent(job.lease, 0, "never", 10.0, deadline=waiting.deadline)
    )
    expect(outcome.state, "timeout", "a replay at the stored deadline times out")
    expect(await emit(driver, "never", 1), (True, 0), "a late emit wakes nobody")


async def claim_after_promotion(driver: Driver, job_id: int) -> list[ClaimedJob]:
    """Claim once the job's due time has passed (promotion rides the claim statement)."""
    for _ in range(3):
        claimed = [job for job in await claim(driver) if job.id == job_id]
        if claimed:
            return claimed
    raise AssertionError(f"job {job_id} was not promoted and claimed")


@conformance_check
async def check_event_wait_is_fenced(driver: Driver, clock: DriverClock) -> None:
    lease = await running(driver)
    stale = Lease(lease.id, lease.attempt + 1, lease.lease_token)
    outcome = await driver.job_wait_event(WaitEvent(stale, 0, "k", HOUR))
    expect(outcome.state, "lost", "a stale lease")
    expect((await record(driver, lease.id)).state, "running", "nothing changed")


# --- children -------------------------------------------------------------------------------


@conformance_check
async def check_spawn_is_exactly_once_per_parent_position(
    driver: Driver, clock: DriverClock
) -> None:
    parent = await running(driver)
    first = (await driver.job_spawn_many([Spawn(parent, 0, new_job(10))]))[0]
    again = (await driver.job_spawn_many([Spawn(parent, 0, new_job(10))]))[0]
    other = (await driver.job_spawn_many([Spawn(parent, 1, new_job(11))]))[0]
    expect((first.created, again.created, other.created), (True, False, True), "created")
    expect(again.child_id, first.child_id, "a replayed spawn returns the same child")
    assert first.child_id is not None and other.child_id is not None
    expect(other.child_id != first.child_id, True, "another position, another child")
    child = await record(driver, first.child_id)
    expect((child.state, child.payload), ("ready", {"n": 10}), "the child")


@conformance_check
async def check_spawns_of_several_parents_share_one_statement(
    driver: Driver, clock: DriverClock
) -> None:
    first, second = await running(driver, 1), await running(driver, 2)
    stale = Lease(second.id, second.attempt, second.lease_token.__class__(int=0))
    outcomes = await driver.job_spawn_many(
        [
            Spawn(first, 0, new_job(10)),
            Spawn(second, 0, new_job(20)),
            Spawn(first, 1, new_job(11)),
            Spawn(stale, 1, new_job(21)),
        ]
    )
    expect([o.created for o in outcomes], [True, True, True, False], "created, in order")
    expect(outcomes[3].child_id, None, "a stale lease in the batch spawns nothing")
    payloads = []
    for outcome in outcomes[:3]:
        assert outcome.child_id is not None
        payloads.append((await record(driver, outcome.child_id)).payload)
    expect(payloads, [{"n": 10}, {"n": 20}, {"n": 11}], "each child its own payload")


@conformance_check
async def check_spawn_is_fenced(driver: Driver, clock: DriverClock) -> None:
    parent = await running(driver)
    stale = Lease(parent.id, parent.attempt + 1, parent.lease_token)
    outcome = (await driver.job_spawn_many([Spawn(stale, 0, new_job())]))[0]
    expect((outcome.child_id, outcome.created), (None, False), "a stale lease spawns nothing")
    expect(await claim(driver), [], "no child")


@conformance_check
async def check_wait_for_final_children_returns_their_outcomes(
    driver: Driver, clock: DriverClock
) -> None:
    parent = await running(driver)
    ok = await spawn_running_child(driver, parent, 0, 1)
    bad = await spawn_running_child(driver, parent, 1, 2)
    await complete(driver, ok, result={"v": 1})
    await fail(driver, bad, None, error={"type": "Boom", "message": "no"})
    outcome = await driver.job_wait_children(WaitChildren(parent, 2, (bad.id, ok.id)))
    expect(outcome.state, "done", "all final")
    got = [(c.id, c.state, c.result) for c in outcome.children]
    expect(got, [(bad.id, "failed", None), (ok.id, "completed", {"v": 1})], "in the given order")
    expect(outcome.children[0].error["type"], "Boom", "the child's stored error")


@conformance_check
async def check_wait_for_a_job_that_is_not_a_child_is_refused(
    driver: Driver, clock: DriverClock
) -> None:
    parent = await running(driver)
    [stranger] = await enqueue(driver, new_job())
    outcome = await driver.job_wait_children(WaitChildren(parent, 0, (stranger,)))
    expect(outcome.state, "unknown", "not a child")
    expect((await record(driver, parent.id)).state, "running", "nothing changed")


@conformance_check
async def check_child_completion_wakes_its_waiting_parent(
    driver: Driver, clock: DriverClock
) -> None:
    parent = await running(driver)
    first = await spawn_running_child(driver, parent, 0, 1)
    second = await spawn_running_child(driver, parent, 1, 2)
    outcome = await driver.job_wait_children(WaitChildren(parent, 2, (first.id, second.id)))
    expect(outcome.state, "waiting", "the parent suspends")
    row = await record(driver, parent.id)
    expect((row.state, row.attempt), ("waiting", parent.attempt - 1), "suspended, no attempt")
    await complete(driver, first)
    expect((await record(driver, parent.id)).state, "waiting", "one child of two is not enough")
    await complete(driver, second, result=2)
    expect((await record(driver, parent.id)).state, "ready", "the last child wakes the parent")
    [again] = await claim(driver)
    expect(again.id, parent.id, "the parent runs again")
    done = await driver.job_wait_children(WaitChildren(again.lease, 2, (first.id, second.id)))
    expect([c.result for c in done.children], [None, 2], "the results")


@conformance_check
async def check_child_lost_by_lease_expiry_wakes_its_waiting_parent(
    driver: Driver, clock: DriverClock
) -> None:
    parent = await running(driver)
    spawned = await driver.job_spawn_many([Spawn(parent, 0, new_job(1, max_attempts=1))])
    [child] = await claim(driver, 1)
    expect(child.id, spawned[0].child_id, "the claimed child")
    outcome = await driver.job_wait_children(WaitChildren(parent, 1, (child.id,)))
    expect(outcome.state, "waiting", "the parent suspends")
    await clock.advance(HOUR)
    recovered = (await driver.maintenance_pass(MaintenancePass())).recovered
    expect(recovered, ((child.id, "failed"),), "the lost child has no attempt left")
    expect((await record(driver, parent.id)).state, "ready", "recovery wakes the parent")


@conformance_check
async def check_child_failure_wakes_a_parent_that_stops_on_failure(
    driver: Driver, clock: DriverClock
) -> None:
    parent = await running(driver)
    first = await spawn_running_child(driver, parent, 0, 1)
    second = await spawn_running_child(driver, parent, 1, 2)
    waiting = await driver.job_wait_children(
        WaitChildren(parent, 2, (first.id, second.id), stop_on_failure=True)
    )
    expect(waiting.state, "waiting", "suspended")
    await fail(driver, second, None)
    expect((await record(driver, parent.id)).state, "ready", "a failed child wakes the parent")
    [again] = await claim(driver)
    outcome = await driver.job_wait_children(
        WaitChildren(again.lease, 2, (first.id, second.id), stop_on_failure=True)
    )
    expect(outcome.state, "failed", "fail-fast")
    stopped = await driver.job_cancel_children(
        CancelChildren(
            again.lease, 2, "gather", "", json.dumps({"failed": second.id}), (first.id, second.id)
        )
    )
    expect(stopped, True, "fenced cancel accepted")
    expect((await record(driver, first.id)).state, "running", "a running sibling runs on...")
    renewed = await driver.job_get(first.id)
    assert renewed is not None
    await fail(driver, first, None, final_state="cancelled")
    expect((await record(driver, first.id)).state, "cancelled", "...until its worker stops it")
    final = await driver.job_wait_children(WaitChildren(again.lease, 3, (first.id, second.id)))
    expect([c.state for c in final.children], ["cancelled", "failed"], "all final")


@conformance_check
async def check_cancelling_a_parent_cancels_its_unfinished_children(
    driver: Driver, clock: DriverClock
) -> None:
    parent = await running(driver)
    runs = await spawn_running_child(driver, parent, 0, 1)
    queued = (await driver.job_spawn_many([Spawn(parent, 1, new_job(2))]))[0]
    later = datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC)
    delayed = (await driver.job_spawn_many([Spawn(parent, 2, new_job(3, run_at=later))]))[0]
    waiting = await driver.job_wait_children(WaitChildren(parent, 3, (runs.id,)))
    expect(waiting.state, "waiting", "the parent waits")
    outcome = await driver.job_cancel(parent.id)
    expect(
        outcome and (outcome.previous_state, outcome.state),
        ("waiting", "waiting"),
        "a parent with a running child waits for it",
    )
    for child_id in (queued.child_id, delayed.child_id):
        assert child_id is not None
        expect((await record(driver, child_id)).state, "cancelled", "an idle child")
    expect((await record(driver, runs.id)).state, "running", "the running child is flagged")
    await fail(driver, runs, None, final_state="cancelled")
    [again] = await claim(driver)
    expect((again.id, again.cancel_requested), (parent.id, True), "woken, to be cancelled")


@conformance_check
async def check_events_are_pruned_after_retention_unless_waited_for(
    driver: Driver, clock: DriverClock
) -> None:
    await emit(driver, "old", 1)
    lease = await running(driver)
    waiting = await driver.job_wait_event(WaitEvent(lease, 0, "awaited", 10 * HOUR))
    expect(waiting.state, "waiting", "a job waits for a key never emitted")
    await clock.advance(200)
    await driver.maintenance_pass(MaintenancePass(retention_seconds=100))
    expect(await emit(driver, "old", 2), (True, 0), "a pruned key is new again")
    expect(await emit(driver, "awaited", 3), (True, 1), "a waited-for key is kept")
