"""The producers' connections: one check at open with the CLI's one-line errors, one LISTEN
connection per producer for all its waits, and a fresh pool in a forked child (os.fork and
gunicorn --preload) that leaves the parent's sessions alone."""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import trioq
from tests.support import make_app, running_worker, sql_scalar, wait_until
from trioq.producer import AsyncProducer, SyncProducer

BACKENDS = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"

# These producers enqueue by name with no worker running: the unserved-name warning is expected.
pytestmark = pytest.mark.filterwarnings("ignore::trioq.UnservedTaskWarning")


def named(pg_url: str) -> tuple[str, str]:
    """A conninfo whose sessions carry a name of their own (to count them), and the name."""
    name = f"producer-{secrets.token_hex(4)}"
    return f"{pg_url} application_name={name}", name


async def migrated(pg_url: str, pg_schema: str) -> trioq.App:
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: Any) -> Any:
        return payload

    async with app.client(migrate=True):
        pass
    return app


# --- opening ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("conninfo", "permanent", "says"),
    [
        ("host=127.0.0.1 port=1 dbname=x", False, "cannot connect to PostgreSQL"),
        ("postgresql://[bad", True, "the database URL is not valid"),
        ("{pg_url} dbname=no_such_db", True, "database 'no_such_db' does not exist: create it"),
    ],
)
def test_opening_a_producer_raises_the_clis_one_line_naming_the_cause(
    pg_url: str, conninfo: str, permanent: bool, says: str
) -> None:
    conninfo = conninfo.format(pg_url=pg_url)
    with pytest.raises(trioq.ProducerConnectionError) as sync_error:
        SyncProducer(conninfo)
    with pytest.raises(trioq.ProducerConnectionError) as async_error:
        asyncio.run(AsyncProducer(conninfo).open())
    for error in (sync_error.value, async_error.value):
        assert isinstance(error, trioq.ProducerError)
        assert says in str(error)
        assert "\n" not in str(error)
        assert error.permanent is permanent
    if not permanent:
        assert "the producer's conninfo or TRIOQ_DATABASE_URL" in str(sync_error.value)


# --- one listener for every wait ----------------------------------------------------------------


async def test_100_sync_waits_share_one_listen_connection(pg_url: str, pg_schema: str) -> None:
    app = await migrated(pg_url, pg_schema)
    url, name = named(pg_url)
    async with app.client() as client:
        jobs = await client.enqueue_many("noop", [{"n": n} for n in range(100)])
        producer = await trio.to_thread.run_sync(lambda: SyncProducer(url, schema=pg_schema))

        def wait_all() -> list[Any]:
            with concurrent.futures.ThreadPoolExecutor(100) as pool:
                return list(pool.map(lambda job: producer.wait_result(job.id, 60), jobs))

        async def all_waiting() -> bool:
            statistics = producer.statistics()
            return statistics is not None and statistics.waiters == 100

        results: list[Any] = []
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _collect(results, wait_all))
                await wait_until(all_waiting)
                backends = sql_scalar(pg_url, BACKENDS, (name,))
                async with running_worker(app, concurrency=20):
                    pass_through = await client.wait_result(jobs[-1].id, timeout=30)
        statistics = producer.statistics()
        await trio.to_thread.run_sync(producer.close)
    assert backends <= 4 + 1  # the pool (4) and the one listener, not a connection per wait
    assert results == [{"n": n} for n in range(100)]
    assert pass_through == {"n": 99}
    assert statistics is not None and statistics.connections_opened == 1


async def test_100_asyncio_waits_share_one_listen_connection(pg_url: str, pg_schema: str) -> None:
    app = await migrated(pg_url, pg_schema)
    url, name = named(pg_url)
    counted: list[int] = []

    async with app.client() as client, trio.open_nursery() as nursery:
        jobs = await client.enqueue_many("noop", [{"n": n} for n in range(100)])
        all_waiting = trio.Event()
        token = trio.lowlevel.current_trio_token()

        async def fastapi_side() -> list[Any]:
            async with AsyncProducer(url, schema=pg_schema) as producer:
                waits = [producer.wait_result(job.id, 60) for job in jobs]
                gathered = asyncio.gather(*waits)
                # Another event loop's state: polled, as wait_until polls on trio's side.
                while (producer.statistics() or _NONE).waiters < 100:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                counted.append(sql_scalar(pg_url, BACKENDS, (name,)))
                trio.from_thread.run_sync(all_waiting.set, trio_token=token)
                results = await gathered
                counted.append((producer.statistics() or _NONE).connections_opened)
                return results

        results: list[Any] = []
        with trio.fail_after(60):
            nursery.start_soon(_collect, results, lambda: asyncio.run(fastapi_side()))
            await all_waiting.wait()
            async with running_worker(app, concurrency=20):
                await client.wait_result(jobs[-1].id, timeout=30)
    backends, opened = counted
    assert backends <= 4 + 1
    assert opened == 1
    assert results == [{"n": n} for n in range(100)]


class _NoStatistics:
    waiters = 0
    connections_opened = 0


_NONE = _NoStatistics()


async def _collect(into: list[Any], work: Any) -> None:
    into.extend(await trio.to_thread.run_sync(work))


# --- fork ---------------------------------------------------------------------------------------


def _in_child(work: Any) -> dict[str, Any]:
    """Run `work()` in a forked child; return what it returned (JSON through a pipe)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and never return into pytest
        os.close(read_end)
        try:
            outcome = {"ok": work()}
        except BaseException as exc:  # anything, reported to the parent
            outcome = {"error": repr(exc)}
        with os.fdopen(write_end, "w") as out:
            json.dump(outcome, out)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as report:
        outcome = json.loads(report.read() or '{"error": "the child wrote nothing"}')
    os.waitpid(pid, 0)
    assert "error" not in outcome, outcome["error"]
    result: dict[str, Any] = outcome["ok"]
    return result


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python 3.12+: threads
def test_a_sync_producer_made_before_a_fork_opens_its_own_connections_in_the_child(
    pg_url: str, pg_schema: str
) -> None:
    trio.run(migrated, pg_url, pg_schema)
    url, name = named(pg_url)
    with SyncProducer(url, schema=pg_schema) as producer:
        before = producer.enqueue("noop", {"from": "parent"})
        producer.cancel(before.id)
        assert producer.wait_final(before.id, timeout=10).state == "cancelled"
        assert sql_scalar(pg_url, BACKENDS, (name,)) == 2  # a pooled one, the listener

        def child() -> dict[str, Any]:
            job = producer.enqueue("noop", {"from": "child"})
            producer.cancel(job.id)
            state = producer.wait_final(job.id, timeout=10).state
            return {
                "job": job.id,
                "state": state,
                "backends": sql_scalar(pg_url, BACKENDS, (name,)),
            }

        seen = _in_child(child)
        # The child opened a pooled connection and a listener of its own, used neither of the
        # parent's, and left them working.
        assert seen["backends"] == 4
        assert seen["state"] == "cancelled"
        after = producer.enqueue("noop", {"from": "parent"})
        assert producer.get_job(seen["job"]).payload == {"from": "child"}
        assert producer.get_job(after.id).state == "ready"


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_an_asyncio_producer_opened_before_a_fork_opens_its_own_pool_in_the_child(
    pg_url: str, pg_schema: str
) -> None:
    trio.run(migrated, pg_url, pg_schema)
    url, name = named(pg_url)
    producer = AsyncProducer(url, schema=pg_schema)

    async def parent_start() -> None:
        await producer.open()
        await producer.enqueue("noop", {"from": "parent"})

    asyncio.run(parent_start())

    async def child_work() -> dict[str, Any]:
        job = await producer.enqueue("noop", {"from": "child"})
        await producer.cancel(job.id)
        state = (await producer.wait_final(job.id, timeout=10)).state
        backends = sql_scalar(pg_url, BACKENDS, (name,))
        await producer.close()
        return {"state": state, "backends": backends}

    seen = _in_child(lambda: asyncio.run(child_work()))
    assert seen == {"state": "cancelled", "backends": 3}  # the parent's, the child's two


@pytest.fixture
def gunicorn_socket(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "gunicorn.sock"


def test_a_module_level_producer_under_gunicorn_preload_serves_every_worker(
    pg_url: str, pg_schema: str, gunicorn_socket: Path
) -> None:
    trio.run(migrated, pg_url, pg_schema)
    url, name = named(pg_url)
    env = {**os.environ, "TRIOQ_DATABASE_URL": url, "TRIOQ_TEST_SCHEMA": pg_schema}
    env["HOME"] = str(gunicorn_socket.parent)  # where gunicorn >= 24 puts its control socket
    command = [sys.executable, "-m", "gunicorn", "--preload", "--workers", "2"]
    command += ["--bind", f"unix:{gunicorn_socket}", "tests.fork_app:app"]
    server = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        served = [_get(gunicorn_socket, server) for _ in range(8)]
        pids = {reply["pid"] for reply in served}
        backends = sql_scalar(pg_url, BACKENDS, (name,))
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert server.pid not in pids  # served by the forked workers, not the master
    assert backends == 1 + len(pids), err.decode()  # the master's, one per serving worker
    jobs = sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.jobs")
    assert jobs == 1 + len(served)


def _get(path: Path, server: subprocess.Popen[bytes]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        if server.poll() is not None:
            raise AssertionError(f"gunicorn exited: {server.stderr.read().decode()}")  # type: ignore[union-attr]
        connection = _UnixHTTPConnection(str(path))
        try:
            connection.request("GET", "/")
            response = connection.getresponse()
            assert response.status == 200
            reply: dict[str, Any] = json.loads(response.read())
            return reply
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # gunicorn starting: nothing to wait on but its socket
        finally:
            connection.close()


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)
