"""A live dashboard for the browser tests: a database schema, a worker and two dashboards (admin
and read-only) running in one trio loop on a background thread, so synchronous playwright code
in the test can drive a browser against them and call into the loop (`Harness.call`)."""

from __future__ import annotations

import collections
import datetime
import functools
import secrets
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import trio

import trioq
from trioq._pg.admin import drop_schema
from trioq.dashboard.app import DashboardConfig, serve_dashboard
from trioq.dashboard.store import Store

START_TIMEOUT = 60.0

app = trioq.App(schema="unset")
harness: Harness | None = None  # the running one (its handlers reach its gate through it)


@app.task("echo")
async def echo(ctx: trioq.Context, payload: Any) -> Any:
    return payload


@app.task("gated", queue="live")
async def gated(ctx: trioq.Context, payload: Any) -> str:
    assert harness is not None
    await harness.gate.wait()
    return "released"


@app.task("flaky", max_attempts=1)
async def flaky(ctx: trioq.Context, payload: Any) -> str:
    if ctx.job.attempt == 1:
        raise RuntimeError(payload.get("message", "the first attempt fails"))
    return "second attempt"


@app.task("approval")
async def approval(ctx: trioq.Context, payload: dict[str, Any]) -> dict[str, Any]:
    asked = await ctx.step("ask approver", lambda: {"asked": payload["key"]})
    await ctx.sleep("cool-off", datetime.timedelta(milliseconds=50))
    decision = await ctx.wait_for_event(payload["key"], timeout=datetime.timedelta(minutes=5))
    done = await ctx.step("record decision", lambda: {"approved": decision})
    return {**asked, **done}


class Harness:
    """Start with `start()`; `call(fn, *args)` runs an async function in the loop."""

    def __init__(self, database_url: str, refresh_seconds: float = 0.25) -> None:
        self.database_url = database_url
        self.schema = f"t_dash_{secrets.token_hex(6)}"
        self.refresh_seconds = refresh_seconds
        self.admin_url = ""
        self.read_only_url = ""
        self.client: trioq.Client | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, daemon=True)
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self.gate: trio.Event
        self.executions: collections.Counter[int] = collections.Counter()  # ended, by job id
        self._execution_ended: trio.Event

    def start(self) -> Harness:
        global harness
        harness = self
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            raise TimeoutError("the dashboard harness did not start")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._token is not None and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(START_TIMEOUT)
        drop_schema(self.database_url, self.schema)
        if self._error is not None:
            raise self._error

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        return trio.from_thread.run(functools.partial(fn, *args, **kwargs), trio_token=self._token)

    def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    async def wait_executions(self, job_id: int, count: int) -> None:
        """Until `count` executions of the job have ended (returned, failed or suspended)."""
        with trio.fail_after(20):
            while self.executions[job_id] < count:
                await self._execution_ended.wait()

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    def _on_job_end(self, job: Any, outcome: str) -> None:
        self.executions[job.id] += 1
        self._execution_ended.set()
        self._execution_ended = trio.Event()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        self.gate = trio.Event()
        self._execution_ended = trio.Event()
        live = app.with_database(self.database_url, self.schema)
        async with live.client(migrate=True) as client, trio.open_nursery() as nursery:
            self.client = client
            await client.schedule("nightly-digest", "echo", cron="0 3 * * *", timezone="UTC")
            hooks = trioq.WorkerHooks(on_job_end=self._on_job_end)
            await nursery.start(
                functools.partial(
                    live.run_worker,
                    ["default", "live"],
                    5,
                    hooks=hooks,
                    poll_interval=0.2,
                    grace_seconds=0,
                )
            )
            store = Store(client)
            for admin in (True, False):
                # The admin pages refresh slowly: a test clicks their buttons, which a refresh
                # would replace under the pointer. The read-only overview shows counts change.
                refresh = 60.0 if admin else self.refresh_seconds
                config = DashboardConfig(port=0, admin=admin, refresh_seconds=refresh)
                port = await nursery.start(serve_dashboard, config, store)
                url = f"http://127.0.0.1:{port}"
                if admin:
                    self.admin_url = url
                else:
                    self.read_only_url = url
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()
