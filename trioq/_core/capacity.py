"""Capacity arithmetic: how many jobs a claim loop may ask for."""

from __future__ import annotations


def open_slots(concurrency: int, owned: int) -> int:
    """Slots not held by a job this worker owns (running, or finished but not yet flushed)."""
    return max(0, concurrency - owned)


def claim_size(concurrency: int, owned: int, reserved: int, batch_limit: int) -> int:
    """How many jobs the next claim may request.

    `reserved` counts claims already in flight (two pickups racing in one worker each reserve
    what they asked for before the statement runs), so together they never exceed capacity.
    """
    return max(0, min(batch_limit, open_slots(concurrency, owned + reserved)))
