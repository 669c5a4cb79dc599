"""Job failure lines (logger `trioq.jobs`) carry the attempt's identity; JSON format."""

from __future__ import annotations

import contextlib
import json
import logging

import pytest
import trio

import trioq
from tests.support import make_app, running_worker
from trioq._runtime.logs import JOB_LOGGER, JsonFormatter


async def test_failure_lines_carry_job_attempt_task_queue_worker_and_error_type(
    pg_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("flaky", queue="mail", max_attempts=2, retry=trioq.RetryPolicy(base_seconds=0.01))
    async def flaky(ctx: trioq.Context, payload: object) -> None:
        raise KeyError("missing")

    caplog.set_level(logging.INFO, logger=JOB_LOGGER)
    async with app.client(migrate=True) as client, running_worker(app, ["mail"]) as worker:
        job = await client.enqueue("flaky", {})
        with trio.fail_after(10), contextlib.suppress(trioq.JobFailed):
            await client.wait_result(job.id)
    records = [r for r in caplog.records if r.name == JOB_LOGGER]
    assert [(r.levelname, r.attempt, r.outcome) for r in records] == [  # type: ignore[attr-defined]
        ("INFO", 1, "retried"),
        ("WARNING", 2, "failed"),
    ]
    line = json.loads(JsonFormatter().format(records[-1]))
    assert {k: line[k] for k in ("job_id", "attempt", "task", "queue", "worker_id")} == {
        "job_id": job.id,
        "attempt": 2,
        "task": "flaky",
        "queue": "mail",
        "worker_id": str(worker.worker_id),
    }
    assert line["error_type"] == "builtins.KeyError" and "trace_id" in line
    assert line["logger"] == "trioq.jobs" and line["level"] == "warning"
    assert f"attempts row job_id={job.id} attempt=2" in line["message"]
    # Worker-loop warnings are another logger: none of these lines is on it.
    assert not any(r.name == "trioq.worker" and "failed" in r.getMessage() for r in records)


NOISY_COMMAND = """
import logging, sys
from trioq.cli import commands

async def noisy(args):
    logging.getLogger("trioq.worker").warning(
        "listener down: connection failed: Connection refused\\n\\tIs the server running?"
    )
    return 0

commands.COMMANDS["migrate"] = noisy
sys.exit(commands.main(["migrate"]))
"""


def test_the_cli_logs_one_line_per_record() -> None:
    """psycopg's messages carry `\\n\\t` hints: in the text log they stay on the record's line."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", NOISY_COMMAND], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    [line] = result.stderr.splitlines()
    assert line.endswith(
        "listener down: connection failed: Connection refused Is the server running?"
    )
