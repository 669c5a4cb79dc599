"""Job failure lines (logger `trioq.jobs`) carry the attempt's identity; JSON format."""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import re
from typing import Any

import pytest
import trio
import trio.testing

import trioq
from tests.support import make_app, running_worker
from trioq._memory import MemoryDriver
from trioq._runtime.services.logs import JOB_LOGGER, JsonFormatter


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


# --- a database outage: one summary, not a line per failed round -----------------------------


class _Outage(MemoryDriver):
    """The in-memory driver whose every statement fails as a lost connection while `down` is
    set, as every statement does while PostgreSQL is away."""

    down = False

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if name.startswith("_") or not inspect.iscoroutinefunction(value):
            return value

        async def call(*args: Any, **kwargs: Any) -> Any:
            if object.__getattribute__(self, "down"):
                await trio.lowlevel.checkpoint()
                raise ConnectionError("injected: connection refused\n\tIs the server running?")
            return await value(*args, **kwargs)

        return call


class _Recovered(logging.Handler):
    """Sets its event when the worker logs that the database is back."""

    def __init__(self) -> None:
        super().__init__()
        self.event = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("database reachable again"):
            self.event.set()


async def test_a_database_outage_logs_one_line_when_it_starts_and_one_when_it_ends(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A 17 s outage logged about 50 WARNING records (a line per failed round of each queue's
    claim loop, lease renewal, leader election, maintenance): now two, and a reminder a minute
    while it lasts."""
    app = trioq.App(schema="virtual")
    for queue in ("a", "b", "c"):
        app.task(f"work_{queue}", queue=queue)(_noop)
    driver = _Outage()
    caplog.set_level(logging.WARNING, logger="trioq")

    def outage_lines() -> list[str]:  # the admission service's limit changes aside
        lines = [r.getMessage() for r in caplog.records]
        return [line for line in lines if not line.startswith("admission: ")]

    async def outage(seconds: float) -> list[str]:
        caplog.clear()
        driver.down = True
        await trio.sleep(seconds)
        recovered = _Recovered()
        logging.getLogger("trioq.worker").addHandler(recovered)
        try:
            driver.down = False
            with trio.fail_after(120):  # virtual: until the worker's next call succeeds
                await recovered.event.wait()
        finally:
            logging.getLogger("trioq.worker").removeHandler(recovered)
        return outage_lines()

    async with app.client(driver=driver), trio.open_nursery() as nursery:
        worker = app.worker(["a", "b", "c"], 4, poll_interval=0.2, grace_seconds=0)
        await nursery.start(worker.run)
        await trio.sleep(3)
        short = await outage(17)
        long = await outage(150)
        worker.request_drain()
    started, ended = short
    assert started.startswith("database unreachable since ")
    assert "injected: connection refused Is the server running?" in started  # one line
    assert re.fullmatch(
        r"database reachable again: calls failed for 1[67]\.\d s from \S+, \d+ call\(s\) in all",
        ended,
    ), ended
    assert [line.split(" since ")[0].split(":")[0] for line in long] == [
        "database unreachable",
        "database still unreachable",
        "database still unreachable",
        "database reachable again",
    ]


async def _noop(ctx: trioq.Context, payload: object) -> None:
    return None
