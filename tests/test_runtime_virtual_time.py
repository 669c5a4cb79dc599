"""The whole worker runtime (claim loops, lease renewer, maintenance) on the in-memory driver
under trio's MockClock: minutes of virtual time run in milliseconds, so counts are exact."""

from __future__ import annotations

import itertools

import attrs
import pytest
import trio
import trio.testing

import trioq
from tests.support import running_worker
from trioq._memory import MemoryDriver
from trioq._runtime.services.maintenance import READY_SWEEP_EVERY
from trioq._runtime.services.polls import LEAD_SECONDS, PollSharing
from trioq._seam.services import MaintenancePass, MaintenanceReport, RenewalResult, RenewLeases


def make_app() -> trioq.App:
    return trioq.App(schema="virtual")


# The statements of the worker's services that probe its queues in place of a claim poll.
PROBING = ("leader_elect", "maintenance_pass")


async def idle_minute(queues: list[str]) -> dict[str, int]:
    """The statements one idle worker (100 slots) sends in one virtual minute, by name."""
    app = make_app()

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    driver = MemoryDriver()
    async with (
        app.client(driver=driver),
        running_worker(app, queues, concurrency=100, poll_interval=1.0),
    ):
        await trio.sleep(0.5)  # let the start-up round of each loop run
        before = dict(driver.statistics().calls)
        await trio.sleep(60)  # one virtual minute, idle
        after = dict(driver.statistics().calls)
    return {name: n - before.get(name, 0) for name, n in after.items() if n > before.get(name, 0)}


@pytest.mark.parametrize("queue_count", [1, 2, 4])
async def test_idle_queues_are_looked_at_once_per_interval_whatever_the_slot_count(
    autojump_clock: trio.testing.MockClock, queue_count: int
) -> None:
    calls = await idle_minute([f"q{n}" for n in range(queue_count)])
    probes = sum(calls.get(name, 0) for name in PROBING)
    looks_per_queue = calls["job_claim"] / queue_count + probes
    # A look is a claim poll or a probe standing in for one: once per poll interval, never
    # more than an interval apart (a probe sent just before a poll was due replaces it).
    assert 60 <= looks_per_queue <= 61, calls
    assert probes >= 4, calls  # maintenance every lease/3 (10 s, jittered) replaced polls


@pytest.mark.parametrize("queue_count", [1, 4])
async def test_idle_worker_sends_at_most_one_statement_per_second_per_queue(
    autojump_clock: trio.testing.MockClock, queue_count: int
) -> None:
    calls = await idle_minute([f"q{n}" for n in range(queue_count)])
    # The lone worker leads: its maintenance pass heartbeats, keeps the seat and reads the
    # schedules, so no renewal, election or scheduler statement is sent while it is idle.
    assert set(calls) == {"job_claim", "maintenance_pass"}, calls
    assert sum(calls.values()) <= 60 * queue_count, calls


class SweepingDriver(MemoryDriver):
    """A memory driver whose first maintenance pass reports a ready ring with pages, and whose
    sweeps leave 2, then 1, then no slot with pages (what PostgreSQL's reports look like)."""

    def __init__(self) -> None:
        super().__init__()
        self.passes = 0
        self.sweeps: list[float] = []
        self.left = [2, 1, 0]

    async def maintenance_pass(self, params: MaintenancePass) -> MaintenanceReport:
        report = await super().maintenance_pass(params)
        self.passes += 1
        return attrs.evolve(report, ready_pending=4 if self.passes == 1 else 0)

    async def ready_sweep(self) -> int:
        self.sweeps.append(trio.current_time())
        return self.left.pop(0) if self.left else 0


async def test_the_leader_sweeps_the_ready_ring_while_a_slot_has_pages_then_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = make_app()

    @app.task("noop", queue="q")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    driver = SweepingDriver()
    async with app.client(driver=driver), running_worker(app, ["q"], poll_interval=1.0):
        await trio.sleep(60)
    # One sweep per READY_SWEEP_EVERY while slots had pages, none once a sweep left none (and
    # no pass reported pages again).
    assert driver.passes >= 4
    assert len(driver.sweeps) == 3, driver.sweeps
    gaps = [later - earlier for earlier, later in itertools.pairwise(driver.sweeps)]
    assert gaps == [READY_SWEEP_EVERY, READY_SWEEP_EVERY], gaps


async def test_probes_standing_in_for_polls_still_find_unannounced_work_within_a_poll_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Poll-only mode (no listener): every job is found by a look at its queue, a claim poll or
    a maintenance probe standing in for one; none waits longer than one poll interval."""
    app = make_app()
    waited: list[float] = []
    enqueued_at: dict[int, float] = {}

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        waited.append(trio.current_time() - enqueued_at[ctx.job.id])

    async with (
        app.client(driver=MemoryDriver()) as client,
        running_worker(app, poll_interval=1.0, notifications=False),
    ):
        for n in range(40):
            await trio.sleep(0.37 + 0.11 * (n % 5))  # phases across the poll and probe timers
            job = await client.enqueue("noop", {})
            enqueued_at[job.id] = trio.current_time()
        with trio.fail_after(5):
            await client.wait_result(job.id, timeout=None)
    assert len(waited) == 40
    assert max(waited) <= 1.0, sorted(waited)[-5:]


async def test_delayed_job_runs_when_due_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = make_app()
    started: list[float] = []

    @app.task("later")
    async def later(ctx: trioq.Context, payload: object) -> None:
        started.append(trio.current_time())

    async with app.client(driver=MemoryDriver()) as client, running_worker(app, poll_interval=5.0):
        t0 = trio.current_time()
        job = await client.enqueue("later", {}, delay=3600)
        with trio.fail_after(4000):
            await client.wait_result(job.id, timeout=None)
    # Database time has microsecond resolution: the job is due from 3600 s less a rounding.
    assert 3600 - 1e-6 <= started[0] - t0 <= 3600 + 5.0


async def test_jobs_due_between_polls_start_at_their_due_time_not_the_next_poll(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = make_app()
    started: list[float] = []

    @app.task("due")
    async def due(ctx: trioq.Context, payload: object) -> None:
        started.append(trio.current_time())

    async with app.client(driver=MemoryDriver()) as client, running_worker(app, poll_interval=30):
        await trio.sleep(0.5)  # past the start-up round of the claim loop
        t0 = trio.current_time()
        jobs = [await client.enqueue("due", {}, delay=delay) for delay in (1.0, 1.4, 1.8)]
        with trio.fail_after(60):
            for job in jobs:
                await client.wait_result(job.id, timeout=None)
    lateness = [start - t0 - delay for start, delay in zip(started, (1.0, 1.4, 1.8), strict=True)]
    # The worker's timer follows each due time (to database time's microsecond rounding).
    assert all(-1e-5 <= late <= 1e-3 for late in lateness), lateness


async def test_a_freed_slot_refills_at_once_not_at_the_next_poll(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = make_app()
    starts: list[float] = []
    ends: list[float] = []

    @app.task("short")
    async def short(ctx: trioq.Context, payload: object) -> None:
        starts.append(trio.current_time())
        await trio.sleep(0.05)
        ends.append(trio.current_time())

    async with (
        app.client(driver=MemoryDriver()) as client,
        running_worker(app, concurrency=1, poll_interval=60),
    ):
        jobs = await client.enqueue_many("short", [{}] * 6)
        with trio.fail_after(600):
            for job in jobs:
                await client.wait_result(job.id, timeout=None)
    gaps = [start - end for start, end in zip(starts[1:], ends, strict=False)]
    assert len(starts) == 6
    assert max(gaps) < 1e-3, gaps  # settling a job claims the next in the same round


async def test_retries_follow_the_backoff_policy_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = make_app()
    attempts: list[float] = []

    @app.task(
        "flaky",
        max_attempts=4,
        retry=trioq.RetryPolicy(base_seconds=10, max_seconds=1000, jitter=0),
    )
    async def flaky(ctx: trioq.Context, payload: object) -> str:
        attempts.append(trio.current_time())
        if ctx.job.attempt < 4:
            raise RuntimeError("not yet")
        return "done"

    async with app.client(driver=MemoryDriver()) as client, running_worker(app, poll_interval=1.0):
        job = await client.enqueue("flaky", {})
        with trio.fail_after(1000):
            assert await client.wait_result(job.id, timeout=None) == "done"
    gaps = [round(later - earlier) for earlier, later in itertools.pairwise(attempts)]
    # 10 s, 20 s, 40 s of backoff, each found by the next poll (1 s interval) at the latest.
    assert [gap // 10 * 10 for gap in gaps] == [10, 20, 40]
    assert all(gap - expected <= 1 for gap, expected in zip(gaps, [10, 20, 40], strict=True))


async def test_job_of_a_vanished_worker_is_recovered_after_its_lease(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A worker cancelled hard (no drain) leaves its lease; another worker's maintenance
    returns the job after the lease expires and runs it as attempt 2."""
    app = make_app()
    runs: list[tuple[int, float]] = []
    hang = trio.Event()
    first_run = trio.Event()

    @app.task("work")
    async def work(ctx: trioq.Context, payload: object) -> str:
        runs.append((ctx.job.attempt, trio.current_time()))
        first_run.set()
        if ctx.job.attempt == 1:
            await hang.wait()
        return "ok"

    async with app.client(driver=MemoryDriver()) as client:
        job = await client.enqueue("work", {})
        with trio.CancelScope() as first_worker:
            async with running_worker(app, lease_seconds=30, poll_interval=1.0):
                await first_run.wait()
                killed_at = trio.current_time()
                first_worker.cancel()  # a hard stop: the lease stays behind
        async with running_worker(app, lease_seconds=30, poll_interval=1.0):
            with trio.fail_after(200):
                assert await client.wait_result(job.id, timeout=None) == "ok"
        attempts = await client.attempts(job.id)
    assert [attempt for attempt, _ in runs] == [1, 2]
    # expiry (30 s) + the maintenance interval (lease/3, jittered up to 1.2x) + one poll
    assert runs[1][1] - killed_at <= 30 + 12 + 1
    assert [a.outcome for a in attempts] == ["lost"]


class StalledRenewals(MemoryDriver):
    """A database whose renewals never answer (a stalled connection, a starved pool)."""

    async def lease_renew_many(self, params: RenewLeases) -> RenewalResult:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def test_unconfirmed_lease_cancels_its_handler_before_recovery_and_a_reclaim_is_safe(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Renewals stall: at 90% of the lease the handler is cancelled, before maintenance could
    recover the job at expiry, and its job is released (fenced) back to ready with its attempt
    restored: a slow renewal does not cost an attempt, and the job runs again at once. A handler
    that ignores the cancellation (shielded) is still running when its lease expires and the job
    comes back to the same worker as attempt 2: the worker runs attempt 2, writes its result,
    fences off attempt 1's late result and its release, and keeps working."""
    app = make_app()
    release_first = trio.Event()
    cancelled_at: list[float] = []
    finished: list[int] = []
    polite_runs = 0

    @app.task("work")
    async def work(ctx: trioq.Context, payload: object) -> int:
        nonlocal polite_runs
        if ctx.job.attempt == 1 and payload == {"stubborn": True}:
            with trio.CancelScope(shield=True):
                await release_first.wait()
        elif payload == {}:
            polite_runs += 1
            if polite_runs == 1:
                try:
                    await trio.sleep_forever()
                except trio.Cancelled:
                    cancelled_at.append(trio.current_time())
                    raise
        finished.append(ctx.job.attempt)
        return ctx.job.attempt

    async with (
        app.client(driver=StalledRenewals()) as client,
        # Admission control (on by default) rightly claims nothing more while renewals stall:
        # this test is about fencing across a reclaim, so admission only observes here.
        running_worker(
            app, concurrency=2, lease_seconds=30, poll_interval=1.0, admission="observe"
        ),
    ):
        started = trio.current_time()
        polite = await client.enqueue("work", {})
        stubborn = await client.enqueue("work", {"stubborn": True})
        with trio.fail_after(120):
            assert await client.wait_result(polite.id, timeout=None) == 1  # released, rerun
            assert await client.wait_result(stubborn.id, timeout=None) == 2
        release_first.set()
        with trio.fail_after(10):  # attempt 1's late result changes nothing; the worker lives on
            again = await client.enqueue("work", {"stubborn": True})
            release_first = trio.Event()
            release_first.set()
            assert await client.wait_result(again.id, timeout=None) == 1
        record = await client.get_job(stubborn.id)
        polite_history = await client.attempts(polite.id)
    assert len(cancelled_at) == 1 and cancelled_at[0] - started <= 0.9 * 30 + 1
    assert (polite_runs, polite_history) == (2, [])  # run twice, no attempt lost
    assert (record.state, record.attempt, record.result) == ("completed", 2, 2)


@attrs.define
class HiccupRenewals(MemoryDriver):
    """A database whose renewals misbehave for a while: of those that carry leases, the first
    answers (the early one, sent as the admission snapshot changes), the next `slow` take
    `delay` seconds, the next `failing` raise, and the rest answer."""

    delay: float = 0.0
    slow: int = 0
    failing: int = 0
    seen: int = 0

    async def lease_renew_many(self, params: RenewLeases) -> RenewalResult:
        if params.leases:
            self.seen += 1
            if 1 < self.seen <= 1 + self.slow:
                await trio.sleep(self.delay)
            elif 1 + self.slow < self.seen <= 1 + self.slow + self.failing:
                raise ConnectionError("connection reset by peer")
        return await super().lease_renew_many(params)


@pytest.mark.parametrize(
    ("delay", "slow", "failing"),
    [(0.4 * 30, 1_000_000, 0), (0.0, 0, 2)],
    ids=["every renewal takes 0.4 of the lease", "two renewals in a row fail"],
)
async def test_a_renewal_hiccup_shorter_than_the_lease_costs_no_lease(
    autojump_clock: trio.testing.MockClock, delay: float, slow: int, failing: int
) -> None:
    """A renewal slower than the renewal interval (lease/3) is waited for while the leases it
    extends last: cut off at the interval, every renewal of a database that answers in 0.4 of
    the lease failed, and the watchdog cancelled each run at 90% of the lease, for ever. Two
    failed renewals in a row are retried in time (admission control asks for an early one)."""
    app = make_app()
    runs: list[int] = []

    @app.task("work")
    async def work(ctx: trioq.Context, payload: object) -> int:
        runs.append(ctx.job.attempt)
        await trio.sleep(2 * 30)  # two leases long: every renewal it needs must land
        return ctx.job.attempt

    driver = HiccupRenewals(delay=delay, slow=slow, failing=failing)
    async with (
        app.client(driver=driver) as client,
        running_worker(app, lease_seconds=30, poll_interval=1.0),
    ):
        job = await client.enqueue("work", {})
        with trio.fail_after(200):
            assert await client.wait_result(job.id, timeout=None) == 1
        attempts = await client.attempts(job.id)
    assert (runs, attempts) == ([1], [])  # run once, never cancelled, released or recovered
    assert driver.seen > 1 + min(slow, 2) + failing  # the hiccup happened, renewals went on


async def test_claims_overlap_one_flush_in_flight_within_the_bounds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With a backlog of instant jobs and statements that take 2 ms of virtual time, the
    completer's flush and the claim loop's claim are in flight at once, never more than one
    flush at a time; handlers running stay within the slots, and the worker's running rows
    (at every commit) within the slots plus the completer's capacity."""
    app = make_app()
    concurrency = 25
    active = most_active = 0

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        nonlocal active, most_active
        active += 1
        most_active = max(most_active, active)
        await trio.lowlevel.checkpoint()
        active -= 1

    inner = MemoryDriver()
    claims = flushes = most_together = most_flushes = most_running = 0

    class SlowStatements:
        """The memory driver with a round trip: each statement commits after 2 ms."""

        def __getattr__(self, name: str) -> object:
            return getattr(inner, name)

        async def job_claim(self, params):  # type: ignore[no-untyped-def]
            return await self._statement(False, inner.job_claim, params)

        async def job_settle_many(self, settlements):  # type: ignore[no-untyped-def]
            return await self._statement(True, inner.job_settle_many, settlements)

        async def _statement(self, flush, method, argument):  # type: ignore[no-untyped-def]
            nonlocal claims, flushes, most_together, most_flushes, most_running
            if flush:
                flushes += 1
            else:
                claims += 1
            most_together = max(most_together, claims + flushes)
            most_flushes = max(most_flushes, flushes)
            try:
                await trio.sleep(0.002)
                result = await method(argument)
                [status] = await inner.queue_status()
                most_running = max(most_running, status.running)
                return result
            finally:
                if flush:
                    flushes -= 1
                else:
                    claims -= 1

    async with app.client(driver=SlowStatements()) as client:  # type: ignore[arg-type]
        jobs = await client.enqueue_many("noop", [{} for _ in range(2000)])
        async with running_worker(app, concurrency=concurrency) as worker:
            [loop] = worker.loops.values()
            with trio.fail_after(600):
                for job in jobs:
                    await client.wait_final(job.id)
        [status] = await inner.queue_status()
    assert status.completed == 2000
    assert (most_together, most_flushes) == (2, 1)
    assert most_active == concurrency
    assert 0 < most_running <= concurrency + loop.completer.capacity


class _LoopInARound:
    """A claim loop whose round is in flight until `round_ends`; its next poll is due one
    poll interval after that (what ClaimLoop.poll_due_at reports; defer_poll holds it)."""

    queue = "default"

    def __init__(self, round_ends: float) -> None:
        self.round_ends = round_ends
        self.poll_at = round_ends + 1.0

    def poll_due_at(self) -> float | None:
        if trio.current_time() < self.round_ends:
            return None
        return self.poll_at

    def defer_poll(self, looked_at: float) -> None:
        self.poll_at = max(self.poll_at, looked_at + 1.0)


class _LoopWaitingForItsPoll:
    """A claim loop waiting for its poll as ClaimLoop does: a cancel scope whose deadline is
    the poll (moved by defer_poll); once the deadline has passed, no poll is due any more."""

    queue = "default"

    def __init__(self, poll_at: float) -> None:
        self.poll_at = poll_at
        self.scope = trio.CancelScope(deadline=poll_at)
        self.polled_at: float | None = None

    def poll_due_at(self) -> float | None:
        return None if self.scope.cancel_called else self.poll_at

    def defer_poll(self, looked_at: float) -> None:
        self.poll_at = max(self.poll_at, looked_at + 1.0)
        self.scope.deadline = self.poll_at

    async def wait(self) -> None:
        with self.scope:
            await trio.sleep_forever()
        self.polled_at = trio.current_time()


async def test_a_service_woken_late_still_stands_in_for_the_poll_it_waited_for(
    mock_clock: trio.testing.MockClock,
) -> None:
    """Regression (idle 1.03 statements/s on a busy machine): a service that woke a few ms
    late found the poll it meant to replace already fired (both sleeps ended in one batch) and
    went unaligned after its 2 s bound. The poll is held a little past its time meanwhile."""
    start = trio.current_time()
    loop = _LoopWaitingForItsPoll(poll_at=start + 1.0)
    sharing = PollSharing([loop], poll_interval=1.0)  # type: ignore[list-item]
    answers: list[float | None] = []

    async def service() -> None:
        answers.append(await sharing.wait_poll_due(at_most=2.0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.wait)
        nursery.start_soon(service)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(1.02)  # the service wakes 21 ms late, after the poll's own time
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [start + 1.0]
        assert loop.polled_at is None, "the poll waited for the statement standing in for it"
        nursery.cancel_scope.cancel()


async def test_a_service_waiting_to_stand_in_for_a_poll_waits_out_a_round_in_flight(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Regression (idle 1.13 statements/s): a maintenance pass that woke while the loop's round
    was in flight slept a whole poll interval and then went unaligned, next to a round (one
    more statement, and a ping of a second pooled connection). It now waits for the poll the
    round re-arms and goes in its place."""
    start = trio.current_time()
    loop = _LoopInARound(round_ends=start + 0.05)
    sharing = PollSharing([loop], poll_interval=1.0)  # type: ignore[list-item]
    poll_due = await sharing.wait_poll_due(at_most=2.0)
    assert poll_due == start + 1.05
    assert trio.current_time() == pytest.approx(poll_due - LEAD_SECONDS)


async def test_an_idle_worker_with_a_long_lease_heartbeats_within_the_liveness_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Regression: an idle worker's heartbeat rides its maintenance pass, every lease/3 by
    default; with a 10-minute lease that was every 200 s (280 s with jitter and alignment),
    and `trioq status` counted the idle worker as gone after 120 s. The derived interval is
    capped at 60 s."""
    app = make_app()

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    driver = MemoryDriver()
    ages: list[float] = []
    async with (
        app.client(driver=driver) as client,
        running_worker(app, lease_seconds=600.0, poll_interval=1.0),
    ):
        for _ in range(60):  # ten virtual minutes, idle
            await trio.sleep(10)
            [worker] = await client.workers()
            ages.append((driver._state.now() - worker.heartbeat_at).total_seconds())
    assert max(ages) < 120, ages


def test_a_maintenance_interval_an_idle_heartbeat_cannot_ride_is_refused() -> None:
    with pytest.raises(ValueError, match="maintenance_interval: must be > 0 and at most 60 s"):
        trioq.WorkerConfig(maintenance_interval=200.0)
    assert trioq.WorkerConfig(lease_seconds=600.0).maintenance_every == 60.0
    assert trioq.WorkerConfig(lease_seconds=30.0).maintenance_every == 10.0
