"""The worker services' statements on PostgreSQL: lease renewal on a pool of its own, the worker's
registration, leader election and the leader's maintenance pass, the ready channels' probe.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Sequence

import psycopg

from .._core.channels import control_channel
from .._seam.schedules import (
    ScheduleDue,
)
from .._seam.services import (
    LeaderElect,
    LeaderResign,
    LeadershipReport,
    MaintenancePass,
    MaintenanceReport,
    QueueAdmission,
    QueueProbe,
    RenewalResult,
    RenewedLease,
    RenewLeases,
    WorkerRegistration,
)
from .replies import (
    LeaderElected,
    LeaderResigned,
    LeaseRenewal,
    Maintenance,
    ReadyChannel,
    ReadySwept,
)
from .statements import Params, PgStatements, lease_arrays

logger = logging.getLogger("trioq.pg")


def renewal_params(params: RenewLeases) -> Params:
    """lease_renew_many's parameters: the fences, the worker's row and its admission."""
    return {
        **lease_arrays(params.leases),
        "worker_id": params.worker_id,
        "worker_state": params.worker_state,
        "lease_seconds": params.lease_seconds,
        **_admission_arrays(params.admission),
    }


def _admission_arrays(admission: Sequence[QueueAdmission]) -> Params:
    """The admission snapshot as parallel arrays (unnested into the worker row's jsonb)."""
    return {
        "admission_queues": [a.queue for a in admission],
        "admission_limits": [a.limit for a in admission],
        "admission_concurrency": [a.concurrency for a in admission],
        "admission_reasons": [a.reason for a in admission],
        "admission_causes": [a.cause for a in admission],
        "admission_reduced_for": [a.reduced_for_seconds for a in admission],
    }


def _probes(
    queues: Sequence[str], work_due: Sequence[bool], next_due: Sequence[datetime.datetime | None]
) -> tuple[QueueProbe, ...]:
    return tuple(QueueProbe(*row) for row in zip(queues, work_due, next_due, strict=True))


class PgServiceStatements(PgStatements):
    """`seam.services.ServiceStatements` on PostgreSQL, part of `PgDriver`."""

    __slots__ = ()

    async def lease_renew_many(self, params: RenewLeases) -> RenewalResult:
        rows = await self._retrying(
            "lease_renew_many", renewal_params(params), pool=self._renewal_pool
        )
        leases = LeaseRenewal.id  # a RenewedLease from here on
        return RenewalResult(
            leases=tuple(RenewedLease(*row[leases:]) for row in rows if row[leases] is not None),
            registered=bool(rows[0][LeaseRenewal.registered]),
        )

    async def maintenance_pass(self, params: MaintenancePass) -> MaintenanceReport:
        """One bounded pass, swept only while `params.leader_id` holds the leader seat (or with
        no leader_id). Retried on a lost connection: a repeated pass finds less to do."""
        rows = await self._retrying(
            "maintenance_pass",
            {
                "recover_limit": params.recover_limit,
                "prune_limit": params.prune_limit,
                "retention_seconds": params.retention_seconds,
                "worker_stale_seconds": params.worker_stale_seconds,
                "leader_id": params.leader_id,
                "scheduler": params.scheduler,
                "ttl_seconds": params.ttl_seconds,
                "queues": list(params.queues),
                "deadline_limit": params.deadline_limit,
                "control_channel": control_channel(self.schema),
            },
        )
        row, now = rows[0], rows[0][Maintenance.now]
        leader = bool(row[Maintenance.leader])
        return MaintenanceReport(
            leader=leader,
            recovered=tuple((int(job_id), state) for job_id, state in row[Maintenance.recovered]),
            pruned_jobs=await self._rotate(params.retention_seconds, now) if leader else 0,
            pruned_workers=row[Maintenance.pruned_workers],
            registered=bool(row[Maintenance.registered]),
            now=now,
            probes=_probes(
                row[Maintenance.queues], row[Maintenance.work_due], row[Maintenance.next_due]
            ),
            schedules=ScheduleDue(
                now=now,
                any_schedule=row[Maintenance.any_schedule],
                next_fire_at=row[Maintenance.next_fire_at],
            ),
            deadlines_passed=row[Maintenance.deadlines_passed],
            ready_pending=row[Maintenance.ready_pending],
        )

    async def ready_sweep(self) -> int:
        """ready_sweep: the ready ring's drained slots truncated; the slots that still have
        pages. Retried on a lost connection (a second sweep finds less to do)."""
        rows = await self._retrying("ready_sweep", {})
        logger.debug("ready ring: %d slots truncated", rows[0][ReadySwept.truncated])
        return int(rows[0][ReadySwept.pending])

    async def _rotate(self, retention_seconds: float, now: datetime.datetime) -> int:
        """job_epochs_rotate, when the last call's `next_due` has come (the first pass of this
        driver always calls it, and so does one whose database clock went back): a statement
        or two a day, not one a pass. The jobs it removed."""
        last = self._epochs_rotated
        if last is not None and last[0] <= now < last[1]:
            return 0
        try:
            pruned, next_due = await self._epochs_rotate(retention_seconds)
        except psycopg.Error as exc:
            # Retention is not worth the pass: its recoveries, deadlines and heartbeat are
            # already written and reported, and the epochs are tried again in a minute.
            logger.warning(
                "job_epochs_rotate failed, tried again in a minute: %s",
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            self._epochs_rotated = (now, now + datetime.timedelta(minutes=1))
            return 0
        self._epochs_rotated = (now, next_due)
        return pruned

    async def leader_elect(self, params: LeaderElect) -> LeadershipReport:
        """Retried on a lost connection (taking or extending the seat twice is harmless)."""
        rows = await self._retrying(
            "leader_elect",
            {
                "worker_id": params.worker_id,
                "scheduler": params.scheduler,
                "ttl_seconds": params.ttl_seconds,
                "queues": list(params.queues),
            },
        )
        row = rows[0]
        return LeadershipReport(
            leader=bool(row[LeaderElected.leader]),
            registered=bool(row[LeaderElected.registered]),
            now=row[LeaderElected.now],
            probes=_probes(
                row[LeaderElected.queues],
                row[LeaderElected.work_due],
                row[LeaderElected.next_due],
            ),
        )

    async def leader_resign(self, params: LeaderResign) -> bool:
        [row] = await self._fetch(
            "leader_resign",
            {"worker_id": params.worker_id, "control_channel": control_channel(self.schema)},
        )
        return bool(row[LeaderResigned.resigned])

    async def worker_register(self, params: WorkerRegistration) -> None:
        await self._retrying(
            "worker_register",
            {
                "worker_id": params.worker_id,
                "hostname": params.hostname,
                "pid": params.pid,
                "queues": list(params.queues),
                "concurrency": params.concurrency,
                "queue_concurrency": list(params.queue_concurrency) or None,
                "task_versions": list(params.task_versions),
                "default_tasks": [row[0] for row in params.task_defaults],
                "default_versions": [row[1] for row in params.task_defaults],
                "default_max_attempts": [row[2] for row in params.task_defaults],
                "default_deadlines": [row[3] for row in params.task_defaults],
                "heartbeat_seconds": params.heartbeat_seconds,
            },
        )

    async def worker_unregister(self, worker_id: uuid.UUID) -> None:
        await self._retrying("worker_unregister", {"worker_id": worker_id})

    async def ready_channels(self, queues: Sequence[str]) -> list[str]:
        rows = await self._retrying("ready_channels", {"queues": list(queues)})
        return [row[ReadyChannel.channel] for row in rows]
