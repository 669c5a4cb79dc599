"""Hostile identifiers: schema, queue and task names are validated before they reach SQL, valid
ones round-trip exactly, and Postgres never sees a syntax error (SQLSTATE class 42).

The DB-backed properties share one app and client across examples: hypothesis runs in a worker
thread and each example hops back into the test's trio run with `trio.from_thread.run`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import hypothesis
import psycopg
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

import trioq
from tests.support import make_app, scalar
from trioq._core.identifiers import (
    MAX_KEY_LENGTH,
    NAME_PATTERN,
    quote_ident,
    validate_key,
    validate_name,
    validate_schema,
)

HOSTILE = [
    "",
    "'; DROP TABLE jobs; --",
    "x'; DROP TABLE jobs; --",
    '"; DROP SCHEMA public CASCADE; --',
    'a"b',
    "a'b",
    "a\\b",
    "\\",
    "$$",
    "$$; DROP TABLE jobs; $$",
    "$1",
    "%s",
    "%(queue)s",
    "{schema}",
    "a b",
    "tab\there",
    "new\nline",
    "trailing\n",
    "nul\x00byte",
    "\ud800",
    "ünïcödé",
    "日本語",
    "emoji🎉",
    "ǅ",
    "ﬁ",  # a ligature that case-folds to "fi"
    "١٢٣",  # Arabic-Indic digits match \d but not [0-9]
    "a" * 128,
    "a" * 129,
    "a" * 300,
    "-leading-dash",
    ".leading-dot",
    ":leading-colon",
    "ok_name.with:punct-1",
    "t",
    "default",
    "pg_catalog",
    "pg_x",
    "public",
    "information_schema",
    "select",
    "UPPER",
    "s" * 53,
    "s" * 54,
    "s" * 63,
    "s" * 64,
]

names = st.one_of(
    st.text(max_size=300),
    st.text(st.sampled_from(list("'\"\\$;-_.: aZz09é\x00\n")), max_size=300),
    st.from_regex(NAME_PATTERN, fullmatch=True),
    st.from_regex(r"[a-z_][a-z0-9_]{0,70}", fullmatch=True),
    st.sampled_from(HOSTILE),
)

DB_SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)


def sendable(text: str) -> bool:
    """Can the text be sent to PostgreSQL at all (no NUL, valid UTF-8)?"""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def is_valid(validator: Callable[..., Any], *args: Any) -> bool:
    try:
        validator(*args)
    except ValueError:
        return False
    return True


def no_syntax_error(exc: BaseException) -> None:
    """Fail loudly if `exc` (or anything it wraps) is a SQLSTATE class 42 error."""
    errors = exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,)
    for error in errors:
        if isinstance(error, BaseExceptionGroup):
            no_syntax_error(error)
        elif isinstance(error, psycopg.Error) and (error.sqlstate or "").startswith("42"):
            pytest.fail(f"PostgreSQL syntax/access error {error.sqlstate}: {error}")


async def run_property(
    example: Callable[[Any], Awaitable[None]], strategy: Any, explicit: Sequence[Any] = ()
) -> None:
    """Run `example` for each `explicit` value and each generated one, inside this trio run,
    from hypothesis' thread."""

    def check(value: Any) -> None:
        try:
            trio.from_thread.run(example, value)
        except BaseException as exc:
            no_syntax_error(exc)
            raise

    for value in explicit:
        check = hypothesis.example(value)(check)
    await trio.to_thread.run_sync(DB_SETTINGS(given(strategy)(check)))


# --- the validators (pure) -------------------------------------------------------------------


@pytest.mark.parametrize("name", HOSTILE)
def test_validators_accept_only_plain_bounded_ascii(name: str) -> None:
    allowed_name = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")
    if is_valid(validate_name, "queue", name):
        assert 1 <= len(name) <= 128 and set(name) <= allowed_name
        assert name[0] not in ".:-"
    else:
        with pytest.raises(ValueError, match=r"^queue: "):
            validate_name("queue", name)
    if is_valid(validate_schema, name):
        assert 1 <= len(name) <= 53 and set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789_")
        assert not name[0].isdigit() and not name.startswith("pg_")
    else:
        with pytest.raises(ValueError, match=r"^schema: "):
            validate_schema(name)


def test_validators_reject_non_strings() -> None:
    for value in (None, 1, b"jobs", ["jobs"]):
        with pytest.raises(ValueError, match=r"^task: "):
            validate_name("task", value)
        with pytest.raises(ValueError, match=r"^schema: "):
            validate_schema(value)
    with pytest.raises(ValueError, match=r"^dedup_key: "):
        validate_key("dedup_key", 5)


def test_schema_names_postgres_would_refuse_are_invalid() -> None:
    with pytest.raises(ValueError, match=r"^schema: "):
        validate_schema("pg_jobs")  # reserved prefix: CREATE SCHEMA fails with 42939
    with pytest.raises(ValueError, match=r"^schema: "):
        validate_schema("s" * 54)  # "<schema>_result_63" would exceed 63 bytes for pg_notify
    assert validate_schema("s" * 53) == "s" * 53
    assert validate_schema("pgx") == "pgx"


def test_keys_are_opaque_but_bounded_and_storable() -> None:
    for key in ("'; DROP TABLE jobs; --", "$$", "\\", "ünï 🎉", "k" * MAX_KEY_LENGTH):
        assert validate_key("partition_key", key) == key
    assert validate_key("partition_key", None) is None
    for key in ("", "k" * (MAX_KEY_LENGTH + 1), "a\x00", "\ud800"):
        with pytest.raises(ValueError, match=r"^partition_key: "):
            validate_key("partition_key", key)


def test_quote_ident_refuses_unvalidated_names() -> None:
    assert quote_ident("jobs_1") == '"jobs_1"'
    with pytest.raises(ValueError):
        quote_ident('x"; DROP TABLE y; --')


@settings(max_examples=50)
@given(names)
def test_task_registration_validates_the_name(name: str) -> None:
    app = trioq.App("postgresql://unused", schema="trioq")

    async def handler(ctx: trioq.Context, payload: object) -> None:
        return None

    if is_valid(validate_name, "task", name):
        app.task(name)(handler)
        assert list(app.tasks) == [name]
    else:
        with pytest.raises(ValueError, match=r"^task: "):
            app.task(name)(handler)
        assert app.tasks == {}


# --- against PostgreSQL ----------------------------------------------------------------------


async def jobs_table_exists(pg_url: str, schema: str) -> bool:
    return await scalar(pg_url, "SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".jobs',))


async def test_hostile_queue_and_task_names_are_refused_or_round_trip_exactly(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema, pool_size=2)

    @app.task("t")
    async def t(ctx: trioq.Context, payload: object) -> None:
        return None

    async def handler(ctx: trioq.Context, payload: object) -> None:
        return None

    round_tripped: list[str] = []

    async with app.client(migrate=True) as client:

        def insert_calls() -> int:
            return client.driver.statistics().calls.get("job_insert_many", 0)

        async def example(name: str) -> None:
            valid = is_valid(validate_name, "queue", name)
            before = insert_calls()
            if not valid:
                with pytest.raises(ValueError, match=r"^queue: "):
                    await client.enqueue("t", {}, queue=name)
                with pytest.raises(ValueError, match=r"^queue: "):
                    await client.enqueue_many("t", [{}], queue=name)
                with pytest.raises(ValueError, match=r"^task: "):
                    app.task(name)(handler)
                with pytest.raises(trioq.UnknownTask):
                    await client.enqueue(name, {})
                assert insert_calls() == before
                return
            if name not in app.tasks:
                app.task(name, queue=name)(handler)
            by_queue = await client.enqueue("t", {"name": name}, queue=name)
            by_task = await client.enqueue(name, {"name": name})
            assert insert_calls() == before + 2
            # ("t" itself is a valid name: its task was registered on queue "default")
            expected = ((by_queue, name, "t"), (by_task, app.tasks[name].queue, name))
            for job, queue, task in expected:
                record = await client.get_job(job.id)
                assert (job.queue, job.task) == (queue, task)
                assert (record.queue, record.task, record.payload) == (queue, task, {"name": name})
            round_tripped.append(name)

        await run_property(example, names, HOSTILE)
    assert len(round_tripped) >= 5  # valid names were exercised, not only refused ones
    assert await jobs_table_exists(pg_url, pg_schema)
    assert await scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.jobs") > 0


async def test_check_constraint_accepts_exactly_the_names_the_validator_accepts(
    pg_url: str, pg_schema: str
) -> None:
    """A raw INSERT (bypassing trioq) with a bad queue or task name is refused by the table's
    CHECK constraint: the database enforces the same rule as the validator."""
    app = make_app(pg_url, pg_schema, pool_size=2)
    insert = (
        f"INSERT INTO {pg_schema}.job_rows (queue, task, payload, run_at, created_at) "
        "VALUES (%s, %s, '{}', now(), now())"
    )

    class RollBack(Exception):
        pass

    async with app.client(migrate=True) as client:

        async def raw_insert(queue: str, task: str) -> None:
            with pytest.raises(RollBack):
                async with client.transaction() as tx:
                    await tx.execute(insert, (queue, task))
                    raise RollBack

        async def example(name: str) -> None:
            if not sendable(name):
                assert not is_valid(validate_name, "queue", name)
                return
            for queue, task in ((name, "t"), ("default", name)):
                if is_valid(validate_name, "queue", name):
                    await raw_insert(queue, task)
                else:
                    with pytest.raises(psycopg.errors.CheckViolation):
                        await raw_insert(queue, task)

        await run_property(example, names, HOSTILE)
        with pytest.raises(psycopg.errors.CheckViolation):
            await raw_insert("'; DROP TABLE jobs; --", "t")
    assert await jobs_table_exists(pg_url, pg_schema)
    assert await scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.jobs") == 0


async def test_hostile_schema_names_are_refused_or_work_end_to_end(pg_url: str) -> None:
    existing = set(await scalar(pg_url, "SELECT array_agg(nspname::text) FROM pg_namespace") or [])
    created: list[str] = []

    async def example(name: str) -> None:
        if not is_valid(validate_schema, name):
            with pytest.raises(ValueError, match=r"^schema: "):
                trioq.App(pg_url, schema=name)
            return
        if name in existing or name in created:
            return  # never touch a schema this test did not create (public, ...)
        app = trioq.App(pg_url, schema=name, pool_size=1)

        @app.task("t")
        async def t(ctx: trioq.Context, payload: object) -> None:
            return None

        created.append(name)
        async with app.client(migrate=True) as client:
            assert client.driver.schema == name
            job = await client.enqueue("t", {"schema": name})
            assert (await client.get_job(job.id)).payload == {"schema": name}
            with trio.fail_after(10):  # result notifications work (channel name in range)
                assert await client.cancel(job.id) == "cancelled"
                assert (await client.wait_final(job.id)).state == "cancelled"
        assert await jobs_table_exists(pg_url, name)

    # Names Postgres itself would refuse (reserved prefix, channel names over 63 bytes) and the
    # longest valid one are always tried.
    critical = ["pg_x", "pg_catalog", "s" * 53, "s" * 54, "s" * 63, "select", "_", "public"]
    try:
        await run_property(example, names, critical)
    finally:
        await trio.to_thread.run_sync(functools.partial(drop_schemas, pg_url, created))
    assert created  # some valid names were exercised end to end


def drop_schemas(pg_url: str, schemas: list[str]) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
