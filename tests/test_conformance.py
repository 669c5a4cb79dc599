"""Every conformance check of `trioq.testing.conformance` against both drivers.

The Postgres driver runs on a fresh schema per test, with `SqlClock` for time travel. Checks
listed in `PG_KNOWN_BUGS` fail on Postgres today (strict xfail: fixing queries.sql turns them
into failures here, so the entry gets removed).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import cast

import pytest
import trio
import trio.testing

from tests.job_due_check import DueCheckedDriver
from tests.ready_keyed_check import KeyedCheckedDriver
from trioq._memory import MemoryDriver
from trioq._pg.driver import PgDriver, open_pg_driver
from trioq._seam.driver import DRIVER_METHODS, Claim, Driver, NewJob
from trioq._seam.services import MaintenancePass
from trioq.testing import CHECKS, DriverClock, ManualClock, SqlClock
from trioq.testing.conformance import concurrency
from trioq.testing.transitions import CheckedDriver

# check name -> why it fails on Postgres today (each becomes a strict xfail there).
PG_KNOWN_BUGS: dict[str, str] = {}

BACKENDS = ("memory", "postgres")


def _cases() -> list[object]:
    cases: list[object] = []
    for name in sorted(CHECKS):
        for backend in BACKENDS:
            marks = []
            if backend == "postgres" and name in PG_KNOWN_BUGS:
                marks.append(pytest.mark.xfail(reason=PG_KNOWN_BUGS[name], strict=True))
            cases.append(pytest.param(name, backend, marks=marks, id=f"{name}[{backend}]"))
    return cases


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> tuple[str, str] | None:
    """None for the memory driver, else (conninfo, fresh schema name)."""
    if request.param == "memory":
        return None
    return request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema")


@pytest.fixture
async def driver_and_clock(
    backend: tuple[str, str] | None, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Driver, DriverClock]]:
    """Each driver wrapped in `CheckedDriver`: every row change a check makes must be an edge of
    the state machine for the statement that made it. The wrapper is sound only for calls made
    one after another, so the concurrency checks (two workers' calls overlapping) get the bare
    driver: their own assertions judge them."""
    check = CHECKS[request.node.callspec.params["check_name"]]
    serial = check.__module__ != concurrency.__name__

    def wrap(inner: Driver) -> Driver:
        return cast(Driver, CheckedDriver(inner)) if serial else inner

    if backend is None:
        clock = ManualClock()
        yield wrap(MemoryDriver(clock=clock)), clock
        return
    conninfo, schema = backend
    async with open_pg_driver(conninfo, schema, pool_size=4) as driver:
        await driver.migrate()
        # job_due and ready_keyed compared with jobs_live after every call that may write a
        # job: every check's transitions keep both exact (tests/test_job_due.py,
        # tests/test_ready_keyed.py).
        checked = cast(Driver, KeyedCheckedDriver(DueCheckedDriver(wrap(driver), driver), driver))
        yield checked, await SqlClock.install(driver)  # the clock: raw SQL, unchecked


@pytest.mark.parametrize(("check_name", "backend"), _cases(), indirect=["backend"])
async def test_driver_passes_conformance_check(
    check_name: str, driver_and_clock: tuple[Driver, DriverClock]
) -> None:
    driver, clock = driver_and_clock
    with trio.fail_after(30):
        await CHECKS[check_name](driver, clock)


def _public_methods(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name))}


def test_memory_and_pg_drivers_have_the_same_methods() -> None:
    assert _public_methods(MemoryDriver) == set(DRIVER_METHODS)
    assert _public_methods(PgDriver) == set(DRIVER_METHODS)


async def test_memory_driver_leases_expire_in_trio_virtual_time(
    mock_clock: trio.testing.MockClock,
) -> None:
    driver = MemoryDriver()
    await driver.job_insert_many([NewJob("default", "echo", "{}")])
    claim = Claim("default", ("echo",), 1, 30.0, uuid.uuid4())
    [job] = (await driver.job_claim(claim)).claimed
    mock_clock.jump(29)
    assert (await driver.maintenance_pass(MaintenancePass())).recovered == ()
    mock_clock.jump(2)
    assert (await driver.maintenance_pass(MaintenancePass())).recovered == ((job.id, "ready"),)


async def test_memory_transaction_rolls_back_when_cancelled() -> None:
    driver = MemoryDriver()
    with trio.CancelScope() as scope:
        async with driver.transaction() as tx:
            await tx.job_insert_many([NewJob("default", "echo", "{}")])
            scope.cancel()
            await trio.lowlevel.checkpoint()
    assert (await driver.queue_status()) == []


async def test_memory_enqueue_of_a_reserved_dedup_key_waits_for_the_transaction() -> None:
    driver = MemoryDriver()
    results: list[tuple[int, bool]] = []

    async def enqueue_same_key() -> None:
        [inserted] = await driver.job_insert_many([NewJob("default", "echo", "{}", dedup_key="k")])
        results.append((inserted.id, inserted.created))

    async with trio.open_nursery() as nursery, driver.transaction() as tx:
        [mine] = await tx.job_insert_many([NewJob("default", "echo", "{}", dedup_key="k")])
        nursery.start_soon(enqueue_same_key)
        await trio.testing.wait_all_tasks_blocked()
        assert results == []
    assert results == [(mine.id, False)]
