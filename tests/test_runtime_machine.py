"""A Hypothesis machine driving the REAL claim loop, completer and worker on the memory driver
under trio's MockClock: handlers (some with a partition key) finish, fail, hang, or sleep
durably; the driver loses its connection for a few claim rounds or completer flushes; flushes
are held back for a while; time advances; at the end the worker drains. After every step the
invariants are checked against the loop's own accounting and the stored rows: handlers running
<= slots; jobs buffered <= prefetch; rows the worker owns <= slots + prefetch + the completer's
capacity, each one accounted for under the same lease (prefetched ones included); and (checked
as each handler starts) a partition key's job runs only when no other job of its key holds the
key, i.e. its predecessor's outcome has committed. The machine runs with prefetch 0 and 2.

The worker runs in one `trio.run` (with a MockClock that only moves when a rule jumps it) on a
background thread; each rule runs a coroutine there and then waits until every task is blocked,
so the state it checks is settled.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import trioq
from tests.support import running_worker
from trioq._memory import MemoryDriver
from trioq._seam.driver import Claim, ClaimResult, Settlement, SettleResult
from trioq.testing.transitions import CheckedDriver

CONCURRENCY = 3
LEASE = 30.0
BEHAVIOURS = ("finish", "fail", "hang", "sleep")


@attrs.define(eq=False)
class FlakyDriver:
    """The memory driver, whose next `lose` claim rounds and next `fail_flushes` completer
    flushes fail as a lost connection; while `flush_gate` is set, flushes wait for it."""

    inner: MemoryDriver
    lose: int = 0
    fail_flushes: int = 0
    flush_gate: trio.Event | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def job_claim(self, params: Claim) -> ClaimResult:
        await trio.lowlevel.checkpoint()
        if self.lose:
            self.lose -= 1
            raise ConnectionError("connection lost (injected)")
        return await self.inner.job_claim(params)

    async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
        await trio.lowlevel.checkpoint()
        if self.flush_gate is not None:
            await self.flush_gate.wait()
        if self.fail_flushes:
            self.fail_flushes -= 1
            raise ConnectionError("connection lost (injected, flush)")
        return await self.inner.job_settle_many(settlements)


class Host:
    def __init__(self, prefetch: int) -> None:
        self.prefetch = prefetch
        self.clock = trio.testing.MockClock()
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("host did not start")
        if self._failure is not None:
            raise self._failure

    def _run(self) -> None:
        try:
            trio.run(self._serve, clock=self.clock)
        except BaseException as exc:
            self._failure = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self.memory = MemoryDriver(schema="machine")
        # Every row change the worker's calls make is checked against TRANSITIONS; its calls
        # overlap (claim loop, completer, renewals), and the check judges them together.
        self.checked = CheckedDriver(self.memory)
        self.driver = FlakyDriver(self.checked)  # type: ignore[arg-type]  (a Driver by proxy)
        self.release = trio.Event()
        self.app = trioq.App(schema="machine")
        host = self

        self.active = 0  # handlers running now
        self.violations: list[str] = []

        @self.app.task("work", max_attempts=2, retry=trioq.RetryPolicy(base_seconds=5, jitter=0))
        async def work(ctx: trioq.Context, payload: dict[str, str]) -> str:
            host.active += 1
            try:
                host.check_key_free(ctx.job.id)
                behaviour = payload["do"]
                if behaviour == "fail":
                    raise RuntimeError("handler failed")
                if behaviour == "hang":
                    await host.release.wait()
                if behaviour == "sleep":
                    await ctx.sleep("nap", datetime.timedelta(seconds=20))
                return behaviour
            finally:
                host.active -= 1

        self._stop = trio.Event()
        async with (
            self.app.client(driver=self.driver) as client,  # type: ignore[arg-type]
            running_worker(
                self.app,
                concurrency=CONCURRENCY,
                lease_seconds=LEASE,
                poll_interval=1.0,
                prefetch=self.prefetch,
            ) as worker,
        ):
            self.client, self.worker = client, worker
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            self.release.set()  # the drain lets hung handlers finish

    def check_key_free(self, job_id: int) -> None:
        """At a handler's start: no other job of its partition key holds the key (running,
        or suspended), so its predecessor's outcome has committed."""
        row = self.memory._state.rows[job_id]
        if row.partition_key is None:
            return
        holders = [
            other.id
            for other in self.memory._state.rows.values()
            if other.id != job_id
            and other.partition_key == row.partition_key
            and other.state in ("running", "sleeping", "waiting")
        ]
        if holders:
            self.violations.append(f"job {job_id} of key {row.partition_key} ran while {holders}")

    def call(self, function: Callable[[], Awaitable[Any]]) -> Any:
        async def settled() -> Any:
            result = await function()
            await trio.testing.wait_all_tasks_blocked()
            return result

        return trio.from_thread.run(settled, trio_token=self._token)

    def close(self) -> None:
        def stop() -> None:
            self.clock.autojump_threshold = 0  # let the drain's timers (backoff, grace) run
            self.driver.lose = self.driver.fail_flushes = 0
            if self.driver.flush_gate is not None:
                self.driver.flush_gate.set()
            self._stop.set()

        trio.from_thread.run_sync(stop, trio_token=self._token)
        self._thread.join(30)
        if self._failure is not None:
            raise self._failure


class RuntimeMachine(RuleBasedStateMachine):
    PREFETCH = 0

    def __init__(self) -> None:
        super().__init__()
        self.host = Host(self.PREFETCH)

    @rule(
        behaviours=st.lists(st.sampled_from(BEHAVIOURS), min_size=1, max_size=4),
        key=st.sampled_from([None, "a", "b"]),
    )
    def enqueue(self, behaviours: list[str], key: str | None) -> None:
        async def enqueue() -> None:
            for behaviour in behaviours:
                await self.host.client.enqueue("work", {"do": behaviour}, partition_key=key)

        self.host.call(enqueue)

    # Steps shorter than the renewal interval (lease/3): renewals keep up. A longer freeze lets
    # the watchdog give up on leases the database still holds, and the lost handlers' rows stay
    # running (uncounted) until they expire: the watchdog's subject, not this machine's.
    @rule(seconds=st.sampled_from([0.01, 1.0, 7.0]))
    def time_passes(self, seconds: float) -> None:
        async def jump() -> None:
            self.host.clock.jump(seconds)
            await trio.lowlevel.checkpoint()

        self.host.call(jump)

    @rule()
    def release_hung_handlers(self) -> None:
        async def release() -> None:
            self.host.release.set()
            await trio.lowlevel.checkpoint()
            self.host.release = trio.Event()

        self.host.call(release)

    @rule(rounds=st.integers(1, 3))
    def connection_lost(self, rounds: int) -> None:
        self.host.driver.lose = rounds

    @rule(flushes=st.integers(1, 3))
    def flushes_fail(self, flushes: int) -> None:
        self.host.driver.fail_flushes = flushes

    @rule()
    def flushes_held(self) -> None:
        if self.host.driver.flush_gate is None:
            self.host.driver.flush_gate = trio.Event()

    @rule()
    def flushes_released(self) -> None:
        async def release() -> None:
            gate, self.host.driver.flush_gate = self.host.driver.flush_gate, None
            if gate is not None:
                gate.set()
            await trio.lowlevel.checkpoint()

        self.host.call(release)

    @invariant()
    def capacity_holds_in_the_loop_and_in_the_rows(self) -> None:
        async def check() -> None:
            worker = self.host.worker
            [loop] = worker.loops.values()
            prefetch = self.host.prefetch
            bound = CONCURRENCY + prefetch + loop.completer.capacity
            owned = loop.owned_leases()
            assert self.host.active <= CONCURRENCY
            # A held outcome (the completer's backlog was full) keeps its handler's slot.
            assert len(loop.running) + loop.completer.held <= CONCURRENCY
            assert len(loop.prefetched()) <= prefetch, loop.prefetched()
            assert len(owned) <= bound, owned
            running_rows = [
                row
                for row in self.host.memory._state.rows.values()
                if row.state == "running" and row.worker_id == worker.worker_id
            ]
            assert len(running_rows) <= bound, running_rows
            # Every row running under this worker is one the loop accounts for (a running
            # handler, a prefetched job, or an outcome the completer has not written yet),
            # under the same lease.
            held = {(row.id, row.attempt, row.lease_token) for row in running_rows}
            assert held <= {(lease.id, lease.attempt, lease.lease_token) for lease in owned}
            assert self.host.violations == []
            assert self.host.checked.violations == []

        self.host.call(check)

    def teardown(self) -> None:
        self.host.close()


class PrefetchingMachine(RuntimeMachine):
    PREFETCH = 2


@pytest.mark.parametrize("machine", [RuntimeMachine, PrefetchingMachine], ids=["0", "2"])
def test_claim_loop_keeps_its_bounds_and_key_order_under_lost_held_and_failed_writes(
    machine: type[RuntimeMachine],
) -> None:
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
