"""The four roles of docs/operations.md ("Roles: least privilege"): its SQL as written (with
this test's names), then each part of trioq under its role, and what each role is refused."""

from __future__ import annotations

import asyncio
import datetime
import pathlib
import re
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import psycopg.conninfo
import pytest
import trio

import trioq
from tests.support import force_waiting, make_app, running_worker
from trioq.dashboard.store import JobSearch, Store
from trioq.producer import AsyncProducer, SyncProducer, declare_task

OPERATIONS = pathlib.Path(__file__).parent.parent / "docs" / "operations.md"
ROLES = ("trioq_owner", "trioq_worker", "trioq_producer", "trioq_viewer")


def documented_roles_sql() -> list[str]:
    """The fenced SQL blocks of the roles section, as a reader copies them: the first runs
    before the first migration, the second after it."""
    text = OPERATIONS.read_text()
    section = text[text.index("## Roles: least privilege") :]
    section = section[: section.index("\n## ")]
    return re.findall(r"```sql\n(.*?)```", section, re.DOTALL)


@attrs.frozen
class Roles:
    schema: str
    urls: dict[str, str]  # documented role name -> this test's conninfo for it

    def app(self, role: str, **kwargs: Any) -> trioq.App:
        return make_app(self.urls[role], self.schema, **kwargs)

    def sql(self, role: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.urls[role], autocommit=True) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []


@attrs.frozen
class Setup:
    roles: Roles
    after_migrate: str  # the second block, run as the owner after the first migration


@pytest.fixture
def setup(pg_url: str, pg_schema: str) -> Iterator[Setup]:
    names = {role: f"{role}_{pg_schema}" for role in ROLES}
    blocks = []
    for text in documented_roles_sql():
        for role, name in names.items():
            text = re.sub(rf"\b{role}\b", name, text)
        blocks.append(re.sub(r"\btrioq\b", pg_schema, text))  # role names are words of their own
    before, after = blocks
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(before)
    urls = {role: psycopg.conninfo.make_conninfo(pg_url, user=names[role]) for role in ROLES}
    try:
        yield Setup(Roles(pg_schema, urls), after)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for name in names.values():
                conn.execute(f'DROP OWNED BY "{name}" CASCADE')
            for name in names.values():
                conn.execute(f'DROP ROLE "{name}"')


@pytest.fixture
async def roles(setup: Setup) -> Roles:
    """The roles of a schema the owner has migrated (the documented second block run)."""
    await migrated(setup.roles)
    setup.roles.sql("trioq_owner", setup.after_migrate)
    return setup.roles


async def migrated(roles: Roles) -> None:
    async with roles.app("trioq_owner").client(migrate=True):
        pass


def refused(roles: Roles, role: str, statement: str, params: Any = None) -> bool:
    try:
        roles.sql(role, statement, params)
    except psycopg.errors.InsufficientPrivilege:
        return True
    return False


async def test_only_the_owner_can_migrate(setup: Setup) -> None:
    roles = setup.roles
    # Before the first migration the schema holds no trioq tables: another role migrating into
    # it would own what it creates there, and is refused with the fix.
    for role in ("trioq_worker", "trioq_producer", "trioq_viewer"):
        with pytest.raises(Exception, match=r"belongs to role .* and holds no trioq tables"):
            async with roles.app(role).client(migrate=True):
                pass
    await migrated(roles)
    for role in ("trioq_worker", "trioq_producer", "trioq_viewer"):
        with pytest.raises(Exception, match="permission denied"):
            async with roles.app(role).client(migrate=True):
                pass
        schema = roles.schema
        assert refused(roles, role, f"CREATE TABLE {schema}.intruder (id int)"), role
        assert refused(roles, role, f"TRUNCATE {schema}.job_rows"), role
        assert refused(roles, role, f"DROP TABLE {schema}.job_rows"), role
        assert refused(roles, role, f"DROP VIEW {schema}.jobs"), role


async def test_the_worker_runs_jobs_workflows_and_maintenance_under_its_role(
    roles: Roles,
) -> None:
    app = roles.app("trioq_worker")

    @app.task("add")
    async def add(ctx: trioq.Context, payload: dict[str, int]) -> int:
        return payload["a"] + payload["b"]

    @app.task("approval")
    async def approval(ctx: trioq.Context, payload: dict[str, str]) -> dict[str, Any]:
        asked = await ctx.step("ask", lambda: {"asked": payload["key"]})
        await ctx.sleep("cool-off", datetime.timedelta(milliseconds=10))
        decision = await ctx.wait_for_event(payload["key"], timeout=datetime.timedelta(minutes=1))
        await ctx.set_value("stage", "decided")
        return {**asked, "decision": decision}

    producer = roles.app("trioq_producer")
    with trio.fail_after(60):
        async with app.client() as worker_client, producer.client() as client:
            async with running_worker(app, concurrency=4):
                added = await client.enqueue(declare_task("add"), {"a": 2, "b": 3})
                flow = await client.enqueue(declare_task("approval"), {"key": "approve:1"})
                assert await client.wait_result(added.id, timeout=30) == 5
                # Stored whether or not the workflow waits yet: a later wait receives it.
                assert (await client.emit_event("approve:1", {"ok": True})).first
                assert await client.wait_result(flow.id, timeout=30) == {
                    "asked": "approve:1",
                    "decision": {"ok": True},
                }
            # Retention and the redrive commands are the worker role's (DELETE).
            assert await worker_client.purge(states=("completed",), older_than=0) == 2


async def test_producers_and_the_sql_entry_points_run_under_the_producer_role(
    roles: Roles,
) -> None:
    url, schema = roles.urls["trioq_producer"], roles.schema
    noop = declare_task("noop")

    def sync_enqueue() -> int:
        with SyncProducer(url, schema=schema, tasks=[noop]) as producer:
            return producer.enqueue(noop, {"from": "sync"}).id

    async def asyncio_enqueue() -> int:
        async with AsyncProducer(url, schema=schema, tasks=[noop]) as producer:
            return (await producer.enqueue(noop, {"from": "asyncio"})).id

    ids = [
        await trio.to_thread.run_sync(sync_enqueue),
        await trio.to_thread.run_sync(asyncio.run, asyncio_enqueue()),
        roles.sql("trioq_producer", f"SELECT {schema}.enqueue('noop', '{{}}')")[0][0],
    ]
    roles.sql("trioq_producer", f"SELECT {schema}.send(%s, 'topic', '1')", (ids[0],))
    roles.sql("trioq_producer", f"SELECT {schema}.event_emit('some-event', '1')")
    # A delayed job, and a wait that the producer's emit ends: each leaves job_due through a
    # trigger that runs with the producer's rights (migration 0044 grants them).
    [[delayed]] = roles.sql(
        "trioq_producer",
        f"SELECT {schema}.enqueue('noop', run_at => now() + interval '1 hour')",
    )
    force_waiting(roles.urls["trioq_owner"], schema, ids[2], event_key="approval")
    roles.sql("trioq_producer", f"SELECT {schema}.event_emit('approval', '1')")
    assert roles.sql("trioq_viewer", f"SELECT job_id FROM {schema}.job_due") == [(delayed,)]
    async with roles.app("trioq_producer").client() as client:
        assert await client.cancel(ids[1]) == "cancelled"
        assert await client.cancel(delayed) == "cancelled"
    assert roles.sql("trioq_viewer", f"SELECT job_id FROM {schema}.job_due") == []
    ids.append(delayed)
    async with roles.app("trioq_producer").client() as client:
        with pytest.raises(Exception, match="permission denied"):
            await client.purge(states=("cancelled",), older_than=0)
    assert refused(roles, "trioq_producer", f"DELETE FROM {schema}.job_rows")
    rows = roles.sql("trioq_viewer", f"SELECT id FROM {schema}.jobs ORDER BY id")
    assert [row[0] for row in rows] == sorted(ids)


async def test_the_viewer_reads_the_dashboard_and_kedas_query_and_writes_nothing(
    roles: Roles,
) -> None:
    schema = roles.schema
    [[job_id]] = roles.sql("trioq_producer", f"SELECT {schema}.enqueue('noop', '{{}}')")
    async with roles.app("trioq_viewer").client() as viewer:
        store = Store(viewer)
        overview = await store.overview()
        assert overview["queues"], overview
        found = await store.search(JobSearch())
        assert [job["id"] for job in found["jobs"]] == [job_id]
        job = await store.job(job_id)
        assert job is not None
        [status] = await viewer.queue_status()
        assert status.queue == "default"
    demand = roles.sql("trioq_viewer", f"SELECT queue, ready FROM {schema}.queue_demand()")
    assert demand == [("default", 1)]
    assert refused(roles, "trioq_viewer", f"SELECT {schema}.enqueue('noop', '{{}}')")
    assert refused(roles, "trioq_viewer", f"UPDATE {schema}.job_rows SET priority = 1")
    assert refused(roles, "trioq_viewer", f"DELETE FROM {schema}.job_rows")
    assert refused(roles, "trioq_viewer", f"SELECT {schema}.event_emit('key', '1')")


async def test_trioq_migrate_under_a_role_without_the_privilege_is_one_line_naming_the_fix(
    setup: Setup, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`trioq migrate` printed `unexpected InsufficientPrivilege` and no fix."""
    from trioq.cli.commands import main as cli_main

    roles = setup.roles
    stranger = f"no_create_{roles.schema}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{stranger}" LOGIN')
    try:
        url = psycopg.conninfo.make_conninfo(pg_url, user=stranger)
        fresh = f"{roles.schema}_fresh"  # no such schema: creating it needs CREATE on the database
        code = await trio.to_thread.run_sync(
            cli_main, ["migrate", "--database-url", url, "--schema", fresh]
        )
        [line] = capsys.readouterr().err.strip().splitlines()
        assert code == 3
        assert f"trioq migrate as role '{stranger}' was refused (permission denied" in line
        assert f"GRANT CREATE ON DATABASE postgres TO {stranger}" in line
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP ROLE "{stranger}"')

    await migrated(roles)
    code = await trio.to_thread.run_sync(
        cli_main,
        ["migrate", "--database-url", roles.urls["trioq_worker"], "--schema", roles.schema],
    )
    [line] = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert "permission denied" in line and "unexpected" not in line
    assert f"run it as the role that owns schema '{roles.schema}'" in line
