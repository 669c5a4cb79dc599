"""trioq/_sql/schema.sql is the database as `migrate` leaves it, however it got there, and each SQL
function is defined once in the tree (trioq/_sql/functions/NAME.sql)."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import psycopg
import pytest
import trio

from tests.releases import extract_previous_release, run_previous_cli
from tests.schema_snapshot import HOT_STATEMENTS, SNAPSHOT, dump, hot_statements, migrate
from tests.support import scalar
from trioq._seam.records import JobRecord
from trioq._sql import parse_blocks

SQL = Path(__file__).resolve().parent.parent / "trioq" / "_sql"
DEFINITION = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+\{schema\}\.(\w+)", re.I)
FIX = "the schema changed: run `python -m tests.schema_snapshot` and commit trioq/_sql/schema.sql"


async def test_schema_sql_is_the_database_as_migrate_leaves_it(pg_url: str, pg_schema: str) -> None:
    await migrate(pg_url, pg_schema)
    dumped = await trio.to_thread.run_sync(dump, pg_url, pg_schema)
    assert dumped == SNAPSHOT.read_text(), FIX


def test_hot_statements_sql_is_what_the_driver_sends() -> None:
    assert hot_statements() == HOT_STATEMENTS.read_text(), (
        "a hot statement changed: run `python -m tests.schema_snapshot` and commit "
        "trioq/_sql/hot_statements.sql"
    )


@pytest.mark.slow
async def test_a_database_migrated_by_the_previous_release_then_this_one_equals_a_fresh_one(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    previous = extract_previous_release(tmp_path)
    await trio.to_thread.run_sync(
        run_previous_cli, previous, pg_url, "migrate", "--schema", pg_schema
    )
    await migrate(pg_url, pg_schema)
    dumped = await trio.to_thread.run_sync(dump, pg_url, pg_schema)
    assert dumped == SNAPSHOT.read_text(), "an upgraded database differs from a fresh one"


async def test_migrate_applies_the_function_bodies_when_they_changed_and_only_then(
    pg_url: str, pg_schema: str
) -> None:
    """Unchanged bodies are not applied again (that would replace each function under its
    callers and drop every session's cached plans that call it); bodies that differ from what
    the last migrate applied (their digest) are, whatever a function holds meanwhile."""
    await migrate(pg_url, pg_schema)
    replace = (
        f"CREATE OR REPLACE FUNCTION {pg_schema}.ready_channel(queue text) RETURNS text "
        "LANGUAGE sql IMMUTABLE AS $$ SELECT 'elsewhere' $$"
    )

    def run(statement: str) -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(statement)

    await trio.to_thread.run_sync(run, replace)
    await migrate(pg_url, pg_schema)
    assert await scalar(pg_url, f"SELECT {pg_schema}.ready_channel('default')") == "elsewhere"
    # As after an upgrade whose function files changed:
    await trio.to_thread.run_sync(run, f"UPDATE {pg_schema}.function_digest SET digest = 'old'")
    await migrate(pg_url, pg_schema)
    channel = await scalar(pg_url, f"SELECT {pg_schema}.ready_channel('default')")
    assert channel.startswith(f"{pg_schema}_ready_"), channel


def test_each_sql_function_is_defined_once_in_its_own_file() -> None:
    where: dict[str, list[str]] = {}
    for path in sorted(SQL.rglob("*.sql")):
        if path.name in ("schema.sql", "hot_statements.sql"):
            continue  # generated from the others
        text = path.read_text()
        if path.name == "queries.sql":
            # The test clock (trioq.testing.SqlClock) swaps db_now() for a test's time travel.
            text = "".join(
                body for name, body in parse_blocks(text).items() if name != "test_clock_install"
            )
        for name in DEFINITION.findall(text):
            where.setdefault(name, []).append(str(path.relative_to(SQL)))
    misplaced = {
        name: files for name, files in where.items() if set(files) != {f"functions/{name}.sql"}
    }
    assert where and not misplaced, misplaced
    overloads = {name: len(files) for name, files in where.items() if len(files) > 1}
    # Only job_cancel_tree has two forms (with and without `whole_tree`), in one file.
    assert overloads == {"job_cancel_tree": 2}, overloads


async def test_the_job_records_view_is_the_whole_row_record_in_its_order(
    pg_url: str, pg_schema: str
) -> None:
    """Every whole-row read builds `JobRecord` positionally from `job_records`: one column list."""
    await migrate(pg_url, pg_schema)
    with psycopg.connect(pg_url) as conn:
        columns = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "ORDER BY attnum",
            (f'"{pg_schema}".job_records',),
        ).fetchall()
    assert [name for (name,) in columns] == [field.name for field in attrs.fields(JobRecord)]
