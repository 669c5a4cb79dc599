"""The worker's health server: GET /livez, /readyz and /metrics, on 127.0.0.1 by default.

A small ASGI callable served by hypercorn's trio worker inside the caller's nursery (hypercorn
owns the HTTP: parsing, keep-alive, timeouts, and a client that resets its connection or times
out mid-response stays inside hypercorn's connection task, never reaching the worker).

/livez is 200 while the supervisor runs, even during a database outage (restarting the worker
would not bring the database back). /readyz is 503 with a JSON body naming each failing check:
admission (draining, or no slot admitted), database, listener, lease renewal. /metrics is
prometheus-client's exposition of the worker's own registry. Nothing mutates.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .worker import Worker

log = logging.getLogger("trioq.health")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# /metrics asks the database for queue demand; a slow database must not hang the scrape.
DEMAND_TIMEOUT_SECONDS = 2.0


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
        metrics.effective_limit.labels(loop.queue).set(worker.effective_limit(loop.queue))
    metrics.set_listener(stats.listener_connected, stats.listener_state)
    metrics.leader.set(1 if stats.leader else 0)
    if stats.leader:
        await _read_demand(worker)
    else:
        metrics.clear_demand()
    return generate_latest(metrics.registry)


async def _read_demand(worker: Worker) -> None:
    """The leader's database-wide gauges; a failed or slow read leaves the last values."""
    demand = None
    with trio.move_on_after(DEMAND_TIMEOUT_SECONDS):
        try:
            demand = await worker.driver.queue_demand()
        except Exception as exc:  # the scrape still answers; the gauges keep their last values
            log.warning("queue demand unavailable for /metrics: %s", exc)
    if demand is not None:
        worker.metrics.set_demand(worker.config.queues, demand)


def health_app(worker: Worker) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
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
        status, body, kind = await _route(scope["method"], scope["path"], worker)
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


async def _route(method: str, path: str, worker: Worker) -> tuple[int, bytes, str]:
    if method not in ("GET", "HEAD"):
        return 405, b"GET only\n", "text/plain"
    if path == "/livez":
        return 200, b"ok\n", "text/plain"
    if path == "/readyz":
        ready, body = readiness(worker)
        return (200 if ready else 503), json.dumps(body).encode() + b"\n", "application/json"
    if path == "/metrics":
        return 200, await render_metrics(worker), CONTENT_TYPE_LATEST
    return 404, b"not found\n", "text/plain"


def _config(host: str, port: int) -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = log
    config.graceful_timeout = 1.0
    config.keep_alive_timeout = 5.0
    return config


async def serve_health(
    worker: Worker,
    port: int,
    host: str = "127.0.0.1",
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; reports the bound port (0 picks a free one) through task_status."""
    # hypercorn types ASGI scopes and events as TypedDicts; this app reads them as mappings.
    app = cast(Any, health_app(worker))
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(functools.partial(serve, app, _config(host, port)))
        task_status.started(int(binds[0].rsplit(":", 1)[1]))
