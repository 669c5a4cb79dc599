"""Maintenance: lease recovery, stale-worker pruning and retention, run by the elected leader
only (leadership.py), one bounded statement per pass.

Each pass also extends the leader's seat (so the leader sends no separate election statement),
heartbeats its worker row, probes its queues in place of the next claim poll (polls.py) and
reads the schedule due first for the scheduler, which therefore needs no idle read of its own.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Awaitable, Callable

import attrs
import trio

from ..._seam.driver import Driver
from ..._seam.services import MaintenancePass, MaintenanceReport
from .outage import lost_connection_level
from .polls import ALIGN_SHARE, PollSharing
from .scheduler import Scheduler

log = logging.getLogger("trioq.worker")


@attrs.frozen
class MaintenanceStatistics:
    passes: int  # maintenance statements that succeeded
    recovered: int  # jobs whose expired lease this worker recovered
    pruned_jobs: int
    pruned_workers: int
    healthy: bool  # the last pass succeeded


@attrs.define(eq=False)
class Maintenance:
    driver: Driver
    worker_id: uuid.UUID
    interval: float
    ttl_seconds: float
    retention_seconds: float
    polls: PollSharing
    register_again: Callable[[], Awaitable[None]]
    scheduler: Scheduler | None = None  # the leader's scheduler, told the next fire time
    on_pass: Callable[[MaintenanceReport], None] | None = None  # test hook
    _passes: int = 0
    _recovered: int = 0
    _pruned_jobs: int = 0
    _pruned_workers: int = 0
    _healthy: bool = True

    def statistics(self) -> MaintenanceStatistics:
        return MaintenanceStatistics(
            self._passes, self._recovered, self._pruned_jobs, self._pruned_workers, self._healthy
        )

    async def run(self) -> None:
        """The leader's loop: a pass at once (a new leader recovers what its dead predecessor
        left), then one per interval (jittered), each sent in place of a claim poll. Returns
        when a pass finds the seat taken by another worker. Safe to cancel: a cancelled pass
        rolls back."""
        poll_due = None
        while await self.sweep(poll_due):
            await trio.sleep(self.interval * (0.8 + 0.4 * random.random()))
            poll_due = await self.polls.wait_poll_due(at_most=ALIGN_SHARE * self.interval)

    async def sweep(self, poll_due: float | None = None) -> bool:
        """One pass, repeated while a batch comes back full; False once not the leader. A
        failed pass keeps the leadership it had (the next one tells)."""
        params = MaintenancePass(
            retention_seconds=self.retention_seconds,
            leader_id=self.worker_id,
            scheduler=self.scheduler is not None,
            ttl_seconds=self.ttl_seconds,
            queues=self.polls.queues,
        )
        while True:
            try:
                with self.polls.standing_in(poll_due) as answer:
                    report = await self.driver.maintenance_pass(params)
                    answer.set(report.now, report.probes)
            except Exception as exc:
                self._healthy = False
                level = lost_connection_level(self.driver.is_connection_lost, exc)
                log.log(level, "maintenance pass failed: %s", exc)
                return True
            await self._record(report)
            if not report.leader:
                return False
            full = (
                len(report.recovered) >= params.recover_limit
                or report.pruned_jobs >= params.prune_limit
                or report.deadlines_passed >= params.deadline_limit
            )
            if not full:
                return True
            poll_due = None

    async def _record(self, report: MaintenanceReport) -> None:
        self._healthy = True
        self._passes += 1
        self._recovered += len(report.recovered)
        self._pruned_jobs += report.pruned_jobs
        self._pruned_workers += report.pruned_workers
        if report.recovered:
            log.warning("recovered %d jobs with expired leases", len(report.recovered))
        if report.deadlines_passed:
            log.info("cancelled %d jobs past their deadline", report.deadlines_passed)
        if self.scheduler is not None and report.schedules is not None and report.leader:
            self.scheduler.observed(report.schedules)
        if self.on_pass is not None:
            self.on_pass(report)
        if not report.registered:
            await self.register_again()
