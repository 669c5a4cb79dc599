"""Database time on trio's clock, for holding early-claimed jobs until their run_at.

Every claim round brackets the database's clock: its reply carries the database time as the
statement ended (`now`, the last row's), and it arrived at trio time `replied_at`, later than
that moment by the commit (its WAL flush: 1-7 ms for a 200-row claim on a durable cluster) and
the trip back. So `replied_at - now` is an upper bound of the offset between the two clocks, and
a job held until `run_at + bound` never starts before its run_at. One round's bound is late by
that round's commit; the smallest bound of the recent rounds is late only by the quickest one
(a fraction of a ms), which is what this keeps.

Clocks drift (the database's wall clock is slewed by NTP; trio's is monotonic): a bound ages by
an allowance of `DRIFT_PER_SECOND` (100 ppm, beyond any sane slew), and bounds older than
`WINDOW_SECONDS` are dropped, so an old tight bound can never make a job start early.
"""

from __future__ import annotations

import collections
import datetime

import attrs

DRIFT_PER_SECOND = 1e-4
WINDOW_SECONDS = 10.0
MAX_BOUNDS = 64


@attrs.define(eq=False)
class DatabaseClock:
    _bounds: collections.deque[tuple[float, float]] = attrs.field(
        factory=lambda: collections.deque(maxlen=MAX_BOUNDS)
    )  # (trio time of the reply, offset bound)

    def observe(self, db_now: datetime.datetime, replied_at: float) -> None:
        """A reply that arrived at trio time `replied_at` carried database time `db_now`."""
        bounds = self._bounds
        while bounds and replied_at - bounds[0][0] > WINDOW_SECONDS:
            bounds.popleft()
        bounds.append((replied_at, replied_at - db_now.timestamp()))

    def to_trio(self, db_time: datetime.datetime, at: float) -> float:
        """The trio time by which `db_time` has surely passed, as known at trio time `at`
        (after at least one `observe`)."""
        offset = min(bound + (at - seen) * DRIFT_PER_SECOND for seen, bound in self._bounds)
        return db_time.timestamp() + offset
