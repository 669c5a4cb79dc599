"""The scheduler service: turns cron schedules into jobs, run by the elected leader only.

Every worker declares its app's schedules at start (`declare`); the scheduler's ticks run only
in the worker that holds the leader seat (leadership.py, shared with maintenance). Each tick is
still one transaction that first tries the scheduler's advisory lock (`scheduler_lead`), so two
workers that both believe they lead for a moment (a stalled leader past its TTL) never tick at
once. Exactly once does not rest on either: each schedule's advance is fenced on the next fire
time it was planned from, and each occurrence's job carries a dedup key naming the schedule and
fire time.

Idle cost: between fire times a scheduler sleeps until the first schedule is due (database
time), at most `idle_seconds`; the leader's maintenance pass reads that time for it
(`observed`), so an idle leader's scheduler sends nothing. A change to the schedules table
(`client.schedule`, a deploy) wakes it through the schedules notification channel.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Sequence

import attrs
import trio

from ..._core.schedule import Cron, first_fire, plan_fires, validate_misfire
from ..._seam.driver import Driver
from ..._seam.schedules import (
    NewSchedule,
    ScheduleAdvance,
    ScheduleDue,
    ScheduleFireDue,
    ScheduleFireReport,
    ScheduleRecord,
)
from .outage import lost_connection_level

log = logging.getLogger("trioq.scheduler")

# A schedule whose stored cron or time zone no longer parses (edited by hand) is retried this
# much later instead of being re-planned in a loop.
BROKEN_SCHEDULE_RETRY = datetime.timedelta(hours=1)


def plan_schedules(
    records: Sequence[ScheduleRecord], now: datetime.datetime
) -> list[ScheduleAdvance]:
    """The scheduler's plan for its due schedules (pure: runs inside the leader's
    transaction). Every due schedule gets an advance, so none is re-planned in a loop."""
    return [_plan_one(record, now) for record in records]


def _plan_one(record: ScheduleRecord, now: datetime.datetime) -> ScheduleAdvance:
    try:
        cron = Cron(record.cron, record.timezone)
        misfire = validate_misfire(record.misfire)
    except ValueError as exc:
        log.error("schedule %r cannot be planned (%s); retrying in an hour", record.name, exc)
        return ScheduleAdvance(record.name, record.next_fire_at, now + BROKEN_SCHEDULE_RETRY)
    start = record.next_fire_at or first_fire(cron, record.anchor_at)
    plan = plan_fires(cron, start, now, misfire, record.catchup_limit)
    if plan.missed:
        log.warning(
            "schedule %r: %d fire time(s) missed (misfire=%s)", record.name, plan.missed, misfire
        )
    return ScheduleAdvance(
        name=record.name,
        expected_next_fire_at=record.next_fire_at,
        next_fire_at=plan.next_fire_at,
        fires=plan.fires,
        missed=plan.missed,
    )


@attrs.frozen
class SchedulerStatistics:
    ticks: int  # scheduler transactions attempted (due schedules seen)
    leader_ticks: int  # of those, the ones that held the scheduler lock
    fired: int  # occurrences this process enqueued
    healthy: bool  # the last statement succeeded


@attrs.define(eq=False)
class Scheduler:
    """One per worker process. `run` until cancelled; `wake` to re-read the schedules now."""

    driver: Driver
    declared: Sequence[NewSchedule] = ()
    idle_seconds: float = 60.0  # re-read at least this often (a missed notification)
    follower_seconds: float = 1.0  # another process was ticking: look again after this
    retry_seconds: float = 5.0  # after a failed statement
    batch: int = 100
    on_tick: Callable[[ScheduleFireReport], None] | None = None  # test hook
    _wake: trio.Event = attrs.field(factory=trio.Event)
    _ticks: int = 0
    _leader_ticks: int = 0
    _fired: int = 0
    _healthy: bool = True
    _declared: bool = attrs.field(default=False, init=False)
    _sleep: trio.CancelScope | None = None  # the idle sleep, while sleeping

    def wake(self) -> None:
        self._wake.set()

    def observed(self, due: ScheduleDue) -> None:
        """Another statement (the leader's maintenance pass) read the schedule due first: tick
        now if it is due, else sleep until it is (this is the idle read `run` would make)."""
        if due.due:
            self.wake()
        elif self._sleep is not None:
            self._sleep.deadline = trio.current_time() + self._idle_delay(due)

    def statistics(self) -> SchedulerStatistics:
        return SchedulerStatistics(self._ticks, self._leader_ticks, self._fired, self._healthy)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Upsert the app's declared schedules, then tick whenever a schedule is due.

        Cancel-safe: a cancelled tick rolls back as a whole (nothing enqueued, nothing
        advanced), and the next leader does it."""
        await self.declare()
        task_status.started()
        while True:
            delay = await self._step()
            with trio.move_on_after(delay) as self._sleep:
                await self._wake.wait()
            self._sleep = None
            self._wake = trio.Event()

    async def declare(self) -> None:
        """Upsert the app's declared schedules (once; retried until it succeeds)."""
        while self.declared and not self._declared:
            try:
                await self.driver.schedule_upsert_many(self.declared)
                self._declared = True
                return
            except Exception as exc:
                self._healthy = False
                log.warning("declaring schedules failed (retrying): %s", exc)
            await trio.sleep(self.retry_seconds)

    async def _step(self) -> float:
        """One read, and a tick when something is due; returns how long to sleep."""
        try:
            due = await self.driver.schedule_next_due()
            if not due.due:
                self._healthy = True
                return self._idle_delay(due)
            report = await self.driver.schedule_fire_due(
                ScheduleFireDue(plan=plan_schedules, limit=self.batch)
            )
        except Exception as exc:
            self._healthy = False
            level = lost_connection_level(self.driver.is_connection_lost, exc)
            log.log(level, "scheduler tick failed: %s", exc)
            return self.retry_seconds
        self._healthy = True
        self._record(report)
        return 0.0 if report.leader else self.follower_seconds

    def _idle_delay(self, due: ScheduleDue) -> float:
        if due.next_fire_at is None:
            return self.idle_seconds
        wait = (due.next_fire_at - due.now).total_seconds()
        return min(max(wait, 0.0), self.idle_seconds)

    def _record(self, report: ScheduleFireReport) -> None:
        self._ticks += 1
        self._leader_ticks += report.leader
        self._fired += len(report.fired)
        for occurrence in report.fired:
            log.info(
                "schedule %r fired for %s: job %d",
                occurrence.schedule,
                occurrence.fire_at.isoformat(),
                occurrence.job_id,
            )
        if self.on_tick is not None:
            self.on_tick(report)
