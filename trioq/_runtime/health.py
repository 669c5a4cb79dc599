"""The worker's health server: GET /livez, /readyz and /metrics, on 127.0.0.1 by default.

A small ASGI callable served by hypercorn's trio worker inside the caller's nursery (hypercorn
owns the HTTP: parsing, keep-alive, timeouts, and a client that resets its connection or times
out mid-response stays inside hypercorn's connection task, never reaching the worker).

The server reports on a `HealthTarget`: `trioq worker` serves it from process start, while it
still waits for the database, and sets the worker in once it runs. /livez is 200 from then on,
also during a database outage (restarting the worker would not bring the database back); it
fails (503) only when the trio loop itself made no progress for longer than a bound: a task
stamps a heartbeat every second, and a stamp that came that much late (a blocking call in an
async handler, say) is reported to the next /livez. While the loop is blocked nothing answers
at all, and the probe's own timeout fails it. /readyz is 503 with a JSON body naming each
failing check: starting (no worker yet), admission (draining, or no slot admitted), database,
listener, lease renewal. /metrics is prometheus-client's exposition of the worker's own
registry (before the worker runs, the process and platform collectors alone); on the leader it
includes `queue_demand()`, read at most every 15 s by one scrape at a time, on a connection of
its own (the port may be reachable by anyone: a scrape must not cost a scan of the jobs on the
pool the claims use). Nothing mutates.
"""

from __future__ import annotations

import functools
import json
import logging
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
    how far past its interval the longest wait for a stamp ran since the previous look.

    Measured in real time (time.monotonic), since a blocked loop stops trio's clock's sleepers
    but not the wall clock. Stamped by a trio task rather than read from a thread: the loop is
    the thing under test, and the HTTP answer comes from the same loop anyway."""

    interval: float = HEARTBEAT_SECONDS
    bound: float = LIVENESS_STALL_SECONDS
    _last: float = attrs.field(factory=time.monotonic)
    _looked_at: float = attrs.field(factory=time.monotonic)
    _worst: float = 0.0

    async def run(self) -> None:
        while True:
            await trio.sleep(self.interval)
            now = time.monotonic()
            late = now - max(self._last, self._looked_at) - self.interval
            if late > self.bound:
                log.warning("the trio loop made no progress for %.1fs (a blocking call?)", late)
            self._worst = max(self._worst, late)
            self._last = now

    def stall_seconds(self) -> float:
        """The worst lateness since the previous call, including a stamp overdue now."""
        now = time.monotonic()
        overdue = now - max(self._last, self._looked_at) - self.interval
        worst = max(self._worst, overdue, 0.0)
        self._worst, self._looked_at = 0.0, now
        return worst


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
