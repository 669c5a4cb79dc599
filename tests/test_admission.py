"""Admission control: the pure AIMD maths, then the service inside a real worker (injected
database errors on the in-memory driver in virtual time; injected scheduler lag on Postgres)."""

from __future__ import annotations

import itertools
import logging
import time

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

import trioq
from tests.support import Gate, make_app
from trioq._core.admission import (
    CLAIM_LATENCY,
    DB_ERRORS,
    LEASE_RENEWAL_LATE,
    OK,
    RECOVERING,
    SCHEDULER_LAG,
    AdmissionPolicy,
    AdmissionSignals,
    AdmissionState,
    admission_step,
    initial_state,
)
from trioq._memory import MemoryDriver
from trioq._runtime.job.claim_loop import WorkerHooks

POLICY = AdmissionPolicy(
    sustain_seconds=1.0, decrease_every=1.0, increase_every=1.0, max_scheduler_lag=0.25
)
DEFAULT_POLICY = AdmissionPolicy()
LAGGING = AdmissionSignals(scheduler_lag=1.0)
HEALTHY = AdmissionSignals()


def run(states: AdmissionState, signals: AdmissionSignals, times: list[float], n: int = 20):
    out = []
    for now in times:
        states = admission_step(states, signals, n, POLICY, now)
        out.append((states.limit, states.reason))
    return states, out


# --- the pure maths ---------------------------------------------------------------------------


def test_sustained_overload_cuts_multiplicatively_down_to_the_floor() -> None:
    _, out = run(initial_state(20), LAGGING, [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert [limit for limit, _ in out] == [20, 20, 10, 10, 5, 2, 1, 1, 1]
    assert {reason for limit, reason in out if limit < 20} == {SCHEDULER_LAG}


def test_a_short_spike_is_not_sustained_overload() -> None:
    state = initial_state(20)
    timeline = [(0.0, LAGGING), (0.5, LAGGING), (0.75, HEALTHY), (1.76, HEALTHY), (1.8, LAGGING)]
    for now, signals in timeline:
        state = admission_step(state, signals, 20, POLICY, now)
    assert (state.limit, state.reason) == (20, OK)


def test_a_brief_healthy_gap_neither_ends_an_overload_nor_grows_the_limit() -> None:
    state = initial_state(20)
    timeline = [(0.0, LAGGING), (0.5, LAGGING), (0.75, HEALTHY), (1.0, LAGGING)]
    limits = []
    for now, signals in timeline:
        state = admission_step(state, signals, 20, POLICY, now)
        limits.append(state.limit)
    assert limits == [20, 20, 20, 10]
    state = admission_step(state, HEALTHY, 20, POLICY, 1.5)  # healthy, but not for long yet
    state = admission_step(state, LAGGING, 20, POLICY, 1.75)
    assert state.limit == 10


def test_recovery_is_additive_and_stops_at_the_configured_concurrency() -> None:
    state = AdmissionState(limit=1, reason=SCHEDULER_LAG, last_change_at=0.0)
    _, out = run(state, HEALTHY, [0.5 * i for i in range(1, 50)], n=6)
    limits = [limit for limit, _ in out]
    assert limits[:11] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6]  # health first lasts 1 s
    assert max(limits) == 6 and limits[-1] == 6
    assert out[2][1] == RECOVERING and out[-1][1] == OK


@pytest.mark.parametrize(
    ("signals", "reason"),
    [
        (AdmissionSignals(renewal_age=20.0, lease_seconds=30.0), LEASE_RENEWAL_LATE),
        (AdmissionSignals(db_errors=3), DB_ERRORS),
        (AdmissionSignals(claim_latency=5.0), CLAIM_LATENCY),
        (AdmissionSignals(scheduler_lag=1.0, db_errors=3), SCHEDULER_LAG),
    ],
)
def test_each_signal_names_its_reason(signals: AdmissionSignals, reason: str) -> None:
    state, _ = run(initial_state(8), signals, [0.0, 1.0], n=8)
    assert (state.limit, state.reason) == (4, reason)


def test_a_lowered_concurrency_clamps_the_limit() -> None:
    state = admission_step(initial_state(20), HEALTHY, 5, POLICY, 0.0)
    assert state.limit == 5


@given(
    concurrency=st.integers(1, 50),
    steps=st.lists(st.tuples(st.floats(0, 3), st.booleans(), st.integers(0, 3)), max_size=60),
)
def test_the_limit_stays_within_bounds_and_grows_by_at_most_one_step(
    concurrency: int, steps: list[tuple[float, bool, int]]
) -> None:
    state, now = initial_state(concurrency), 0.0
    for dt, lagging, errors in steps:
        now += dt
        signals = AdmissionSignals(scheduler_lag=1.0 if lagging else 0.0, db_errors=errors)
        after = admission_step(state, signals, concurrency, POLICY, now)
        assert min(POLICY.min_limit, concurrency) <= after.limit <= concurrency
        assert after.limit <= state.limit + POLICY.increase_step
        if after.limit < state.limit:
            assert after.reason in (SCHEDULER_LAG, DB_ERRORS)
        state = after


# --- the service in a worker: injected database errors, virtual time ------------------------


class FailingClaims(MemoryDriver):
    """The in-memory driver whose claim statement raises while `failing` is set."""

    failing = False

    async def job_claim(self, params):  # type: ignore[no-untyped-def]
        if self.failing:
            await trio.sleep(0.01)
            raise ConnectionError("injected: database unreachable")
        return await super().job_claim(params)


async def _errors_then_recovery(mode: str) -> tuple[list, list, trioq.Worker]:
    app = trioq.App(schema="virtual")
    changes: list[tuple[float, int, str]] = []
    rounds: list[tuple[int, int, int]] = []  # (requested, running before, effective limit)
    gate = Gate()

    @app.task("hold")
    async def hold(ctx: trioq.Context, payload: object) -> None:
        gate.enter()
        await gate.release.wait()

    driver = FailingClaims()
    async with app.client(driver=driver) as client, trio.open_nursery() as nursery:

        def on_round(queue: str, requested: int, claimed: int) -> None:
            running = len(worker.loops[queue].running)  # the claimed ones are not added yet
            rounds.append((requested, running, worker.effective_limit(queue)))

        worker = app.worker(
            ["default"],
            10,
            hooks=WorkerHooks(on_round=on_round),
            poll_interval=0.5,
            grace_seconds=0,
            admission=mode,
        )
        worker.admission.on_change = lambda queue, state: changes.append(
            (trio.current_time(), state.limit, state.reason)
        )
        await nursery.start(worker.run)
        t0 = trio.current_time()
        driver.failing = True
        await trio.sleep(5)  # five virtual seconds of failing claims
        driver.failing = False
        await client.enqueue_many("hold", [None] * 30)
        with trio.fail_after(60):
            await gate.wait_entered(10)
            gate.release.set()
        await trio.sleep(25)
        worker.request_drain()
    return [(t - t0, limit, reason) for t, limit, reason in changes], rounds, worker


async def test_injected_database_errors_lower_the_limit_and_claims_follow_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    changes, rounds, _worker = await _errors_then_recovery("on")
    cuts = [limit for _, limit, reason in changes if reason == DB_ERRORS]
    assert cuts == [5, 2, 1]
    # The first cut comes once the overload has been sustained (default policy: 2 s).
    sustain = DEFAULT_POLICY.sustain_seconds
    assert sustain <= changes[0][0] <= sustain + 0.6, changes
    growth = [(t, limit) for t, limit, reason in changes if reason in (RECOVERING, OK)]
    assert [limit for _, limit in growth] == list(range(2, 11))  # additive: +1 a step
    every = DEFAULT_POLICY.increase_every
    assert all(b[0] - a[0] >= every - 1e-9 for a, b in itertools.pairwise(growth))
    # Claims follow the effective limit: never asked for more than it leaves open.
    assert all(requested <= max(0, limit - running) for requested, running, limit in rounds)
    assert any(0 < requested < 10 for requested, _, _ in rounds), rounds


async def test_observe_mode_computes_the_limit_but_changes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    changes, rounds, worker = await _errors_then_recovery("observe")
    assert [limit for _, limit, reason in changes if reason == DB_ERRORS] == [5, 2, 1]
    assert worker.effective_limit("default") == 10
    # The first round after the outage asks for every slot.
    assert max(requested for requested, _, _ in rounds) == 10


# --- injected scheduler lag on Postgres -------------------------------------------------------


@pytest.mark.slow
async def test_injected_scheduler_lag_lowers_the_limit_without_cancelling_handlers(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    first, concurrent, most = Gate(), [0], [0]
    outcomes: list[str] = []

    @app.task("job")
    async def job(ctx: trioq.Context, payload: dict[str, int]) -> None:
        if payload["n"] < 8:
            first.enter()
            await first.release.wait()

    def started(job: object) -> None:
        concurrent[0] += 1
        most[0] = max(most[0], concurrent[0])

    held_done = trio.Event()

    def ended(job: object, outcome: str) -> None:
        concurrent[0] -= 1
        outcomes.append(outcome)
        if len(outcomes) == 8:
            held_done.set()

    cut, recovered = trio.Event(), trio.Event()
    limits: list[int] = []

    def on_change(queue: str, state: object) -> None:
        limits.append(state.limit)  # type: ignore[attr-defined]
        if state.limit == 2:  # type: ignore[attr-defined]
            cut.set()
        if state.limit == 8:  # type: ignore[attr-defined]
            recovered.set()

    lagging = True

    async def inject_lag() -> None:
        while lagging:
            time.sleep(0.05)  # noqa: ASYNC251 -- blocks the trio thread, as CPU-bound code does
            await trio.lowlevel.checkpoint()

    async with app.client(migrate=True) as client, trio.open_nursery() as nursery:
        worker = app.worker(
            ["default"],
            8,
            hooks=WorkerHooks(on_job_start=started, on_job_end=ended),
            poll_interval=0.2,
            grace_seconds=0,
            admission="on",
        )
        worker.admission.sample_interval = 0.05
        worker.admission.lag_window = 0.5
        worker.admission.policy = AdmissionPolicy(
            max_scheduler_lag=0.02,
            sustain_seconds=0.6,
            decrease_every=0.2,
            increase_every=0.1,
            min_limit=2,
        )
        worker.admission.on_change = on_change
        await nursery.start(worker.run)
        await client.enqueue_many("job", [{"n": n} for n in range(8)])
        with trio.fail_after(30):
            await first.wait_entered(8)
            injected_at = trio.current_time()
            nursery.start_soon(inject_lag)
            await cut.wait()
            reaction = trio.current_time() - injected_at
            first.release.set()  # the 8 running handlers finish normally
            await held_done.wait()
            most[0] = concurrent[0]  # measure the concurrency of new claims from here on
            recovering_from = len(limits)
            jobs = await client.enqueue_many("job", [{"n": n} for n in range(8, 40)])
            for queued in jobs[:3]:
                await client.wait_result(queued.id)
            during_cut = most[0]
            lagging = False
            await recovered.wait()
            for queued in jobs[3:]:
                await client.wait_result(queued.id)
        worker.request_drain()
    assert during_cut <= 2  # claims followed the cut limit while the lag lasted
    # Nothing was cancelled: the 8 handlers running at the cut, and every other, completed.
    assert outcomes.count("completed") == 40 and set(outcomes) == {"completed"}
    assert limits[: limits.index(2) + 1][-2:] == [4, 2]  # multiplicative cuts
    after = limits[recovering_from - 1 :]
    increases = [b - a for a, b in itertools.pairwise(after) if b > a]
    assert increases and set(increases) == {1} and after[-1] == 8  # additive recovery
    print(f"admission reaction time to injected scheduler lag: {reaction:.3f}s")
    assert reaction < 5


# --- the worker row's snapshot (trioq explain), virtual time -----------------------------------


async def test_the_snapshot_is_written_early_and_rate_limited_then_cleared(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each admission change asks for an early lease renewal (the heartbeat writes the
    snapshot), at most one per `publish_every`; back at full concurrency the row holds NULL
    again, and a steady idle worker sends no extra renewal."""
    app = trioq.App(schema="virtual")

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    driver = FailingClaims()
    changes: list[float] = []
    published: list[tuple[float, tuple[object, ...]]] = []
    cut_written, cleared = trio.Event(), trio.Event()

    def on_publish(snapshot: tuple[object, ...]) -> None:
        published.append((trio.current_time(), snapshot))
        if snapshot:
            cut_written.set()
        elif cut_written.is_set():
            cleared.set()

    def renewals() -> int:
        return driver.statistics().calls.get("lease_renew_many", 0)

    async with app.client(driver=driver) as client, trio.open_nursery() as nursery:
        worker = app.worker(["default"], 10, poll_interval=0.5, grace_seconds=0)
        worker.admission.on_change = lambda queue, state: changes.append(trio.current_time())
        worker.admission.on_publish = on_publish
        await nursery.start(worker.run)
        start_renewals = renewals()
        driver.failing = True
        job = await client.enqueue("noop", {})
        with trio.fail_after(60):
            await cut_written.wait()
            why = await client.explain(job.id)
            driver.failing = False
            await client.wait_result(job.id)
            await cleared.wait()
        extra = renewals() - start_renewals
        steady = renewals()
        await trio.sleep(25)  # idle at full concurrency, within the 30 s idle heartbeat
        assert renewals() == steady
        worker.request_drain()
    assert why.blocked_by == "admission" and why.verdict.startswith(
        "admission reduced to 5 of 10 because database errors (worker "
    ), why.verdict
    assert published[-1][1] == ()
    assert 2 <= extra <= len(changes)  # at most one renewal per change (none was due otherwise)
    early = [t for t, _ in published]
    assert all(b - a >= worker.admission.publish_every - 1e-9 for a, b in itertools.pairwise(early))


async def test_a_reason_change_at_an_unchanged_limit_logs_no_limit_change(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A queue of one slot cannot be cut: database errors change its reason, not its limit,
    and the log says so instead of `effective limit 1 -> 1`."""
    from trioq._runtime.services.admission import AdmissionControl

    caplog.set_level(logging.INFO, "trioq")
    admission = AdmissionControl({"q": 1})
    reasons = []
    for _ in range(40):
        admission.record_error("job_claim", OSError("down"))
        await trio.sleep(0.25)
        admission.sample(trio.current_time())
        reasons.append(admission.state("q").reason)
    assert "db_errors" in reasons and admission.state("q").limit == 1
    lines = [record.getMessage() for record in caplog.records]
    assert not [line for line in lines if "1 -> 1" in line], lines
    assert any("reason ok -> db_errors" in line for line in lines), lines
