"""Retention of finished jobs by whole UTC days (docs/concepts.md, "Storage").

A finished job is gone at the first rotation after its finish day (UTC) ended more than the
retention period ago. PostgreSQL keeps a job's record, outcome and satellites in the partitions
of its id's epoch (a UTC day of ids, migration 0049) and empties an ended epoch whole, its
survivors copied aside (satellite_epochs_rotate()): no DELETE of a job row, no vacuum debt, as
long as few of the epoch's jobs survive. The memory driver applies the same rule, and the
conformance checks hold the two to it.
"""

from __future__ import annotations

import datetime
import math

DAY_SECONDS = 86_400


def day_end(moment: datetime.datetime) -> datetime.datetime:
    """The end of the UTC day `moment` falls in (the start of the next one)."""
    day = math.floor(moment.timestamp() / DAY_SECONDS)
    return datetime.datetime.fromtimestamp((day + 1) * DAY_SECONDS, tz=datetime.UTC)


def seconds_to_day_end(moment: datetime.datetime) -> float:
    return (day_end(moment) - moment).total_seconds()


def expired(finished_at: datetime.datetime, cutoff: datetime.datetime) -> bool:
    """Whether a job that finished at `finished_at` is gone by `cutoff` (now - retention)."""
    return day_end(finished_at) <= cutoff
