"""Shared fixtures: one Postgres per test session, one fresh schema name per test."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from psycopg import sql

from tests import hypothesis_profiles
from trioq._pg import Connection, connect
from trioq.embedded import EmbeddedPostgres, EmbeddedSettings

pytest_plugins = ["pytester"]

hypothesis_profiles.load()

SESSION_CLUSTER_SETTINGS = EmbeddedSettings(
    max_connections=300, shared_preload_libraries=("pg_stat_statements",)
)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """`TRIOQ_DATABASE_URL` when set; otherwise an embedded cluster shared by the whole session."""
    external = os.environ.get("TRIOQ_DATABASE_URL")
    if external:
        yield external
        return
    with EmbeddedPostgres(settings=SESSION_CLUSTER_SETTINGS) as cluster:
        yield cluster.conninfo


@pytest.fixture(scope="session")
def trioq_database_url(pg_url: str) -> str:
    """The trioq pytest plugin's fixtures use the session's cluster (no second one)."""
    return pg_url


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[str]:
    """A schema name no other test uses; whatever the test creates in it is dropped afterwards."""
    name = f"t_{secrets.token_hex(8)}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # A session the test leaked while holding locks fails the teardown instead of hanging it.
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
async def observer(pg_url: str) -> AsyncIterator[Connection]:
    """A second session that inspects the server (and sends NOTIFYs) while the code under test
    runs."""
    conn = await connect(pg_url, application_name="trioq-test-observer")
    try:
        yield conn
    finally:
        await conn.close()
