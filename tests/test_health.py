"""The worker's health server: liveness, readiness and metrics."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import trio
from prometheus_client.parser import text_string_to_metric_families

import trioq
from tests.support import in_thread, make_app, running_worker, steal_lease, wait_until
from trioq._runtime.services.health import HealthTarget, LoopHeartbeat, serve_health
from trioq.embedded import EmbeddedPostgres

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def http_get(port: int, path: str) -> tuple[int, str]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        await stream.send_all(request.encode())
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
            assert 'trioq_open_slots{queue="mail"} 7.0' in metrics
            assert 'trioq_effective_limit{queue="default"} 7.0' in metrics
            assert (await http_get(port, "/nope"))[0] == 404
            worker.request_drain()
            status, body = await http_get(port, "/readyz")
            assert status == 503
            readiness = json.loads(body)
            assert readiness["draining"] is True
            assert "admission" in readiness["failing"]
            assert readiness["checks"]["admission"] == "draining"
            assert (await http_get(port, "/livez"))[0] == 200
        nursery.cancel_scope.cancel()


def _reset_connection(port: int, request: bytes) -> None:
    """Send `request`, then abort the connection with a TCP RST (SO_LINGER 0) without reading."""
    import socket
    import struct

    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.sendall(request)
    sock.close()


async def test_a_client_resetting_its_connection_does_not_kill_the_worker(
    pg_url: str, pg_schema: str
) -> None:
    """Regression: a scraper's TCP RST mid-request or mid-response must stay inside the
    health server; the worker's nursery never sees it."""
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    async with (
        app.client(migrate=True),
        running_worker(app, ["default"]) as worker,
        trio.open_nursery() as nursery,
    ):
        port = await nursery.start(serve_health, worker, 0)
        with trio.fail_after(20):
            for request in [
                b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",  # RST before the response is read
                b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /met",  # RST mid-request
            ] * 20:
                await trio.to_thread.run_sync(_reset_connection, port, request)
            # The server (and the worker) still answer.
            assert (await http_get(port, "/livez"))[0] == 200
        nursery.cancel_scope.cancel()


async def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics parsed by prometheus-client's own parser: {(sample name, labels): value}."""
    status, text = await http_get(port, "/metrics")
    assert status == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_parse_and_their_counters_equal_the_jobs_run(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("work", max_attempts=1)
    async def work(ctx: trioq.Context, payload: dict[str, int]) -> int:
        if payload["n"] % 5 == 0:
            raise RuntimeError("boom")
        return payload["n"]

    async with (
        app.client(migrate=True) as client,
        running_worker(app, ["default"], concurrency=4) as worker,
        trio.open_nursery() as nursery,
    ):
        port = await nursery.start(serve_health, worker, 0)
        jobs = await client.enqueue_many("work", [{"n": n} for n in range(1, 21)])
        await client.enqueue("work", {"n": 1}, delay=3600)
        with trio.fail_after(20):
            for job in jobs:
                with contextlib.suppress(trioq.JobFailed):
                    await client.wait_result(job.id)
            samples = await scrape(port)
        nursery.cancel_scope.cancel()
    queue = (("queue", "default"),)
    assert samples[("trioq_claimed_jobs_total", queue)] == 20
    assert samples[("trioq_job_outcomes_total", (("outcome", "completed"), *queue))] == 16
    assert samples[("trioq_job_outcomes_total", (("outcome", "failed"), *queue))] == 4
    assert samples[("trioq_handler_seconds_count", (("task", "work"),))] == 20
    assert (
        samples[("trioq_claim_statements_total", queue)] >= samples[("trioq_claims_total", queue)]
    )
    assert (
        samples[("trioq_claim_statement_seconds_count", queue)]
        == samples[("trioq_claim_statements_total", queue)]
    )
    assert samples[("trioq_effective_limit", queue)] == 4
    assert samples[("trioq_queue_demand", (("kind", "scheduled"), *queue))] == 1
    assert samples[("trioq_queue_demand", (("kind", "ready"), *queue))] == 0


async def test_livez_stays_up_and_readyz_names_the_database_across_a_postgres_restart() -> None:
    """A private cluster is stopped and started again under a running worker (same data
    directory and socket): /livez stays 200, /readyz is 503 naming the database while it is
    down and 200 after, and jobs enqueued afterwards complete."""
    cluster = EmbeddedPostgres()
    cluster.start()
    try:
        app = trioq.App(cluster.conninfo, schema="restart_test", pool_size=4)

        @app.task("noop")
        async def noop(ctx: trioq.Context, payload: object) -> str:
            return "done"

        async def readyz() -> tuple[int, dict[str, object]]:
            status, body = await http_get(port, "/readyz")
            return status, json.loads(body)

        async with (
            app.client(migrate=True) as client,
            running_worker(app, ["default"], poll_interval=0.2) as worker,
            trio.open_nursery() as nursery,
        ):
            port = await nursery.start(serve_health, worker, 0)
            with trio.fail_after(60):
                assert (await readyz())[0] == 200
                # The embedded cluster has no public restart; stop and start the same server.
                await trio.to_thread.run_sync(cluster._run_pg_ctl, "stop", "-m", "fast")

                async def database_reported_down() -> bool:
                    status, body = await readyz()
                    return status == 503 and "database" in body["failing"]  # type: ignore[operator]

                await wait_until(database_reported_down)
                assert (await http_get(port, "/livez"))[0] == 200
                await trio.to_thread.run_sync(cluster._start_server)

                async def ready_again() -> bool:
                    return (await readyz())[0] == 200

                await wait_until(ready_again)
                jobs = await client.enqueue_many("noop", [None] * 5)
                assert [await client.wait_result(job.id) for job in jobs] == ["done"] * 5
            nursery.cancel_scope.cancel()
    finally:
        cluster.stop()


async def test_a_lost_lease_counts_as_a_lost_outcome_and_a_lost_lease(
    pg_url: str, pg_schema: str
) -> None:
    """A handler whose lease is taken from it (another token written in SQL) finds out at its
    next checkpoint write: the attempt ends `lost`, and both `trioq_job_outcomes_total
    {outcome="lost"}` and `trioq_lost_leases_total` count it."""
    app = make_app(pg_url, pg_schema)
    lost = trio.Event()

    @app.task("victim")
    async def victim(ctx: trioq.Context, payload: object) -> None:
        await in_thread(steal_lease, pg_url, pg_schema, ctx.job.id)
        await ctx.step("after", lambda: 1)  # fenced: rejected, the attempt is lost

    hooks = trioq.WorkerHooks(
        on_job_end=lambda job, outcome: lost.set() if outcome == "lost" else None
    )
    async with (
        app.client(migrate=True) as client,
        running_worker(app, hooks=hooks, lease_seconds=60) as worker,
    ):
        await client.enqueue("victim", {})
        with trio.fail_after(10):
            await lost.wait()
        registry = worker.metrics.registry
        labels = {"queue": "default", "outcome": "lost"}
        assert registry.get_sample_value("trioq_job_outcomes_total", labels) == 1
        assert registry.get_sample_value("trioq_lost_leases_total") == 1


async def test_livez_answers_while_the_worker_waits_for_the_database_at_start() -> None:
    """`trioq worker` against a database that is down: the health server is up before the
    first connection attempt, /livez is 200 (the liveness probe must not restart the pod for an
    outage) and /readyz 503 naming `starting`, while the command keeps retrying."""
    with socket.socket() as probe:  # a free port for the worker's health server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [
        sys.executable, "-m", "trioq.cli", "worker", "workflows.demo:app",
        "--database-url", "postgresql://127.0.0.1:1/x", "--health-port", str(port),
    ]  # fmt: skip
    proc = await trio.lowlevel.open_process(argv, cwd=REPO_ROOT, stderr=subprocess.DEVNULL)
    try:
        with trio.fail_after(30):
            await wait_until(lambda: _answers(port))
            assert await http_get(port, "/livez") == (200, "ok\n")
            status, body = await http_get(port, "/readyz")
            metrics = await http_get(port, "/metrics")
        assert status == 503
        assert json.loads(body)["failing"] == ["starting"]
        assert metrics[0] == 200 and "process_cpu_seconds_total" in metrics[1]
        assert proc.returncode is None  # still waiting for the database
    finally:
        proc.kill()
        await proc.wait()


async def _answers(port: int) -> bool:
    try:
        await http_get(port, "/livez")
    except OSError:
        return False
    return True


async def test_livez_fails_for_every_poller_for_a_while_after_the_trio_loop_was_blocked(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    async with (
        app.client(migrate=True),
        running_worker(app) as worker,
        trio.open_nursery() as nursery,
    ):
        target = HealthTarget(worker, LoopHeartbeat(interval=0.05, bound=1.0, hold=1.5))
        port = await nursery.start(serve_health, target, 0)
        with trio.fail_after(10):
            assert (await http_get(port, "/livez"))[0] == 200
            time.sleep(2.0)  # noqa: ASYNC251 (the fault under test: the trio thread blocked)
            # A second poller (a person's curl, another monitor) does not take the 503 the
            # kubelet should see: every poll within the hold reads the same stall.
            for _poller in ("someone else", "the kubelet"):
                status, body = await http_get(port, "/livez")
                assert status == 503
                assert body.startswith("the trio loop made no progress for")

            async def alive_again() -> bool:
                return (await http_get(port, "/livez"))[0] == 200

            await wait_until(alive_again)  # the hold passed, the loop progressing
        nursery.cancel_scope.cancel()
