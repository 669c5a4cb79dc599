"""The checkpoint writer's group commit on a stub driver: who shares a statement, who is woken
with what, and what a writer cancelled while its batch is in flight leaves behind."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest
import trio

from trioq._runtime.workflow.checkpoints import CheckpointLost, CheckpointWriter
from trioq._seam.lease import Lease
from trioq._seam.workflow import CheckpointWrite, WrittenCheckpoint


class StubDriver:
    """Answers each batch when `release` is set; jobs in `lost` are not returned."""

    def __init__(self) -> None:
        self.batches: list[list[CheckpointWrite]] = []
        self.sent = trio.Event()
        self.release = trio.Event()
        self.lost: set[int] = set()

    def is_connection_lost(self, exc: BaseException) -> bool:
        return False

    async def checkpoint_insert_many(
        self, writes: Sequence[CheckpointWrite]
    ) -> list[WrittenCheckpoint]:
        self.batches.append(list(writes))
        self.sent.set()
        await self.release.wait()
        return [
            WrittenCheckpoint(job_id=w.lease.id, position=w.position, value=w.value_json)
            for w in writes
            if w.lease.id not in self.lost
        ]


def step_write(job_id: int, value: str) -> CheckpointWrite:
    return CheckpointWrite(Lease(job_id, 1, uuid.uuid4()), 0, "step", "one", value)


async def test_writes_of_one_tick_share_one_statement_and_each_gets_its_stored_value() -> None:
    driver = StubDriver()
    driver.release.set()
    writer = CheckpointWriter(driver)  # type: ignore[arg-type]
    values: dict[int, Any] = {}

    async def write(job_id: int) -> None:
        values[job_id] = await writer.write(step_write(job_id, str(job_id)))

    with trio.fail_after(5):
        async with trio.open_nursery() as flusher:
            flusher.start_soon(writer.run)
            async with trio.open_nursery() as writers:
                for job_id in range(1, 26):
                    writers.start_soon(write, job_id)
            flusher.cancel_scope.cancel()
    assert [len(batch) for batch in driver.batches] == [25]
    assert values == {job_id: str(job_id) for job_id in range(1, 26)}


async def test_a_write_the_statement_did_not_return_raises_checkpoint_lost() -> None:
    driver = StubDriver()
    driver.release.set()
    driver.lost.add(2)
    writer = CheckpointWriter(driver)  # type: ignore[arg-type]
    with trio.fail_after(5):
        async with trio.open_nursery() as flusher:
            flusher.start_soon(writer.run)
            assert await writer.write(step_write(1, "1")) == "1"
            with pytest.raises(CheckpointLost):
                await writer.write(step_write(2, "2"))
            flusher.cancel_scope.cancel()


async def test_a_writer_cancelled_in_flight_stops_waiting_and_the_rest_get_answers() -> None:
    driver = StubDriver()
    writer = CheckpointWriter(driver)  # type: ignore[arg-type]
    kept: list[Any] = []

    async def keep() -> None:
        kept.append(await writer.write(step_write(2, "2")))

    with trio.fail_after(5):
        async with trio.open_nursery() as flusher:
            flusher.start_soon(writer.run)
            async with trio.open_nursery() as writers:
                with trio.CancelScope() as cancelled:
                    writers.start_soon(keep)
                    writers.start_soon(_cancel_when_sent, driver, cancelled)
                    await writer.write(step_write(1, "1"))
                assert cancelled.cancelled_caught  # the cancelled writer returned at once
                assert not kept  # while the batch it joined is still in flight
                driver.release.set()
            flusher.cancel_scope.cancel()
    assert [len(batch) for batch in driver.batches] == [2]
    assert kept == ["2"]


async def _cancel_when_sent(driver: StubDriver, scope: trio.CancelScope) -> None:
    await driver.sent.wait()
    scope.cancel()
