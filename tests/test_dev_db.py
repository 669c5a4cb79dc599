"""`trioq dev-db` / `python -m trioq.embedded`: a development PostgreSQL in the foreground."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import trio

EXPORT = "export TRIOQ_DATABASE_URL="


async def start_dev_db(data_dir: Path, port: int) -> tuple[trio.Process, str]:
    """Start it; return the process and the URL from its `export` line."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "trioq.embedded", "--data-dir", str(data_dir), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    seen = b""
    with trio.fail_after(60):
        while EXPORT.encode() not in seen or not seen.endswith(b"\n"):
            chunk = await process.stdout.receive_some()
            if not chunk:
                assert process.stderr is not None
                error = await process.stderr.receive_some()
                raise AssertionError(f"dev-db exited early: {seen!r} {error!r}")
            seen += chunk
    line = next(x for x in seen.decode().splitlines() if x.startswith(EXPORT))
    [url] = shlex.split(line.removeprefix(EXPORT))
    return process, url


async def stop(process: trio.Process) -> int:
    process.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends
    with trio.fail_after(60):
        return await process.wait()


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """Under /tmp and open to others: the server runs as the postgres OS user when we are root
    (pytest's tmp_path sits under a directory only we may enter)."""
    parent = Path(tempfile.mkdtemp(prefix="trioq-dev-db-test-", dir="/tmp"))
    parent.chmod(0o755)
    yield parent / "pgdata"
    shutil.rmtree(parent, ignore_errors=True)


async def test_dev_db_prints_a_stable_url_keeps_its_data_and_stops_on_ctrl_c(
    data_dir: Path,
) -> None:
    port = 20000 + os.getpid() % 20000
    process, url = await start_dev_db(data_dir, port)
    try:
        assert url == f"postgresql://postgres@/postgres?host=/tmp/trioq-dev-db-{port}&port={port}"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (n int)")
        with trio.fail_after(60):
            busy = await trio.run_process(
                [sys.executable, "-m", "trioq.cli", "dev-db", "--port", str(port)],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        assert busy.returncode == 2
        assert f"port {port}: a PostgreSQL server (pid " in busy.stderr.decode()
    finally:
        assert await stop(process) == 0
    assert not await trio.Path(f"/tmp/trioq-dev-db-{port}").exists()  # socket dir removed

    again, same_url = await start_dev_db(data_dir, port)  # the same URL, the same data
    try:
        assert same_url == url
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)
    finally:
        assert await stop(again) == 0
