"""Fault test 5: trio cancellation at random points (Hypothesis chooses where) of the driver's
claim, renew, settle (complete, retry, release, sleep) and maintenance writes. Afterwards no
pooled connection is leaked, no session is left `idle in transaction`, and every job is final,
ready, scheduled/sleeping, or running under a lease that expires within one lease (so lease
recovery will pick it up)."""

from __future__ import annotations

import datetime
import secrets
import uuid

import trio
from hypothesis import strategies as st

from tests.procs import fetch
from tests.test_identifiers import run_property
from trioq._pg.driver import PgDriver, open_pg_driver
from trioq._seam.driver import Claim, ClaimedJob, NewJob, Settlement
from trioq._seam.services import MaintenancePass, RenewLeases

LEASE = 5.0
QUEUE = "q"
SETTLEMENTS = {
    "complete": lambda job: Settlement(job.lease, "complete", result_json="1"),
    "retry": lambda job: Settlement(
        job.lease, "retry", error_json='{"type": "E"}', delay_seconds=0
    ),
    "release": lambda job: Settlement(job.lease, "release"),
    "sleep": lambda job: Settlement(
        job.lease, "sleep", wake_at=datetime.datetime.now(datetime.UTC)
    ),
}
steps = st.lists(
    st.tuples(
        st.sampled_from(["enqueue", "claim", "renew", "maintenance", *SETTLEMENTS]),
        st.one_of(st.just(0.0), st.floats(0.0, 0.01)),  # when to cancel; 0: at once
    ),
    min_size=1,
    max_size=8,
)


async def step(driver: PgDriver, held: list[ClaimedJob], operation: str) -> None:
    worker = uuid.UUID(int=1)
    if operation == "enqueue":
        await driver.job_insert_many([NewJob(QUEUE, "t", "{}") for _ in range(3)])
    elif operation == "claim":
        result = await driver.job_claim(Claim(QUEUE, ("t",), 3, LEASE, worker))
        held.extend(result.claimed)
    elif operation == "renew" and held:
        await driver.lease_renew_many(
            RenewLeases(worker, "running", LEASE, tuple(job.lease for job in held))
        )
    elif operation in SETTLEMENTS and held:
        job = held.pop()
        await driver.job_settle_many([SETTLEMENTS[operation](job)])
    elif operation == "maintenance":
        await driver.maintenance_pass(MaintenancePass())


async def test_cancellation_anywhere_in_driver_writes_leaks_nothing_and_strands_no_job(
    pg_url: str, pg_schema: str
) -> None:
    app_name = f"trioq-cancel-{secrets.token_hex(4)}"
    async with open_pg_driver(pg_url, pg_schema, pool_size=3, application_name=app_name) as driver:
        await driver.migrate()
        held: list[ClaimedJob] = []
        cancelled = 0

        async def example(plan: list[tuple[str, float]]) -> None:
            nonlocal cancelled
            for operation, delay in plan:
                with trio.move_on_after(delay) as scope:
                    await step(driver, held, operation)
                cancelled += scope.cancelled_caught
            pools = (driver._pool.statistics(), driver._renewal_pool.statistics())
            assert [pool.in_use for pool in pools] == [0, 0], pools
            idle_in_transaction = await fetch(
                pg_url,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND state LIKE 'idle in transaction%%'",
                (app_name,),
            )
            assert idle_in_transaction == [(0,)]
            stranded = await fetch(
                pg_url,
                f"SELECT id, state, lease_expires_at - now() FROM {pg_schema}.jobs "
                "WHERE state NOT IN ('ready', 'scheduled', 'sleeping', 'completed', 'failed') "
                "AND NOT "
                "(state = 'running' AND lease_expires_at <= now() + %s * interval '1 second')",
                (LEASE,),
            )
            assert stranded == []

        await run_property(example, steps)
    assert cancelled > 0  # cancellation really happened mid-call, not only between calls
