"""`trioq migrate` online: a lock it waits for never holds up enqueues for longer than its
lock_timeout, a no-transaction migration builds an index CONCURRENTLY, and a lock held too long
ends the migrate with one line and nothing half-applied."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import trio

import trioq
from tests.schema_snapshot import migrate
from tests.support import sql_scalar, wait_until
from trioq._core.errors import MigrationLockTimeout
from trioq._pg import migrations as pg_migrations
from trioq._pg.driver import open_pg_driver
from trioq._sql import Migration, migrations

ADD_COLUMN = Migration(
    9001, "add_a_column", "ALTER TABLE {schema}.job_rows ADD COLUMN probe integer;"
)
BUILD_INDEX = Migration(
    9002,
    "index_concurrently",
    "-- trioq: no-transaction\n"
    "-- Two statements, each on its own: the second is CONCURRENTLY (on a partition: a\n"
    "-- partitioned table takes no concurrent index).\n"
    "DROP INDEX CONCURRENTLY IF EXISTS {schema}.jobs_probe_idx;\n"
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_probe_idx ON {schema}.job_rows_e0 (probe);\n",
)


def with_extra(monkeypatch: pytest.MonkeyPatch, *extra: Migration) -> None:
    def patched(schema: str) -> list[Migration]:
        quoted = f'"{schema}"' if not schema.isidentifier() else schema
        mine = [Migration(m.version, m.name, m.sql.replace("{schema}", quoted)) for m in extra]
        return [*migrations(schema), *mine]

    monkeypatch.setattr(pg_migrations, "migrations", patched)


def hold(pg_url: str, statement: str) -> Iterator[psycopg.Connection[Any]]:
    """A session inside a transaction that ran `statement` (and holds its locks)."""
    conn = psycopg.connect(pg_url)
    conn.execute(statement)
    try:
        yield conn
    finally:
        conn.close()


async def lock_waits(pg_url: str) -> bool:
    query = (
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND query LIKE '%ADD COLUMN probe%'"
    )
    return bool(await trio.to_thread.run_sync(sql_scalar, pg_url, query))


def test_a_no_transaction_migration_splits_into_its_statements() -> None:
    assert BUILD_INDEX.transactional is False and ADD_COLUMN.transactional is True
    assert [s.split()[0:3] for s in BUILD_INDEX.statements()] == [
        ["DROP", "INDEX", "CONCURRENTLY"],
        ["CREATE", "INDEX", "CONCURRENTLY"],
    ]


async def test_a_migration_waiting_for_a_lock_lets_enqueues_through_between_its_tries(
    pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pg_dump-like reader holds ACCESS SHARE on jobs; the migration needs ACCESS EXCLUSIVE.
    Queued without a lock timeout, its request would hold every enqueue behind it for as long
    as the reader runs (here: until the enqueue got through, so forever)."""
    await migrate(pg_url, pg_schema)
    with_extra(monkeypatch, ADD_COLUMN)
    reader = hold(pg_url, f"LOCK TABLE {pg_schema}.job_rows IN ACCESS SHARE MODE")
    holder = next(reader)
    app = trioq.App(pg_url, schema=pg_schema)

    @app.task("anything")
    async def anything(ctx: trioq.Context, payload: object) -> None:
        return None

    async with trio.open_nursery() as nursery, app.client() as client:
        nursery.start_soon(migrate, pg_url, pg_schema)
        with trio.fail_after(30):
            await wait_until(lambda: lock_waits(pg_url))
            job = await client.enqueue("anything", {"n": 1})
        await trio.to_thread.run_sync(holder.commit)
    reader.close()
    column = f"SELECT count(*) FROM {pg_schema}.job_rows WHERE probe IS NULL AND id = {job.id}"
    assert sql_scalar(pg_url, column) == 1


async def test_a_no_transaction_migration_builds_its_index_concurrently_and_records_it_once(
    pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_extra(monkeypatch, ADD_COLUMN, BUILD_INDEX)
    await migrate(pg_url, pg_schema)
    await migrate(pg_url, pg_schema)  # nothing pending: nothing runs twice
    valid = (
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        f" WHERE n.nspname = '{pg_schema}' AND c.relname = 'jobs_probe_idx'"
    )
    assert sql_scalar(pg_url, valid) is True
    recorded = f"SELECT count(*) FROM {pg_schema}.migrations WHERE version IN (9001, 9002)"
    assert sql_scalar(pg_url, recorded) == 2
    timeout = "SELECT current_setting('statement_timeout')"
    async with open_pg_driver(pg_url, pg_schema, pool_size=1) as driver:
        assert await driver.migrate() == []
        async with driver._pool.connection() as conn:  # the session's timeouts were restored
            assert (await conn.fetch(timeout))[0][0] == "30s"


async def test_a_lock_held_past_the_lock_wait_ends_migrate_with_one_line_and_nothing_applied(
    pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await migrate(pg_url, pg_schema)
    with_extra(monkeypatch, ADD_COLUMN)
    reader = hold(pg_url, f"LOCK TABLE {pg_schema}.job_rows IN ACCESS SHARE MODE")
    next(reader)
    try:
        async with open_pg_driver(pg_url, pg_schema, pool_size=1) as driver:
            with pytest.raises(MigrationLockTimeout, match="--lock-wait"):
                await driver.migrate(lock_timeout=0.05, lock_wait=0.5)
    finally:
        reader.close()
    columns = (
        "SELECT count(*) FROM information_schema.columns"
        f" WHERE table_schema = '{pg_schema}' AND table_name = 'jobs' AND column_name = 'probe'"
    )
    assert sql_scalar(pg_url, columns) == 0
    assert (
        sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.migrations WHERE version = 9001") == 0
    )


async def test_migrate_of_an_older_release_on_a_schema_a_newer_one_migrated_changes_nothing(
    pg_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An old worker restarting with --migrate during a rolling deploy (or a rollback) must not
    put its release's function bodies under the newer workers."""
    await migrate(pg_url, pg_schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # What a newer release leaves: a migration this one does not know, its own bodies.
        conn.execute(
            f"INSERT INTO {pg_schema}.migrations (version, name) VALUES (9999, 'from_the_future')"
        )
        conn.execute(f"UPDATE {pg_schema}.function_digest SET digest = 'the newer release'")
    async with open_pg_driver(pg_url, pg_schema, pool_size=1) as driver:
        assert await driver.migrate() == []
    digest = sql_scalar(pg_url, f"SELECT digest FROM {pg_schema}.function_digest")
    assert digest == "the newer release"  # this release's bodies were not applied over them
    [line] = [r.getMessage() for r in caplog.records if "newer than this trioq" in r.getMessage()]
    assert "migration 9999" in line and "nothing applied" in line
