"""The watchdog: cancels, as lost, every handler whose lease the database has not confirmed
for 90% of the lease. Past that point another worker may recover and run the job, so this one
must stop first (renewals failing, the database away, or the pool starved)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs
import trio

from ..job.claim_loop import LEASE_MARGIN, ClaimLoop

log = logging.getLogger("trioq.worker")

# The share of the lease after which an unconfirmed handler is cancelled.
MARGIN = LEASE_MARGIN


@attrs.frozen
class WatchdogStatistics:
    cancelled: int  # handlers cancelled because their lease went unconfirmed


@attrs.define(eq=False)
class Watchdog:
    loops: Sequence[ClaimLoop]
    lease_seconds: float
    _cancelled: int = 0

    def statistics(self) -> WatchdogStatistics:
        return WatchdogStatistics(self._cancelled)

    async def run(self) -> None:
        """Until cancelled: wake at the earliest confirmation deadline (at least every
        lease/3, so handlers started meanwhile are watched)."""
        while True:
            wake_at = self._check(trio.current_time())
            await trio.sleep_until(wake_at)

    def _check(self, now: float) -> float:
        """Cancel the handlers past their deadline; returns when to look again."""
        margin = MARGIN * self.lease_seconds
        wake_at = now + self.lease_seconds / 3
        for loop in self.loops:
            for entry in list(loop.running.values()):
                if entry.cancel_reason is not None:
                    continue
                deadline = entry.confirmed_at + margin
                if deadline > now:
                    wake_at = min(wake_at, deadline)
                    continue
                log.warning(
                    "lease of job %d attempt %d not confirmed for %.1fs: cancelling",
                    entry.job.id,
                    entry.job.attempt,
                    now - entry.confirmed_at,
                )
                self._cancelled += 1
                entry.cancel("unconfirmed")  # settled by a fenced release
        return wake_at
