"""Capacity arithmetic: how many jobs a claim loop may ask for."""

from __future__ import annotations

# Jobs a claim loop keeps claimed ahead of its free slots (`prefetch`), per queue. Off by
# default: with the completer freeing slots at once, 10,000-job drains at c=25 (2 workers,
# medians of 5 interleaved, bench/RESULTS.md) ran prefetch 25 at 0.97-1.04x of prefetch 0 and
# prefetch 5-10 at 0.66-0.80x (more, smaller claims). Kept here, not in the runtime, so the
# CLI can show it without importing the worker.
DEFAULT_PREFETCH = 0

# The most claim rounds one loop has in flight at once when refilling its prefetch buffer: in
# the same runs 1 and 2 were within noise (0.97x vs 1.04x of prefetch 0); 2 lets a refill go
# while a slow one is still out.
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
