"""What the race tests (several `trioq worker` processes against one limit) share: peaks of
stored or logged intervals, and a live sampler of running counts."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

SAMPLE_EVERY = 0.005  # the live sampler's cadence (it observes; nothing waits on it)

Interval = tuple[datetime.datetime, datetime.datetime]


def q(schema: str, template: str) -> sql.Composed:
    return sql.SQL(template).format(s=sql.Identifier(schema))


def peak(intervals: list[Interval]) -> int:
    """The most intervals [start, finish) open at once (a finish at t closes before a start
    at t opens)."""
    events = sorted([(f, -1) for _, f in intervals] + [(s, 1) for s, _ in intervals])
    running = highest = 0
    for _, change in events:
        running += change
        highest = max(highest, running)
    return highest


def sample(
    pg_url: str,
    query: sql.Composed,
    stop: threading.Event,
    reduce: Callable[[list[tuple[Any, ...]]], int],
) -> list[int]:
    """`reduce(rows)` of `query`, one consistent snapshot per sample, until `stop` is set (run
    in a thread)."""
    samples = []
    with psycopg.connect(pg_url, autocommit=True) as conn:
        while not stop.is_set():
            samples.append(reduce(conn.execute(query).fetchall()))
            time.sleep(SAMPLE_EVERY)
    return samples
