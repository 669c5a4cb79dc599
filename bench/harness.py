"""The harness's hands: the embedded cluster, roles and schemas, and the processes under test.

Each process under test connects as a role of its own (`bench_w<n>`, `bench_base<n>`), and the
harness as `bench_harness`, so pg_stat_statements (which keys statements by role) tells exactly
which statements a given worker process ran, without the harness's polling in the count.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs
import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench import contract_floor
from bench.app import SCHEMA_ENV, make_app
from trioq.embedded import EmbeddedPostgres, EmbeddedSettings

REPO_ROOT = Path(__file__).resolve().parent.parent
HARNESS_ROLE = "bench_harness"
POLL_SECONDS = 0.05  # how often the harness checks for completion (its own role: not counted)
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    """A scenario could not run (a process died, a wait timed out)."""


@attrs.define(eq=False)
class Database:
    """The embedded cluster of this run plus the harness's own session on it."""

    cluster: EmbeddedPostgres
    conn: psycopg.Connection[Any]
    _names: Iterator[int] = attrs.field(factory=lambda: itertools.count(1))
    # Called as the cluster stops, however the run ends: each Launcher's stop_all, so a run that
    # fails leaves no worker behind (one that did went on retrying its connection, and taking
    # CPU from the next run's measurement).
    closing: list[Callable[[], None]] = attrs.field(factory=list)

    @property
    def socket_dir(self) -> str:
        return conninfo_to_dict(self.cluster.conninfo)["host"]

    def conninfo(self, role: str) -> str:
        return make_conninfo(self.cluster.conninfo, user=role)

    def asyncpg_dsn(self, role: str) -> str:
        host = quote(self.socket_dir, safe="")
        return f"postgresql://{role}@/postgres?host={host}&port={self.cluster.port}"

    def new_role(self, prefix: str) -> str:
        role = f"{prefix}{next(self._names)}"
        self.conn.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
        return role

    def fetch(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()

    def scalar(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        return self.fetch(sql, params)[0][0]

    def fresh_schema(self, *, migrate: bool = True) -> str:
        """A new, migrated trioq schema (`bench_<n>`); with `migrate=False` only its name (a
        worker started with `migrate=True` creates it with its own tree's migrations)."""
        schema = f"bench_{next(self._names)}"
        if not migrate:
            return schema

        async def migrate() -> None:
            async with make_app(schema, self.conninfo(HARNESS_ROLE)).client(migrate=True):
                pass

        trio.run(migrate)
        return schema

    def install_raw(self, schema: str) -> None:
        """The raw baseline's own minimal table, in `schema`."""
        from bench import baseline

        self.conn.execute(baseline.INSTALL_SQL.format(schema=schema))

    def awa_dsn(self, role: str) -> str:
        """A URL awa's driver (sqlx) reads: a host name, with the socket directory as `host`."""
        host = quote(self.socket_dir, safe="")
        return f"postgresql://{role}@localhost:{self.cluster.port}/postgres?host={host}"

    def awa(self, command: str, *args: str) -> str:
        """Run `python -m bench.awa_peer COMMAND` as the harness role; its last output line."""
        argv = [sys.executable, "-m", "bench.awa_peer", command, "--dsn"]
        argv.append(self.awa_dsn(HARNESS_ROLE))
        result = subprocess.run(
            [*argv, *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise BenchError(f"bench.awa_peer {command} failed:\n{result.stderr[-3000:]}")
        lines = result.stdout.strip().splitlines()
        return lines[-1] if lines else ""

    def pgq(self, schema: str, command: str, *args: str) -> Any:
        """Run `python -m bench.pgq COMMAND` against `schema` (as the harness role); its JSON."""
        argv = [sys.executable, "-m", "bench.pgq", command, "--dsn", self.asyncpg_dsn(HARNESS_ROLE)]
        result = subprocess.run(
            [*argv, *args],
            cwd=REPO_ROOT,
            env={**os.environ, "PGQUEUER_SCHEMA": schema},
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise BenchError(f"bench.pgq {command} failed:\n{result.stderr[-3000:]}")
        lines = result.stdout.strip().splitlines()
        return json.loads(lines[-1]) if lines else None

    def drop_schema(self, schema: str) -> None:
        self.conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    def server_cpu_seconds(self) -> float:
        """User + system CPU of the whole cluster so far, less the harness's own session: the
        postmaster, each live child (backends, WAL writer, checkpointer, autovacuum workers)
        and the children that exited (the postmaster's cutime/cstime count them once reaped).
        pg_stat_statements' execution time leaves out parse, bind, commit (its WAL write) and
        the protocol; this is what the server's processes spent, read from /proc.

        The read is retried until the postmaster reaped nobody during it: a child reaped after
        the postmaster's totals were read and before the children were listed was counted in
        neither, and its whole CPU then landed in the next read. It did so at a drain's start
        (the enqueue's session of this checkout's trioq, exiting as the window opened): 5 of 8
        windows read 14-17 us a job above the sum of the cluster's processes (the session's
        20,000 inserts), the records' 1.34x main's server CPU included."""
        harness = self._harness_pid()
        postmaster = _stat_fields(harness)[1]
        while True:
            fields = _stat_fields(postmaster)
            total = sum(fields[11:15])
            for pid in _child_pids(postmaster):
                if pid != harness:
                    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                        total += sum(_stat_fields(pid)[11:13])
            if _stat_fields(postmaster)[13:15] == fields[13:15]:
                return total / CLOCK_TICKS

    def _harness_pid(self) -> int:
        return int(self.conn.info.backend_pid)

    def wait_harness_sessions_gone(self, timeout: float = 5.0) -> None:
        """Wait until the harness's other sessions (an enqueue's own client) have exited and
        been reaped, so their CPU lands in the postmaster's cutime before a measured window
        starts, not inside it (a reaped process leaves /proc; a zombie does not)."""
        harness = self._harness_pid()
        postmaster = _stat_fields(harness)[1]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # An exiting backend's process title is gone (empty cmdline) before the postmaster
            # reaps it: it is waited for too, or its CPU moves to the postmaster's totals
            # inside the window.
            others = [
                pid
                for pid in _child_pids(postmaster)
                if pid != harness
                and (HARNESS_ROLE.encode() in (title := _cmdline(pid)) or not title)
            ]
            if not others:
                return
            time.sleep(0.001)

    def reset_statements(self) -> None:
        self.conn.execute("SELECT pg_stat_statements_reset()")

    def statement_totals(self, roles: Sequence[str]) -> tuple[int, float]:
        """Top-level statements run by `roles` since the last reset (utility ones included),
        and their total execution time in ms (server side, planning excluded)."""
        calls, total_ms = self.fetch(
            "SELECT coalesce(sum(s.calls), 0), coalesce(sum(s.total_exec_time), 0)"
            " FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid"
            " WHERE r.rolname = ANY(%s)",
            [list(roles)],
        )[0]
        return int(calls), float(total_ms)

    def statement_calls(self, roles: Sequence[str]) -> int:
        return self.statement_totals(roles)[0]

    def top_statements(self, roles: Sequence[str], limit: int = 4) -> list[dict[str, Any]]:
        """The statements `roles` ran most often since the last reset, with their server time."""
        rows = self.fetch(
            "SELECT s.calls, s.mean_exec_time, s.total_exec_time, s.plans, s.mean_plan_time,"
            " left(regexp_replace(s.query, '\\s+', ' ', 'g'), 80)"
            " FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid"
            " WHERE r.rolname = ANY(%s) ORDER BY s.calls DESC LIMIT %s",
            [list(roles), limit],
        )
        return [
            {
                "calls": calls,
                "mean_exec_ms": round(mean_ms, 4),
                "total_exec_ms": round(total_ms, 1),
                "plans": plans,
                "mean_plan_ms": round(mean_plan_ms, 4),
                "query": query,
            }
            for calls, mean_ms, total_ms, plans, mean_plan_ms, query in rows
        ]

    def statement_breakdown(self, roles: Sequence[str]) -> dict[str, tuple[int, float]]:
        """Every statement `roles` ran since the last reset, by the first 90 characters of its
        text (whitespace squeezed, each fresh schema's name read as `{schema}`, so one
        statement keys alike in every repeat): (calls, total execution ms)."""
        rows = self.fetch(
            "SELECT left(regexp_replace(regexp_replace(s.query, '\\s+', ' ', 'g'),"
            " '\"bench_[0-9]+\"', '{schema}', 'g'), 90), sum(s.calls),"
            " sum(s.total_exec_time)"
            " FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid"
            " WHERE r.rolname = ANY(%s) GROUP BY 1",
            [list(roles)],
        )
        return {query: (int(calls), float(ms)) for query, calls, ms in rows}

    def wait_count(
        self,
        sql: str,
        params: Sequence[Any],
        expected: int,
        timeout: float,
        process_alive: Callable[[], None] = lambda: None,
        *,
        paced: bool = False,
    ) -> None:
        """Poll `sql` (a count) until it reaches `expected`; raise after `timeout` seconds.

        `paced`: for a drain timed by its rows (the last finished_at), not by this wait. After
        the first polls it sleeps half the time the count's rate says is left (at least
        POLL_SECONDS), so a drain is polled a dozen times, not once per POLL_SECONDS: the count
        is the harness's own CPU, not in the server's figure, but it competes with the drain for
        the 2 cores, and through the write-once layout's `jobs` view a count of 40,000 jobs
        polled every 50 ms cost 34-45 us a job (9-11 on a table)."""
        deadline = time.monotonic() + timeout
        first: tuple[float, int] | None = None
        while (count := self.scalar(sql, params)) < expected:
            process_alive()
            now = time.monotonic()
            if now > deadline:
                raise BenchError(f"timed out after {timeout:.0f}s: {count}/{expected} ({sql})")
            pause = POLL_SECONDS
            if paced:
                if first is None:
                    first = (now, count)
                elif count > first[1]:
                    rate = (count - first[1]) / (now - first[0])
                    pause = min(max(POLL_SECONDS, (expected - count) / rate / 2), 2.0)
            time.sleep(pause)


def _stat_fields(pid: int) -> list[int]:
    """/proc/PID/stat's numeric fields after the command name: [0] state (as 0), [1] ppid,
    [11] utime, [12] stime, [13] cutime, [14] cstime (clock ticks)."""
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return [0, *(int(field) for field in rest[1:15])]


def _cmdline(pid: int) -> bytes:
    """A backend's process title (`postgres: ROLE DATABASE ...`); empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def _child_pids(parent: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError, IndexError):
                if _stat_fields(int(entry.name))[1] == parent:
                    children.append(int(entry.name))
    return children


@contextlib.contextmanager
def open_database(max_connections: int = 100, *, durable: bool = True) -> Iterator[Database]:
    """Start the embedded cluster (pg_stat_statements loaded) and the harness role.

    `durable` (the default) runs it with PostgreSQL's production durability: fsync,
    synchronous_commit and full_page_writes on, so every COMMIT waits for its WAL flush, as it
    does on a real server. The embedded cluster of `trioq demo` and the tests keeps them off.
    """
    durability = {
        "fsync": durable,
        "synchronous_commit": durable,
        "full_page_writes": durable,
    }
    settings = EmbeddedSettings(
        max_connections=max_connections,
        shared_preload_libraries=("pg_stat_statements",),
        # track_planning: planning time is reported next to execution time (a statement that is
        # re-planned at every call shows it there, and only there).
        server_settings={
            **durability,
            "pg_stat_statements.track_utility": True,
            "pg_stat_statements.track_planning": True,
        },
    )
    with EmbeddedPostgres(settings=settings) as cluster:
        with psycopg.connect(cluster.conninfo, autocommit=True) as admin:
            admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            admin.execute(f"CREATE ROLE {HARNESS_ROLE} LOGIN SUPERUSER")
        harness = make_conninfo(cluster.conninfo, user=HARNESS_ROLE)
        with psycopg.connect(harness, autocommit=True) as conn:
            # The harness's reads (a drain's completion count above all) must not start
            # parallel workers: they are processes of the cluster apart from this session, so
            # their CPU counted as the server's. Through the write-once `jobs` view the count's
            # workers were 11.5-15 us a job of a drain's "server CPU" (0.5 without them).
            conn.execute("SET max_parallel_workers_per_gather = 0")
            db = Database(cluster, conn)
            try:
                yield db
            finally:
                for close in db.closing:
                    close()


# --- processes under test ---------------------------------------------------------------------


@attrs.define(eq=False)
class Process:
    """A worker (trioq or baseline) running as a child; its CPU and memory read from /proc."""

    name: str
    role: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def cpu_seconds(self) -> float:
        """User + system CPU of every thread of the process so far."""
        fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def peak_rss_mb(self) -> float:
        """VmHWM: the peak resident set size since the process started."""
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise BenchError(f"{self.name}: no VmHWM in /proc")

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise BenchError(f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}")

    def wait_for_line(self, prefix: bytes, timeout: float = READY_TIMEOUT) -> None:
        """Block until the process prints a line starting with `prefix` on stdout."""
        assert self.popen.stdout is not None
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self.popen.stdout], [], [], remaining)
            if not readable:
                break
            line = self.popen.stdout.readline()
            if not line:
                self.check_alive()
                time.sleep(0.01)
                continue
            if line.startswith(prefix):
                return
        self.check_alive()
        raise BenchError(f"{self.name}: no {prefix!r} line within {timeout:.0f}s")

    def stop(self) -> None:
        """SIGTERM (a trioq worker drains), then wait; SIGKILL only if it will not exit."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise BenchError(f"{self.name} did not stop within {STOP_TIMEOUT:.0f}s") from None
        finally:
            if self.popen.stdout is not None:  # its `ready` line's pipe: nothing reads it now
                self.popen.stdout.close()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@attrs.define(eq=False)
class Launcher:
    """Spawns the processes under test with their own roles and logs; stops them all at the end."""

    db: Database
    log_dir: Path
    started: list[Process] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        self.db.closing.append(self.stop_all)

    def trioq_worker(
        self,
        schema: str,
        *,
        concurrency: int,
        queues: Sequence[str] = ("default",),
        poll_interval: float = 1.0,
        profile: Path | None = None,
        tree: Path | None = None,
        migrate: bool = False,
        prefetch: int | None = None,
        health_port: int | None = None,
    ) -> Process:
        """A `trioq worker` process; with `profile`, under cProfile writing there at exit. With
        `tree`, the worker of another checkout (its `.venv` and its code, bench.app included);
        with `migrate`, it migrates the schema first; `prefetch` None: the worker's default;
        `health_port`: serve /metrics there."""
        role = self.db.new_role("bench_w")
        profiler = [] if profile is None else ["-m", "cProfile", "-o", str(profile)]
        python = sys.executable if tree is None else str(tree / ".venv" / "bin" / "python")
        argv = [
            python,
            *profiler,
            "-m",
            "trioq.cli",
            "worker",
            "bench.app:app",
            "--concurrency",
            str(concurrency),
            "--poll-interval",
            str(poll_interval),
            "--grace",
            "10",
        ]
        for queue in queues:
            argv += ["--queue", queue]
        if migrate:
            argv.append("--migrate")
        if prefetch is not None:
            argv += ["--prefetch", str(prefetch)]
        if health_port is not None:
            argv += ["--health-port", str(health_port)]
        env = {"TRIOQ_DATABASE_URL": self.db.conninfo(role), SCHEMA_ENV: schema}
        process = self._spawn(f"trioq worker {role}", role, argv, env, cwd=tree)
        process.wait_for_line(b"trioq worker ")
        return process

    def baseline_worker(
        self,
        schema: str,
        *,
        expect: int,
        batch: int = 25,
        listen: bool = False,
        delete: bool = False,
        async_claim: bool = False,
    ) -> Process:
        role = self.db.new_role("bench_base")
        self.db.install_raw(schema)
        argv = [
            sys.executable,
            "-m",
            "bench.baseline",
            "--dsn",
            self.db.asyncpg_dsn(role),
            "--schema",
            schema,
            "--batch",
            str(batch),
            "--expect",
            str(expect),
        ]
        if listen:
            argv.append("--listen")
        if delete:
            argv.append("--delete")
        if async_claim:
            argv.append("--async-claim")
        process = self._spawn(f"baseline {role}", role, argv, {})
        process.wait_for_line(b"ready")
        return process

    def trio_floor_worker(
        self,
        schema: str,
        *,
        expect: int,
        batch: int = 25,
        scope: bool = True,
        contract: str | None = None,
        delete: bool = False,
        variant: Path | None = None,
    ) -> Process:
        """The raw loop's algorithm on trio and trioq's statement path (bench/trio_floor.py),
        on the raw loop's own table, or with `contract` ("keep" or "delete") on the tables and
        statements of the contract's floor (bench/contract_floor.py); `delete` with the raw
        loop's completion that deletes the row."""
        role = self.db.new_role("bench_floor")
        if contract is None:
            self.db.install_raw(schema)
        elif contract != "trioq":  # "trioq": trioq's statements on the migrated schema
            contract_floor.install(self.db.conn, schema)
        argv = [sys.executable, "-m", "bench.trio_floor", "--dsn", self.db.conninfo(role)]
        argv += ["--schema", schema, "--batch", str(batch), "--expect", str(expect)]
        argv.append("--scope" if scope else "--no-scope")
        if contract is not None:
            argv += ["--contract", contract]
        if delete:
            argv.append("--delete")
        if variant is not None:
            argv += ["--variant", str(variant)]
        process = self._spawn(f"trio floor {role}", role, argv, {})
        process.wait_for_line(b"ready")
        return process

    def pgq_worker(self, schema: str, *, batch: int = 25, record: Path | None = None) -> Process:
        """A PgQueuer worker (its schema objects installed into `schema` first)."""
        self.db.pgq(schema, "install")
        role = self.db.new_role("bench_pgq")
        argv = [
            sys.executable,
            "-m",
            "bench.pgq",
            "worker",
            "--dsn",
            self.db.asyncpg_dsn(role),
            "--batch",
            str(batch),
        ]
        if record is not None:
            argv += ["--record", str(record)]
        process = self._spawn(f"pgqueuer {role}", role, argv, {"PGQUEUER_SCHEMA": schema})
        process.wait_for_line(b"ready")
        return process

    def awa_worker(self, schema: str, *, concurrency: int = 25) -> Process:
        """An awa worker on a fresh `awa` schema (awa's own; `schema` is the drain's, unused)."""
        self.db.awa("reset")
        role = self.db.new_role("bench_awa")
        argv = [sys.executable, "-m", "bench.awa_peer", "worker", "--dsn", self.db.awa_dsn(role)]
        argv += ["--concurrency", str(concurrency)]
        process = self._spawn(f"awa {role}", role, argv, {})
        process.wait_for_line(b"ready")
        return process

    def _spawn(
        self,
        name: str,
        role: str,
        argv: list[str],
        env: dict[str, str],
        cwd: Path | None = None,
    ) -> Process:
        log_path = self.log_dir / f"{role}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                argv,
                cwd=REPO_ROOT if cwd is None else cwd,
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        process = Process(name, role, popen, log_path)
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        """Stop every process still running (after a failure; scenarios stop their own)."""
        for process in self.started:
            if process.popen.poll() is None:
                with contextlib.suppress(BenchError):
                    process.stop()
        self.started.clear()
