"""The worker's health server: GET /livez, /readyz and /metrics on 127.0.0.1 by default.

/livez is 200 while the supervisor runs, even during a database outage (restarting the worker
would not bring the database back). /readyz is 503 while draining, while the database is
unreachable or while lease renewals are late. /metrics is Prometheus text. Nothing mutates.
"""

from __future__ import annotations

import functools
import json

import trio

from .worker import Worker

MAX_REQUEST_BYTES = 8192


def render_metrics(worker: Worker) -> str:
    stats = worker.statistics()
    lines = [
        "# TYPE trioq_worker_ready gauge",
        f"trioq_worker_ready {int(is_ready(worker))}",
        "# TYPE trioq_listener_connected gauge",
        f"trioq_listener_connected {int(stats.listener_connected)}",
        "# TYPE trioq_lease_renewal_age_seconds gauge",
        f"trioq_lease_renewal_age_seconds {stats.seconds_since_lease_renewal:.3f}",
        "# TYPE trioq_slots gauge",
        "# TYPE trioq_running_jobs gauge",
        "# TYPE trioq_claimed_jobs_total counter",
    ]
    for loop in stats.loops:
        label = f'{{queue="{loop.queue}"}}'  # queue names are validated: no quotes inside
        lines += [
            f"trioq_slots{label} {loop.concurrency}",
            f"trioq_running_jobs{label} {loop.running}",
            f"trioq_claimed_jobs_total{label} {loop.claimed_total}",
        ]
    return "\n".join(lines) + "\n"


def is_ready(worker: Worker) -> bool:
    stats = worker.statistics()
    late = stats.seconds_since_lease_renewal > worker.config.renew_interval * 2 + 1
    return not stats.draining and stats.database_healthy and not late


def readiness(worker: Worker) -> dict[str, object]:
    stats = worker.statistics()
    return {
        "ready": is_ready(worker),
        "draining": stats.draining,
        "database": "ok" if stats.database_healthy else "unreachable",
        "listener": "ok" if stats.listener_connected else "degraded",
        "seconds_since_lease_renewal": round(stats.seconds_since_lease_renewal, 3),
    }


async def serve_health(
    worker: Worker,
    port: int,
    host: str = "127.0.0.1",
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; reports the bound port (0 picks a free one) through task_status."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(functools.partial(_handle, worker=worker), listeners)


async def _handle(stream: trio.SocketStream, *, worker: Worker) -> None:
    async with stream:
        with trio.move_on_after(5):
            request = b""
            while b"\r\n\r\n" not in request and len(request) < MAX_REQUEST_BYTES:
                chunk = await stream.receive_some(1024)
                if not chunk:
                    return
                request += chunk
            parts = request.split(b" ", 2)
            path = parts[1].decode("ascii", "replace") if len(parts) > 2 else ""
            status, body, kind = _route(parts[0], path, worker)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            await stream.send_all(head.encode() + body)


def _route(method: bytes, path: str, worker: Worker) -> tuple[str, bytes, str]:
    if method != b"GET":
        return "405 Method Not Allowed", b"GET only\n", "text/plain"
    if path == "/livez":
        return "200 OK", b"ok\n", "text/plain"
    if path == "/readyz":
        body = json.dumps(readiness(worker)).encode() + b"\n"
        status = "200 OK" if is_ready(worker) else "503 Service Unavailable"
        return status, body, "application/json"
    if path == "/metrics":
        return "200 OK", render_metrics(worker).encode(), "text/plain; version=0.0.4"
    return "404 Not Found", b"not found\n", "text/plain"
