"""Database time on trio's clock, for holding early-claimed jobs until their run_at.

Every claim round brackets the database's clock. It was sent at trio time `sent_at`, before the
database read its `now` (the last row's: the statement's end), and its reply arrived at
`replied_at`, after it: the offset between the two clocks (trio minus database) lies in
[`sent_at - now`, `replied_at - now`]. A job held until `run_at + upper bound` never starts
before its run_at. One round's upper bound is late by that round's commit (its WAL flush: 1-7 ms
for a 200-row claim on a durable cluster) and trip back; the smallest upper bound of the recent
rounds is late only by the quickest of them (a fraction of a ms), which is what this keeps.

An old bound is only as good as the clocks' agreement since it was taken. The database's wall
clock may be slewed by NTP or stepped (a failover to a host whose clock differs, a resume):
- a bound ages by `DRIFT_PER_SECOND` (500 ppm, ntpd's largest slew) from when it was taken to
  the release it maps, and lives at most `WINDOW_SECONDS`;
- a bound below the newest round's LOWER bound contradicts it (the database clock stepped back,
  or drifted faster than allowed): it is dropped.
What a step back hides inside the newest round's bracket cannot be told apart: after one, a held
job may start up to that round's `sent_at -> now` time (its checkout and statement: about a ms)
before its run_at. Without steps (NTP steps only beyond 128 ms; it slews smaller corrections,
which the allowance covers) it never starts early.
"""

from __future__ import annotations

import collections
import datetime

import attrs

DRIFT_PER_SECOND = 5e-4
WINDOW_SECONDS = 2.0
MAX_BOUNDS = 32


@attrs.define(eq=False)
class DatabaseClock:
    _bounds: collections.deque[tuple[float, float]] = attrs.field(
        factory=lambda: collections.deque(maxlen=MAX_BOUNDS)
    )  # (trio time of the reply, upper bound of the offset), oldest first

    def observe(self, db_now: datetime.datetime, sent_at: float, replied_at: float) -> None:
        """A round sent at trio time `sent_at` whose reply, carrying database time `db_now`,
        arrived at `replied_at`."""
        now = db_now.timestamp()
        lower = sent_at - now
        bounds = self._bounds
        # `_aged` written out (every claim round runs this over up to MAX_BOUNDS bounds: the
        # calls were 2.7% of a drain's worker CPU), and the deque rebuilt only when a bound
        # goes.
        kept = [
            bound
            for bound in bounds
            if (age := replied_at - bound[0]) <= WINDOW_SECONDS
            and bound[1] + (age if age > 0.0 else 0.0) * DRIFT_PER_SECOND >= lower
        ]
        if len(kept) != len(bounds):
            bounds = self._bounds = collections.deque(kept, maxlen=MAX_BOUNDS)
        bounds.append((replied_at, replied_at - now))

    def to_trio(self, db_time: datetime.datetime) -> float:
        """The trio time by which `db_time` has surely passed (after at least one
        `observe`): each bound aged to the release it maps."""
        target = db_time.timestamp()
        return min(
            target + bound + max(0.0, target + bound - seen) * DRIFT_PER_SECOND
            for seen, bound in self._bounds
        )


def _aged(bound: tuple[float, float], at: float) -> float:
    seen, offset = bound
    return offset + max(0.0, at - seen) * DRIFT_PER_SECOND
