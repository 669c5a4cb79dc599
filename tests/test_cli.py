"""The `trioq` command line: errors end in one line with their documented exit code
(subprocess tests), and the inspect / redrive commands (jobs, job, retry, cancel, purge, queue)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from typing import Any

import psycopg
import pytest
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import trioq
from tests import support
from tests.procs import WorkerProc, wait_until, worker_group
from tests.support import force_final, sql_rows
from tests.test_faults import count_is, producer, started_by
from trioq import cli
from trioq._memory import MemoryDriver
from trioq.cli import commands
from trioq.producer import SyncProducer, declare_task

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(
    *argv: str, url: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRIOQ_DATABASE_URL"}
    if url is not None:
        env["TRIOQ_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "trioq.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
        env=env,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("trioq: "), lines
    return lines[0]


# --- errors (subprocesses) -----------------------------------------------------------------


@pytest.mark.slow
def test_bad_database_urls_end_in_one_line_naming_the_fix_with_exit_3(pg_url: str) -> None:
    params = conninfo_to_dict(pg_url)
    cases = {
        "host=/tmp dbname": "the database URL is not valid",
        "postgresql://127.0.0.1:1/x": "cannot connect to PostgreSQL",
        make_conninfo(pg_url, dbname="no_such_db"): "database 'no_such_db' does not exist",
        make_conninfo(pg_url, user="no_such_role"): "role 'no_such_role' does not exist",
    }
    assert params.get("host")  # the session cluster: a unix socket
    for url, expected in cases.items():
        result = run("jobs", "--database-url", url)
        line = one_line(result)
        assert result.returncode == 3, (url, result.stderr)
        assert (expected in line and "fix" in line) or "create it" in line, line


@pytest.mark.slow
def test_missing_module_or_attribute_ends_in_one_line_with_exit_2() -> None:
    for path, expected in [
        ("no_such_module:app", "cannot import module 'no_such_module'"),
        ("workflows.demo:nope", "module 'workflows.demo' has no attribute 'nope'"),
        ("workflows.demo", "must look like module:attribute"),
    ]:
        result = run("worker", path, url="postgresql://127.0.0.1:1/x")
        assert result.returncode == 2, result.stderr
        assert expected in one_line(result)


@pytest.mark.slow
def test_traceback_only_with_verbose_accepted_after_the_subcommand() -> None:
    result = run("jobs", "--database-url", "host=/tmp dbname", "-v")
    assert result.returncode == 3
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("trioq: the database URL")
    quiet = run("jobs", "--log-level", "debug", "--database-url", "host=/tmp dbname")
    assert "Traceback" not in quiet.stderr


def test_busy_health_port_ends_in_one_line_with_exit_2(pg_url: str, pg_schema: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(
            "worker",
            "tests.fault_app:app",
            "--queue",
            "faults",
            "--migrate",
            "--health-port",
            str(port),
            url=make_conninfo(pg_url, options=f"-c search_path={pg_schema}"),
        )
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert f"--health-port {port}: address already in use on 127.0.0.1" in last
    assert "choose another --health-port" in last


def test_worker_that_cannot_reach_the_database_retries_and_says_so() -> None:
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trioq.cli",
            "worker",
            "workflows.demo:app",
            "--database-url",
            "postgresql://127.0.0.1:1/x",
            "--queue",
            "default",
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    ) as proc:
        try:
            assert proc.stderr is not None
            lines: list[str] = []
            while len([line for line in lines if "retrying in" in line]) < 2:
                line = proc.stderr.readline()
                assert line, "".join(lines)
                lines.append(line)
            assert proc.poll() is None  # still trying, not exited
        finally:
            proc.kill()
            proc.wait()
    retries = [line for line in lines if "retrying in" in line]
    assert "cannot connect to PostgreSQL" in retries[0] and "retrying in 0.5s" in retries[0]
    assert "retrying in 1s" in retries[1]  # backoff
    assert any("does not serve" in line for line in lines)  # tasks on other queues: warned


@pytest.mark.slow
def test_version_help_defaults_and_usage_errors() -> None:
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("trioq ")
    options = run("worker", "--help").stdout.split("options:", 1)[1]
    entries = re.findall(r"^  (-.*?)(?=^  -|\Z)", options, re.MULTILINE | re.DOTALL)
    for option in ("--concurrency", "--poll-interval", "--lease", "--grace", "--health-host"):
        [entry] = [e for e in entries if option in e.split()[0:3]]
        assert "(default:" in entry, entry
    usage = run("jobs", "--limit", "many")
    assert usage.returncode == 2 and "invalid int value" in usage.stderr
    assert run("purge", "--state", "failed", "--older-than", "soon").returncode == 2
    assert run("queue", "pause", url="postgresql://127.0.0.1:1/x").returncode == 2


async def test_worker_options_reach_the_workers_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`trioq worker` passes its options on to `App.run_worker` (here: --notifications; not
    given, the app decides: on, unless behind a pooler without a listen URL)."""
    seen: list[dict[str, Any]] = []

    async def run_worker(self: trioq.App, **config: Any) -> None:
        seen.append(config)

    app = trioq.App("postgresql://127.0.0.1:1/unused")

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    for extra, notifications in (
        ([], None),
        (["--notifications", "on"], True),
        (["--notifications", "off"], False),
    ):
        args = cli.build_parser().parse_args(["worker", "m:app", "--concurrency", "7", *extra])
        with monkeypatch.context() as patched, trio.CancelScope() as done:
            patched.setattr(trioq.App, "run_worker", run_worker)
            await commands._run_worker(app, args, done, task_status=trio.TASK_STATUS_IGNORED)
        assert seen[-1].get("notifications") is notifications and seen[-1]["concurrency"] == 7
        async with app.client(driver=MemoryDriver()):
            options = {} if notifications is None else {"notifications": notifications}
            worker = app.worker(["default"], 7, **options)
        assert worker.config.notifications is (notifications is not False)


# --- inspect and redrive (in-process: `cli.main`) -------------------------------------------


def trioq_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = cli.main([*argv])
    out = capsys.readouterr().out
    return code, json.loads(out) if "--json" in argv else out


# Declared, so the producer does not warn that no worker serves them (none runs here).
NO_WORKER_TASKS = (declare_task("mail"), declare_task("sync"))


@pytest.fixture
def migrated(pg_url: str, pg_schema: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    base = ["--database-url", pg_url, "--schema", pg_schema]
    assert cli.main(["migrate", *base]) == 0
    capsys.readouterr()
    return base


def test_jobs_job_retry_cancel_purge_and_queue_pause_from_the_command_line(
    pg_url: str, pg_schema: str, migrated: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with SyncProducer(pg_url, schema=pg_schema, tasks=NO_WORKER_TASKS) as producer:
        jobs = producer.enqueue_many("mail", [{"n": n} for n in range(3)], queue="q1")
        other = producer.enqueue("sync", {"n": 9}, queue="q2", partition_key="acct")
    with psycopg.connect(pg_url, autocommit=True) as conn:  # job 0 failed after one attempt
        conn.execute(
            f"UPDATE {pg_schema}.job_rows_legacy SET phase = 'failed', attempt = 1, "
            "max_attempts = 1, finished_at = now() - interval '8 days', "
            'error = \'{"message": "boom"}\', '
            f"lane = {pg_schema}.job_lane(now() - interval '8 days') WHERE id = %s",
            (jobs[0].id,),
        )
        conn.execute(
            f"INSERT INTO {pg_schema}.attempts (job_id, attempt, outcome, error_type, "
            "error_message, traceback, finished_at) VALUES (%s, 1, 'failed', 'Boom', 'boom', "
            "'Traceback: line 1', now())",
            (jobs[0].id,),
        )
        conn.execute(  # a workflow's history: one stored step
            f"INSERT INTO {pg_schema}.checkpoints (job_id, position, kind, name, value, "
            "created_at) VALUES (%s, 0, 'step', 'charge', '{\"cents\": 5}', now())",
            (jobs[0].id,),
        )

    code, listed = trioq_cli(capsys, "jobs", *migrated, "--json")
    assert code == 0 and [j["id"] for j in listed["jobs"]] == [
        other.id,
        *[j.id for j in jobs][::-1],
    ]
    code, page = trioq_cli(capsys, "jobs", *migrated, "--json", "--limit", "2")
    assert listed["jobs"][2]["id"] == page["next_before"] - 1 or page["next_before"] is not None
    code, rest = trioq_cli(
        capsys, "jobs", *migrated, "--json", "--before", str(page["next_before"])
    )
    assert [j["id"] for j in page["jobs"] + rest["jobs"]] == [j["id"] for j in listed["jobs"]]
    code, failed = trioq_cli(capsys, "jobs", *migrated, "--json", "--state", "failed")
    assert [j["id"] for j in failed["jobs"]] == [jobs[0].id]
    code, keyed = trioq_cli(capsys, "jobs", *migrated, "--json", "--partition-key", "acct")
    assert [j["id"] for j in keyed["jobs"]] == [other.id]
    code, table = trioq_cli(capsys, "jobs", *migrated, "--queue", "q1")
    assert code == 0 and "failed" in table and "boom" in table

    code, shown = trioq_cli(capsys, "job", *migrated, str(jobs[0].id), "--json")
    assert shown["job"]["state"] == "failed"
    assert shown["attempts"][0]["traceback"] == "Traceback: line 1"
    assert shown["history"] == [
        {"position": 0, "kind": "step", "name": "charge", "value": {"cents": 5}}
    ]
    code, text = trioq_cli(capsys, "job", *migrated, str(jobs[0].id))
    assert "Boom: boom" in text and "Traceback: line 1" in text
    assert "timeline (1 checkpoints)" in text and "charge" in text
    assert cli.main(["job", *migrated, "999999"]) == 1

    code, purged = trioq_cli(
        capsys, "purge", *migrated, "--state", "failed", "--older-than", "7d", "--json"
    )
    assert (code, purged) == (0, {"deleted": 1})
    code, cancelled = trioq_cli(capsys, "cancel", *migrated, str(jobs[1].id), "--json")
    assert cancelled == {"jobs": [{"id": jobs[1].id, "state": "cancelled"}]}
    code, retried = trioq_cli(
        capsys, "retry", *migrated, str(jobs[1].id), str(jobs[2].id), "--json"
    )
    assert code == 0  # the cancelled job is ready again, the ready one stays ready
    assert retried["jobs"] == [
        {"id": jobs[1].id, "state": "ready"},
        {"id": jobs[2].id, "state": "ready"},
    ]
    code, missing = trioq_cli(capsys, "retry", *migrated, "999999", "--json")
    assert (code, missing) == (1, {"jobs": [{"id": 999999, "state": "missing"}]})
    assert sql_rows(pg_url, f"SELECT state FROM {pg_schema}.jobs WHERE id = %s", (jobs[1].id,)) == [
        ("ready",)
    ]

    code, paused = trioq_cli(capsys, "queue", "pause", "q1", *migrated, "--json")
    assert paused == {
        "changed": True,
        "paused": [{"queue": "q1", "paused_at": paused["paused"][0]["paused_at"]}],
    }
    code, text = trioq_cli(capsys, "queue", "list", *migrated)
    assert text.startswith("q1: paused since")
    code, text = trioq_cli(capsys, "status", *migrated)
    assert "queue q1 is PAUSED since" in text
    code, resumed = trioq_cli(capsys, "queue", "resume", "q1", *migrated, "--json")
    assert resumed == {"changed": True, "paused": []}


def test_retry_failed_by_task_redrives_every_failed_job_of_it(
    pg_url: str, pg_schema: str, migrated: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with SyncProducer(pg_url, schema=pg_schema, tasks=NO_WORKER_TASKS) as producer:
        mail = producer.enqueue_many("mail", [{}, {}])
        other = producer.enqueue("sync", {})
    force_final(pg_url, pg_schema, [*(job.id for job in mail), other.id], "failed")
    code, out = trioq_cli(capsys, "retry", *migrated, "--failed", "--task", "mail", "--json")
    assert code == 0
    assert sorted(j["id"] for j in out["jobs"]) == sorted(j.id for j in mail)
    states = dict(sql_rows(pg_url, f"SELECT id, state FROM {pg_schema}.jobs"))
    assert states == {mail[0].id: "ready", mail[1].id: "ready", other.id: "failed"}
    assert cli.main(["retry", *migrated, "--failed", "1"]) == 2  # ids and --failed: usage


@pytest.mark.slow
async def test_second_signal_that_abandons_running_jobs_exits_4_and_a_clean_drain_0(
    pg_url: str, pg_schema: str, tmp_path: Any
) -> None:
    async with (
        producer(pg_url, pg_schema) as client,
        worker_group(pg_url, pg_schema, tmp_path) as group,
    ):
        forced = await group.start("forced", concurrency=2, lease=30, grace=30)
        await client.enqueue("work", {"seconds": 60.0})
        await wait_until(
            pg_url, *started_by(pg_schema, forced.pid), count_is(1), within=10, what="a start"
        )
        forced.signal(signal.SIGTERM)  # drain: the job may run for the 30 s grace ...
        with trio.fail_after(10):  # the worker's own output is the only signal of its drain
            await support.wait_until(condition=_says(forced, "draining"))
        forced.signal(signal.SIGTERM)  # ... but a second signal stops at once
        assert await forced.wait_exit(10) == 4, forced.output()
        assert "1 job(s) abandoned" in forced.output()
        clean = await group.start("clean", concurrency=2, lease=30, grace=1)
        clean.signal(signal.SIGTERM)
        assert await clean.wait_exit(10) == 0, clean.output()


def _says(proc: WorkerProc, text: str) -> Any:
    async def check() -> bool:
        await trio.lowlevel.checkpoint()
        return text in proc.output()

    return check


def test_the_dashboard_stops_with_0_on_sigterm(pg_url: str, pg_schema: str) -> None:
    migrated = run("migrate", "--schema", pg_schema, url=pg_url)
    assert migrated.returncode == 0, migrated.stderr
    argv = [sys.executable, "-m", "trioq.cli", "dashboard", "--database-url", pg_url,
            "--schema", pg_schema, "--port", "0"]  # fmt: skip
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert "trioq dashboard on" in line, line
            proc.terminate()
            _, stderr = proc.communicate(timeout=30)
        finally:
            proc.kill()
    assert (proc.returncode, stderr.strip()) == (0, "SIGTERM: stopping")


def test_migrate_prints_how_many_migrations_it_applied(pg_url: str, pg_schema: str) -> None:
    from trioq._sql import migrations

    every = migrations(pg_schema)
    first = run("migrate", "--schema", pg_schema, url=pg_url)
    assert first.stdout.strip() == (
        f"schema {pg_schema}: applied {len(every)} migration(s), now at version {every[-1].version}"
    ), first.stdout
    again = run("migrate", "--schema", pg_schema, url=pg_url)
    assert again.stdout.strip() == f"schema {pg_schema}: up to date, nothing applied"
