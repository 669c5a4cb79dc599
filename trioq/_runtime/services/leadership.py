"""Leadership: ONE elected worker per schema runs maintenance and the scheduler (River's
leader, Oban's Peer); the others only stand for election.

The seat is a row with a TTL (migration 0010). A follower tries to take it once per maintenance
interval (`leader_elect`, which also heartbeats and probes the worker's queues in place of a
claim poll); the leader keeps it with each maintenance pass. A leader that drains or stops gives
the seat up and tells the others on the control channel, so one of them takes it at once; a
leader that dies keeps it until the TTL runs out, so recovery of expired leases happens within
about max(lease, TTL) + one maintenance interval.

A worker with the scheduler off (`run_scheduler=False`) still stands for election and runs
maintenance when it leads; a candidate that runs the scheduler takes the seat from it at its
next attempt, so schedules keep firing in a mixed fleet.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Awaitable, Callable

import attrs
import trio

from ..._seam.driver import Driver
from ..._seam.services import LeaderElect, LeaderResign
from .maintenance import Maintenance
from .outage import lost_connection_level
from .polls import ALIGN_SHARE, PollSharing
from .scheduler import Scheduler

log = logging.getLogger("trioq.worker")

# A resignation that cannot be written in this time is left to the seat's TTL.
RESIGN_TIMEOUT = 2.0


@attrs.frozen
class LeadershipStatistics:
    leader: bool  # this worker holds the seat (as far as its last statement knows)
    elections: int  # election statements that succeeded (sent while a follower)
    terms: int  # times this worker took the seat


@attrs.define(eq=False)
class Leadership:
    driver: Driver
    worker_id: uuid.UUID
    interval: float  # between a follower's attempts (the maintenance interval)
    ttl_seconds: float
    polls: PollSharing
    maintenance: Maintenance
    register_again: Callable[[], Awaitable[None]]
    scheduler: Scheduler | None = None
    on_change: Callable[[bool], None] | None = None  # test hook: leadership taken / lost
    _leader: bool = False
    _elections: int = 0
    _terms: int = 0
    _wake: trio.Event = attrs.field(factory=trio.Event)
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)

    @property
    def is_leader(self) -> bool:
        return self._leader

    def statistics(self) -> LeadershipStatistics:
        return LeadershipStatistics(self._leader, self._elections, self._terms)

    def wake(self) -> None:
        """The seat was given up (a `leader` message on the control channel): try now."""
        self._wake.set()

    def stop(self) -> None:
        """Stop standing (a drain): leave the seat, if held, and end `run`."""
        self._scope.cancel()

    async def run(self) -> None:
        """Stand for election until stopped or cancelled; lead while elected. On the way out
        the seat, if held, is given up (shielded, bounded)."""
        try:
            with self._scope:
                poll_due = None
                while True:
                    if await self._elect(poll_due):
                        await self._lead()
                    poll_due = await self._wait_next_attempt()
        finally:
            await self._resign()

    async def _wait_next_attempt(self) -> float | None:
        with trio.move_on_after(self.interval * (0.8 + 0.4 * random.random())):
            await self._wake.wait()
        if self._wake.is_set():
            self._wake = trio.Event()  # the seat is free: no reason to wait for a poll
            return None
        return await self.polls.wait_poll_due(at_most=ALIGN_SHARE * self.interval)

    async def _elect(self, poll_due: float | None) -> bool:
        params = LeaderElect(
            worker_id=self.worker_id,
            ttl_seconds=self.ttl_seconds,
            scheduler=self.scheduler is not None,
            queues=self.polls.queues,
        )
        try:
            with self.polls.standing_in(poll_due) as answer:
                report = await self.driver.leader_elect(params)
                answer.set(report.now, report.probes)
        except Exception as exc:
            level = lost_connection_level(self.driver.is_connection_lost, exc)
            log.log(level, "leader election failed: %s", exc)
            return False
        self._elections += 1
        if not report.registered:
            await self.register_again()
        return report.leader

    async def _lead(self) -> None:
        self._set_leader(True)
        log.info("worker %s is the leader (maintenance, scheduler)", self.worker_id)
        async with trio.open_nursery() as nursery:
            if self.scheduler is not None:
                nursery.start_soon(self.scheduler.run, name="trioq scheduler")
            await self.maintenance.run()  # returns when the seat was taken
            nursery.cancel_scope.cancel()
        log.info("worker %s is no longer the leader", self.worker_id)
        self._set_leader(False)

    def _set_leader(self, leader: bool) -> None:
        self._leader = leader
        self._terms += leader
        if self.on_change is not None:
            self.on_change(leader)

    async def _resign(self) -> None:
        if not self._leader:
            return
        self._set_leader(False)
        with trio.CancelScope(shield=True), trio.move_on_after(RESIGN_TIMEOUT):
            try:
                await self.driver.leader_resign(LeaderResign(self.worker_id))
            except Exception as exc:
                log.warning("could not give up the leader seat (its TTL frees it): %s", exc)
