"""Cluster-wide limits of a queue: a global concurrency limit and a rate limit (pure).

A rate `N/PERIOD` means: at most N starts in any window of PERIOD, whichever workers start
them. The gate below is the one rule both drivers apply (PostgreSQL in
`queue_limit_gate`/`queue_limit_spend`, migration 0023; the memory driver in
`_memory/limits.py`): a sliding log of the queue's last N start times, so a burst of N may
start at once and the next start waits until the oldest of them leaves the window.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence

import attrs

MAX_GLOBAL_LIMIT = 100_000
MAX_RATE_ALLOWED = 10_000
PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_PERIOD_NAMES = {"second": "s", "sec": "s", "minute": "m", "min": "m", "hour": "h"}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*([a-z]+)\s*$")

LIMIT_FORM = f"a whole number from 1 to {MAX_GLOBAL_LIMIT}, or none"
RATE_FORM = (
    f"N/PERIOD, N a whole number from 1 to {MAX_RATE_ALLOWED} and PERIOD one of s, m, h "
    "(for example 100/m or 5/s), or none"
)


@attrs.frozen
class Rate:
    """At most `allowed` starts in any window of `period` seconds."""

    allowed: int
    period: float

    def __str__(self) -> str:
        for unit, seconds in PERIODS.items():
            if seconds == self.period:
                return f"{self.allowed}/{unit}"
        return f"{self.allowed}/{self.period:g}s"


def parse_global_limit(field: str, value: object) -> int | None:
    """A global limit from code (an int or None) or the command line ("5", "none")."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    number: object = value
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    if type(number) is not int or not 1 <= number <= MAX_GLOBAL_LIMIT:
        raise ValueError(f"{field} {value!r}: expected {LIMIT_FORM}")
    return number


def parse_rate(field: str, value: object) -> Rate | None:
    """A rate from code ("100/m", a `Rate`, None) or the command line ("5/s", "none")."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if isinstance(value, Rate):
        value = str(value)
    match = _RATE.match(value) if isinstance(value, str) else None
    unit = match and _PERIOD_NAMES.get(match[2], match[2])
    if match is None or unit not in PERIODS or not 1 <= int(match[1]) <= MAX_RATE_ALLOWED:
        raise ValueError(f"{field} {value!r}: expected {RATE_FORM}")
    return Rate(int(match[1]), PERIODS[unit])


@attrs.frozen
class Gate:
    """What a limited queue's claim may take now: `allowed` of the requested jobs, and when
    the next start is allowed once those have started (None: now, or no rate)."""

    allowed: int
    next_start_at: datetime.datetime | None = None
    at_global_limit: bool = False  # the global limit is reached once these have started


def gate(
    requested: int,
    now: datetime.datetime,
    *,
    global_limit: int | None,
    running: int,
    rate: Rate | None,
    recent_starts: Sequence[datetime.datetime],
) -> Gate:
    """How many of `requested` jobs a claim at `now` may start (`recent_starts`: the log of
    the queue's newest start times, oldest first)."""
    allowed = requested
    if global_limit is not None:
        allowed = min(allowed, max(global_limit - running, 0))
    full = global_limit is not None and running + allowed >= global_limit
    if rate is None:
        return Gate(allowed, at_global_limit=full)
    window_start = now - datetime.timedelta(seconds=rate.period)
    counted = sorted(at for at in recent_starts if at > window_start)
    allowed = min(allowed, max(rate.allowed - len(counted), 0))
    return Gate(allowed, next_start_at(counted, allowed, now, rate), full)


def next_start_at(
    counted: Sequence[datetime.datetime], starting: int, now: datetime.datetime, rate: Rate
) -> datetime.datetime | None:
    """When the next start is allowed after `starting` more at `now` (None: at once)."""
    full = len(counted) + starting - rate.allowed
    if full < 0:
        return None
    oldest = counted[full] if full < len(counted) else now
    return oldest + datetime.timedelta(seconds=rate.period)


def spend(
    recent_starts: Sequence[datetime.datetime], started: int, now: datetime.datetime, rate: Rate
) -> tuple[datetime.datetime, ...]:
    """The log after `started` starts at `now`: the newest `rate.allowed` start times."""
    log = sorted([*recent_starts, *([now] * started)])
    return tuple(log[-rate.allowed :])
