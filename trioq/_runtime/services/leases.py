"""The lease renewer: ONE statement per renewal interval (lease/3) extends every lease this
worker holds and heartbeats its worker row, writing the admission snapshot (migration 0008).

A worker holding no leases sends nothing here unless its admission snapshot changed (then early,
rate-limited by admission control): its heartbeat rides the leader election or the maintenance
pass it sends anyway (leadership.py), so an idle worker's only periodic statements are the ones
that also stand in for its claim polls (polls.py).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from ..._seam.driver import Driver
from ..._seam.lease import Lease
from ..._seam.services import QueueAdmission, RenewedLease, RenewLeases
from ..job.claim_loop import ClaimLoop
from .admission import AdmissionControl
from .metrics import WorkerMetrics
from .outage import lost_connection_level

log = logging.getLogger("trioq.worker")
# A cancel hint renews early at most this often: a notification storm (any login may NOTIFY)
# costs at most one renewal statement a second.
CHECK_EVERY = 1.0


@attrs.frozen
class LeaseRenewerStatistics:
    renewals: int  # renewal statements that succeeded
    lost: int  # handlers cancelled because the database no longer had their lease
    healthy: bool  # the last renewal succeeded (or there was nothing to renew)
    seconds_since_renewal: float


@attrs.define(eq=False)
class LeaseRenewer:
    driver: Driver
    worker_id: uuid.UUID
    loops: Sequence[ClaimLoop]
    lease_seconds: float
    metrics: WorkerMetrics
    admission: AdmissionControl
    draining: Callable[[], bool]
    register_again: Callable[[], Awaitable[None]]
    last_renewal: float = attrs.field(factory=trio.current_time)
    # When the last renewal that answered was sent (or the renewer last held nothing): the
    # leases it extended run out a lease later.
    confirmed_from: float = attrs.field(factory=trio.current_time)
    healthy: bool = True
    _renewals: int = 0
    _lost: int = 0
    _check: trio.Event = attrs.field(factory=trio.Event)
    _checked_at: float = -CHECK_EVERY

    @property
    def interval(self) -> float:
        return self.lease_seconds / 3

    def age(self) -> float:
        """Seconds since the leases were last confirmed (0 while there is nothing to renew)."""
        return trio.current_time() - self.last_renewal

    def statistics(self) -> LeaseRenewerStatistics:
        return LeaseRenewerStatistics(self._renewals, self._lost, self.healthy, self.age())

    async def run(self) -> None:
        """Renew every interval until cancelled.

        Each attempt is bounded by the life left in the leases it extends (at least the
        interval), so a slow database or a starved pool cannot hold renewals back silently;
        the watchdog acts on what is not confirmed. A lease the
        database no longer returns is lost: its handler is cancelled at once.
        """
        while True:
            await self._wait_renewal()
            self._check = trio.Event()  # this renewal reads every stored cancel request
            leases = [lease for loop in self.loops for lease in loop.renewable_leases()]
            admission = self.admission.snapshot()
            if not leases and not self.admission.unpublished(admission):
                self.last_renewal = self.confirmed_from = trio.current_time()  # not late
                self.healthy = True
                continue
            await self._renew(leases, admission)

    def check_soon(self) -> None:
        """A cancel hint named a job running here: renew now (at most once a second), so its
        stored cancel request is read without waiting for the renewal interval."""
        self._check.set()

    async def _wait_renewal(self) -> None:
        """The renewal interval, or less: early (rate-limited by admission control) when the
        admission snapshot the heartbeat writes changed, or when a cancel hint came
        (`check_soon`, at most once every CHECK_EVERY)."""
        async with trio.open_nursery() as nursery:

            async def first(wait: Callable[[], Awaitable[None]]) -> None:
                await wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(first, functools.partial(self.admission.wait_renewal, self.interval))
            nursery.start_soon(first, self._wait_check)

    async def _wait_check(self) -> None:
        await self._check.wait()
        await trio.sleep_until(self._checked_at + CHECK_EVERY)
        self._checked_at = trio.current_time()

    async def _renew(self, leases: list[Lease], admission: tuple[QueueAdmission, ...]) -> None:
        sent_at = trio.current_time()
        renewed = None
        # A slow renewal is waited for until the leases it extends run out (at least one
        # interval): cut off at lease/3, a database answering in 0.4 of the lease failed every
        # renewal and the watchdog cancelled every handler. The watchdog still acts at 90% of
        # the lease on what this has not confirmed by then.
        with trio.move_on_after(
            max(self.interval, self.confirmed_from + self.lease_seconds - sent_at)
        ):
            try:
                renewed = await self.driver.lease_renew_many(
                    RenewLeases(
                        worker_id=self.worker_id,
                        worker_state="draining" if self.draining() else "running",
                        lease_seconds=self.lease_seconds,
                        leases=tuple(leases),
                        admission=admission,
                    )
                )
            except Exception as exc:
                level = lost_connection_level(self.driver.is_connection_lost, exc)
                log.log(level, "lease renewal failed: %s", exc)
        if renewed is None:
            self.healthy = False
            return
        self.healthy = True
        self.admission.published(admission if renewed.registered else ())
        self._renewals += 1
        self.metrics.lease_renewals.inc()
        self.last_renewal = trio.current_time()
        self.confirmed_from = sent_at
        self._apply(set(leases), renewed.leases, sent_at)
        if not renewed.registered:
            await self.register_again()

    def _apply(
        self, requested: set[Lease], renewed: tuple[RenewedLease, ...], sent_at: float
    ) -> None:
        still_owned = {row.id: row for row in renewed}
        for loop in self.loops:
            for waiting in loop.prefetched():  # claimed ahead, not started: never start a lost one
                if waiting.job.lease not in requested:
                    continue
                row = still_owned.get(waiting.job.id)
                if row is None:
                    log.warning(
                        "lost ownership of prefetched job %d attempt %d: dropping it",
                        waiting.job.id,
                        waiting.job.attempt,
                    )
                    self._lost += 1
                    loop.drop_prefetched(waiting)
                elif row.confirmed:  # a cancel request is seen once it runs (next renewal)
                    waiting.confirmed_at = max(waiting.confirmed_at, sent_at)
            for entry in list(loop.running.values()):
                if entry.job.lease not in requested or entry.cancel_reason is not None:
                    continue
                row = still_owned.get(entry.job.id)
                if row is None:
                    log.warning(
                        "lost ownership of job %d attempt %d (lease %s): cancelling",
                        entry.job.id,
                        entry.job.attempt,
                        entry.job.lease_token,
                    )
                    self._lost += 1
                    entry.cancel("lost")
                    continue
                if row.confirmed:  # an unconfirmed row (locked elsewhere) was not extended
                    entry.confirmed_at = max(entry.confirmed_at, sent_at)
                if row.cancel_requested:
                    entry.cancel("cancelled")
