"""Cron schedules on PostgreSQL: declaring them, and firing each due occurrence once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._core.channels import schedules_channel
from .._core.schedule import fire_dedup_key
from .._seam.schedules import (
    FiredOccurrence,
    NewSchedule,
    ScheduleAdvance,
    ScheduleDue,
    ScheduleFireDue,
    ScheduleFireReport,
    ScheduleRecord,
)
from . import (
    Connection,
)
from .replies import (
    ScheduleFired,
    ScheduleNextDue,
    SchedulerLead,
    ScheduleUpserted,
)
from .statements import Params, PgStatements


class PgScheduleStatements(PgStatements):
    """`seam.schedules.ScheduleStatements` on PostgreSQL, part of `PgDriver`."""

    __slots__ = ()

    async def schedule_upsert_many(self, schedules: Sequence[NewSchedule]) -> list[str]:
        """Create or update schedules by name; returns the names that were created."""
        rows = await self._retrying(
            "schedule_upsert_many",
            {
                "names": [s.name for s in schedules],
                "tasks": [s.task for s in schedules],
                "queues": [s.queue for s in schedules],
                "payloads": [s.payload_json for s in schedules],
                "crons": [s.cron for s in schedules],
                "timezones": [s.timezone for s in schedules],
                "misfires": [s.misfire for s in schedules],
                "catchup_limits": [s.catchup_limit for s in schedules],
                "max_attempts": [s.max_attempts for s in schedules],
                "versions": [s.version for s in schedules],
                "origins": [s.origin for s in schedules],
                "channel": schedules_channel(self.schema),
            },
        )
        return [row[ScheduleUpserted.name] for row in rows if row[ScheduleUpserted.created]]

    async def schedule_delete(self, name: str) -> bool:
        rows = await self._retrying(
            "schedule_delete", {"name": name, "channel": schedules_channel(self.schema)}
        )
        return bool(rows)

    async def schedule_list(self) -> list[ScheduleRecord]:
        return [ScheduleRecord(*row) for row in await self._retrying("schedule_list")]

    async def schedule_next_due(self) -> ScheduleDue:
        [row] = await self._retrying("schedule_next_due")
        return ScheduleDue(
            now=row[ScheduleNextDue.now],
            any_schedule=row[ScheduleNextDue.any_schedule],
            next_fire_at=row[ScheduleNextDue.next_fire_at],
        )

    async def schedule_fire_due(self, params: ScheduleFireDue) -> ScheduleFireReport:
        """One tick in one transaction, done only by the holder of the scheduler lock.

        Not retried: the fence and the dedup keys make a repeated tick harmless, and the
        scheduler's next tick does it. Cancelling it rolls the whole tick back."""
        async with self._pool.connection() as conn, conn.transaction():
            with self._schema_required():
                [lead] = await self._counted(conn, "scheduler_lead", {"schema_name": self.schema})
                now = lead[SchedulerLead.now]
                if not lead[SchedulerLead.leader]:
                    return ScheduleFireReport(leader=False, now=now)
                rows = await self._counted(
                    conn, "schedule_due_lock", {"now": now, "limit": params.limit}
                )
                advances = params.plan([ScheduleRecord(*row) for row in rows], now)
                fired = await self._fire(conn, advances) if advances else []
        return ScheduleFireReport(leader=True, now=now, due=len(rows), fired=tuple(fired))

    async def _counted(
        self, conn: Connection, name: str, params: Params | None = None
    ) -> list[tuple[Any, ...]]:
        self._calls[name] += 1
        return await self._query(conn, name, params)

    async def _fire(
        self, conn: Connection, advances: Sequence[ScheduleAdvance]
    ) -> list[FiredOccurrence]:
        fires = [(a.name, fire) for a in advances for fire in a.fires]
        rows = await self._counted(
            conn,
            "schedule_fire_many",
            {
                "names": [a.name for a in advances],
                "expected": [a.expected_next_fire_at for a in advances],
                "next_fire_ats": [a.next_fire_at for a in advances],
                "last_fire_ats": [max(a.fires) if a.fires else None for a in advances],
                "fired": [len(a.fires) for a in advances],
                "missed": [a.missed for a in advances],
                "fire_names": [name for name, _ in fires],
                "fire_ats": [fire for _, fire in fires],
                "fire_keys": [fire_dedup_key(name, fire) for name, fire in fires],
            },
        )
        return [
            FiredOccurrence(
                schedule=row[ScheduleFired.name],
                fire_at=row[ScheduleFired.fire_at],
                job_id=row[ScheduleFired.id],
            )
            for row in rows
        ]
