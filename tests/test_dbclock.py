"""`DatabaseClock` (trioq/_runtime/dbclock.py) maps database time to trio's clock for jobs
claimed before their run_at: the mapping is never early (a held job never starts before its
run_at), and it is late only by the quickest recent reply, not by the round that claimed."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioq._runtime.dbclock import DRIFT_PER_SECOND, WINDOW_SECONDS, DatabaseClock

EPOCH = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
OFFSET = 1000.0  # the true mapping: database time EPOCH + x is trio time OFFSET + x


def db(seconds: float) -> datetime.datetime:
    return EPOCH + datetime.timedelta(seconds=seconds)


def observe(clock: DatabaseClock, db_seconds: float, latency: float) -> float:
    """A reply carrying database time `db_seconds` that arrived `latency` s later; returns
    its trio time."""
    replied_at = OFFSET + db_seconds + latency
    clock.observe(db(db_seconds), replied_at)
    return replied_at


def test_the_quickest_recent_reply_sets_the_offset_not_the_claiming_one() -> None:
    clock = DatabaseClock()
    first = observe(clock, 1.0, 0.0004)  # a quick idle round
    at = observe(clock, 2.0, 0.007)  # the claim of 200 rows: a 7 ms commit
    mapped = clock.to_trio(db(2.2), at)
    aged = (at - first) * DRIFT_PER_SECOND
    assert mapped == pytest.approx(OFFSET + 2.2 + 0.0004 + aged, abs=1e-6)


def test_bounds_older_than_the_window_are_dropped() -> None:
    clock = DatabaseClock()
    observe(clock, 0.0, 0.0001)
    at = observe(clock, WINDOW_SECONDS + 1.0, 0.005)
    assert clock.to_trio(db(WINDOW_SECONDS + 1.2), at) == pytest.approx(
        OFFSET + WINDOW_SECONDS + 1.2 + 0.005, abs=1e-6
    )


@given(
    st.lists(
        st.tuples(st.floats(0.0, 0.05), st.floats(0.0, 5.0)),  # (reply latency, gap to next)
        min_size=1,
        max_size=30,
    ),
    st.floats(0.0, 1.0),
)
def test_a_held_job_is_never_released_before_its_run_at(
    rounds: list[tuple[float, float]], ahead: float
) -> None:
    clock = DatabaseClock()
    now, at = 0.0, 0.0
    for latency, gap in rounds:
        at = observe(clock, now, latency)
        now += latency + gap
    assert clock.to_trio(db(now + ahead), at) >= OFFSET + now + ahead - 1e-6
