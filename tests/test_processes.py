"""`trioq worker --processes 3`: one supervisor, three worker processes. A child killed with
SIGKILL is restarted and its jobs recover; SIGTERM to the supervisor drains all three.

Synchronisation is by polling the database or the supervisor's output under `trio.fail_after`
(tests/procs.py); every process this test starts, directly or through the supervisor, is
killed by its pid at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import trio

from tests.fault_app import QUEUE, SCHEMA_ENV
from tests.procs import APP_PATH, REPO_ROOT, fetch, wait_until
from tests.test_faults import count_is, producer, q
from trioq.cli.processes import SUPERVISOR_FD_ENV

LEASE = 2.0
POLL = 0.2
MAINTENANCE = 0.5


def worker_pids(schema: str) -> tuple[object, None]:
    return q(schema, "SELECT DISTINCT pid FROM {s}.workers ORDER BY pid"), None


async def start_supervisor(
    pg_url: str, pg_schema: str, log_file: IO[bytes], processes: int, *extra: str
) -> trio.Process:
    # fmt: off
    return await trio.lowlevel.open_process(
        [
            sys.executable, "-m", "trioq.cli", "-v", "worker", APP_PATH,
            "--queue", QUEUE, "--concurrency", "2", "--processes", str(processes),
            "--lease", str(LEASE), "--poll-interval", str(POLL), "--grace", "10",
            "--maintenance-interval", str(MAINTENANCE), "--database-url", pg_url, *extra,
        ],
        cwd=REPO_ROOT,
        env={**os.environ, SCHEMA_ENV: pg_schema, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    # fmt: on


async def reap(supervisor: trio.Process, pids: set[int]) -> None:
    """Kill (by pid) every process the test started, directly or through the supervisor."""
    with trio.CancelScope(shield=True):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if supervisor.returncode is None:
            supervisor.kill()
            await supervisor.wait()


async def test_processes_3_restarts_a_killed_child_and_sigterm_drains_all(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    log_path = tmp_path / "supervisor.log"
    seen_pids: set[int] = set()
    async with producer(pg_url, pg_schema) as client:
        with log_path.open("wb") as log_file:
            supervisor = await start_supervisor(pg_url, pg_schema, log_file, 3)
            try:
                rows = await wait_until(
                    pg_url, *worker_pids(pg_schema), count_is(3), within=30,
                    what="three worker processes registered",
                )  # fmt: skip
                seen_pids.update(pid for (pid,) in rows)
                assert supervisor.pid not in seen_pids
                ids = [j.id for j in await client.enqueue_many("work", [{"seconds": 1.0}] * 6)]
                started = await wait_until(
                    pg_url,
                    q(pg_schema, "SELECT DISTINCT worker_pid FROM {s}.exec_log"),
                    None,
                    lambda rows: len(rows) >= 1,
                    within=15,
                    what="a child to start a job",
                )
                victim = started[0][0]
                os.kill(victim, signal.SIGKILL)
                rows = await wait_until(
                    pg_url, *worker_pids(pg_schema), count_is(4), within=30,
                    what="the killed child restarted (a fourth pid registered)",
                )  # fmt: skip
                seen_pids.update(pid for (pid,) in rows)
                await wait_until(
                    pg_url,
                    q(
                        pg_schema,
                        "SELECT id FROM {s}.jobs WHERE id = ANY(%s) AND state = %s",
                    ),
                    (ids, "completed"),
                    count_is(6),
                    within=LEASE + MAINTENANCE * 1.2 + POLL + 20,
                    what="all six jobs completed, the killed child's recovered",
                )
                # Drain: jobs running when SIGTERM arrives finish (grace 10 s) on all children.
                drained = [j.id for j in await client.enqueue_many("work", [{"seconds": 1.0}] * 6)]
                await wait_until(
                    pg_url,
                    q(
                        pg_schema,
                        "SELECT id FROM {s}.jobs WHERE id = ANY(%s) AND state = %s",
                    ),
                    (drained, "running"),
                    count_is(6),
                    within=15,
                    what="six jobs running across the children",
                )
                supervisor.send_signal(signal.SIGTERM)
                with trio.fail_after(30):
                    code = await supervisor.wait()
            finally:
                await reap(supervisor, seen_pids)
        output = log_path.read_text(errors="replace")
        states = await fetch(
            pg_url,
            q(pg_schema, "SELECT state, count(*) FROM {s}.jobs WHERE id = ANY(%s) GROUP BY 1"),
            (drained,),
        )
        registered = await fetch(pg_url, *worker_pids(pg_schema))
    assert code == 0, output
    assert f"pid {victim}) was killed by SIGKILL; restarting in 0.5s" in output, output
    assert "SIGTERM: draining 3 worker(s)" in output, output
    # The app's "reports" queue is served by no worker here: said once, by the supervisor.
    assert output.count("which this worker does not serve") == 1, output
    assert states == [("completed", 6)], output  # drained, none released or lost
    assert registered == [(victim,)], output  # the live three unregistered on their way out


async def test_children_drain_when_their_supervisor_is_killed(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    pids: set[int] = set()
    async with producer(pg_url, pg_schema):
        with (tmp_path / "supervisor.log").open("wb") as log_file:
            supervisor = await start_supervisor(pg_url, pg_schema, log_file, 2, "--split")
            try:
                rows = await wait_until(
                    pg_url, *worker_pids(pg_schema), count_is(2), within=30,
                    what="two worker processes registered",
                )  # fmt: skip
                pids.update(pid for (pid,) in rows)
                supervisor.kill()
                await supervisor.wait()
                # Each child saw the pipe close, drained and unregistered its row.
                await wait_until(
                    pg_url, *worker_pids(pg_schema), count_is(0), within=30,
                    what="both children drained after their supervisor died",
                )  # fmt: skip
            finally:
                await reap(supervisor, pids)
        output = (tmp_path / "supervisor.log").read_text(errors="replace")
    assert output.count("the --processes supervisor went away: draining") == 2, output
    assert "does not serve" not in output, output  # --split: the other queues are served elsewhere


async def test_a_child_whose_supervisor_died_before_it_started_exits_cleanly(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    """The supervisor's pipe is at EOF from the child's first moment, so the child signals
    itself before its worker exists. The signal is taken from the command's start: start-up
    stops, exit 0, no worker row left (the default handler used to kill the process with -15,
    and one that came after the worker registered left its row behind)."""
    read_end, write_end = os.pipe()
    os.close(write_end)
    log_path = tmp_path / "child.log"
    try:
        with log_path.open("wb") as log_file:
            # fmt: off
            child = await trio.lowlevel.open_process(
                [
                    sys.executable, "-m", "trioq.cli", "worker", APP_PATH, "--queue", QUEUE,
                    "--poll-interval", str(POLL), "--database-url", pg_url,
                ],
                cwd=REPO_ROOT,
                env={**os.environ, SCHEMA_ENV: pg_schema, SUPERVISOR_FD_ENV: str(read_end)},
                pass_fds=(read_end,),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
            # fmt: on
            try:
                with trio.fail_after(30):
                    code = await child.wait()
            finally:
                if child.returncode is None:
                    child.kill()
                    await child.wait()
    finally:
        os.close(read_end)
    output = log_path.read_text(errors="replace")
    assert code == 0, output
    assert "the --processes supervisor went away: draining" in output, output
    async with producer(pg_url, pg_schema):
        assert await fetch(pg_url, *worker_pids(pg_schema)) == [], output
