"""A database password never reaches a log line, an error or a repr: libpq quotes the part of a
URL it cannot parse (a bad `%` escape: the password; a bad IPv6 bracket: the whole URI), and
reprs end up in tracebacks' locals (Sentry) and debug pages."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import psycopg.conninfo
import pytest

import trioq
from trioq._pg.driver import open_pg_driver
from trioq.producer import SyncProducer

PASSWORD = "s3cr%t@p]ss"
BROKEN = (
    "postgresql://app:s3cr%zzet@db.example/app",  # a bad % escape: libpq quotes the token
    f"postgresql://app:{PASSWORD}@[::1/app",  # a bad IPv6 bracket: libpq quotes the whole URI
)


@pytest.mark.parametrize("url", BROKEN)
async def test_an_unparsable_url_is_refused_without_echoing_it(url: str) -> None:
    with pytest.raises(psycopg.ProgrammingError) as refused:
        async with trioq.App(url).client():
            pass
    assert "s3cr" not in str(refused.value), refused.value


@pytest.mark.parametrize("url", BROKEN)
def test_producers_and_the_command_line_refuse_it_without_echoing_it(url: str) -> None:
    with pytest.raises(trioq.TrioqError) as refused:
        SyncProducer(url).close()
    assert "s3cr" not in str(refused.value), refused.value
    result = subprocess.run(
        [sys.executable, "-m", "trioq.cli", "status", "--database-url", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "s3cr" not in result.stdout + result.stderr, result.stderr


async def test_no_repr_of_a_driver_pool_or_producer_holds_the_password(
    pg_url: str, pg_schema: str
) -> None:
    url = psycopg.conninfo.make_conninfo(pg_url, password=PASSWORD)  # trust auth ignores it
    async with open_pg_driver(url, pg_schema, pool_size=1) as driver:
        for shown in (repr(driver), repr(driver._pool)):
            assert PASSWORD not in shown and "s3cr" not in shown, shown
    producer = SyncProducer(url, schema=pg_schema)
    try:
        assert "s3cr" not in repr(producer._settings), repr(producer._settings)
    finally:
        producer.close()
