"""Cron schedules as pure maths: validation, fire times and the misfire policy.

Nothing here reads a clock: `now` (database time) is always a parameter. Expressions are
parsed and iterated by `croniter` (5 fields, or 6 with seconds as the last field); time zones
come from `zoneinfo`, so "0 9 * * *" in Europe/Paris fires at 09:00 local time on both sides
of a DST change.

A schedule stores `next_fire_at`, the earliest fire time not yet handled. When the scheduler
reaches it (`plan_fires`), every fire time in [next_fire_at, now] is *due*; the misfire policy
decides which of them are enqueued:

- `all`: every due fire time, at most `catchup_limit` of them (the most recent ones);
- `latest`: only the most recent due fire time;
- `skip`: only fire times reached within `MISFIRE_GRACE_SECONDS` of when they were due;
  anything older was missed (downtime) and is dropped.

Fire times on time (the normal case: one due fire, a few milliseconds late) are enqueued by
every policy; the policies differ only after a downtime.
"""

from __future__ import annotations

import datetime
import enum
import zoneinfo
from collections.abc import Iterator

import attrs
from croniter import croniter

MISFIRE_GRACE_SECONDS = 60.0
DEFAULT_CATCHUP_LIMIT = 100
MAX_CATCHUP_LIMIT = 10_000
# Fire times walked one by one beyond the catch-up limit, so `missed` is exact after an
# ordinary downtime; past that the plan jumps to the end (a week of a per-second schedule).
EXACT_WALK = 1_000


class Misfire(enum.StrEnum):
    SKIP = "skip"
    LATEST = "latest"
    ALL = "all"


def validate_cron(expression: object) -> str:
    """Return `expression` if croniter accepts it, else raise ValueError naming the field."""
    if not isinstance(expression, str) or not croniter.is_valid(expression.strip()):
        raise ValueError(
            f"cron: {expression!r} is not a valid cron expression (5 fields 'minute hour "
            f"day month weekday', e.g. '0 9 * * *', or 6 with seconds last)"
        )
    return expression.strip()


def validate_timezone(name: object) -> str:
    """Return `name` if it is an IANA time zone zoneinfo knows, else raise ValueError."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"timezone: {name!r} must be an IANA time zone name such as 'UTC'")
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"timezone: {name!r} is not a known IANA time zone (e.g. 'UTC', 'Europe/Paris')"
        ) from None
    return name


def validate_misfire(policy: object) -> Misfire:
    if not isinstance(policy, str) or policy not in {m.value for m in Misfire}:
        raise ValueError(
            f"misfire: {policy!r} must be one of {', '.join(repr(m.value) for m in Misfire)}"
        )
    return Misfire(policy)


def validate_catchup_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CATCHUP_LIMIT:
        raise ValueError(f"catchup_limit: {limit!r} must be an integer in [1, {MAX_CATCHUP_LIMIT}]")
    return limit


@attrs.frozen
class Cron:
    """A validated cron expression in a time zone."""

    expression: str = attrs.field(converter=validate_cron)
    timezone: str = attrs.field(default="UTC", converter=validate_timezone)

    def fire_times_after(self, moment: datetime.datetime) -> Iterator[datetime.datetime]:
        """Fire times strictly after `moment` (aware), in UTC, ascending, without end."""
        if moment.tzinfo is None:
            raise ValueError("moment: must be timezone-aware")
        local = moment.astimezone(zoneinfo.ZoneInfo(self.timezone))
        iterator = croniter(self.expression, local)
        while True:
            yield iterator.get_next(datetime.datetime).astimezone(datetime.UTC)

    def next_after(self, moment: datetime.datetime) -> datetime.datetime:
        return next(self.fire_times_after(moment))


@attrs.frozen
class FirePlan:
    """What to do with one schedule now: enqueue `fires`, then wait for `next_fire_at`."""

    fires: tuple[datetime.datetime, ...]
    missed: int  # due fire times the policy dropped (a lower bound after a very long downtime)
    next_fire_at: datetime.datetime


def plan_fires(
    cron: Cron,
    next_fire_at: datetime.datetime,
    now: datetime.datetime,
    misfire: Misfire,
    catchup_limit: int = DEFAULT_CATCHUP_LIMIT,
) -> FirePlan:
    """The fire times due at `now` (from `next_fire_at` on) that `misfire` enqueues.

    The work is bounded by `catchup_limit` whatever the downtime: past the limit, the walk
    jumps to the last `catchup_limit` fire times before `now`.
    """
    if next_fire_at > now:
        return FirePlan((), 0, next_fire_at)
    recent, dropped = _recent_fires(cron, next_fire_at, now, catchup_limit)
    if misfire is Misfire.ALL:
        chosen = recent
    elif misfire is Misfire.LATEST:
        chosen = recent[-1:]
    else:
        grace = datetime.timedelta(seconds=MISFIRE_GRACE_SECONDS)
        chosen = tuple(fire for fire in recent if now - fire <= grace)
    return FirePlan(chosen, dropped + len(recent) - len(chosen), cron.next_after(now))


def _recent_fires(
    cron: Cron, first: datetime.datetime, now: datetime.datetime, limit: int
) -> tuple[tuple[datetime.datetime, ...], int]:
    """The last `limit` fire times in [first, now] ascending, and how many earlier ones were
    left out (exact when the walk fits in limit + EXACT_WALK fire times, else a lower bound)."""
    fires: list[datetime.datetime] = []
    for fire in _fires_from(cron, first):
        if fire > now:
            return tuple(fires[-limit:]), max(0, len(fires) - limit)
        fires.append(fire)
        if len(fires) > limit + EXACT_WALK:
            break
    # A long downtime: take the last `limit` fire times walking back from `now` instead of
    # walking the whole gap forward one fire at a time.
    latest = _last_fires_until(cron, now, limit, after=fires[-1])
    return latest, len(fires)


def _fires_from(cron: Cron, first: datetime.datetime) -> Iterator[datetime.datetime]:
    yield first
    yield from cron.fire_times_after(first)


def _last_fires_until(
    cron: Cron, now: datetime.datetime, limit: int, *, after: datetime.datetime
) -> tuple[datetime.datetime, ...]:
    """Up to `limit` fire times in (after, now], the most recent ones, ascending."""
    local = now.astimezone(zoneinfo.ZoneInfo(cron.timezone))
    # croniter's get_prev is strictly before its start; nudge so a fire exactly at `now` counts.
    iterator = croniter(cron.expression, local + datetime.timedelta(microseconds=1))
    fires: list[datetime.datetime] = []
    while len(fires) < limit:
        fire = iterator.get_prev(datetime.datetime).astimezone(datetime.UTC)
        if fire <= after:
            break
        fires.append(fire)
    return tuple(reversed(fires))


def first_fire(cron: Cron, anchor: datetime.datetime) -> datetime.datetime:
    """A new (or re-timed) schedule fires first at the first fire time after its anchor."""
    return cron.next_after(anchor)


def fire_dedup_key(schedule: str, fire_at: datetime.datetime) -> str:
    """The unique key of one occurrence: the same (schedule, fire time) is enqueued once."""
    moment = fire_at.astimezone(datetime.UTC).isoformat(timespec="microseconds")
    return f"schedule:{schedule}:{moment}"
