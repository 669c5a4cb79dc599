"""The schedules table of `MemoryDriver`, with the semantics of the `schedule_*` statements.

Kept apart from `driver.py` (jobs) so each stays readable; `MemoryState` holds one
`ScheduleTable`, and `MemoryDriver` turns its answers into notifications and job rows.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence

import attrs

from .._core.identifiers import validate_name
from .._core.schedule import validate_catchup_limit, validate_misfire
from .._seam.schedules import NewSchedule, ScheduleAdvance, ScheduleDue, ScheduleRecord


@attrs.define(eq=False)
class ScheduleTable:
    rows: dict[str, ScheduleRecord] = attrs.field(factory=dict)

    def upsert(self, schedule: NewSchedule, now: datetime.datetime) -> bool:
        """Insert or update by name (True: created). A changed cron or time zone re-times the
        schedule (next fire time recomputed from now); an unchanged one keeps its next fire."""
        _validate(schedule)
        old = self.rows.get(schedule.name)
        same_timing = (
            old is not None and old.cron == schedule.cron and old.timezone == schedule.timezone
        )
        self.rows[schedule.name] = ScheduleRecord(
            name=schedule.name,
            task=schedule.task,
            queue=schedule.queue,
            payload=json.loads(schedule.payload_json),
            cron=schedule.cron,
            timezone=schedule.timezone,
            misfire=schedule.misfire,
            catchup_limit=schedule.catchup_limit,
            max_attempts=schedule.max_attempts,
            version=schedule.version,
            origin=schedule.origin,
            anchor_at=old.anchor_at if old is not None and same_timing else now,
            next_fire_at=old.next_fire_at if old is not None and same_timing else None,
            last_fire_at=None if old is None else old.last_fire_at,
            fired=0 if old is None else old.fired,
            missed=0 if old is None else old.missed,
            created_at=now if old is None else old.created_at,
            updated_at=now,
        )
        return old is None

    def delete(self, name: str) -> bool:
        return self.rows.pop(name, None) is not None

    def listing(self) -> list[ScheduleRecord]:
        return [self.rows[name] for name in sorted(self.rows)]

    def next_due(self, now: datetime.datetime) -> ScheduleDue:
        if not self.rows:
            return ScheduleDue(now=now, any_schedule=False, next_fire_at=None)
        first = min(self.rows.values(), key=_due_order)
        return ScheduleDue(now=now, any_schedule=True, next_fire_at=first.next_fire_at)

    def due(self, now: datetime.datetime, limit: int) -> list[ScheduleRecord]:
        due = [r for r in self.rows.values() if r.next_fire_at is None or r.next_fire_at <= now]
        return sorted(due, key=_due_order)[:limit]

    def advance(self, advances: Sequence[ScheduleAdvance]) -> list[ScheduleRecord]:
        """Apply the fenced advances; returns the schedules (as they were) that advanced."""
        advanced = []
        for plan in advances:
            row = self.rows.get(plan.name)
            if row is None or row.next_fire_at != plan.expected_next_fire_at:
                continue
            self.rows[plan.name] = attrs.evolve(
                row,
                next_fire_at=plan.next_fire_at,
                last_fire_at=max(plan.fires) if plan.fires else row.last_fire_at,
                fired=row.fired + len(plan.fires),
                missed=row.missed + plan.missed,
            )
            advanced.append(row)
        return advanced


def _due_order(row: ScheduleRecord) -> tuple[bool, datetime.datetime]:
    # NULLS FIRST, then by next fire time.
    return (row.next_fire_at is not None, row.next_fire_at or row.anchor_at)


def _validate(schedule: NewSchedule) -> None:
    """What the table's CHECK constraints enforce in Postgres."""
    for field in ("name", "task", "queue"):
        validate_name(field, getattr(schedule, field))
    validate_misfire(schedule.misfire)
    validate_catchup_limit(schedule.catchup_limit)
    if schedule.origin not in ("code", "runtime"):
        raise ValueError(f"origin: {schedule.origin!r} must be 'code' or 'runtime'")
    json.loads(schedule.payload_json)
