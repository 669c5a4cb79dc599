"""`SharedTimers` (trioq/_runtime/job/run.py): the timer that holds early-claimed jobs until their
run_at. Many waiters on one deadline share ONE trio timer task, every waiter wakes at (not
before) its deadline, and a cancelled waiter leaves the others waiting."""

from __future__ import annotations

import trio
import trio.testing

from trioq._runtime.job.run import SharedTimers


async def test_waiters_on_one_deadline_share_one_timer_and_wake_at_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    woke: list[tuple[int, float]] = []
    async with trio.open_nursery() as timer_tasks, trio.open_nursery() as waiters:
        timers = SharedTimers(timer_tasks)
        start = trio.current_time()

        async def wait(index: int, deadline: float) -> None:
            await timers.wait_until(deadline)
            woke.append((index, trio.current_time()))

        for index in range(200):
            waiters.start_soon(wait, index, start + 0.25)
        waiters.start_soon(wait, 200, start + 0.5)
        await trio.testing.wait_all_tasks_blocked()
        assert len(timer_tasks.child_tasks) == 2  # one per distinct deadline, not per waiter
    assert sorted(index for index, _ in woke) == list(range(201))
    assert all(at == start + 0.25 for index, at in woke if index < 200)
    assert [at for index, at in woke if index == 200] == [start + 0.5]


async def test_a_cancelled_waiter_leaves_the_others_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    woke: list[str] = []
    async with trio.open_nursery() as timer_tasks:
        timers = SharedTimers(timer_tasks)
        deadline = trio.current_time() + 1.0

        async def wait(name: str, scope: trio.CancelScope) -> None:
            with scope:
                await timers.wait_until(deadline)
                woke.append(name)

        cancelled = trio.CancelScope()
        async with trio.open_nursery() as waiters:
            waiters.start_soon(wait, "kept", trio.CancelScope())
            waiters.start_soon(wait, "cancelled", cancelled)
            await trio.testing.wait_all_tasks_blocked()
            cancelled.cancel()
    assert woke == ["kept"]
    assert trio.current_time() == deadline
