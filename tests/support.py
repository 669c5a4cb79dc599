"""Helpers shared by the integration tests (not fixtures: plain functions and context managers)."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import trio
from psycopg import sql

import trioq
from trioq._pg import Connection
from trioq._sql import Migration, functions, queries


def apply_functions(conn: psycopg.Connection[Any], schema: str) -> None:
    """What `migrate` does before the migrations, for a test that replays them one by one: the
    SQL functions' current bodies (trioq/_sql/functions/), unchecked until they run."""
    statements = queries(schema)
    with conn.transaction():
        conn.execute(statements["migration_functions_unchecked"])
        for function in functions(schema):
            conn.execute(function.sql)  # type: ignore[arg-type]


def apply_migration(conn: psycopg.Connection[Any], migration: Migration) -> None:
    """One migration's SQL on an autocommit connection, as `migrate` runs it: a transactional
    one whole, a no-transaction one (`-- trioq: no-transaction`) statement by statement."""
    if migration.transactional:
        conn.execute(migration.sql)  # type: ignore[arg-type]
        return
    for statement in migration.statements():
        conn.execute(statement)  # type: ignore[arg-type]


def make_app(pg_url: str, pg_schema: str, **kwargs: Any) -> trioq.App:
    return trioq.App(pg_url, schema=pg_schema, **kwargs)


@asynccontextmanager
async def running_worker(
    app: trioq.App, queues: list[str] | None = None, concurrency: int = 5, **config: Any
) -> AsyncIterator[trioq.Worker]:
    """Start a worker in a nursery; drain it (grace 0 unless given) when the block ends."""
    config.setdefault("grace_seconds", 0)
    config.setdefault("write_timeout", 10)
    async with trio.open_nursery() as nursery:
        worker: trioq.Worker = await nursery.start(
            functools.partial(app.run_worker, queues or ["default"], concurrency, **config)
        )
        try:
            yield worker
        finally:
            worker.request_drain()


def sql_scalar(pg_url: str, query: str, params: Any = None) -> Any:
    """A blocking one-off read from a separate session (for assertions from the outside)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
        return None if row is None else row[0]


def sql_rows(pg_url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def partitions_of(pg_url: str, parent: str) -> list[str]:
    """The names of the partitions of `parent` (schema-qualified), in name order."""
    rows = sql_rows(
        pg_url,
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = %s::regclass ORDER BY 1",
        (parent,),
    )
    return [name for (name,) in rows]


async def scalar(pg_url: str, query: str, params: Any = None) -> Any:
    return await trio.to_thread.run_sync(sql_scalar, pg_url, query, params)


class Gate:
    """Handlers wait on `release`; the test waits until `n` handlers have `entered`."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.entered = 0
        self._changed = trio.Event()

    def enter(self) -> None:
        self.entered += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_entered(self, n: int) -> None:
        while self.entered < n:
            await self._changed.wait()


async def wait_until(condition: Callable[[], Awaitable[bool]], interval: float = 0.02) -> None:
    """Poll an observable condition that offers no event (another session's or process's
    state); bound it with `trio.fail_after` in the caller."""
    while True:
        if await condition():
            return
        await trio.sleep(interval)


def stall_db_now_once(conn: psycopg.Connection[Any], schema: str) -> None:
    """Replace `schema.db_now()` for an interleaving test: in a session that has set `test.stall`
    to 'on', the first call waits for the advisory lock `hold_stall` holds on `conn`'s side, so
    that session's statement (a claim) has taken its snapshot and stays there, having locked no
    row, until the test has done what must happen meanwhile and calls `end_stall`. A lock, not
    a pg_sleep: the stall lasts as long as the test needs, however slow the machine."""
    conn.execute(
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}.db_now() RETURNS timestamptz "
            "LANGUAGE plpgsql AS $$ BEGIN "
            "IF current_setting('test.stall', true) = 'on' THEN "
            "PERFORM set_config('test.stall', 'off', false); "
            "PERFORM pg_advisory_xact_lock(hashtext({})); END IF; "
            "RETURN now(); END $$"
        ).format(sql.Identifier(schema), sql.Literal(_stall_key(schema)))
    )


def _stall_key(schema: str) -> str:
    return f"{schema}: test stall"


def hold_stall(conn: psycopg.Connection[Any], schema: str) -> None:
    """Take the lock a stalling `db_now()` waits for (a session lock on `conn`)."""
    conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (_stall_key(schema),))


def end_stall(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (_stall_key(schema),))


def wait_stalled(conn: psycopg.Connection[Any], pid: int, within: float = 30.0) -> None:
    """Block until backend `pid` waits in the stalling `db_now()` (for `hold_stall`'s lock)."""
    deadline = time.monotonic() + within
    query = "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s"
    while conn.execute(query, (pid,)).fetchone() != ("Lock", "advisory"):
        assert time.monotonic() < deadline, f"session {pid} never stalled"
        time.sleep(0.01)  # another session's state: polled, there is no event


def run_explained(
    conn: psycopg.Connection[Any], statement: str, params: Any
) -> tuple[list[tuple[Any, ...]], list[str]]:
    """Run `statement` prepared on `conn` with auto_explain on: its rows and the plans
    PostgreSQL logged for it (as notices), so a test can read the plan a prepared statement
    actually ran."""
    plans: list[str] = []
    conn.execute("LOAD 'auto_explain'")
    for setting in ("log_min_duration = 0", "log_level = notice"):
        conn.execute(f"SET auto_explain.{setting}")
    conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    return conn.execute(statement, params, prepare=True).fetchall(), plans


async def blocked_on_a_lock(observer: Connection, pg_schema: str) -> bool:
    """Whether some session's statement on `pg_schema` waits for a lock (an interleaving test's
    held transaction has blocked it)."""
    count = await observer.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND position(%s in query) > 0",
        [pg_schema],
    )
    return bool(count)
