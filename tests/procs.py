"""Worker subprocesses for the fault tests: spawn `trioq worker`, signal it, always reap it.

`worker_group()` owns every process it starts: when the block ends (normally or by a failing
assertion) each process still alive is sent SIGKILL (which also ends a SIGSTOPped process) and
reaped, and only those pids are ever signalled. The output of every worker goes to a log file;
on failure the logs are printed, so pytest shows them with the failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import attrs
import psycopg
import trio
from psycopg import sql

from tests.fault_app import QUEUE, SCHEMA_ENV

REPO_ROOT = Path(__file__).resolve().parent.parent
APP_PATH = "tests.fault_app:app"
BANNER = re.compile(r"^trioq worker ([0-9a-f-]{36}) ", re.MULTILINE)
POLL_SECONDS = 0.05


# --- reading the database from the outside ----------------------------------------------------


def _fetch_sync(pg_url: str, query: str, params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


async def fetch(
    pg_url: str, query: str | sql.Composable, params: Any = None
) -> list[tuple[Any, ...]]:
    """All rows of one query, from a separate short session."""
    return await trio.to_thread.run_sync(_fetch_sync, pg_url, query, params)


async def db_now(pg_url: str) -> Any:
    """The database clock (`clock_timestamp()`), to compare with `exec_log.db_ts`."""
    return (await fetch(pg_url, "SELECT clock_timestamp()"))[0][0]


async def wait_until(
    pg_url: str,
    query: str | sql.Composable,
    params: Any,
    done: Callable[[list[tuple[Any, ...]]], bool],
    *,
    within: float,
    what: str,
) -> list[tuple[Any, ...]]:
    """Poll `query` until `done(rows)`; fail after `within` seconds showing the last rows.
    A poll that finds the server away (a fault test restarting PostgreSQL under it) is retried
    at the next poll, like any other not-yet."""
    rows: list[tuple[Any, ...]] = []
    try:
        with trio.fail_after(within):
            while True:
                try:
                    rows = await fetch(pg_url, query, params)
                except psycopg.OperationalError:
                    rows = []
                else:
                    if done(rows):
                        return rows
                await trio.sleep(POLL_SECONDS)
    except trio.TooSlowError:
        raise AssertionError(
            f"timed out after {within}s waiting for {what}; last: {rows}"
        ) from None


# --- worker processes -------------------------------------------------------------------------


@attrs.define(eq=False)
class WorkerProc:
    name: str
    process: trio.Process
    log_path: Path
    _log_file: IO[bytes]
    worker_id: str | None = None
    processes: int | None = None  # `--processes N`: the process is the supervisor

    def worker_ids(self) -> list[str]:
        """The ids of the workers this process started (each child's, under a supervisor)."""
        return BANNER.findall(self.output())

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def exited(self) -> bool:
        return self.process.returncode is not None

    def child_pids(self) -> list[int]:
        """The pids of this process's children (a supervisor's workers), from /proc."""
        try:
            return [
                int(pid)
                for pid in Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
            ]
        except OSError:
            return []

    def signal(self, signum: int) -> None:
        if not self.exited:
            self.process.send_signal(signum)

    def output(self) -> str:
        self._log_file.flush()
        return self.log_path.read_text(errors="replace")

    async def wait_exit(self, within: float) -> int:
        """The exit code (negative: killed by that signal); fails after `within` seconds."""
        with trio.fail_after(within):
            return await self.process.wait()


@attrs.define(eq=False)
class WorkerGroup:
    pg_url: str
    schema: str
    log_dir: Path
    procs: list[WorkerProc] = attrs.field(factory=list)

    async def start(
        self,
        name: str,
        *,
        concurrency: int,
        lease: float,
        poll: float = 0.5,
        grace: float = 1.0,
        maintenance: float = 0.5,
        ready_within: float = 15.0,
        env: dict[str, str] | None = None,
        source: Path = REPO_ROOT,
        app_path: str = APP_PATH,
        queues: tuple[str, ...] = (QUEUE,),
        processes: int | None = None,
    ) -> WorkerProc:
        """Spawn a worker and return once it is registered and its claim loop runs (each of its
        children's, with `processes`). `source`: the checkout whose trioq and tests.fault_app it
        runs (an older release's, in the upgrade test)."""
        args = [
            sys.executable,
            "-m",
            "trioq.cli",
            "-v",
            "worker",
            app_path,
            *(arg for queue in queues for arg in ("--queue", queue)),
            *(("--processes", str(processes)) if processes else ()),
            "--concurrency",
            str(concurrency),
            "--poll-interval",
            str(poll),
            "--lease",
            str(lease),
            "--grace",
            str(grace),
            "--maintenance-interval",
            str(maintenance),
            "--database-url",
            self.pg_url,
        ]
        env = {
            **os.environ,
            "TRIOQ_DATABASE_URL": self.pg_url,
            SCHEMA_ENV: self.schema,
            "PYTHONUNBUFFERED": "1",
            # `-m` puts the working directory first on sys.path: `source`'s trioq wins over the
            # installed one.
            "PYTHONPATH": str(source),
            **(env or {}),
        }
        log_path = self.log_dir / f"worker-{name}.log"
        log_file = log_path.open("wb")
        try:
            process = await trio.lowlevel.open_process(
                args,
                cwd=source,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        except BaseException:
            log_file.close()
            raise
        proc = WorkerProc(name, process, log_path, log_file, processes=processes)
        self.procs.append(proc)
        await self._wait_ready(proc, ready_within)
        return proc

    async def _wait_ready(self, proc: WorkerProc, within: float) -> None:
        # The banner is printed once the worker has registered and started its claim loops.
        with trio.fail_after(within):
            while len(ids := proc.worker_ids()) < (proc.processes or 1):
                if proc.exited:
                    raise AssertionError(f"worker {proc.name} exited at start-up:\n{proc.output()}")
                await trio.sleep(POLL_SECONDS)
        proc.worker_id = ids[0]
        if proc.processes:
            return  # the children register under their own pids
        await wait_until(
            self.pg_url,
            sql.SQL("SELECT pid FROM {}.workers WHERE id = %s").format(sql.Identifier(self.schema)),
            (proc.worker_id,),
            lambda rows: rows == [(proc.pid,)],
            within=within,
            what=f"worker {proc.name} registration",
        )

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            for proc in self.procs:
                if not proc.exited:
                    for child in proc.child_pids() if proc.processes else ():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(child, signal.SIGKILL)  # by pid: a supervisor's workers
                    proc.process.kill()  # SIGKILL ends a SIGSTOPped process as well
            for proc in self.procs:
                with trio.move_on_after(10):
                    await proc.process.wait()
                proc._log_file.close()

    def dump_logs(self) -> None:
        for proc in self.procs:
            print(
                f"----- worker {proc.name} (pid {proc.pid}, exit {proc.process.returncode})"
                f" -----\n{proc.log_path.read_text(errors='replace')}"
            )


@asynccontextmanager
async def worker_group(pg_url: str, schema: str, log_dir: Path) -> AsyncIterator[WorkerGroup]:
    """Start workers with `group.start(...)`; all of them are killed and reaped at the end."""
    group = WorkerGroup(pg_url, schema, log_dir)
    try:
        yield group
    except BaseException:
        await group.aclose()
        group.dump_logs()
        raise
    else:
        await group.aclose()


__all__ = ["WorkerGroup", "WorkerProc", "db_now", "fetch", "wait_until", "worker_group"]
