"""The worker's health server: GET /livez, /readyz and /metrics, on 127.0.0.1 by default.

A small ASGI callable served by hypercorn's trio worker inside the caller's nursery (hypercorn
owns the HTTP: parsing, keep-alive, timeouts, and a client that resets its connection or times
out mid-response stays inside hypercorn's connection task, never reaching the worker).

The server reports on a `HealthTarget`: `trioq worker` serves it from process start, while it
still waits for the database, and sets the worker in once it runs. /livez is 200 from then on,
also during a database outage (restarting the worker would not bring the database back); it
fails (503) only when the trio loop itself made no progress for longer than a bound: a task
stamps a heartbeat every second, and a stamp that came that much late (a blocking call in an
async handler, say) is reported to every /livez for as long again after the loop resumes,
whoever polls (a second poller cannot take the 503 the kubelet should see). While the loop is
blocked nothing answers at all, and the probe's own timeout fails it. /readyz is 503 with a
JSON body naming each failing check: starting (no worker yet), admission (draining, or no slot
admitted), database, listener, lease renewal. /metrics is prometheus-client's exposition of the
worker's own registry (before the worker runs, the process and platform collectors alone); on
the leader it includes `queue_demand()`, read at most every 15 s by one scrape at a time, on a
connection of its own (the port may be reachable by anyone: a scrape must not cost a scan of
the jobs on the pool the claims use). Nothing mutates.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, cast

import attrs
import trio
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from .worker import Worker

if TYPE_CHECKING:  # hypercorn is imported only when a server starts (`--health-port`)
    from hypercorn.config import Config

log = logging.getLogger("trioq.health")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# /metrics asks the database for queue demand; a slow database must not hang the scrape.
DEMAND_TIMEOUT_SECONDS = 2.0
# /livez fails once the trio loop went this long without progress: well past anything a
# healthy loop shows (admission control already reacts to 0.1 s of lag), and short of a 30 s
# lease, whose renewals the same loop sends.
LIVENESS_STALL_SECONDS = 20.0
HEARTBEAT_SECONDS = 1.0


@attrs.define(eq=False)
class LoopHeartbeat:
    """The trio loop's progress: `run` stamps the time every `interval`; `stall_seconds` says
    how late the stamp overdue now is, or the last stall past `bound` while it is recent.

    A stall past the bound stays reported for `hold` seconds (the bound's length by default)
    after the loop resumed, to every reader: reading changes nothing, so a second poller (a
    person's curl, a monitoring system) never takes the 503 the kubelet should see. With the
    shipped probe (every 10 s, 3 failures) the timeouts during a stall past 20 s and the 503s
    after it are enough failures in a row to restart the pod.

    Measured in real time (time.monotonic), since a blocked loop stops trio's clock's sleepers
    but not the wall clock. Stamped by a trio task rather than read from a thread: the loop is
    the thing under test, and the HTTP answer comes from the same loop anyway."""

    interval: float = HEARTBEAT_SECONDS
    bound: float = LIVENESS_STALL_SECONDS
    hold: float = attrs.field()
    _last: float = attrs.field(factory=time.monotonic)
    # The last stall past the bound (its lateness) and when the loop resumed from it.
    _stall: float = 0.0
    _resumed_at: float = -math.inf

    @hold.default
    def _hold_default(self) -> float:
        return self.bound

    async def run(self) -> None:
        while True:
            await trio.sleep(self.interval)
            now = time.monotonic()
            late = now - self._last - self.interval
            if late > self.bound:
                log.warning("the trio loop made no progress for %.1fs (a blocking call?)", late)
                self._stall, self._resumed_at = late, now
            self._last = now

    def stall_seconds(self) -> float:
        """The lateness of the stamp overdue now, or the last stall past the bound if the
        loop resumed from it less than `hold` seconds ago (whichever is longer). A read only:
        every caller within the hold sees the same stall."""
        now = time.monotonic()
        overdue = now - self._last - self.interval
        recent = self._stall if now - self._resumed_at < self.hold else 0.0
        return max(overdue, recent, 0.0)


def _process_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


@attrs.define(eq=False)
class HealthTarget:
    """What the health server reports on: `worker` once it runs (None while the command still
    waits for the database or starts), and the loop's heartbeat."""

    worker: Worker | None = None
    heartbeat: LoopHeartbeat = attrs.field(factory=LoopHeartbeat)
    # /metrics before the worker runs: the process and platform collectors alone (the worker's
    # registry has its own).
    starting_registry: CollectorRegistry = attrs.field(factory=_process_registry)


def liveness(target: HealthTarget) -> tuple[bool, str]:
    stall = target.heartbeat.stall_seconds()
    if stall > target.heartbeat.bound:
        return False, f"the trio loop made no progress for {stall:.1f}s (a blocking call?)\n"
    return True, "ok\n"


def _starting() -> tuple[bool, dict[str, object]]:
    checks = {"starting": "waiting for the database or starting the worker"}
    return False, {"ready": False, "failing": ["starting"], "checks": checks}


def readiness_checks(worker: Worker) -> dict[str, str]:
    """Each readiness check and its state: "ok" or what is wrong."""
    stats = worker.statistics()
    late = stats.seconds_since_lease_renewal > worker.config.renew_interval * 2 + 1
    admitted = any(worker.effective_limit(loop.queue) > 0 for loop in stats.loops)
    return {
        "admission": "draining" if stats.draining else ("ok" if admitted else "no slots admitted"),
        "database": "ok" if stats.database_healthy else "unreachable",
        "listener": stats.listener_state,
        "lease_renewal": "late" if late else "ok",
    }


def readiness(worker: Worker) -> tuple[bool, dict[str, object]]:
    checks = readiness_checks(worker)
    # Polling is a working (slower) pickup path: a note, not a failure.
    failing = sorted(
        name for name, state in checks.items() if state not in ("ok", "polling", "off")
    )
    stats = worker.statistics()
    body: dict[str, object] = {
        "ready": not failing,
        "failing": failing,
        "checks": checks,
        "draining": stats.draining,
        "leader": stats.leader,
        "seconds_since_lease_renewal": round(stats.seconds_since_lease_renewal, 3),
    }
    return not failing, body


async def render_metrics(worker: Worker) -> bytes:
    metrics = worker.metrics
    stats = worker.statistics()
    for loop in stats.loops:
        owned = loop.running + loop.pending_writes
        metrics.open_slots.labels(loop.queue).set(max(0, loop.concurrency - owned))
        metrics.queue_concurrency.labels(loop.queue).set(loop.concurrency)
        metrics.effective_limit.labels(loop.queue).set(worker.effective_limit(loop.queue))
    metrics.set_listener(stats.listener_connected, stats.listener_state)
    metrics.leader.set(1 if stats.leader else 0)
    if stats.leader:
        await _read_demand(worker)
    else:
        metrics.clear_demand()
    return generate_latest(metrics.registry)


async def _read_demand(worker: Worker) -> None:
    """The leader's database-wide gauges, read at most once per `DEMAND_CACHE_SECONDS` and by
    one scrape at a time (the others export the last values, or wait for the read in flight),
    on the driver's scan connection, not the main pool; a failed or slow read leaves the last
    values."""
    reads = worker.metrics.demand_reads
    if not reads.read_due():
        with trio.move_on_after(DEMAND_TIMEOUT_SECONDS):
            await reads.wait_read()
        return
    with reads.reading(), trio.move_on_after(DEMAND_TIMEOUT_SECONDS):
        try:
            demand = await worker.driver.queue_demand()
        except Exception as exc:  # the scrape still answers; the gauges keep their last values
            log.warning("queue demand unavailable for /metrics: %s", exc)
            return
        worker.metrics.set_demand(worker.config.queues, demand)


def health_app(target: HealthTarget) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The ASGI application (three read-only routes; no framework needed for that)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        status, body, kind = await _route(scope["method"], scope["path"], target)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", kind.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


async def _route(method: str, path: str, target: HealthTarget) -> tuple[int, bytes, str]:
    if method not in ("GET", "HEAD"):
        return 405, b"GET only\n", "text/plain"
    worker = target.worker
    if path == "/livez":
        alive, text = liveness(target)
        return (200 if alive else 503), text.encode(), "text/plain"
    if path == "/readyz":
        ready, body = _starting() if worker is None else readiness(worker)
        return (200 if ready else 503), json.dumps(body).encode() + b"\n", "application/json"
    if path == "/metrics":
        if worker is None:
            return 200, generate_latest(target.starting_registry), CONTENT_TYPE_LATEST
        return 200, await render_metrics(worker), CONTENT_TYPE_LATEST
    return 404, b"not found\n", "text/plain"


def _config(host: str, port: int) -> Config:
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = log
    config.graceful_timeout = 1.0
    config.keep_alive_timeout = 5.0
    return config


async def serve_health(
    target: HealthTarget | Worker,
    port: int,
    host: str = "127.0.0.1",
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; reports the bound port (0 picks a free one) through task_status.
    A Worker given directly is reported on as running from the start."""
    from hypercorn.trio import serve

    if isinstance(target, Worker):
        target = HealthTarget(target)
    # hypercorn types ASGI scopes and events as TypedDicts; this app reads them as mappings.
    app = cast(Any, health_app(target))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(target.heartbeat.run, name="trioq health heartbeat")
        binds: list[str] = await nursery.start(functools.partial(serve, app, _config(host, port)))
        task_status.started(int(binds[0].rsplit(":", 1)[1]))
