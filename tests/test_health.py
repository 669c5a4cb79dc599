"""The worker's health server: liveness, readiness and metrics."""

from __future__ import annotations

import json

import trio

import trioq
from tests.support import make_app, running_worker
from trioq._runtime.health import serve_health


async def http_get(port: int, path: str) -> tuple[int, str]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        response = b""
        while chunk := await stream.receive_some(65536):
            response += chunk
    head, _, body = response.decode().partition("\r\n\r\n")
    return int(head.split(" ")[1]), body


async def test_health_endpoints_report_liveness_readiness_and_metrics(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    async with (
        app.client(migrate=True),
        running_worker(app, ["default", "mail"], concurrency=7) as worker,
        trio.open_nursery() as nursery,
    ):
        port = await nursery.start(serve_health, worker, 0)
        with trio.fail_after(10):
            assert await http_get(port, "/livez") == (200, "ok\n")
            status, body = await http_get(port, "/readyz")
            assert status == 200
            assert json.loads(body)["ready"] is True
            status, metrics = await http_get(port, "/metrics")
            assert status == 200
            assert 'trioq_slots{queue="mail"} 7' in metrics
            assert (await http_get(port, "/nope"))[0] == 404
            worker.request_drain()
            status, body = await http_get(port, "/readyz")
            assert status == 503
            assert json.loads(body)["draining"] is True
            assert (await http_get(port, "/livez"))[0] == 200
        nursery.cancel_scope.cancel()
