"""The seam's schedule statements: declaring cron schedules and firing their due occurrences
(the scheduler, trioq/_runtime/services/scheduler.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs


@attrs.frozen
class NewSchedule:
    """A schedule to create or update by name; `payload_json` is validated and encoded."""

    name: str
    task: str
    queue: str
    payload_json: str
    cron: str
    timezone: str = "UTC"
    misfire: str = "latest"
    catchup_limit: int = 100
    max_attempts: int = 5
    version: int = 1
    origin: str = "runtime"  # "code": declared with @app.periodic; "runtime": client.schedule


@attrs.frozen
class ScheduleAdvance:
    """The plan for one due schedule: enqueue `fires`, then wait for `next_fire_at`.

    Applied only if the schedule's next_fire_at is still `expected_next_fire_at` (the fence)."""

    name: str
    expected_next_fire_at: datetime.datetime | None
    next_fire_at: datetime.datetime
    fires: tuple[datetime.datetime, ...] = ()
    missed: int = 0


@attrs.frozen
class ScheduleFireDue:
    """One scheduler tick: `plan` (pure, no I/O) turns the due schedules and database time into
    advances, inside the leader's transaction; at most `limit` schedules per tick."""

    plan: Callable[[Sequence[ScheduleRecord], datetime.datetime], Sequence[ScheduleAdvance]]
    limit: int = 100


@attrs.frozen
class ScheduleRecord:
    name: str
    task: str
    queue: str
    payload: Any
    cron: str
    timezone: str
    misfire: str
    catchup_limit: int
    max_attempts: int
    version: int
    origin: str
    anchor_at: datetime.datetime
    next_fire_at: datetime.datetime | None
    last_fire_at: datetime.datetime | None
    fired: int
    missed: int
    created_at: datetime.datetime
    updated_at: datetime.datetime


@attrs.frozen
class ScheduleDue:
    """Database time and the schedule due first (None: no schedules, or one not yet timed)."""

    now: datetime.datetime
    any_schedule: bool
    next_fire_at: datetime.datetime | None

    @property
    def due(self) -> bool:
        return self.any_schedule and (self.next_fire_at is None or self.next_fire_at <= self.now)


@attrs.frozen
class FiredOccurrence:
    schedule: str
    fire_at: datetime.datetime
    job_id: int


@attrs.frozen
class ScheduleFireReport:
    leader: bool  # False: another process held the scheduler lock; nothing was done
    now: datetime.datetime
    due: int = 0  # due schedules locked by this tick (== limit: more may be due)
    fired: tuple[FiredOccurrence, ...] = ()


class ScheduleStatements(Protocol):
    """The statements of cron schedules, part of `Driver`."""

    async def schedule_upsert_many(self, schedules: Sequence[NewSchedule]) -> list[str]: ...

    async def schedule_delete(self, name: str) -> bool: ...

    async def schedule_list(self) -> list[ScheduleRecord]: ...

    async def schedule_next_due(self) -> ScheduleDue: ...

    async def schedule_fire_due(self, params: ScheduleFireDue) -> ScheduleFireReport: ...
