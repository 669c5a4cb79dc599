"""Concurrency keys through the public API and a running worker: a task's key template, a key
at its limit leaving free slots to other work, a limit changed while the worker runs, a dead
worker's holds freed by lease recovery, and the values refused."""

from __future__ import annotations

import asyncio
import collections
import json
import uuid
from typing import Any

import psycopg
import pytest
import trio

import trioq
from tests.releases import previous_release_migrations
from tests.support import Gate, expire_lease, make_app, running_worker, sql_rows
from trioq import cli
from trioq._seam.driver import Claim
from trioq._seam.services import MaintenancePass
from trioq._sql import queries
from trioq.producer import AsyncProducer, SyncProducer

HOLDS = "SELECT concurrency_key, count(*) FROM {}.concurrency_holds GROUP BY 1 ORDER BY 1"


async def test_a_task_template_gives_each_job_its_key_and_the_tasks_limit(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("sync_tenant", concurrency_key="tenant:{tenant_id}", concurrency_limit=3)
    async def sync_tenant(ctx: trioq.Context, payload: dict[str, Any]) -> None: ...

    async with app.client(migrate=True) as client:
        jobs = await client.enqueue_many("sync_tenant", [{"tenant_id": n % 2} for n in range(4)])
        given = await client.enqueue("sync_tenant", {"tenant_id": 9}, concurrency_key="vip")
        with pytest.raises(ValueError, match=r"^concurrency_key: .*tenant_id"):
            await client.enqueue("sync_tenant", {"other": 1})
    rows = sql_rows(
        pg_url,
        f"SELECT id, concurrency_key, concurrency_limit FROM {pg_schema}.jobs ORDER BY id",
    )
    expected = [(job.id, f"tenant:{n % 2}", 3) for n, job in enumerate(jobs)]
    assert rows == [*expected, (given.id, "vip", 3)]


async def test_a_key_at_its_limit_leaves_free_slots_to_other_keys(
    pg_url: str, pg_schema: str
) -> None:
    """The partition-key regression test, generalised: 20 blocked jobs of one key (limit 2)
    ahead in claim order, a worker of 5 slots; the other keys' jobs and unkeyed jobs all
    finish while the busy key runs exactly 2 and its other 18 wait."""
    app = make_app(pg_url, pg_schema)
    gate = Gate()
    running: collections.Counter[str | None] = collections.Counter()
    peak: collections.Counter[str | None] = collections.Counter()

    @app.task("work", concurrency_limit=2)
    async def work(ctx: trioq.Context, payload: dict[str, Any]) -> None:
        key = ctx.job.concurrency_key
        running[key] += 1
        peak[key] = max(peak[key], running[key])
        try:
            if payload.get("block"):
                gate.enter()
                await gate.release.wait()
        finally:
            running[key] -= 1

    async with app.client(migrate=True) as client:
        busy = await client.enqueue_many(
            "work", [{"block": True}] * 20, concurrency_key="busy", priority=-5
        )
        others = [
            await client.enqueue("work", {}, concurrency_key=f"tenant:{n}") for n in range(12)
        ]
        others += await client.enqueue_many("work", [{}] * 8)
        async with running_worker(app, concurrency=5, poll_interval=30):
            with trio.fail_after(20):
                await gate.wait_entered(2)
                for job in others:
                    await client.wait_result(job.id)
            assert gate.entered == 2 and peak["busy"] == 2
            [status] = await client.key_status(["busy"])
            assert (status.running, status.limit, status.saturated) == (2, 2, True)
            explanation = await client.explain(busy[-1].id)
            assert "key busy at its limit 2/2" in explanation.verdict
            gate.release.set()
            with trio.fail_after(20):
                for job in busy:
                    await client.wait_result(job.id)
    assert peak["busy"] == 2


async def test_a_limit_raised_while_the_worker_runs_applies_from_the_next_claim(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    gate = Gate()

    @app.task("work")
    async def work(ctx: trioq.Context, payload: dict[str, Any]) -> None:
        gate.enter()
        await gate.release.wait()

    async with app.client(migrate=True) as client:
        await client.enqueue_many("work", [{}] * 6, concurrency_key="tenant:7")
        # A poll interval far longer than the test: the change needs no restart and no poll,
        # the next claim round (here a new job's notification) reads it.
        async with running_worker(app, concurrency=10, poll_interval=30):
            with trio.fail_after(20):
                await gate.wait_entered(1)  # no limit anywhere: one at a time
                assert await client.set_key_limit("tenant:*", 4)
                await client.enqueue("work", {}, concurrency_key="tenant:8")
                await gate.wait_entered(5)  # 3 more of tenant:7, and tenant:8's one
            rows = sql_rows(pg_url, HOLDS.format(pg_schema))
            assert rows == [("tenant:7", 4), ("tenant:8", 1)]
            assert [(lim.pattern, lim.max_running) for lim in await client.key_limits()] == [
                ("tenant:*", 4)
            ]
            gate.release.set()


async def test_lease_recovery_of_a_dead_worker_frees_its_key_holds(
    pg_url: str, pg_schema: str
) -> None:
    """A worker that claimed two jobs of a key and died (its leases simply expire) holds the
    key's slots until the leader's recovery; then the jobs are claimable again."""
    app = make_app(pg_url, pg_schema)

    @app.task("work")
    async def work(ctx: trioq.Context, payload: dict[str, Any]) -> None: ...

    async with app.client(migrate=True) as client:
        await client.set_key_limit("k", 2)
        await client.enqueue_many("work", [{}] * 3, concurrency_key="k")
        claim = Claim("default", ("work",), 10, 30, uuid.uuid4())
        dead = await client.driver.job_claim(claim)
        assert len(dead.claimed) == 2
        assert (await client.driver.job_claim(claim)).claimed == ()
        expire_lease(pg_url, pg_schema, [job.id for job in dead.claimed])
        report = await client.driver.maintenance_pass(MaintenancePass())
        assert sorted(report.recovered) == sorted((job.id, "ready") for job in dead.claimed)
        assert sql_rows(pg_url, HOLDS.format(pg_schema)) == []
        assert len((await client.driver.job_claim(claim)).claimed) == 2


@pytest.mark.parametrize(
    ("pattern", "limit", "message"),
    [
        ("tenant:*", 0, r"^limit: 0 must be a whole number from 1 to 10000$"),
        ("tenant:*", -2, r"^limit: -2 must be a whole number from 1 to 10000$"),
        ("tenant:*", 10_001, r"^limit: 10001 must be a whole number"),
        ("", 3, r"^pattern: '' must be a key \(tenant:42\) or a prefix ending in \*"),
        ("ten*ant:*", 3, r"^pattern: 'ten\*ant:\*' must be a key"),
    ],
)
async def test_bad_key_limits_are_refused_in_one_line_and_change_nothing(
    pg_url: str, pg_schema: str, pattern: str, limit: int, message: str
) -> None:
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        with pytest.raises(ValueError, match=message):
            await client.set_key_limit(pattern, limit)
        assert await client.key_limits() == []


def test_task_declarations_refuse_bad_concurrency_options() -> None:
    app = trioq.App("postgresql://unused", schema="unused")
    with pytest.raises(ValueError, match=r"^concurrency_limit: 0 must be a whole number"):
        app.task("a", concurrency_key="k:{id}", concurrency_limit=0)(_handler)
    with pytest.raises(ValueError, match=r"^concurrency_key: '' must be a key template"):
        app.task("b", concurrency_key="")(_handler)
    with pytest.raises(ValueError, match=r"^concurrency_key: 'k:\{' is not a valid template"):
        trioq.declare_task("c", concurrency_key="k:{")


async def _handler(ctx: trioq.Context, payload: Any) -> None: ...


def test_trioq_key_limit_sets_lists_and_removes_limits_and_status_names_a_full_key(
    pg_url: str, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--database-url", pg_url, "--schema", pg_schema]
    assert cli.main(["migrate", *base]) == 0
    assert cli.main(["key", "limit", "tenant:*", "3", *base]) == 0
    assert cli.main(["key", "limit", "tenant:42", "1", *base]) == 0
    capsys.readouterr()
    for bad in ("0", "-1", "x", "10001"):
        assert cli.main(["key", "limit", "tenant:*", bad, *base]) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"key limit: {bad!r} must be none or a whole number from 1 to 10000")
        assert len(err.splitlines()) == 1
    assert cli.main(["key", "limit", "a*b", "3", *base]) == 2
    assert "pattern: 'a*b' must be a key" in capsys.readouterr().err

    async def fill_one_key() -> None:
        app = make_app(pg_url, pg_schema)
        async with app.client() as client:
            work = trioq.declare_task("work")
            await client.enqueue_many(work, [{}] * 2, concurrency_key="tenant:42")
            claim = Claim("default", ("work",), 10, 30, uuid.uuid4())
            assert len((await client.driver.job_claim(claim)).claimed) == 1

    trio.run(fill_one_key)
    assert cli.main(["key", "list", *base, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(row["pattern"], row["max_running"]) for row in listed["limits"]] == [
        ("tenant:*", 3),
        ("tenant:42", 1),
    ]
    assert listed["keys"] == [{"key": "tenant:42", "running": 1, "limit": 1}]
    assert cli.main(["status", *base]) == 0
    assert "key tenant:42 at its limit 1/1" in capsys.readouterr().out
    assert cli.main(["key", "limit", "tenant:42", "none", *base]) == 0
    assert capsys.readouterr().out.strip() == "key tenant:42: limit removed"
    assert cli.main(["key", "list", *base]) == 0
    assert "key tenant:42 runs 1/3" in capsys.readouterr().out


def test_producers_and_sql_enqueue_store_the_concurrency_key_and_its_limit(
    pg_url: str, pg_schema: str
) -> None:
    sync_tenant = trioq.declare_task(
        "sync_tenant", concurrency_key="tenant:{tenant_id}", concurrency_limit=2
    )
    other = trioq.declare_task("other")

    async def migrate() -> None:
        async with make_app(pg_url, pg_schema).client(migrate=True):
            pass

    trio.run(migrate)
    with SyncProducer(pg_url, schema=pg_schema, tasks=[sync_tenant, other]) as producer:
        by_template = producer.enqueue(sync_tenant, {"tenant_id": 5})
        given = producer.enqueue(other, {}, concurrency_key="acct:1", concurrency_limit=4)

    async def from_asyncio() -> list[trioq.Job]:
        async with AsyncProducer(pg_url, schema=pg_schema, tasks=[sync_tenant]) as producer:
            return await producer.enqueue_many(sync_tenant, [{"tenant_id": 6}, {"tenant_id": 7}])

    batch = asyncio.run(from_asyncio())
    from_sql = sql_rows(
        pg_url,
        f"SELECT {pg_schema}.enqueue('other', concurrency_key => 'acct:2', concurrency_limit => 3)",
    )[0][0]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="concurrency_limit: 0 must"):
        sql_rows(
            pg_url,
            f"SELECT {pg_schema}.enqueue('other', concurrency_key => 'a', concurrency_limit => 0)",
        )
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="not both"):
        sql_rows(
            pg_url,
            f"SELECT {pg_schema}.enqueue('other', partition_key => 'p', concurrency_key => 'a')",
        )
    rows = dict(
        (row[0], row[1:])
        for row in sql_rows(
            pg_url, f"SELECT id, concurrency_key, concurrency_limit FROM {pg_schema}.jobs"
        )
    )
    assert rows == {
        by_template.id: ("tenant:5", 2),
        given.id: ("acct:1", 4),
        batch[0].id: ("tenant:6", 2),
        batch[1].id: ("tenant:7", 2),
        from_sql: ("acct:2", 3),
    }


def test_migration_0027_keeps_live_rows_claimable_and_old_sql_enqueue_calls_working(
    pg_url: str, pg_schema: str
) -> None:
    """A schema at the version before concurrency keys, with ready, delayed and running jobs:
    migrating it keeps every row, and the ready ones are claimed through the rebuilt index."""
    with psycopg.connect(pg_url, autocommit=True) as conn, conn.transaction():
        conn.execute(queries(pg_schema)["migration_prepare"])
        for migration in previous_release_migrations(pg_schema):  # as version 26 left it
            if migration.version < 27:
                conn.execute(migration.sql)
                conn.execute(
                    queries(pg_schema)["migration_record"],
                    {"version": migration.version, "name": migration.name},
                )
        for call in ("'work'", "'work', '{}', 'default', now() + interval '1 hour'"):
            conn.execute(f"SELECT {pg_schema}.enqueue({call})")
        conn.execute(f"SELECT {pg_schema}.enqueue('work', partition_key => 'p')")
        conn.execute(
            f"UPDATE {pg_schema}.jobs SET state = 'running', attempt = 1, "
            "lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour' "
            "WHERE partition_key = 'p'"
        )
    before = sql_rows(pg_url, f"SELECT id, state FROM {pg_schema}.jobs ORDER BY id")

    async def migrate_and_claim() -> tuple[set[int], int]:
        app = make_app(pg_url, pg_schema)
        async with app.client(migrate=True) as client:
            # A call written for the old signature (by position) still works.
            old_style = sql_rows(
                pg_url, f"SELECT {pg_schema}.enqueue('work', '{{}}', 'default', NULL, 0::smallint)"
            )[0][0]
            claim = Claim("default", ("work",), 10, 30, uuid.uuid4())
            claimed = (await client.driver.job_claim(claim)).claimed
            return {job.id for job in claimed}, old_style

    claimed, old_style = trio.run(migrate_and_claim)
    ready, delayed, running = before
    assert (ready[1], delayed[1], running[1]) == ("ready", "scheduled", "running")
    assert claimed == {ready[0], old_style}
    after = sql_rows(pg_url, f"SELECT id, state FROM {pg_schema}.jobs ORDER BY id")
    assert after == [(ready[0], "running"), delayed, running, (old_style, "running")]
