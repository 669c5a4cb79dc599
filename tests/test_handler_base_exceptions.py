"""A handler cannot take the worker down: SystemExit, KeyboardInterrupt and GeneratorExit raised
by handler code are that job's failure, recorded with its error; the worker keeps running the
next jobs. (Only a signal stops a worker: the CLI turns SIGINT/SIGTERM into a drain.)"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import trio

import trioq
from tests.support import make_app, running_worker


class HandlerBaseError(BaseException):
    """A user-defined BaseException subclass raised by handler code."""


RAISED: dict[str, type[BaseException]] = {
    "exit": SystemExit,
    "interrupt": KeyboardInterrupt,
    "generator_exit": GeneratorExit,
    "custom": HandlerBaseError,
}


@pytest.mark.parametrize("kind", sorted(RAISED))
async def test_base_exception_in_a_handler_fails_the_job_and_the_worker_keeps_going(
    pg_url: str, pg_schema: str, kind: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("misbehave", max_attempts=1)
    async def misbehave(ctx: trioq.Context, payload: Any) -> None:
        if kind == "exit":
            sys.exit(3)
        raise RAISED[kind]("raised by handler code")

    @app.task("fine")
    async def fine(ctx: trioq.Context, payload: Any) -> str:
        return "ok"

    async with app.client(migrate=True) as client:
        bad = await client.enqueue("misbehave", {})
        with trio.fail_after(20):
            async with running_worker(app, concurrency=2) as worker:
                record = await client.wait_final(bad.id, timeout=None)
                good = await client.enqueue("fine", {})
                assert await client.wait_result(good.id, timeout=None) == "ok"
                assert not worker.statistics().draining
        attempts = await client.attempts(bad.id)
    assert record.state == "failed"
    assert RAISED[kind].__name__ in record.error["type"]
    assert [a.outcome for a in attempts] == ["failed"]


# The program restores Python's own SIGINT handler first: a process started from a shell's
# background job (`.ci/run &` without job control) inherits SIGINT ignored, Python then keeps
# it ignored, trio installs no handler, the raised signal is dropped and the handler spins
# until the timeout (seen once in a CI run, reproduced by running the program so).
CTRL_C_PROGRAM = """
import signal, trio, trioq
from trioq.testing import MemoryDriver

signal.signal(signal.SIGINT, signal.default_int_handler)

app = trioq.App(schema="ctrl_c")

@app.task("spin")
async def spin(ctx, payload):
    signal.raise_signal(signal.SIGINT)  # a real Ctrl-C, delivered by trio's handler
    while True:
        pass

async def main():
    async with app.client(driver=MemoryDriver()) as client:
        await client.enqueue("spin", {})
        await app.run_worker(["default"], 1)

trio.run(main)
"""


def test_a_real_ctrl_c_while_a_handler_runs_still_stops_an_embedded_worker() -> None:
    result = subprocess.run(
        [sys.executable, "-c", CTRL_C_PROGRAM], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "KeyboardInterrupt" in result.stderr and "_ki.py" in result.stderr, result.stderr
