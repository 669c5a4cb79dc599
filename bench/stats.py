"""Small statistics helpers: nearest-rank percentiles, median and spread of repeats."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (p100 is the maximum); `values` need not be sorted."""
    if not values:
        raise ValueError("percentile: no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def rotated(items: Sequence[T], repeat: int) -> list[T]:
    """`items` in the order of repeat number `repeat`: each repeat starts one further along,
    so every system of an interleaved comparison takes each place in turn (the machine's drift
    within a repeat is not always one system's)."""
    turn = repeat % len(items)
    return [*items[turn:], *items[:turn]]


def summarize(values: Sequence[float]) -> dict[str, float | list[float]]:
    """Median, min and max of one metric's repeats (and the repeats themselves)."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": list(values),
    }
