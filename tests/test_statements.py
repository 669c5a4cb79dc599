"""The cost of trioq's statements on the client does not depend on the schema name."""

from __future__ import annotations

import collections
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg._queries
import pytest
import trio
from psycopg import sql

import trioq
from tests.support import make_app, running_worker
from trioq._core.identifiers import SCHEMA_PATTERN
from trioq._sql import parse_blocks, positional_queries, queries, to_positional


@pytest.fixture
def longest_schema(pg_url: str, pg_schema: str) -> Iterator[str]:
    """A schema name of the maximum length (53 characters), dropped afterwards."""
    name = (pg_schema + "_" + "x" * 53)[:53]
    assert SCHEMA_PATTERN.fullmatch(name)
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


async def test_hot_statements_are_never_reparsed_whatever_the_schema_names_length(
    pg_url: str, longest_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg caches the parsing of `%(name)s` placeholders only for statements up to 4 KiB;
    the claim statement is over that for schema names of 8 characters or more, and was parsed
    again on every call. Statements are now sent with `$n` placeholders, parsed by nobody."""
    uncached: collections.Counter[bytes] = collections.Counter()
    parse = psycopg._queries._query2pg_nocache

    def counting(query: bytes, encoding: str) -> Any:
        uncached[query[:60]] += 1
        return parse(query, encoding)

    monkeypatch.setattr(psycopg._queries, "_query2pg_nocache", counting)
    app = make_app(pg_url, longest_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: Any) -> int:
        return int(payload["n"])

    async with app.client(migrate=True) as client:
        jobs = await client.enqueue_many("noop", [{"n": n} for n in range(30)])
        async with running_worker(app, concurrency=5, lease_seconds=0.6):
            with trio.fail_after(20):
                results = [await client.wait_result(job.id) for job in jobs]
    assert results == list(range(30))
    assert max(len(text) for text in queries(longest_schema).values()) > 4096  # the hazard
    assert uncached == {}


def test_positional_form_numbers_each_name_once_and_unescapes_percent() -> None:
    statement = to_positional("SELECT %(a)s, %(b)s, %(a)s, 'x%%' WHERE y = %(b)s")
    assert statement.text == b"SELECT $1, $2, $1, 'x%' WHERE y = $2"
    assert statement.names == ("a", "b")
    assert statement.values({"b": 2, "a": 1, "unused": 3}) == [1, 2]
    assert set(positional_queries("trioq")) == set(queries("trioq"))


def test_a_fragment_with_names_is_included_with_the_includes_names() -> None:
    """`-- fragment: y(a, b)` writes `@a@`, `@b@`; each include gives its own names (the claim's
    one loose index scan serves partition keys and concurrency keys), and a wrong count of
    names is an error at load time."""
    text = (
        "-- fragment: pick(col, tab)\n    SELECT @col@ FROM @tab@\n"
        "-- name: both\n-- include: pick(a, t)\nUNION ALL\n-- include: pick(b, u)\n"
    )
    assert parse_blocks(text) == {"both": "SELECT a FROM t\nUNION ALL\nSELECT b FROM u"}
    with pytest.raises(ValueError, match="takes 2 names"):
        parse_blocks("-- fragment: pick(col, tab)\nx\n-- name: one\n-- include: pick(a)\n")
    claim = queries("x")["job_claim"]
    assert re.search(r"@[a-z_]+@", claim) is None  # every marker replaced
    assert "FROM ready_keys k" in claim and "FROM ready_concurrency_keys k" in claim


def test_a_fragment_is_included_where_a_statement_names_it_and_nowhere_else() -> None:
    """`-- include: x` lines are replaced by the `-- fragment: x` block's lines (comments and
    indentation dropped as for any statement); a fragment is no statement of its own, and an
    include of a fragment that does not exist is an error at load time."""
    text = (
        "-- fragment: cols\n-- a comment\n    a, b\n"
        "-- name: thing_read\nSELECT\n    -- include: cols\nFROM t;\n"
    )
    assert parse_blocks(text) == {"thing_read": "SELECT\na, b\nFROM t;"}
    with pytest.raises(ValueError, match="no fragment 'rows'"):
        parse_blocks("-- name: thing_read\nSELECT\n-- include: rows\n")
    claim_columns = "j.version,"
    for name in ("job_claim", "job_claim_rated", "job_claim_plain"):
        assert claim_columns in queries("x")[name]  # both claims read the one column list
    assert "claim_returning" not in queries("x")


def test_the_parent_wake_up_is_written_once_and_called_where_children_end() -> None:
    """The rule (a parent counts its finished children; a waiting one is woken when none it
    waits for is left or one did not complete) is parents_notify() of migration 0030, which
    the cancels call too. No statement writes a parent's count itself."""
    statements = queries("x")
    assert [name for name, text in statements.items() if "children_settled + " in text] == []
    for name in ("job_settle_many", "maintenance_pass"):
        assert '"x".parents_notify(' in statements[name], name
