"""Conformance checks of the schedule statements (registered in `CHECKS` like the others).

They use the real planner (`plan_schedules`) and an every-minute cron: the memory clock starts
on a minute boundary, a Postgres `SqlClock` anywhere, so each check moves time by whole minutes
and compares fire times with the schedule's own `next_fire_at`, never with a guessed instant.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence

from ..._core.channels import schedules_channel
from ..._core.schedule import fire_dedup_key
from ..._runtime.services.scheduler import plan_schedules
from ..._seam.driver import Driver, NewJob
from ..._seam.schedules import (
    NewSchedule,
    ScheduleAdvance,
    ScheduleFireDue,
    ScheduleFireReport,
    ScheduleRecord,
)
from ..._seam.workflow import CheckpointWrite
from .harness import (
    QUEUE,
    TASK,
    DriverClock,
    NotificationRecorder,
    claim,
    conformance_check,
    enqueue,
    expect,
    flush_notifications,
    record,
)

EVERY_MINUTE = "* * * * *"


def new_schedule(name: str = "digest", **fields: object) -> NewSchedule:
    defaults: dict[str, object] = {
        "name": name,
        "task": TASK,
        "queue": QUEUE,
        "payload_json": json.dumps({"schedule": name}),
        "cron": EVERY_MINUTE,
    }
    return NewSchedule(**{**defaults, **fields})  # type: ignore[arg-type]


async def tick(driver: Driver) -> ScheduleFireReport:
    return await driver.schedule_fire_due(ScheduleFireDue(plan=plan_schedules))


async def stored(driver: Driver, name: str) -> ScheduleRecord:
    found = [s for s in await driver.schedule_list() if s.name == name]
    assert found, f"schedule {name!r} is not stored"
    return found[0]


async def timed(driver: Driver, name: str) -> datetime.datetime:
    """Make the schedule's first tick (it computes the next fire time) and return that time."""
    report = await tick(driver)
    expect((report.leader, report.fired), (True, ()), "first tick of a new schedule")
    next_fire_at = (await stored(driver, name)).next_fire_at
    assert next_fire_at is not None, "the first tick did not time the schedule"
    return next_fire_at


@conformance_check
async def check_schedules_are_upserted_listed_and_deleted(
    driver: Driver, clock: DriverClock
) -> None:
    created = await driver.schedule_upsert_many([new_schedule("b"), new_schedule("a")])
    expect(sorted(created), ["a", "b"], "created names")
    listed = await driver.schedule_list()
    expect([s.name for s in listed], ["a", "b"], "schedules listed by name")
    expect(
        (listed[0].task, listed[0].queue, listed[0].payload, listed[0].next_fire_at),
        (TASK, QUEUE, {"schedule": "a"}, None),
        "a stored schedule before its first tick",
    )
    expect(await driver.schedule_upsert_many([new_schedule("a", misfire="all")]), [], "update")
    expect((await stored(driver, "a")).misfire, "all", "updated misfire policy")
    expect(await driver.schedule_delete("a"), True, "delete an existing schedule")
    expect(await driver.schedule_delete("a"), False, "delete a missing schedule")
    expect([s.name for s in await driver.schedule_list()], ["b"], "after delete")


@conformance_check
async def check_schedule_fires_each_occurrence_once_when_due(
    driver: Driver, clock: DriverClock
) -> None:
    await driver.schedule_upsert_many([new_schedule()])
    expect((await driver.schedule_next_due()).due, True, "a new schedule is due for timing")
    first = await timed(driver, "digest")
    due = await driver.schedule_next_due()
    expect((due.due, due.next_fire_at), (False, first), "next due after timing")
    await clock.advance(60)
    report = await tick(driver)
    expect([(f.schedule, f.fire_at) for f in report.fired], [("digest", first)], "fired")
    job = await record(driver, report.fired[0].job_id)
    expect(
        (job.task, job.queue, job.payload, job.run_at, job.dedup_key),
        (TASK, QUEUE, {"schedule": "digest"}, first, fire_dedup_key("digest", first)),
        "the occurrence's job",
    )
    expect((await tick(driver)).fired, (), "a second tick at the same time")
    [claimed] = await claim(driver)
    expect(claimed.id, job.id, "the occurrence is claimable")
    schedule = await stored(driver, "digest")
    expect((schedule.fired, schedule.last_fire_at), (1, first), "schedule counters")
    expect(schedule.next_fire_at is not None and schedule.next_fire_at > first, True, "advanced")


@conformance_check
async def check_stale_schedule_plan_changes_nothing(driver: Driver, clock: DriverClock) -> None:
    await driver.schedule_upsert_many([new_schedule()])
    first = await timed(driver, "digest")
    await clock.advance(60)
    plans: list[Sequence[ScheduleAdvance]] = []

    def remember(rows: Sequence[ScheduleRecord], now: datetime.datetime) -> list[ScheduleAdvance]:
        plans.append(plan_schedules(rows, now))
        return list(plans[-1])

    await driver.schedule_fire_due(ScheduleFireDue(plan=remember))
    replayed = await driver.schedule_fire_due(ScheduleFireDue(plan=lambda rows, now: plans[0]))
    expect(replayed.fired, (), "a replayed plan (a second leader) enqueues nothing")
    expect((await stored(driver, "digest")).fired, 1, "fired count after a replay")
    expect(plans[0][0].fires, (first,), "the original plan")


@conformance_check
async def check_schedule_occurrence_already_enqueued_is_not_repeated(
    driver: Driver, clock: DriverClock
) -> None:
    await driver.schedule_upsert_many([new_schedule()])
    first = await timed(driver, "digest")
    await enqueue(driver, NewJob(QUEUE, TASK, "{}", dedup_key=fire_dedup_key("digest", first)))
    await clock.advance(60)
    report = await tick(driver)
    expect(report.fired, (), "an occurrence whose key is taken")
    schedule = await stored(driver, "digest")
    expect(schedule.next_fire_at is not None and schedule.next_fire_at > first, True, "advanced")


@conformance_check
async def check_retimed_schedule_fires_from_its_new_cron(
    driver: Driver, clock: DriverClock
) -> None:
    await driver.schedule_upsert_many([new_schedule()])
    first = await timed(driver, "digest")
    await driver.schedule_upsert_many([new_schedule(payload_json='{"v": 2}')])
    expect((await stored(driver, "digest")).next_fire_at, first, "same cron keeps next fire")
    await driver.schedule_upsert_many([new_schedule(cron="0 0 1 1 *")])
    expect((await stored(driver, "digest")).next_fire_at, None, "a new cron re-times")
    await timed(driver, "digest")
    await clock.advance(120)
    expect((await tick(driver)).fired, (), "the old every-minute cron no longer fires")


@conformance_check
async def check_schedule_changes_are_announced(driver: Driver, clock: DriverClock) -> None:
    recorder = NotificationRecorder()
    channel = schedules_channel(driver.schema)
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        await listener.listen(channel)
        await driver.schedule_upsert_many([new_schedule()])
        await recorder.wait_for(channel, "schedules")
        recorder.received.clear()
        await driver.schedule_delete("missing")
        await flush_notifications(driver, listener, recorder)
        expect((channel, "schedules") in recorder.received, False, "notified for no change")
        await driver.schedule_delete("digest")
        await recorder.wait_for(channel, "schedules")


@conformance_check
async def check_task_status_counts_jobs_by_task_and_state(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(driver, NewJob(QUEUE, TASK, "{}"), NewJob(QUEUE, TASK, "{}"))
    await enqueue(driver, NewJob("other", "report", "{}"))
    await claim(driver, 1)
    expect(
        [
            (s.queue, s.task, s.version, s.state, s.jobs, s.retried)
            for s in await driver.task_status()
        ],
        [
            (QUEUE, TASK, 1, "ready", 1, 0),
            (QUEUE, TASK, 1, "running", 1, 0),
            ("other", "report", 1, "ready", 1, 0),
        ],
        "task status",
    )


@conformance_check
async def check_task_history_kinds_count_jobs_per_checkpoint_kind(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(driver, NewJob(QUEUE, TASK, "{}"), NewJob(QUEUE, TASK, "{}"))
    first, second = await claim(driver, 2)
    await driver.checkpoint_insert_many(
        [
            CheckpointWrite(first.lease, 0, "step", "a", "1"),
            CheckpointWrite(first.lease, 1, "step", "b", "2"),
            CheckpointWrite(first.lease, 2, "sleep", "nap", None, wake_in_seconds=5),
            CheckpointWrite(second.lease, 0, "step", "a", "1"),
        ]
    )
    expect(
        [(k.task, k.kind, k.jobs) for k in await driver.task_history_kinds()],
        [(TASK, "sleep", 1), (TASK, "step", 2)],
        "jobs per checkpoint kind",
    )
