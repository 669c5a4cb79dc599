"""`trioq dev-db` / `python -m trioq.embedded`: a development PostgreSQL in the foreground."""

from __future__ import annotations

import os
import pwd
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


@pytest.mark.parametrize("squat", ["other owner", "open to others", "symlink"])
def test_dev_db_refuses_a_socket_directory_someone_else_prepared(squat: str) -> None:
    """The fixed socket directory is in /tmp: a directory another user created there (or left
    writable to all, or a symlink) would get the trust-auth superuser socket. Refused with the
    fix, before any server starts."""
    port = 40000 + os.getpid() % 20000 + ["other owner", "open to others", "symlink"].index(squat)
    path = Path(f"/tmp/trioq-dev-db-{port}")
    target = Path(tempfile.mkdtemp(prefix="trioq-squat-", dir="/tmp"))
    try:
        if squat == "symlink":
            path.symlink_to(target)
        else:
            path.mkdir()
            path.chmod(0o777)
            if squat == "other owner" and os.getuid() == 0:
                nobody = pwd.getpwnam("nobody")
                os.chown(path, nobody.pw_uid, nobody.pw_gid)
        refused = subprocess.run(
            [sys.executable, "-m", "trioq.cli", "dev-db", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        error = refused.stderr
        assert refused.returncode == 2, error
        assert str(path) in error and "choose another --port" in error, error
        assert len(error.strip().splitlines()) == 1, error
        assert not (target / f".s.PGSQL.{port}").exists()
    finally:
        if path.is_symlink():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
        shutil.rmtree(target, ignore_errors=True)
