"""The worker's per-job path (claim loop, executor, completer, metrics): what its cheaper
bookkeeping must keep. Counts checked against prometheus-client's own types, the completer's
ownership, bound and order, and the isolation a task per job gives (contextvars, failures,
cancels)."""

from __future__ import annotations

import contextvars
import datetime
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry, Counter, Histogram

import trioq
from tests.support import running_worker
from trioq._memory import MemoryDriver
from trioq._runtime.job.claim_loop import ClaimLoop, WorkerHooks
from trioq._runtime.job.completer import Completer, open_completer
from trioq._runtime.job.outcome import (
    Cancelled,
    Completed,
    CompletedInTransaction,
    Failed,
    Lost,
    Released,
    RetryAt,
    Suspended,
    outcome_name,
)
from trioq._runtime.job.tasks import TaskSpec
from trioq._runtime.services.metrics import HANDLER_BUCKETS, WorkerMetrics
from trioq._runtime.workflow.checkpoints import CheckpointWriter
from trioq._seam.driver import Claim, ClaimedJob, ClaimResult, Settlement, SettleResult
from trioq._seam.lease import Lease
from trioq._seam.workflow import EventWaitOutcome


def _samples(registry: CollectorRegistry, prefix: str) -> dict[tuple[str, frozenset], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name.startswith(prefix) and not sample.name.endswith("_created")
    }


def test_job_tally_exposes_what_prometheus_clients_counter_and_histogram_would() -> None:
    durations = [0.0, 0.005, 0.0050001, 0.3, 1.0, 59.9, 300.0, 1800.0, 1800.5, 1e6]
    metrics = WorkerMetrics()
    reference = CollectorRegistry()
    histogram = Histogram(
        "trioq_handler_seconds", "x", ["task"], buckets=HANDLER_BUCKETS, registry=reference
    )
    counter = Counter("trioq_job_outcomes", "x", ["queue", "outcome"], registry=reference)
    for n, seconds in enumerate(durations):
        task, outcome = ("a", "completed") if n % 3 else ("b", "failed")
        metrics.jobs.ended(task, "q", outcome, seconds)
        histogram.labels(task).observe(seconds)
        counter.labels("q", outcome).inc()
    for prefix in ("trioq_handler_seconds", "trioq_job_outcomes"):
        assert _samples(metrics.registry, prefix) == _samples(reference, prefix)
    assert metrics.registry.get_sample_value("trioq_lost_leases_total") == 0
    metrics.jobs.ended("a", "q", "lost", 0.1)
    assert metrics.registry.get_sample_value("trioq_lost_leases_total") == 1
    assert metrics.jobs.outcome_count("q", "lost") == 1


def test_per_round_metrics_update_the_children_prometheus_client_exposes() -> None:
    metrics = WorkerMetrics()
    for claimed in (3, 0, 5):
        metrics.on_round("q", 25, claimed)
    assert metrics.child(metrics.claims, "q") is metrics.claims.labels("q")
    sample = metrics.registry.get_sample_value
    assert sample("trioq_claims_total", {"queue": "q"}) == 3
    assert sample("trioq_claimed_jobs_total", {"queue": "q"}) == 8


def test_every_outcome_has_its_name() -> None:
    names = [
        outcome_name(outcome)
        for outcome in (
            Completed("null"), CompletedInTransaction(), RetryAt("{}", 1.0), Failed("{}"),
            Cancelled("{}"), Released(), Lost(), Suspended("waiting", None),
        )
    ]  # fmt: skip
    assert names == [
        "completed", "completed", "retried", "failed", "cancelled", "released", "lost", "waiting",
    ]  # fmt: skip


NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _settlement(job_id: int, kind: str = "complete") -> Settlement:
    lease = Lease(job_id, 1, uuid.uuid4())
    if kind == "complete":
        return Settlement(lease, kind, result_json="null")
    return Settlement(lease, kind)


async def test_completer_owns_outcomes_until_written_waits_when_full_and_resends_first(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The backlog holds at most max_backlog outcomes (a hand-over then waits); an outcome's
    lease stays owned until its batch commits; a batch lost with the connection is sent again
    ahead of newer outcomes, still knowing which outcome frees a key."""
    sent: list[tuple[int, ...]] = []
    fail_next = True
    written: list[tuple[tuple[int, ...], bool]] = []
    all_written = trio.Event()

    def on_written(batch: tuple[Settlement, ...], frees: bool, *_: object) -> None:
        written.append((tuple(s.lease.id for s in batch), frees))
        if len(written) == 2:
            all_written.set()

    class Driver:
        def is_connection_lost(self, exc: BaseException) -> bool:
            return isinstance(exc, ConnectionError)

        async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
            nonlocal fail_next
            await trio.sleep(0.01)
            sent.append(tuple(s.lease.id for s in settlements))
            if fail_next:
                fail_next = False
                raise ConnectionError("lost")
            settled = tuple((s.lease.id, "completed") for s in settlements)
            return SettleResult(settled=settled, now=NOW)

    completer = Completer(
        driver=Driver(),  # type: ignore[arg-type]
        queue="default",
        max_backlog=2,
        batch_size=2,
        on_written=on_written,
    )
    one, two, three = _settlement(1), _settlement(2, "release"), _settlement(3)
    completer.hand_over_nowait(one, keyed=False)
    completer.hand_over_nowait(two, keyed=True)
    with pytest.raises(trio.WouldBlock):
        completer.hand_over_nowait(three, keyed=False)
    assert completer.capacity == 4
    async with open_completer(completer):
        await completer.hand_over(three, keyed=False)  # waits until the first batch leaves
        assert set(completer.leases()) == {one.lease, two.lease, three.lease}
        with trio.fail_after(5):
            await all_written.wait()
    assert sent == [(1, 2), (1, 2), (3,)]  # the lost batch again, ahead of the newer outcome
    assert written == [((1, 2), True), ((3,), False)]
    assert completer.statistics().retries == 1 and completer.leases() == []


def _one_outcome_completer(
    release: trio.Event, sent: list[tuple[int, ...]], **extra: Any
) -> Completer:
    """A completer whose backlog holds one outcome, batches of one sent at once, on a driver
    that records each batch's job ids in `sent` and answers once `release` is set."""

    class Driver:
        def is_connection_lost(self, exc: BaseException) -> bool:
            return False

        async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
            sent.append(tuple(s.lease.id for s in settlements))
            await release.wait()
            settled = tuple((s.lease.id, "completed") for s in settlements)
            return SettleResult(settled=settled, now=NOW)

    return Completer(
        driver=Driver(),  # type: ignore[arg-type]
        queue="default",
        max_backlog=1,
        batch_size=1,
        flush_delay=0,
        **extra,
    )


async def test_waiting_hand_overs_enter_the_backlog_in_order_and_a_cancelled_one_leaves_nothing(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Hand-overs that find the backlog full wait; as a batch leaves, the oldest waiting ones
    are taken (their tasks return, the outcome already in the backlog), in the order they
    came; a waiting hand-over that is cancelled is never written, and a new hand-over does
    not overtake the waiting ones."""
    release = trio.Event()
    sent: list[tuple[int, ...]] = []

    completer = _one_outcome_completer(release, sent)
    returned: list[int] = []

    async def hand(job_id: int, cancel_scope: trio.CancelScope | None = None) -> None:
        with cancel_scope or trio.CancelScope():
            await completer.hand_over(_settlement(job_id), keyed=False)
            returned.append(job_id)

    completer.hand_over_nowait(_settlement(1), keyed=False)
    two_scope = trio.CancelScope()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            # Waiting before the completer runs: 2, 3 and 4 find the backlog (1) full.
            nursery.start_soon(hand, 2, two_scope)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(hand, 3)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(hand, 4)
            await trio.testing.wait_all_tasks_blocked()
            two_scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.WouldBlock):  # room or not, 3 and 4 go first
                completer.hand_over_nowait(_settlement(5), keyed=False)
            assert returned == []
            async with open_completer(completer):
                await trio.testing.wait_all_tasks_blocked()
                # Batch (1) in flight; 3 took its room, 4 still waits (owned: its lease is
                # renewed); the cancelled 2 is owned by nobody.
                assert sent == [(1,)] and returned == [3]
                assert {lease.id for lease in completer.leases()} == {1, 3, 4}
                release.set()
                while len(sent) < 3:
                    await trio.testing.wait_all_tasks_blocked()
    assert sent == [(1,), (3,), (4,)]  # 2 was cancelled while waiting: never written
    assert returned == [3, 4] and completer.leases() == []


async def test_held_outcomes_keep_their_slots_and_leases_until_they_enter_the_backlog(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A hand-over that finds the backlog full is held without waiting: it counts as a taken
    slot (`held`) and an owned lease until a batch leaves room; it then enters the backlog in
    the order it came, among waiting hand-overs too, and `on_room` says its slot is open."""
    release = trio.Event()
    sent: list[tuple[int, ...]] = []
    rooms: list[int] = []

    completer = _one_outcome_completer(release, sent, on_room=lambda: rooms.append(completer.held))
    returned: list[int] = []

    async def hand(job_id: int) -> None:
        await completer.hand_over(_settlement(job_id), keyed=False)
        returned.append(job_id)

    assert completer.hand_over_or_hold(_settlement(1), keyed=False)
    assert not completer.hand_over_or_hold(_settlement(2), keyed=True)  # full: held
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hand, 3)  # a waiting hand-over, after the held one
            await trio.testing.wait_all_tasks_blocked()
            assert not completer.hand_over_or_hold(_settlement(4), keyed=False)  # 3 waits
            assert completer.held == 2 and len(completer) == 4
            assert completer.statistics().held == 2
            # Held outcomes and waiting hand-overs (a drain's releases of prefetched jobs,
            # owned nowhere else meanwhile) are owned: the renewer extends their leases.
            assert {lease.id for lease in completer.leases()} == {1, 2, 3, 4}
            async with open_completer(completer):
                await trio.testing.wait_all_tasks_blocked()
                # Batch (1) in flight; the held 2 took its room: its slot opened.
                assert sent == [(1,)] and rooms == [1] and returned == []
                release.set()
                while len(sent) < 4:
                    await trio.testing.wait_all_tasks_blocked()
    assert sent == [(1,), (2,), (3,), (4,)]
    assert returned == [3] and rooms == [1, 0]
    assert completer.held == 0 and completer.leases() == []


def _stub_loop(driver: object, handler: Any, **options: Any) -> ClaimLoop:
    """A claim loop of the default queue on a stub `driver`, serving one task named after
    `handler` (one attempt), its partial batches sent at once, its poll a minute away."""
    name = handler.__name__
    return ClaimLoop(
        queue="default",
        driver=driver,  # type: ignore[arg-type]
        tasks={name: TaskSpec(name, handler, max_attempts=1)},
        worker_id=uuid.uuid4(),
        lease_seconds=30,
        poll_interval=60,
        hooks=WorkerHooks(),
        checkpoints=CheckpointWriter(MemoryDriver()),
        flush_delay=0,
        **options,
    )


async def test_a_hard_stop_writes_what_is_left_and_starts_no_buffered_job() -> None:
    """A hard stop while a flush hangs, outcomes are held (the backlog is full) and claimed
    jobs wait in the prefetch buffer: the completer's last write takes the held outcomes in,
    which opens their slots, and nothing may start on them (the handlers' nursery is closed).
    Every outcome handed over is written by that last write; no buffered job ever ran."""
    first_flush = trio.Event()
    written: list[int] = []
    started: list[int] = []
    jobs = [
        ClaimedJob(i, "default", "noop", {}, 1, None, uuid.uuid4(), None, 0, NOW, NOW, False)
        for i in range(1, 9)
    ]

    class Driver:
        flushes = 0

        def is_connection_lost(self, exc: BaseException) -> bool:
            return False

        async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
            Driver.flushes += 1
            if Driver.flushes == 1:
                first_flush.set()
                await trio.sleep_forever()  # hangs until the hard stop cancels it
            written.extend(s.lease.id for s in settlements)
            settled = tuple((s.lease.id, "completed") for s in settlements)
            return SettleResult(settled=settled, now=NOW)

        async def job_claim(self, params: Claim) -> ClaimResult:
            claimed = tuple(jobs[: params.limit])
            del jobs[: params.limit]
            return ClaimResult(claimed=claimed, now=NOW)

    async def noop(ctx: Any, payload: Any) -> None:
        started.append(ctx.job.id)

    loop = _stub_loop(
        Driver(),
        noop,
        concurrency=2,
        max_backlog=1,
        prefetch=2,
    )
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(loop.run)
            await first_flush.wait()
            # Until every slot is held by an outcome waiting for room and the buffer is full.
            while not (loop.completer.held == 2 and len(loop.prefetched()) == 2):
                await trio.testing.wait_all_tasks_blocked()
            handed_over = sorted(started)
            nursery.cancel_scope.cancel()  # the hard stop
    assert sorted(started) == handed_over  # no buffered job started after the stop
    assert sorted(written) == handed_over  # the last write carried every outcome


async def test_a_wait_suspended_while_a_round_was_in_flight_still_sets_the_timer(
    autojump_clock: trio.abc.Clock,
) -> None:
    """An event wait with a timeout suspends the job in its own statement. A claim round sent
    while the job still ran (woken by a notification) answers after that commit, from a
    snapshot that saw the job running, with no due time: the wait's deadline must still set
    the loop's timer, or the timed-out job waits for the 60 s poll."""
    base = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    waited = trio.Event()
    late_round = trio.Event()  # a claim round after the first virtual second
    rounds: list[float] = []  # trio time of each claim round
    deadlines: list[datetime.datetime] = []  # the suspended job's, once its wait committed
    job = ClaimedJob(1, "default", "waits", {}, 1, None, uuid.uuid4(), None, 0, base, base, False)

    def db_now() -> datetime.datetime:
        return base + datetime.timedelta(seconds=trio.current_time())

    class Driver:
        def is_connection_lost(self, exc: BaseException) -> bool:
            return False

        async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
            settled = tuple((s.lease.id, "completed") for s in settlements)
            return SettleResult(settled=settled, now=db_now())

        async def job_claim(self, params: Claim) -> ClaimResult:
            rounds.append(trio.current_time())
            if rounds[-1] >= 1.0:
                late_round.set()
            # A round sees the suspended row's due time only if sent after its commit, and
            # only before the claim's lookahead (0.25 s) reaches it: a round within it claims
            # the job early instead (here the test has its answer by then).
            lookahead = datetime.timedelta(seconds=0.25)
            next_due = deadlines[0] if deadlines and db_now() < deadlines[0] - lookahead else None
            if len(rounds) == 2:
                await waited.wait()  # in flight while the wait's statement commits
            await trio.lowlevel.checkpoint()
            claimed = (job,) if len(rounds) == 1 else ()
            return ClaimResult(claimed=claimed, now=db_now(), next_due=next_due)

        async def job_wait_event(self, params: Any) -> EventWaitOutcome:
            deadlines.append(db_now() + datetime.timedelta(seconds=params.timeout_seconds))
            waited.set()
            return EventWaitOutcome("waiting", None, deadlines[0])

    async def waits(ctx: trioq.Context, payload: Any) -> None:
        loop.wake()  # a notification: round 2 goes out while this job runs
        await trio.testing.wait_all_tasks_blocked()
        await ctx.wait_for_event("never", timeout=datetime.timedelta(seconds=2))

    loop = _stub_loop(
        Driver(),
        waits,
        concurrency=2,
        # Notifications are live: after a short claim, a slot that opens claims nothing more
        # (the round after the suspension that would see its due time is never sent).
        notifications_live=lambda: True,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run)
        with trio.fail_after(10):  # virtual seconds: the poll is at 60
            await late_round.wait()
        nursery.cancel_scope.cancel()
    assert rounds[1] < 1.0  # sent while the job ran
    assert 1.5 <= rounds[-1] <= 2.5  # the next round: at the wait's deadline (2 s)


async def test_jobs_claimed_for_slots_admission_took_away_go_back_beyond_the_prefetch() -> None:
    """A round in flight asked for 3 slots and 2 prefetched; before it answers, admission
    control cuts the queue to 1 slot. One job starts, the buffer keeps its 2, and the other 2
    are handed back (fenced releases through the completer): the buffer never holds more
    than `prefetch`."""
    answer = trio.Event()
    releases: list[int] = []
    slots = [3]
    jobs = [
        ClaimedJob(i, "default", "blocks", {}, 1, None, uuid.uuid4(), None, 0, NOW, NOW, False)
        for i in range(1, 6)
    ]

    class Driver:
        def is_connection_lost(self, exc: BaseException) -> bool:
            return False

        async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
            releases.extend(s.lease.id for s in settlements if s.kind == "release")
            settled = tuple((s.lease.id, "ready") for s in settlements)
            return SettleResult(settled=settled, now=NOW)

        async def job_claim(self, params: Claim) -> ClaimResult:
            await answer.wait()
            claimed = tuple(jobs[: params.limit])
            del jobs[: params.limit]
            return ClaimResult(claimed=claimed, now=NOW)

    async def blocks(ctx: Any, payload: Any) -> None:
        await trio.sleep_forever()

    loop = _stub_loop(
        Driver(),
        blocks,
        concurrency=3,
        admitted=lambda: slots[0],
        prefetch=2,
    )
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(loop.run)
            await trio.testing.wait_all_tasks_blocked()  # the first round (5 jobs) waits
            slots[0] = 1  # admission cuts the queue to one slot
            answer.set()
            while len(releases) < 2:
                await trio.testing.wait_all_tasks_blocked()
            assert len(loop.running) == 1 and len(loop.prefetched()) == 2
            nursery.cancel_scope.cancel()
    assert sorted(releases) == [4, 5]  # the newest claimed go back


async def test_handlers_of_one_round_neither_share_contextvars_nor_failures_nor_cancels(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Ten jobs claimed in one round: each handler sets a contextvar and sees only its own
    value; one raises, one is cancelled on request, one exits via SystemExit; the rest
    complete, each with its own result."""
    app = trioq.App(schema="hot")
    var: contextvars.ContextVar[int] = contextvars.ContextVar("var")
    all_set = trio.Event()
    seen: dict[int, int | None] = {}

    @app.task("probe", max_attempts=1)
    async def probe(ctx: trioq.Context, payload: dict[str, int]) -> int:
        n = payload["n"]
        seen[n] = var.get(None)
        var.set(n)
        if len(seen) == 10:
            all_set.set()
        await all_set.wait()  # every handler of the round has set its value
        if n == 3:
            raise ValueError("three")
        if n == 4:
            raise SystemExit(4)
        if n == 5:
            await trio.sleep_forever()  # cancelled on request below
        await trio.sleep(0.1)
        return var.get() * 10

    driver = MemoryDriver()
    async with app.client(driver=driver) as client, running_worker(app, concurrency=10):
        jobs = await client.enqueue_many("probe", [{"n": n} for n in range(10)])
        with trio.fail_after(30):
            await all_set.wait()
            await client.cancel(jobs[5].id)
            records = [await client.wait_final(job.id) for job in jobs]
    assert seen == dict.fromkeys(range(10))  # nobody saw another's value
    states = [record.state for record in records]
    assert (states[3], records[3].error["type"]) == ("failed", "builtins.ValueError")
    assert (states[4], records[4].error["type"]) == ("failed", "builtins.SystemExit")
    assert states[5] == "cancelled"
    for n in (0, 1, 2, 6, 7, 8, 9):
        assert (states[n], records[n].result) == ("completed", n * 10)
