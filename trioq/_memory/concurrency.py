"""Concurrency keys in memory (the concurrency_holds and concurrency_limits tables).

A claim runs in one step here, so a key's slots are counted from the rows themselves: the
running rows of that key in any queue. The SQL keeps a holds row per running job instead,
because its claimers race (migration 0027).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence

from .._core.concurrency import KeyLimit, ReadyJob, claim_limit, limit_for
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


def concurrency_candidates(
    state: MemoryState,
    ready: Sequence[Row],
    due: Sequence[Row],
    visited: Sequence[str],
    serves: Callable[[Row], bool],
    limit: int,
) -> list[Row]:
    """Up to limit - running due rows of each visited key, in claim order: a key at its limit
    gives none, and the others still give theirs. The limit is `claim_limit`'s (the key's
    head's unless a pattern matches, as in the SQL)."""
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
