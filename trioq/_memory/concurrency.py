"""Concurrency keys in memory (the concurrency_holds, concurrency_limits, concurrency_rates
and concurrency_rate_starts tables).

A claim runs in one step here, so a key's slots are counted from the rows themselves: the
running rows of that key in any queue, and a rated key's starts are one sliding log (the
rule of `_core/limits.py`). The SQL keeps a holds row per running job and a row per start
slot instead, because its claimers race (migrations 0027 and 0028).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence

import attrs

from .._core import limits as rules
from .._core.concurrency import KeyLimit, ReadyJob, claim_limit, limit_for, rate_for
from .._seam.admin import ConcurrencyKeyStatus, ConcurrencyLimit, ConcurrencyRate, KeyRateStatus
from .state import MemoryState, Row


def running_per_key(state: MemoryState) -> dict[str, list[Row]]:
    """Each concurrency key's running rows, across queues."""
    running: dict[str, list[Row]] = {}
    for ids in state.open_by_queue.values():
        for job_id in ids:
            row = state.rows[job_id]
            if row.state == "running" and row.concurrency_key is not None:
                running.setdefault(row.concurrency_key, []).append(row)
    return running


def patterns(state: MemoryState) -> list[tuple[str, int]]:
    return [(limit.pattern, limit.max_running) for limit in state.concurrency_limits.values()]


def key_limit(state: MemoryState, key: str, job_limit: int | None) -> int:
    return limit_for(key, patterns(state), job_limit)


def queue_key_limit(
    state: MemoryState, queue: str, key: str, own_limit: int | None = None
) -> KeyLimit:
    """The limit a claim of `queue` applies to `key` (`claim_limit`: its head's, or a
    pattern's), as `explain` reports it."""
    ready = [
        (row.claim_order, row.id, row.concurrency_limit)
        for row in (state.rows[job_id] for job_id in state.open_by_queue.get(queue, ()))
        if row.state == "ready" and row.concurrency_key == key
    ]
    return claim_limit(key, patterns(state), ready, own_limit)


def key_rate(state: MemoryState, key: str) -> rules.Rate | None:
    return rate_for(key, [(rate.pattern, rate.rate) for rate in state.concurrency_rates.values()])


def _in_window(
    state: MemoryState, key: str, rate: rules.Rate, now: datetime.datetime
) -> list[datetime.datetime]:
    window_start = now - datetime.timedelta(seconds=rate.period)
    return sorted(at for at in state.key_starts.get(key, ()) if at > window_start)


@attrs.frozen
class RatedKey:
    """A visited key with a rate, as the claim saw it (concurrency_room_rated in the SQL)."""

    key: str
    rate: rules.Rate
    rate_room: int  # starts its rate allows now
    other_room: int  # starts its limit and the claim's size allow
    oldest: datetime.datetime | None  # its oldest start in the window


def concurrency_candidates(
    state: MemoryState,
    ready: Sequence[Row],
    due: Sequence[Row],
    visited: Sequence[str],
    serves: Callable[[Row], bool],
    limit: int,
    now: datetime.datetime,
    rated: list[RatedKey] | None = None,
) -> list[Row]:
    """Up to limit - running due rows of each visited key, in claim order: a key at its limit
    gives none, and the others still give theirs. The limit is `claim_limit`'s (the key's
    head's unless a pattern matches, as in the SQL). A rated key gives at most the starts its
    window has left; `rated` collects those keys for the reply (`rate_spend`)."""
    running = running_per_key(state)
    wanted = set(visited)
    ready_per_key: dict[str, list[ReadyJob]] = {}
    for row in ready:
        if row.concurrency_key in wanted:
            ready_per_key.setdefault(row.concurrency_key, []).append(
                (row.claim_order, row.id, row.concurrency_limit)
            )
    known = patterns(state)
    per_key: dict[str, list[Row]] = {}
    for row in sorted(due, key=lambda row: row.claim_order):
        if row.concurrency_key in wanted and serves(row):
            per_key.setdefault(row.concurrency_key, []).append(row)
    taken: list[Row] = []
    for key in visited:
        if key not in ready_per_key:
            continue
        room = claim_limit(key, known, ready_per_key[key]).limit - len(running.get(key, ()))
        room = max(0, min(room, limit))
        rate = key_rate(state, key)
        if rate is not None:
            counted = _in_window(state, key, rate, now)
            rate_room = max(0, rate.allowed - len(counted))
            if rated is not None:
                rated.append(RatedKey(key, rate, rate_room, room, counted[0] if counted else None))
            room = min(room, rate_room)
        taken += per_key.get(key, [])[:room]
    return taken


def rate_spend(
    state: MemoryState, rated: Sequence[RatedKey], claimed: Sequence[Row], now: datetime.datetime
) -> datetime.datetime | None:
    """Enter the claimed rows of rated keys in their logs; the earliest time a key its rate
    held back may start again (None: none was), as key_rate_limited_until in the SQL."""
    started: dict[str, int] = {}
    for row in claimed:
        if row.concurrency_key is not None:
            started[row.concurrency_key] = started.get(row.concurrency_key, 0) + 1
    until: datetime.datetime | None = None
    for entry in rated:
        count = started.get(entry.key, 0)
        if count:
            log = state.key_starts.get(entry.key, ())
            state.key_starts[entry.key] = rules.spend(log, count, now, entry.rate)
        if entry.rate_room < entry.other_room and entry.rate_room <= count:
            at = (entry.oldest or now) + datetime.timedelta(seconds=entry.rate.period)
            until = at if until is None else min(until, at)
    return until


def set_limit(
    state: MemoryState, pattern: str, max_running: int | None, now: datetime.datetime
) -> bool:
    if max_running is None:
        return state.concurrency_limits.pop(pattern, None) is not None
    state.concurrency_limits[pattern] = ConcurrencyLimit(pattern, max_running, now)
    return True


def key_status(state: MemoryState, keys: Sequence[str] | None) -> list[ConcurrencyKeyStatus]:
    statuses = []
    for key, rows in sorted(running_per_key(state).items()):
        if keys is not None and key not in keys:
            continue
        job_limits = [row.concurrency_limit for row in rows if row.concurrency_limit is not None]
        limit = key_limit(state, key, max(job_limits) if job_limits else None)
        statuses.append(ConcurrencyKeyStatus(key, len(rows), limit))
    return statuses


def set_rate(
    state: MemoryState, pattern: str, rate: rules.Rate | None, now: datetime.datetime
) -> bool:
    if rate is None:
        return state.concurrency_rates.pop(pattern, None) is not None
    state.concurrency_rates[pattern] = ConcurrencyRate(pattern, rate, now)
    return True


def rate_status(state: MemoryState, now: datetime.datetime) -> list[KeyRateStatus]:
    statuses = []
    for key in sorted(state.key_starts):
        rate = key_rate(state, key)
        if rate is None:
            continue
        counted = _in_window(state, key, rate, now)
        if not counted:
            continue
        until = rules.next_start_at(counted, 0, now, rate) if len(counted) >= rate.allowed else None
        statuses.append(KeyRateStatus(key, rate, len(counted), until))
    return statuses


def rate_facts(state: MemoryState, key: str, now: datetime.datetime) -> dict[str, object]:
    """explain's facts of a key's rate (job_explain's rate_* fields; empty: no rate)."""
    rate = key_rate(state, key)
    if rate is None:
        return {}
    counted = _in_window(state, key, rate, now)
    full = len(counted) >= rate.allowed
    return {
        "rate_allowed": rate.allowed,
        "rate_period": rate.period,
        "recent_starts": len(counted),
        "rate_limited_until": rules.next_start_at(counted, 0, now, rate) if full else None,
    }
