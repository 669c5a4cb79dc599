"""One summary of a database outage instead of a WARNING per failed round.

Every service of a worker (each queue's claim loop, lease renewal, leader election,
maintenance, the scheduler) retries on its own when the connection is lost, and each used to
log every failed round: a 17 s outage wrote about 50 WARNING records. The worker's driver
reports each call's outcome here (trioq/_runtime/services/metrics.py wraps every driver
method); this logs the first lost connection once, a reminder while it lasts, and the
reconnection with the outage's length and the number of failed calls. The services log their
own lost-connection failures at DEBUG; any other error stays a WARNING where it happens.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable

import attrs
import trio

log = logging.getLogger("trioq.worker")

REMINDER_SECONDS = 60.0  # while the database stays away, one line a minute says so


@attrs.define(eq=False)
class DatabaseOutage:
    """Tracks whether the database is reachable, from the outcome of every driver call."""

    is_connection_lost: Callable[[BaseException], bool]
    _since: float | None = None  # trio time of the first failure of this outage
    _since_wall: datetime.datetime | None = None
    _failed: int = 0
    _last_failure: float = 0.0
    _reminded_at: float = 0.0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, statement: str, error: BaseException) -> None:
        """A driver call raised: counted when it is a lost connection (logged once)."""
        if not self.is_connection_lost(error):
            return
        now = trio.current_time()
        self._failed += 1
        self._last_failure = now
        if self._since is None:
            self._since, self._reminded_at = now, now
            self._since_wall = datetime.datetime.now(datetime.UTC)
            log.warning(
                "database unreachable since %s (%s: %s); every service retries, and their "
                "failures are counted here rather than logged one by one",
                _clock(self._since_wall),
                statement,
                _one_line(error),
            )
        elif now - self._reminded_at >= REMINDER_SECONDS:
            self._reminded_at = now
            log.warning(
                "database still unreachable since %s (%.0f s): %d call(s) failed so far",
                _clock(self._since_wall),
                now - self._since,
                self._failed,
            )

    def succeeded(self) -> None:
        """A driver call returned: an outage in progress is over. Its length is from the first
        failed call to the last (an idle worker may call again only a while later)."""
        if self._since is None:
            return
        log.warning(
            "database reachable again: calls failed for %.1f s from %s, %d call(s) in all",
            self._last_failure - self._since,
            _clock(self._since_wall),
            self._failed,
        )
        self._since, self._since_wall, self._failed = None, None, 0


def lost_connection_level(
    is_connection_lost: Callable[[BaseException], bool], error: BaseException
) -> int:
    """The level a service logs a failed round at: DEBUG for a lost connection (the outage's
    summary says it), WARNING for anything else."""
    return logging.DEBUG if is_connection_lost(error) else logging.WARNING


def _clock(moment: datetime.datetime | None) -> str:
    return "?" if moment is None else moment.isoformat(timespec="seconds")


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
