"""trioq's SQL functions use trioq's objects and PostgreSQL's, whatever the caller's search_path:
a schema placed before pg_catalog, holding tables, functions and operators of the same names,
changes nothing (docs/operations.md, "Roles: least privilege")."""

from __future__ import annotations

import datetime
from typing import Any

import psycopg
import pytest
import trio
from psycopg import sql

from tests.support import force_running, make_app

PINNED = ["search_path=pg_catalog, pg_temp"]
# Called per row of the hot statements (or inlined into them): a SET clause would stop the
# inlining and cost ~2.5 us a call, so their bodies name every function, operator and type by
# schema instead (each file says so).
QUALIFIED = {
    "concurrency_limit_of",
    "concurrency_rate_of",
    "concurrency_release",
    "db_now",
    "deadline_error",
    "job_key_released",
    "jobs_live_file",
    "jobs_live_left",
    "ready_keyed_file",
    "ready_channel",
    "ready_ring_file",
    "ready_ring_low",
    "ready_slot",
    "result_channel",
    "task_deadline_seconds",
}

# Same names as what trioq's functions use, each raising: a call that reaches one fails.
HOSTILE_FUNCTIONS = [
    ("now()", "timestamptz"),
    ("current_setting(text, boolean)", "text"),
    ("hashtext(text)", "integer"),
    ("to_char(timestamp, text)", "text"),
    ("right(text, integer)", "text"),
    ("left(text, integer)", "text"),
    ("starts_with(text, text)", "boolean"),
    ("length(text)", "integer"),
    ("pg_notify(text, text)", "void"),
    ("nextval(regclass)", "bigint"),
    ("jsonb_typeof(jsonb)", "text"),
    ("array_length(anyarray, integer)", "integer"),
]
HOSTILE_OPERATORS = [
    ("=", "text", "text", "boolean"),
    ("<>", "text", "text", "boolean"),
    ("||", "text", "text", "text"),
    ("&", "integer", "integer", "integer"),
    ("&", "bigint", "bigint", "bigint"),
]


def plant_hostile_schema(conn: psycopg.Connection[Any], evil: str) -> None:
    schema = sql.Identifier(evil)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
    for table in ("jobs", "events", "messages", "checkpoints", "concurrency_limits"):
        conn.execute(
            sql.SQL("CREATE TABLE {}.{} (id bigint)").format(schema, sql.Identifier(table))
        )
    for signature, returns in HOSTILE_FUNCTIONS:
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {}.{} RETURNS {} LANGUAGE plpgsql AS "
                "$$BEGIN RAISE EXCEPTION 'hijacked: %', {}; END$$"
            ).format(schema, sql.SQL(signature), sql.SQL(returns), sql.Literal(signature))
        )
    for number, (operator, left, right, returns) in enumerate(HOSTILE_OPERATORS):
        function = sql.Identifier(f"op_{number}")
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {}.{}(a {}, b {}) RETURNS {} LANGUAGE plpgsql AS "
                "$$BEGIN RAISE EXCEPTION 'hijacked: operator %', {}; END$$"
            ).format(
                schema,
                function,
                sql.SQL(left),
                sql.SQL(right),
                sql.SQL(returns),
                sql.Literal(operator),
            )
        )
        conn.execute(
            sql.SQL("CREATE OPERATOR {}.{} (LEFTARG = {}, RIGHTARG = {}, FUNCTION = {}.{})").format(
                schema, sql.SQL(operator), sql.SQL(left), sql.SQL(right), schema, function
            )
        )


def test_every_function_pins_its_search_path_or_names_everything_by_schema(
    pg_url: str, pg_schema: str
) -> None:
    trio.run(_migrate, pg_url, pg_schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT p.proname, p.proconfig FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s",
            (pg_schema,),
        ).fetchall()
    assert rows
    # A function may SET more than its search_path (job_history_rotate's lock_timeout).
    unpinned = sorted({name for name, config in rows if not set(PINNED) <= set(config or ())})
    assert unpinned == sorted(QUALIFIED)
    assert all(config is None for name, config in rows if name in QUALIFIED)


async def _migrate(pg_url: str, pg_schema: str) -> None:
    async with make_app(pg_url, pg_schema).client(migrate=True):
        pass


def test_functions_called_under_a_hostile_search_path_use_trioqs_objects(
    pg_url: str, pg_schema: str
) -> None:
    trio.run(_migrate, pg_url, pg_schema)
    evil = f"{pg_schema}_evil"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        try:
            plant_hostile_schema(conn, evil)
            _exercise(conn, pg_schema, evil)
        finally:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(evil)))


def _exercise(conn: psycopg.Connection[Any], schema: str, evil: str) -> None:
    s = sql.Identifier(schema)

    def one(query: str, params: Any = None) -> Any:
        row = conn.execute(sql.SQL(query).format(s=s), params).fetchone()
        assert row is not None
        return row[0]

    deadline = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    expected = {
        "ready": one("SELECT {s}.ready_channel('default')"),
        "result": one("SELECT {s}.result_channel(7)"),
        "error": one("SELECT {s}.deadline_error(%s, NULL)", (deadline,)),
    }

    def run(query: str, params: Any = None) -> None:
        conn.execute(sql.SQL(query).format(s=s), params)

    run(
        "INSERT INTO {s}.concurrency_limits (pattern, max_running, updated_at) "
        "VALUES ('t:*', 2, now())"
    )
    keyed = one("SELECT {s}.enqueue('noop', '{{}}', concurrency_key => 't:1')")
    force_running(conn, schema, [keyed], expires_in=datetime.timedelta(minutes=1))
    run(
        "INSERT INTO {s}.concurrency_holds (concurrency_key, slot, job_id) VALUES ('t:1', 0, %s)",
        (keyed,),
    )
    with conn.transaction():
        conn.execute(sql.SQL("SET LOCAL search_path = {}, pg_catalog").format(sql.Identifier(evil)))
        # The planted objects are live on this path:
        with pytest.raises(psycopg.errors.RaiseException, match="hijacked"), conn.transaction():
            conn.execute("SELECT now()")
        assert one("SELECT {s}.db_now() OPERATOR(pg_catalog.=) pg_catalog.now()")
        assert one("SELECT {s}.ready_channel('default')") == expected["ready"]
        assert one("SELECT {s}.result_channel(7)") == expected["result"]
        assert one("SELECT {s}.deadline_error(%s, NULL)", (deadline,)) == expected["error"]
        assert one("SELECT {s}.concurrency_limit_of('t:1', 5)") == 2
        assert (
            conn.execute(
                sql.SQL("SELECT * FROM {s}.concurrency_rate_of('t:1')").format(s=s)
            ).fetchall()
            == []
        )
        assert one("SELECT {s}.task_deadline_seconds('noop', 1)") is None
        job = one("SELECT {s}.enqueue('noop', '{{\"a\": 1}}')")
        message = one("SELECT {s}.send(%s, 'topic', '1')", (job,))
        assert one("SELECT (e).emitted_first FROM {s}.event_emit('an-event', '2') AS e")
        demand = conn.execute(sql.SQL("SELECT * FROM {s}.queue_demand()").format(s=s)).fetchall()
        probe = conn.execute(
            sql.SQL("SELECT * FROM {s}.queue_probe(ARRAY['default'])").format(s=s)
        ).fetchall()
        # The trigger of a keyed job's end (its run deleted, migration 0047) releases its slot.
        run("DELETE FROM {s}.job_runs WHERE job_id = %s", (keyed,))
    assert one("SELECT payload FROM {s}.jobs WHERE id = %s", (job,)) == {"a": 1}
    assert one("SELECT payload FROM {s}.messages WHERE id = %s", (message,)) == 1
    assert one("SELECT payload FROM {s}.events WHERE key = 'an-event'") == 2
    assert one("SELECT count(*) FROM {s}.concurrency_holds") == 0
    assert [row[0] for row in demand] == ["default"] and probe[0][1] is True
    for table in ("jobs", "events", "messages"):
        count = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.{}").format(
                sql.Identifier(evil), sql.Identifier(table)
            )
        ).fetchone()
        assert count == (0,)
