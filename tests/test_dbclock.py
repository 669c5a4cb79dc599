"""`DatabaseClock` (trioq/_runtime/job/dbclock.py) maps database time to trio's clock for jobs
claimed before their run_at: the mapping is never early (a held job never starts before its
run_at), also when the database's clock steps or drifts, and it is late only by the quickest
recent reply, not by the round that claimed."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioq._runtime.job.dbclock import DRIFT_PER_SECOND, WINDOW_SECONDS, DatabaseClock

EPOCH = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
OFFSET = 1000.0  # the true mapping: database time EPOCH + x is trio time OFFSET + x


def db(seconds: float) -> datetime.datetime:
    return EPOCH + datetime.timedelta(seconds=seconds)


def observe(
    clock: DatabaseClock, db_seconds: float, latency: float, *, offset: float = OFFSET
) -> float:
    """A round whose statement read database time `db_seconds` (sent just before, its reply
    arriving `latency` s after); returns the reply's trio time."""
    clock.observe(db(db_seconds), offset + db_seconds - 0.0001, offset + db_seconds + latency)
    return offset + db_seconds + latency


def test_the_quickest_recent_reply_sets_the_offset_not_the_claiming_one() -> None:
    clock = DatabaseClock()
    first = observe(clock, 1.0, 0.0004)  # a quick idle round
    observe(clock, 1.5, 0.007)  # the claim of 200 rows: a 7 ms commit
    mapped = clock.to_trio(db(1.7))
    aged = (OFFSET + 1.7 + 0.0004 - first) * DRIFT_PER_SECOND
    assert mapped == pytest.approx(OFFSET + 1.7 + 0.0004 + aged, abs=1e-6)


def test_bounds_older_than_the_window_are_dropped() -> None:
    clock = DatabaseClock()
    observe(clock, 0.0, 0.0001)
    observe(clock, WINDOW_SECONDS + 1.0, 0.005)
    assert clock.to_trio(db(WINDOW_SECONDS + 1.2)) == pytest.approx(
        OFFSET + WINDOW_SECONDS + 1.2 + 0.005 + 0.2 * DRIFT_PER_SECOND, abs=1e-6
    )


def test_a_database_clock_stepping_back_drops_the_bounds_it_contradicts() -> None:
    clock = DatabaseClock()
    observe(clock, 1.0, 0.0004)
    # The database's clock steps back 0.2 s: the same trio instant now reads 0.2 s earlier, so
    # the true offset grew by 0.2 s.
    observe(clock, 1.3, 0.0004, offset=OFFSET + 0.2)
    assert clock.to_trio(db(1.5)) >= OFFSET + 0.2 + 1.5


def test_a_frozen_database_clock_keeps_holding_jobs_until_their_run_at() -> None:
    clock = DatabaseClock()
    for tick in range(5):  # every round reads the same database time, 0.3 s apart
        clock.observe(db(1.0), OFFSET + 1.0 + 0.3 * tick, OFFSET + 1.0 + 0.3 * tick + 0.001)
    last_reply = OFFSET + 1.0 + 0.3 * 4 + 0.001
    assert clock.to_trio(db(1.2)) >= last_reply + 0.2


# A database clock is slewed (drift, up to the allowance) or stepped (ntpd and chrony step only
# beyond 128 ms). What a step back hides inside a round's bracket cannot be told apart (see
# dbclock.py): a held job is then early by at most the newest round's `sent_at -> now` time.
STEPS = st.one_of(st.just(0.0), st.floats(0.128, 0.3), st.floats(-0.3, -0.128))
SENT_BEFORE = 0.0001  # the model's statements read the database clock 0.1 ms after sending


@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 0.05),  # reply latency
            st.floats(0.0, 1.5),  # gap to the next round
            STEPS,  # a step of the database clock before the round
            st.floats(-DRIFT_PER_SECOND, DRIFT_PER_SECOND),  # drift rate since the last round
        ),
        min_size=1,
        max_size=30,
    ),
    st.floats(0.0, 0.25),
)
def test_a_held_job_is_released_before_its_run_at_only_within_a_stepped_clocks_bracket(
    rounds: list[tuple[float, float, float, float]], ahead: float
) -> None:
    clock = DatabaseClock()
    trio_now, offset, db_seconds, elapsed = OFFSET, OFFSET, 0.0, 0.0
    for latency, gap, step, drift in rounds:
        offset += step + drift * elapsed  # slewed over the time since the last round
        db_seconds = trio_now - offset
        clock.observe(db(db_seconds), trio_now - SENT_BEFORE, trio_now + latency)
        trio_now += latency + gap
        elapsed = latency + gap
    due = db_seconds + ahead
    stepped = any(step for _, _, step, _ in rounds)
    assert clock.to_trio(db(due)) >= offset + due - (SENT_BEFORE if stepped else 0) - 1e-6
