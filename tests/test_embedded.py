"""The embedded cluster: reachable on its socket only, throwaway settings, clean stop, discovery."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from trioq.embedded import (
    EmbeddedPostgres,
    EmbeddedPostgresError,
    EmbeddedSettings,
    embedded_postgres,
    find_postgres_bindir,
)

# Slow tier: each test starts its own PostgreSQL cluster; `pytest -m "not slow"` leaves it out.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedPostgres]:
    """A cluster of this module's own, so these tests hold even with TRIOQ_DATABASE_URL set."""
    with EmbeddedPostgres() as started:
        yield started


def show(conninfo: str, setting: str) -> str:
    with psycopg.connect(conninfo) as conn:
        row = conn.execute(f"SHOW {setting}").fetchone()
    assert row is not None
    return str(row[0])


def test_cluster_accepts_connections_over_its_unix_socket(cluster: EmbeddedPostgres) -> None:
    with psycopg.connect(cluster.conninfo) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        # inet_server_addr() is NULL exactly when the session came in over a unix socket.
        assert conn.execute("SELECT inet_server_addr()").fetchone() == (None,)
        assert conn.info.host.startswith("/tmp/")


def test_url_form_reaches_the_same_cluster(cluster: EmbeddedPostgres) -> None:
    assert show(cluster.url, "unix_socket_directories") == show(
        cluster.conninfo, "unix_socket_directories"
    )


def test_server_listens_on_no_tcp_address_and_skips_durability(cluster: EmbeddedPostgres) -> None:
    assert show(cluster.conninfo, "listen_addresses") == ""
    assert show(cluster.conninfo, "fsync") == "off"
    assert show(cluster.conninfo, "synchronous_commit") == "off"
    assert show(cluster.conninfo, "full_page_writes") == "off"
    assert show(cluster.conninfo, "max_connections") == "200"


@pytest.mark.skipif(
    bool(os.environ.get("TRIOQ_DATABASE_URL")), reason="the session uses an external server"
)
def test_session_cluster_preloads_pg_stat_statements(pg_url: str) -> None:
    assert show(pg_url, "shared_preload_libraries") == "pg_stat_statements"
    assert show(pg_url, "max_connections") == "300"


def test_stop_removes_the_temporary_directories_and_is_idempotent() -> None:
    cluster = EmbeddedPostgres()
    cluster.start()
    run_dir = cluster.log_path.parent
    assert (run_dir / "data" / "PG_VERSION").exists()

    cluster.stop()
    assert not run_dir.exists()
    assert not cluster.running
    cluster.stop()


def test_a_second_cluster_runs_alongside_the_session_one(pg_url: str) -> None:
    query = "SELECT system_identifier FROM pg_control_system()"
    with (
        embedded_postgres() as other_url,
        psycopg.connect(pg_url) as session_conn,
        psycopg.connect(other_url) as other_conn,
    ):
        session_id = session_conn.execute(query).fetchone()
        other_id = other_conn.execute(query).fetchone()
    assert session_id != other_id


def test_given_data_dir_is_kept_and_its_cluster_reused_by_the_next_start() -> None:
    # Under /tmp and world-traversable: when we are root, the server runs as `postgres`.
    parent = Path(tempfile.mkdtemp(prefix="trioq-test-", dir="/tmp"))
    try:
        parent.chmod(0o755)
        data_dir = parent / "data"
        with EmbeddedPostgres(data_dir=data_dir) as first, psycopg.connect(first.conninfo) as conn:
            conn.execute("CREATE TABLE kept (id int)")
            conn.commit()
        assert (data_dir / "PG_VERSION").exists()

        with (
            EmbeddedPostgres(data_dir=data_dir) as second,
            psycopg.connect(second.conninfo) as conn,
        ):
            assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)
        assert (data_dir / "postgresql.conf").read_text().count("trioq.conf") == 1
    finally:
        shutil.rmtree(parent)


def test_failed_start_reports_the_server_log_tail() -> None:
    broken = EmbeddedSettings(server_settings={"shared_buffers": "not a size"})
    cluster = EmbeddedPostgres(settings=broken)
    with pytest.raises(EmbeddedPostgresError, match="server log tail") as raised:
        cluster.start()
    assert "shared_buffers" in str(raised.value)
    assert not cluster.running


def test_missing_binaries_raise_an_error_that_says_how_to_fix_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    search_globs = (str(tmp_path / "postgresql" / "*" / "bin"),)
    with pytest.raises(EmbeddedPostgresError) as raised:
        find_postgres_bindir(search_globs=search_globs, include_pgserver=False)

    message = str(raised.value)
    assert "initdb, pg_ctl, postgres" in message
    assert "pg_config is not on PATH" in message
    assert f"nothing matches {search_globs[0]}" in message
    assert "apt-get install postgresql" in message
    assert "TRIOQ_DATABASE_URL" in message
    assert "pip install 'trioq[embedded]'" in message


def test_search_picks_the_highest_version_that_has_all_server_programs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    for version, programs in {
        "9.6": ("initdb", "pg_ctl", "postgres"),
        "15": ("initdb", "pg_ctl", "postgres"),
        "16": ("pg_ctl",),
    }.items():
        bindir = tmp_path / "postgresql" / version / "bin"
        bindir.mkdir(parents=True)
        for program in programs:
            (bindir / program).touch()

    found = find_postgres_bindir(
        search_globs=(str(tmp_path / "postgresql" / "*" / "bin"),), include_pgserver=False
    )
    assert found == tmp_path / "postgresql" / "15" / "bin"


def test_unique_schema_names_are_plain_identifiers(pg_schema: str) -> None:
    assert re.fullmatch(r"[a-z_][a-z0-9_]*", pg_schema)
