"""The memory driver's queue_limits table: the gate of a limited queue's claim and the
changes `trioq queue limit` / `trioq queue rate` make (the rules are `_core/limits.py`, the
same ones migration 0023's functions apply on PostgreSQL)."""

from __future__ import annotations

import datetime

import attrs

from .._core import limits as rules
from .._seam.admin import QueueLimit, QueueLimitSet
from .state import MemoryState, QueueLimitRow


def running(state: MemoryState, queue: str) -> int:
    rows = state.rows
    return sum(
        1 for job_id in state.open_by_queue.get(queue, ()) if rows[job_id].state == "running"
    )


def gate(
    state: MemoryState, queue: str, requested: int, now: datetime.datetime
) -> rules.Gate | None:
    """How many of `requested` jobs the queue's claim may take now (None: it has no limits).
    Counted before the round's settlements, as the PostgreSQL gate counts before its claim."""
    row = state.limits.get(queue)
    if row is None:
        return None
    return rules.gate(
        requested,
        now,
        global_limit=row.global_limit,
        running=running(state, queue) if row.global_limit is not None else 0,
        rate=row.rate,
        recent_starts=row.recent_starts,
    )


def spend(
    state: MemoryState, queue: str, started: int, now: datetime.datetime
) -> datetime.datetime | None:
    """Enter `started` starts at `now` in the queue's rate log; when the next is allowed."""
    row = state.limits.get(queue)
    if row is None or row.rate is None or started <= 0:
        return None
    row.recent_starts = rules.spend(row.recent_starts, started, now, row.rate)
    if len(row.recent_starts) < row.rate.allowed:
        return None
    return row.recent_starts[0] + datetime.timedelta(seconds=row.rate.period)


def change(state: MemoryState, params: QueueLimitSet) -> None:
    row = state.limits.get(params.queue, QueueLimitRow())
    if params.set_limit:
        row = attrs.evolve(row, global_limit=params.global_limit)
    if params.set_rate:
        row = attrs.evolve(row, rate=params.rate)
    if row.global_limit is None and row.rate is None:
        state.limits.pop(params.queue, None)
    else:
        state.limits[params.queue] = row


def listing(state: MemoryState, now: datetime.datetime) -> list[QueueLimit]:
    out = []
    for queue, row in sorted(state.limits.items()):
        counted: list[datetime.datetime] = []
        until = None
        if row.rate is not None:
            window_start = now - datetime.timedelta(seconds=row.rate.period)
            counted = sorted(at for at in row.recent_starts if at > window_start)
            if len(counted) >= row.rate.allowed:
                until = rules.next_start_at(counted, 0, now, row.rate)
        out.append(
            QueueLimit(
                queue=queue,
                global_limit=row.global_limit,
                rate=row.rate,
                running=running(state, queue),
                recent_starts=len(counted),
                rate_limited_until=until,
            )
        )
    return out
