"""The operator's statements on PostgreSQL: the reads and writes of the CLI, the dashboard and
`Client`'s inspection (job lists, status, health, limits, cancel, retry, purge). None is on a
job's way from enqueue to its outcome (docs/life-of-a-job.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._core.channels import control_channel
from .._core.explain import ExplainFacts
from .._core.limits import Rate
from .._seam.admin import (
    AttemptRecord,
    CancelJob,
    CancelOutcome,
    ConcurrencyKeyStatus,
    ConcurrencyLimit,
    ConcurrencyRate,
    Descendant,
    HealthReport,
    JobFilter,
    JobPurge,
    KeyRateStatus,
    QueueDemand,
    QueueLimit,
    QueueLimitSet,
    QueuePause,
    QueueStatus,
    TaskHistoryKind,
    TaskStatus,
    UnroutableJobs,
    WorkerInfo,
    WorkflowFilter,
    WorkflowRecord,
)
from .._seam.driver import (
    JobRecord,
)
from .._seam.services import (
    QueueAdmission,
)
from .._seam.workflow import (
    Checkpoint,
)
from .replies import (
    Cancelled,
    Explained,
    JobStateRow,
    QueueLimitRow,
    Unroutable,
    WorkerRow,
)
from .statements import PgStatements


def _job_states(rows: Sequence[Sequence[Any]]) -> list[Descendant]:
    return [Descendant(row[JobStateRow.id], row[JobStateRow.state]) for row in rows]


def _cancel_outcome(rows: Sequence[Sequence[Any]]) -> CancelOutcome | None:
    """What job_cancel, job_cancel_with or job_retry did (None: no such job)."""
    if not rows:
        return None
    return CancelOutcome(
        previous_state=rows[0][Cancelled.previous_state], state=rows[0][Cancelled.state]
    )


class PgOperatorStatements(PgStatements):
    """`seam.admin.AdminStatements` on PostgreSQL but `migrate` (`migrations.py`); part of
    `PgDriver`."""

    __slots__ = ()

    async def job_cancel(self, job_id: int) -> CancelOutcome | None:
        rows = await self._fetch(
            "job_cancel", {"id": job_id, "control_channel": control_channel(self.schema)}
        )
        return _cancel_outcome(rows)

    async def job_attempts(self, job_id: int) -> list[AttemptRecord]:
        rows = await self._retrying("job_attempts", {"id": job_id})
        return [AttemptRecord(*row) for row in rows]

    async def checkpoint_list(self, job_id: int) -> list[Checkpoint]:
        rows = await self._retrying("checkpoint_list", {"id": job_id})
        return [Checkpoint(*row) for row in rows]

    async def job_list(self, params: JobFilter) -> list[JobRecord]:
        def optional(values: tuple[str, ...] | None) -> list[str] | None:
            return None if values is None else list(values)

        rows = await self._retrying(
            "job_list",
            {
                "states": optional(params.states),
                "tasks": optional(params.tasks),
                "queues": optional(params.queues),
                "partition_key": params.partition_key,
                "older_than": params.older_than_seconds,
                "before_id": params.before_id,
                "limit": params.limit,
            },
        )
        return [JobRecord(*row) for row in rows]

    async def job_retry(self, job_id: int) -> CancelOutcome | None:
        rows = await self._fetch("job_retry", {"id": job_id})
        return _cancel_outcome(rows)

    async def job_purge(self, params: JobPurge) -> int:
        days = 0
        if params.whole_days:
            days, _ = await self._epochs_rotate(params.older_than_seconds)
        rows = await self._fetch(
            "job_purge",
            {
                "states": list(params.states),
                "older_than": params.older_than_seconds,
                "tasks": None if params.tasks is None else list(params.tasks),
                "queues": None if params.queues is None else list(params.queues),
                "limit": params.limit,
            },
        )
        return days + len(rows)

    async def queue_pause(self, queue: str) -> bool:
        return bool(await self._retrying("queue_pause", {"queue": queue}))

    async def queue_resume(self, queue: str) -> bool:
        return bool(await self._retrying("queue_resume", {"queue": queue}))

    async def queue_pause_list(self) -> list[QueuePause]:
        return [QueuePause(*row) for row in await self._retrying("queue_pause_list")]

    async def concurrency_limit_set(self, pattern: str, max_running: int | None) -> bool:
        """Set (or, with None, remove) a key pattern's limit; False: there was none to remove."""
        if max_running is None:
            return bool(await self._retrying("concurrency_limit_delete", {"pattern": pattern}))
        params = {"pattern": pattern, "max_running": max_running}
        return bool(await self._retrying("concurrency_limit_set", params))

    async def concurrency_limit_list(self) -> list[ConcurrencyLimit]:
        return [ConcurrencyLimit(*row) for row in await self._retrying("concurrency_limit_list")]

    async def concurrency_key_status(
        self, keys: Sequence[str] | None = None
    ) -> list[ConcurrencyKeyStatus]:
        params = {"keys": None if keys is None else list(keys)}
        rows = await self._retrying("concurrency_key_status", params)
        return [ConcurrencyKeyStatus(*row) for row in rows]

    async def concurrency_rate_set(self, pattern: str, rate: Rate | None) -> bool:
        """Set (or, with None, remove) a key pattern's rate; False: there was none to remove.
        This process's claims read the rates again at their next round."""
        self._rated.forget("")
        if rate is None:
            return bool(await self._retrying("concurrency_rate_delete", {"pattern": pattern}))
        params = {"pattern": pattern, "rate_allowed": rate.allowed, "rate_period": rate.period}
        return bool(await self._retrying("concurrency_rate_set", params))

    async def concurrency_rate_list(self) -> list[ConcurrencyRate]:
        return [
            ConcurrencyRate(pattern, Rate(allowed, period), updated_at)
            for pattern, allowed, period, updated_at in await self._retrying(
                "concurrency_rate_list"
            )
        ]

    async def concurrency_rate_status(self) -> list[KeyRateStatus]:
        return [
            KeyRateStatus(key, Rate(allowed, period), recent, until)
            for key, allowed, period, recent, until in await self._retrying(
                "concurrency_rate_status"
            )
        ]

    async def queue_limit_set(self, params: QueueLimitSet) -> None:
        """Retried on a lost connection: applying the same change twice leaves the same row."""
        rate = params.rate
        await self._retrying(
            "queue_limit_set",
            {
                "queue": params.queue,
                "set_limit": params.set_limit,
                "global_limit": params.global_limit,
                "set_rate": params.set_rate,
                "rate_allowed": None if rate is None else rate.allowed,
                "rate_period": None if rate is None else rate.period,
                "control_channel": control_channel(self.schema),
            },
        )
        self._limited.forget(params.queue)

    async def queue_limit_list(self) -> list[QueueLimit]:
        return [
            QueueLimit(
                queue=row[QueueLimitRow.queue],
                global_limit=row[QueueLimitRow.global_limit],
                rate=(
                    None
                    if (allowed := row[QueueLimitRow.rate_allowed]) is None
                    else Rate(allowed, row[QueueLimitRow.rate_period])
                ),
                running=row[QueueLimitRow.running],
                recent_starts=row[QueueLimitRow.recent_starts],
                rate_limited_until=row[QueueLimitRow.rate_limited_until],
            )
            for row in await self._retrying("queue_limit_list")
        ]

    async def job_explain(self, job_id: int) -> ExplainFacts | None:
        rows = await self._retrying("job_explain", {"id": job_id})
        if not rows:
            return None
        row = rows[0]
        return ExplainFacts(
            row[Explained.now],
            row[Explained.job],
            row[Explained.key_holder],
            row[Explained.key_ahead],
            tuple(row[Explained.workers]),
            row[Explained.last_attempt],
            row[Explained.pause],
            row[Explained.concurrency],
            other_workers=tuple(row[Explained.other_workers]),
        )

    async def status_health(self) -> HealthReport:
        [row] = await self._retrying("status_health")
        return HealthReport(*row)

    async def queue_demand(self) -> list[QueueDemand]:
        rows = await self._retrying("queue_demand", pool=self._scan_pool)
        return [QueueDemand(*row) for row in rows]

    async def queue_status(self) -> list[QueueStatus]:
        return [QueueStatus(*row) for row in await self._retrying("queue_status")]

    async def worker_list(self) -> list[WorkerInfo]:
        rows = await self._retrying("worker_list")
        return [
            WorkerInfo(
                row[WorkerRow.id],
                row[WorkerRow.hostname],
                row[WorkerRow.pid],
                tuple(row[WorkerRow.queues]),
                row[WorkerRow.concurrency],
                row[WorkerRow.state],
                row[WorkerRow.started_at],
                row[WorkerRow.heartbeat_at],
                row[WorkerRow.running],
                tuple(row[WorkerRow.task_versions]),
                tuple(
                    QueueAdmission(q, int(lim), int(conc), reason, cause, float(age))
                    for q, lim, conc, reason, cause, age in row[WorkerRow.admission]
                ),
                tuple(row[WorkerRow.queue_concurrency] or ()),
                row[WorkerRow.heartbeat_seconds],
                row[WorkerRow.heartbeat_age],
            )
            for row in rows
        ]

    async def task_history_kinds(self) -> list[TaskHistoryKind]:
        return [TaskHistoryKind(*row) for row in await self._retrying("task_history_kinds")]

    async def job_unroutable(self, stale_seconds: float = 120.0) -> list[UnroutableJobs]:
        rows = await self._retrying("job_unroutable", {"stale_seconds": stale_seconds})
        return [
            UnroutableJobs(
                row[Unroutable.queue],
                row[Unroutable.task],
                row[Unroutable.version],
                row[Unroutable.jobs],
                tuple(sorted(row[Unroutable.states])),
            )
            for row in rows
        ]

    async def task_status(self) -> list[TaskStatus]:
        return [TaskStatus(*row) for row in await self._retrying("task_status")]

    async def workflow_list(self, params: WorkflowFilter) -> list[WorkflowRecord]:
        rows = await self._retrying(
            "workflow_list",
            {
                "states": None if params.states is None else list(params.states),
                "tasks": None if params.tasks is None else list(params.tasks),
                "before_id": params.before_id,
                "limit": params.limit,
            },
        )
        return [WorkflowRecord(*row) for row in rows]

    async def job_cancel_with(self, params: CancelJob) -> CancelOutcome | None:
        rows = await self._fetch(
            "job_cancel_with",
            {"id": params.id, "tree": params.tree, "control_channel": control_channel(self.schema)},
        )
        return _cancel_outcome(rows)

    async def job_descendants(self, job_id: int) -> list[Descendant]:
        return _job_states(await self._fetch("job_descendants", {"id": job_id}))
