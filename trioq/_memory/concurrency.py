"""Concurrency keys in memory (the concurrency_holds and concurrency_limits tables).

A claim runs in one step here, so a key's slots are counted from the rows themselves: the
running rows of that key in any queue. The SQL keeps a holds row per running job instead,
because its claimers race (migration 0027).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence

from .._core.concurrency import limit_for
from .._driver import ConcurrencyKeyStatus, ConcurrencyLimit
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


def key_limit(state: MemoryState, key: str, job_limit: int | None) -> int:
    patterns = [(limit.pattern, limit.max_running) for limit in state.concurrency_limits.values()]
    return limit_for(key, patterns, job_limit)


def concurrency_candidates(
    state: MemoryState,
    ready: Sequence[Row],
    due: Sequence[Row],
    visited: Sequence[str],
    serves: Callable[[Row], bool],
    limit: int,
) -> list[Row]:
    """Up to limit - running due rows of each visited key, in claim order: a key at its limit
    gives none, and the others still give theirs. The limit is the key's first ready row's
    (as in the SQL), unless a pattern matches."""
    running = running_per_key(state)
    wanted = set(visited)
    first: dict[str, Row] = {}
    for row in sorted(ready, key=lambda row: row.claim_order):
        if row.concurrency_key in wanted:
            first.setdefault(row.concurrency_key, row)
    per_key: dict[str, list[Row]] = {}
    for row in sorted(due, key=lambda row: row.claim_order):
        if row.concurrency_key in wanted and serves(row):
            per_key.setdefault(row.concurrency_key, []).append(row)
    taken: list[Row] = []
    for key in visited:
        if key not in first:
            continue
        room = key_limit(state, key, first[key].concurrency_limit) - len(running.get(key, ()))
        taken += per_key.get(key, [])[: max(0, min(room, limit))]
    return taken


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
