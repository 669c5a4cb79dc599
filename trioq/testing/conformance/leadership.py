"""Conformance checks of the leader election and the queue probe (registered in `CHECKS`).

One seat per schema with a TTL: taken when free or expired, kept by its holder, given up by
`leader_resign` (which tells the control channel); only the holder's maintenance pass sweeps.
The probe says what a claim poll would find without claiming.
"""

from __future__ import annotations

import uuid

from ..._core.channels import control_channel
from ..._seam.driver import Driver, NewJob
from ..._seam.services import (
    LeaderElect,
    LeaderResign,
    MaintenancePass,
    QueueProbe,
    WorkerRegistration,
)
from .harness import (
    QUEUE,
    DriverClock,
    NotificationRecorder,
    claim,
    conformance_check,
    database_now,
    enqueue,
    expect,
    new_job,
)

TTL = 20.0


async def elect(driver: Driver, worker_id: uuid.UUID, *, scheduler: bool = True) -> bool:
    report = await driver.leader_elect(LeaderElect(worker_id, TTL, scheduler=scheduler))
    return report.leader


@conformance_check
async def check_one_leader_holds_the_seat_until_it_expires(
    driver: Driver, clock: DriverClock
) -> None:
    first, second = uuid.uuid4(), uuid.uuid4()
    expect(await elect(driver, first), True, "the first candidate takes the free seat")
    expect(await elect(driver, second), False, "a second candidate while the seat is held")
    await clock.advance(TTL / 2)
    expect(await elect(driver, first), True, "the holder extends its seat")
    await clock.advance(TTL / 2 + 1)
    expect(await elect(driver, second), False, "the seat was extended: still held")
    await clock.advance(TTL)
    expect(await elect(driver, second), True, "the seat expired: the next candidate takes it")
    expect(await elect(driver, first), False, "the old holder lost it")


@conformance_check
async def check_a_candidate_running_the_scheduler_takes_the_seat_from_one_that_does_not(
    driver: Driver, clock: DriverClock
) -> None:
    plain, scheduling = uuid.uuid4(), uuid.uuid4()
    expect(await elect(driver, plain, scheduler=False), True, "first leader, scheduler off")
    expect(await elect(driver, uuid.uuid4(), scheduler=False), False, "another, scheduler off")
    expect(await elect(driver, scheduling), True, "a candidate running the scheduler")
    expect(await elect(driver, plain, scheduler=False), False, "the displaced leader")


@conformance_check
async def check_resigning_frees_the_seat_and_tells_the_control_channel(
    driver: Driver, clock: DriverClock
) -> None:
    leader, other = uuid.uuid4(), uuid.uuid4()
    await elect(driver, leader)
    recorder = NotificationRecorder()
    channel = control_channel(driver.schema)
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        await listener.listen(channel)
        expect(await driver.leader_resign(LeaderResign(other)), False, "a follower resigning")
        expect(await driver.leader_resign(LeaderResign(leader)), True, "the leader resigning")
        await recorder.wait_for(channel, "leader")
    expect(await elect(driver, other), True, "the seat is free at once after a resignation")


@conformance_check
async def check_only_the_seat_holder_maintenance_pass_sweeps(
    driver: Driver, clock: DriverClock
) -> None:
    leader, follower = uuid.uuid4(), uuid.uuid4()
    for worker in (leader, follower):
        await driver.worker_register(WorkerRegistration(worker, "host", 1, (QUEUE,), 1))
    [job_id] = await enqueue(driver, new_job())
    await claim(driver, lease_seconds=1)
    await elect(driver, leader)
    await clock.advance(2)  # the lease expired
    swept_by = {}
    for worker in (follower, leader):
        report = await driver.maintenance_pass(MaintenancePass(leader_id=worker, ttl_seconds=TTL))
        swept_by[worker] = (report.leader, report.recovered, report.registered)
    expect(swept_by[follower], (False, (), True), "a follower's pass")
    expect(swept_by[leader], (True, ((job_id, "ready"),), True), "the leader's pass")


@conformance_check
async def check_probe_reports_due_work_and_the_next_due_time_per_queue(
    driver: Driver, clock: DriverClock
) -> None:
    worker = uuid.uuid4()
    await enqueue(
        driver,
        NewJob(queue="busy", task="t", payload_json="{}"),
        NewJob(queue="later", task="t", payload_json="{}", delay_seconds=60),
    )
    report = await driver.leader_elect(LeaderElect(worker, TTL, queues=("later", "busy", "empty")))
    now = await database_now(driver)
    [busy, empty, later] = report.probes
    expect((busy, empty), (QueueProbe("busy", True, None), QueueProbe("empty", False, None)), "")
    expect((later.queue, later.work_due), ("later", False), "a queue with delayed work only")
    assert later.next_due is not None and 59 <= (later.next_due - now).total_seconds() <= 60, later
    await clock.advance(61)
    report = await driver.leader_elect(LeaderElect(worker, TTL, queues=("later",)))
    expect(report.probes, (QueueProbe("later", True, None),), "delayed work once due")
