"""Pure core (no I/O): retry backoff, claim capacity arithmetic and the job state machine."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import trioq
from trioq._core.capacity import claim_size, open_slots
from trioq._core.retry import RetryPolicy, should_retry
from trioq._core.states import TERMINAL_STATES, TRANSITIONS, JobState, is_allowed
from trioq._sql import query_names

# --- retry -----------------------------------------------------------------------------------


def test_retry_delays_double_per_attempt_without_jitter() -> None:
    policy = RetryPolicy(base_seconds=0.5, max_seconds=1000.0, jitter=0)
    assert [policy.delay(attempt) for attempt in range(1, 7)] == [0.5, 1, 2, 4, 8, 16]


def test_retry_delay_is_capped_at_max_seconds_even_for_huge_attempts() -> None:
    policy = RetryPolicy(base_seconds=1.0, max_seconds=60.0, jitter=0)
    assert policy.delay(7) == 60.0  # 64 s uncapped
    assert policy.delay(10_000) == 60.0  # no overflow of 2**attempt
    assert policy.delay(2**62) == 60.0


def test_zero_base_retries_immediately_at_every_attempt() -> None:
    policy = RetryPolicy(base_seconds=0.0, max_seconds=300.0, jitter=0)
    assert {policy.delay(attempt) for attempt in (1, 61, 62, 999, 10**9)} == {0.0}


def test_retry_delay_for_first_and_nonpositive_attempts_is_the_base() -> None:
    policy = RetryPolicy(base_seconds=3.0, jitter=0)
    assert policy.delay(1) == policy.delay(0) == policy.delay(-5) == 3.0


@given(
    attempt=st.integers(min_value=1, max_value=500),
    base=st.floats(min_value=0, max_value=100),
    cap=st.floats(min_value=0, max_value=10_000),
    jitter=st.floats(min_value=0, max_value=1),
    seed=st.integers(),
)
def test_jittered_retry_delay_stays_within_its_bounds(
    attempt: int, base: float, cap: float, jitter: float, seed: int
) -> None:
    policy = RetryPolicy(base_seconds=base, max_seconds=cap, jitter=jitter)
    ceiling = min(cap, base * 2.0 ** (attempt - 1))
    delay = policy.delay(attempt, random.Random(seed))
    assert math.isfinite(delay)
    assert ceiling * (1 - jitter) - 1e-9 <= delay <= ceiling + 1e-9


def test_jitter_spreads_delays_of_the_same_attempt() -> None:
    policy = RetryPolicy(base_seconds=10.0, jitter=0.5)
    rng = random.Random(42)
    delays = [policy.delay(1, rng) for _ in range(200)]
    assert min(delays) >= 5.0
    assert max(delays) <= 10.0
    assert len(set(delays)) > 100  # not a constant
    assert max(delays) - min(delays) > 2.5  # and spread over most of the range


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_seconds": -1.0},
        {"max_seconds": -0.1},
        {"base_seconds": math.nan},
        {"max_seconds": math.nan},
        {"base_seconds": math.inf},
        {"max_seconds": math.inf},
        {"jitter": -0.01},
        {"jitter": 1.01},
        {"jitter": math.nan},
    ],
)
def test_retry_policy_rejects_bad_parameters_naming_the_field(kwargs: dict[str, float]) -> None:
    (field,) = kwargs
    with pytest.raises(ValueError, match=field):
        RetryPolicy(**kwargs)


def test_failed_attempt_is_retried_only_while_attempts_remain() -> None:
    assert [should_retry(attempt, 3) for attempt in (1, 2, 3, 4)] == [True, True, False, False]
    assert not should_retry(1, 1)


def test_retry_policy_is_public_and_frozen() -> None:
    policy = trioq.RetryPolicy()
    with pytest.raises(AttributeError):
        policy.base_seconds = 2.0  # type: ignore[misc]


# --- capacity --------------------------------------------------------------------------------


def test_claim_size_asks_only_for_open_slots() -> None:
    assert claim_size(concurrency=10, owned=0, reserved=0, batch_limit=100) == 10
    assert claim_size(concurrency=10, owned=7, reserved=0, batch_limit=100) == 3
    assert claim_size(concurrency=10, owned=7, reserved=2, batch_limit=100) == 1
    assert claim_size(concurrency=10, owned=10, reserved=0, batch_limit=100) == 0


def test_claim_size_is_bounded_by_the_batch_limit() -> None:
    assert claim_size(concurrency=500, owned=0, reserved=0, batch_limit=100) == 100


def test_claim_size_is_never_negative_when_over_committed() -> None:
    assert claim_size(concurrency=5, owned=9, reserved=3, batch_limit=100) == 0
    assert open_slots(concurrency=5, owned=9) == 0


@given(
    concurrency=st.integers(min_value=1, max_value=10_000),
    owned=st.integers(min_value=0, max_value=20_000),
    reserved=st.integers(min_value=0, max_value=20_000),
    batch_limit=st.integers(min_value=0, max_value=1000),
)
def test_claim_size_never_lets_owned_plus_claimed_exceed_concurrency(
    concurrency: int, owned: int, reserved: int, batch_limit: int
) -> None:
    size = claim_size(concurrency, owned, reserved, batch_limit)
    assert 0 <= size <= batch_limit
    if owned + reserved <= concurrency:
        assert owned + reserved + size <= concurrency
        # ...and it does not leave a slot idle that the batch limit allows it to fill
        assert size == min(batch_limit, concurrency - owned - reserved)
    else:
        assert size == 0


# --- state machine ---------------------------------------------------------------------------


def test_only_a_redrive_leaves_a_terminal_state() -> None:
    for (source, target), statements in TRANSITIONS.items():
        if source in TERMINAL_STATES:
            assert (target, statements) == (JobState.READY, ("job_retry",)), (source, target)
    assert not is_allowed(JobState.COMPLETED, JobState.READY)  # a completed job stays completed
    for terminal in TERMINAL_STATES:
        for target in JobState:
            if target is not JobState.READY:
                assert not is_allowed(terminal, target)


def test_terminal_states_are_completed_failed_and_cancelled() -> None:
    assert {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED} == TERMINAL_STATES


def test_every_state_is_reachable_from_ready() -> None:
    reached = {JobState.READY}
    frontier = [JobState.READY]
    while frontier:
        source = frontier.pop()
        for edge_source, target in TRANSITIONS:
            if edge_source == source and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(JobState)


def test_every_transition_names_the_statements_allowed_to_make_it() -> None:
    for edge, statements in TRANSITIONS.items():
        assert statements, edge
        assert all(isinstance(name, str) and name for name in statements), edge
        assert set(statements) <= query_names(), edge  # each one is a statement of queries.sql
    assert is_allowed(JobState.READY, JobState.RUNNING)
    assert not is_allowed(JobState.READY, JobState.COMPLETED)  # a job must run to complete
    assert not is_allowed(JobState.READY, JobState.READY)
