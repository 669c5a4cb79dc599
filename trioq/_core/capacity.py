"""Capacity arithmetic: how many jobs a claim loop may ask for."""

from __future__ import annotations

# Jobs a claim loop keeps claimed ahead of its free slots (`prefetch`), per queue. Chosen by
# bench/scenarios (prefetch 0 vs N in one run, bench/RESULTS.md). Kept here, not in the
# runtime, so the CLI can show it without importing the worker.
DEFAULT_PREFETCH = 0

# The most claim rounds one loop has in flight at once when refilling its prefetch buffer.
MAX_REFILLS_IN_FLIGHT = 2


def open_slots(concurrency: int, owned: int) -> int:
    """Slots not held by a job this worker owns (running, or finished but not yet flushed)."""
    return max(0, concurrency - owned)


def claim_size(concurrency: int, owned: int, reserved: int, batch_limit: int) -> int:
    """How many jobs the next claim may request.

    `reserved` counts claims already in flight (two pickups racing in one worker each reserve
    what they asked for before the statement runs), so together they never exceed capacity.
    """
    return max(0, min(batch_limit, open_slots(concurrency, owned + reserved)))


def low_watermark(prefetch: int) -> int:
    """A refill starts once the buffer holds fewer than this (half of it, at least one)."""
    return max(1, prefetch // 2) if prefetch > 0 else 0
