"""Retention of finished jobs by whole UTC days (docs/concepts.md, "Storage").

PostgreSQL keeps the jobs that finished on one UTC day in one partition (`job_lane()`,
migration 0038) and removes it whole, once the day ended more than the retention period ago:
no DELETE of a job row, no vacuum debt. The memory driver applies the same rule, and the
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
