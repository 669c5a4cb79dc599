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

# A ready ring slot is written for 5 s and drains for 15 (functions/ready_slot.sql): a sweep
# every 2 s truncates a drained slot within a few seconds, so under a pinned horizon at most
# about two slots' dead entries wait (once per maintenance interval, 10-20 s by default, a slot
# was often reused before its turn came: the claims then stepped over several slots' worth).
READY_SWEEP_EVERY = 2.0


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
    _sweep_wanted: trio.Event = attrs.Factory(trio.Event)

    def statistics(self) -> MaintenanceStatistics:
        return MaintenanceStatistics(
            self._passes, self._recovered, self._pruned_jobs, self._pruned_workers, self._healthy
        )

    async def run(self) -> None:
        """The leader's loop: a pass at once (a new leader recovers what its dead predecessor
        left), then one per interval (jittered), each sent in place of a claim poll. Returns
        when a pass finds the seat taken by another worker. Safe to cancel: a cancelled pass
        rolls back."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._ready_sweeps)
            poll_due = None
            while await self.sweep(poll_due):
                await trio.sleep(self.interval * (0.8 + 0.4 * random.random()))
                poll_due = await self.polls.wait_poll_due(at_most=ALIGN_SHARE * self.interval)
            nursery.cancel_scope.cancel()

    async def _ready_sweeps(self) -> None:
        """The leader's sweep of the ready ring: once a pass reports a slot with pages, every
        READY_SWEEP_EVERY seconds until no slot has any (an idle ring sends nothing)."""
        while True:
            await self._sweep_wanted.wait()
            self._sweep_wanted = trio.Event()
            pending = 1
            while pending:
                try:
                    pending = await self.driver.ready_sweep()
                except Exception as exc:
                    level = lost_connection_level(self.driver.is_connection_lost, exc)
                    log.log(level, "ready ring sweep failed: %s", exc)
                    pending = 0  # the next pass that finds pages starts the sweeps again
                if pending:
                    await trio.sleep(READY_SWEEP_EVERY)

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
        if report.ready_pending:
            self._sweep_wanted.set()
        if self.on_pass is not None:
            self.on_pass(report)
        if not report.registered:
            await self.register_again()
