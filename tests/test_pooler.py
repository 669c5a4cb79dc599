"""trioq behind PgBouncer in transaction mode (Debian's pgbouncer, started by tests/pgbouncer.py
in front of the session's cluster): `prepared_statements="off"` on the app, both producers and
the CLI, LISTEN on a direct `listen_url`, and no session state left behind for the next client
of a server connection."""

from __future__ import annotations

import asyncio
import datetime
import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import trio

import trioq
from tests.pgbouncer import PgBouncer, running_pgbouncer
from tests.support import running_worker, sql_rows, sql_scalar, wait_until
from trioq._pg import ConnectOptions, connect
from trioq._pg.connection import session_params
from trioq._pg.errors import connection_problem, is_unreachable
from trioq.cli.commands import build_parser
from trioq.cli.commands import main as cli_main
from trioq.producer import AsyncProducer, SyncProducer

# What a server connection must not carry to its next client: settings SET for the session,
# LISTENs, prepared statements. PgBouncer itself SETs the startup parameters it tracks per
# client (application_name, client_encoding, DateStyle, TimeZone, ...) when it hands a server
# connection over: those are its own, not a leak.
SESSION_STATE = """
SELECT (SELECT count(*) FROM pg_settings WHERE source = 'session'
        AND name NOT IN ('application_name', 'client_encoding', 'DateStyle', 'TimeZone',
                         'IntervalStyle', 'standard_conforming_strings')),
       (SELECT count(*) FROM pg_listening_channels()),
       (SELECT count(*) FROM pg_prepared_statements)
"""

# The producers enqueue by name before any worker has registered the tasks (as a web process
# deployed ahead of its workers does): the unserved-name warning is expected here.
pytestmark = pytest.mark.filterwarnings("ignore::trioq.UnservedTaskWarning")


@pytest.fixture(scope="module")
def bouncer(pg_url: str) -> Iterator[PgBouncer]:
    # "single" has one server connection, so every client of it shares the same session.
    databases = {"postgres": "dbname=postgres", "single": "dbname=postgres pool_size=1"}
    with running_pgbouncer(pg_url, databases, pool_mode="transaction") as running:
        yield running


def pooled_app(bouncer: PgBouncer, pg_url: str, schema: str, database: str = "postgres") -> Any:
    app = trioq.App(
        bouncer.conninfo(database), schema=schema, prepared_statements="off", listen_url=pg_url
    )

    @app.task("double")
    async def double(ctx: trioq.Context, payload: dict[str, Any]) -> int:
        return int(payload["n"]) * 2

    @app.task("approval", queue="flows")
    async def approval(ctx: trioq.Context, payload: dict[str, Any]) -> Any:
        await ctx.sleep("cool-off", datetime.timedelta(milliseconds=50))
        decision = await ctx.wait_for_event(
            f"approval:{payload['n']}", timeout=datetime.timedelta(seconds=60)
        )
        return await ctx.step("record", lambda: {"approved": decision["approved"]})

    return app


async def test_migrate_enqueue_from_both_producers_and_8_threads_then_a_worker_drains(
    bouncer: PgBouncer, pg_url: str, pg_schema: str
) -> None:
    app = pooled_app(bouncer, pg_url, pg_schema)
    url = bouncer.conninfo()

    def from_threads() -> list[int]:
        with SyncProducer(url, schema=pg_schema, prepared_statements="off") as producer:
            ids: list[int] = []
            lock = threading.Lock()

            def enqueue_some(thread: int) -> None:
                for n in range(25):  # past psycopg's prepare threshold (5) on each connection
                    job = producer.enqueue("double", {"n": thread * 100 + n})
                    with lock:
                        ids.append(job.id)

            threads = [threading.Thread(target=enqueue_some, args=(t,)) for t in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return ids

    async def from_asyncio() -> list[int]:
        async with AsyncProducer(url, schema=pg_schema, prepared_statements="off") as producer:
            jobs = [await producer.enqueue("double", {"n": 1000 + n}) for n in range(10)]
            jobs += await producer.enqueue_many("double", [{"n": 2000 + n} for n in range(10)])
            return [job.id for job in jobs]

    async with app.client(migrate=True) as client:
        with trio.fail_after(60):
            threaded = await trio.to_thread.run_sync(from_threads)
            awaited = await trio.to_thread.run_sync(asyncio.run, from_asyncio())
            ours = [(await client.enqueue("double", {"n": 3000 + n})).id for n in range(10)]
            assert len(set(threaded)) == 200
            async with running_worker(app, concurrency=10):
                assert await client.wait_result(ours[-1], timeout=30) == 6018
                for job_id in threaded + awaited + ours:
                    await client.wait_final(job_id, timeout=30)
    states = sql_rows(pg_url, f"SELECT state, count(*) FROM {pg_schema}.jobs GROUP BY state")
    assert states == [("completed", 230)]


async def _state_is(client: trioq.Client, job_id: int, state: str) -> bool:
    return (await client.get_job(job_id)).state == state


async def test_workflow_with_a_sleep_and_an_event_and_results_through_the_listen_url(
    bouncer: PgBouncer, pg_url: str, pg_schema: str
) -> None:
    app = pooled_app(bouncer, pg_url, pg_schema)
    url = bouncer.conninfo()

    def producer_side(job_id: int) -> tuple[Any, Any]:
        with SyncProducer(
            url, schema=pg_schema, prepared_statements="off", listen_url=pg_url
        ) as producer:
            first = producer.emit_event("approval:7", {"approved": True})
            return first, producer.wait_result(job_id, timeout=30)

    async with app.client(migrate=True) as client, running_worker(app, ["flows"]):
        with trio.fail_after(60):
            job = await client.enqueue("approval", {"n": 7})
            # Suspended on the event (after its durable sleep): emitted through the pooler.
            await wait_until(lambda: _state_is(client, job.id, "waiting"))
            first, result = await trio.to_thread.run_sync(producer_side, job.id)
    assert result == {"approved": True}
    kinds = sql_rows(
        pg_url, f"SELECT kind FROM {pg_schema}.checkpoints WHERE job_id = %s ORDER BY position",
        (job.id,),
    )  # fmt: skip
    assert [kind for (kind,) in kinds] == ["sleep", "event", "step"]
    assert first is not None


async def test_queue_pause_and_resume_from_the_cli_through_the_pooler(
    bouncer: PgBouncer, pg_url: str, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    app = pooled_app(bouncer, pg_url, pg_schema)
    async with app.client(migrate=True):
        pass
    url = bouncer.conninfo()
    for action in ("pause", "resume", "pause"):
        argv = ["--prepared-statements", "off", "queue", action, "default"]
        argv += ["--database-url", url, "--schema", pg_schema]
        assert await trio.to_thread.run_sync(cli_main, argv) == 0, capsys.readouterr().err
    assert sql_rows(pg_url, f"SELECT queue FROM {pg_schema}.queue_pauses") == [("default",)]


async def test_every_inspecting_command_honours_prepared_statements_off_behind_the_pooler(
    bouncer: PgBouncer, pg_url: str, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each command that reads or writes through a client, with the global flag, behind
    PgBouncer in transaction mode: exit 0 (`workflows` ignored the flag, and exited 3 telling
    the user to pass the flag they had passed)."""
    app = pooled_app(bouncer, pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        job = await client.enqueue("double", {"n": 2})
    url = bouncer.conninfo()
    commands = [
        ["status"],
        ["jobs"],
        ["job", str(job.id)],
        ["explain", str(job.id)],
        ["schedules"],
        ["workflows"],
        ["key", "list"],
        ["queue", "list"],
    ]
    for command in commands:
        argv = ["--prepared-statements", "off", *command]
        argv += ["--database-url", url, "--schema", pg_schema]
        code = await trio.to_thread.run_sync(cli_main, argv)
        assert code == 0, (command, capsys.readouterr().err)


async def test_a_pooler_refusing_trioqs_startup_options_is_one_line_naming_the_fix_not_a_retry(
    bouncer: PgBouncer, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = bouncer.conninfo()
    with trio.fail_after(30):  # a retried "unreachable" database would wait here forever
        code = await trio.to_thread.run_sync(
            cli_main, ["worker", "tests.tx_app:app", "--queue", "ledger", "--database-url", url]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert len(err) == 1
    assert "refuses the startup parameter 'options'" in err[0]
    assert "--prepared-statements off" in err[0]
    with_options = url + " options='-c work_mem=8MB'"
    with pytest.raises(trioq.ProducerConnectionError, match="--prepared-statements off") as raised:
        SyncProducer(with_options, schema=pg_schema, prepared_statements="off")
    assert raised.value.permanent
    with pytest.raises(trioq.ProducerConnectionError, match="refuses the startup parameter"):
        await trio.to_thread.run_sync(asyncio.run, AsyncProducer(with_options).open())


async def test_no_session_state_reaches_the_next_client_of_the_server_connection(
    bouncer: PgBouncer, pg_url: str, pg_schema: str
) -> None:
    app = pooled_app(bouncer, pg_url, pg_schema, database="single")
    url = bouncer.conninfo("single")

    def producers() -> None:
        with SyncProducer(url, schema=pg_schema, prepared_statements="off") as producer:
            for n in range(10):
                producer.enqueue("double", {"n": n})

        async def awaited() -> None:
            async with AsyncProducer(url, schema=pg_schema, prepared_statements="off") as producer:
                for n in range(10):
                    await producer.enqueue("double", {"n": n})

        asyncio.run(awaited())

    async with app.client(migrate=True) as client:
        with trio.fail_after(60):
            await trio.to_thread.run_sync(producers)
            async with client.transaction() as tx:  # trioq's own transaction: SET LOCAL
                await tx.enqueue("double", {"n": 99})
            async with running_worker(app, concurrency=4):
                last = await client.enqueue("double", {"n": 100})
                assert await client.wait_result(last.id, timeout=30) == 200
    assert sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.jobs") == 22
    with psycopg.connect(url, autocommit=True) as plain:
        assert plain.execute(SESSION_STATE).fetchone() == (0, 0, 0)
        # The check sees a leak when there is one: a session SET by one client ...
        plain.execute("SET statement_timeout = 1234")
    with psycopg.connect(url, autocommit=True) as plain:
        # ... is what the next client of the one server connection gets.
        assert plain.execute(SESSION_STATE).fetchone() == (1, 0, 0)
        plain.execute("RESET ALL")


# --- the pieces, on a direct connection ----------------------------------------------------


async def test_pooler_mode_sets_nothing_for_the_session_and_its_timeouts_only_locally(
    pg_url: str,
) -> None:
    assert "options" not in session_params(pg_url, ConnectOptions(transaction_pooler=True))
    assert "options" in session_params(pg_url, ConnectOptions())
    conn = await connect(pg_url, prepare_threshold=None, transaction_pooler=True)
    try:
        settings = "SELECT setting, source FROM pg_settings WHERE name = %s"
        assert await conn.fetchrow(settings, ["statement_timeout"]) == ("0", "default")
        assert await conn.fetchval("SHOW client_connection_check_interval") == "0"
        async with conn.transaction():
            assert await conn.fetchval("SHOW statement_timeout") == "30s"
            assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "1min"
        assert await conn.fetchrow(settings, ["statement_timeout"]) == ("0", "default")
    finally:
        await conn.close()


def test_pooler_errors_are_permanent_and_name_the_fix_while_a_refused_port_is_retried() -> None:
    for text in (
        "connection failed: ... FATAL:  unsupported startup parameter: options",
        'prepared statement "trioq_0" already exists',
        'prepared statement "_pg3_0" does not exist',
        'bind message supplies 10 parameters, but prepared statement "_pg3_1" requires 2',
    ):
        error = psycopg.OperationalError(text)
        assert not is_unreachable(error)
        problem = connection_problem(error)
        assert problem is not None and problem.permanent
        assert "--prepared-statements off" in problem.message
    refused = psycopg.OperationalError("connection failed: ... Connection refused")
    assert is_unreachable(refused)


def test_off_without_a_listen_url_polls_and_refuses_to_pretend_it_listens() -> None:
    assert not trioq.App(prepared_statements="off").listens
    assert trioq.App(prepared_statements="off", listen_url="host=/direct").listens
    assert trioq.App().listens
    with pytest.raises(ValueError, match="prepared_statements: 'no' must be 'auto' or 'off'"):
        trioq.App(prepared_statements="no")


async def test_a_worker_behind_a_pooler_without_a_listen_url_polls(
    bouncer: PgBouncer, pg_schema: str
) -> None:
    app = trioq.App(bouncer.conninfo(), schema=pg_schema, prepared_statements="off")

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: Any) -> None:
        pass

    async with app.client(migrate=True) as client:
        with pytest.raises(trioq.ConfigurationError, match="LISTEN needs listen_url"):
            app.worker(notifications=True)
        async with running_worker(app) as worker:
            job = await client.enqueue("noop", None)
            with trio.fail_after(30):
                assert (await client.wait_final(job.id)).state == "completed"
            assert worker.statistics().listener_state == "off"


def test_the_clis_prepared_statements_option_goes_before_or_after_the_command() -> None:
    parser = build_parser()
    for argv in (
        ["--prepared-statements", "off", "status"],
        ["status", "--prepared-statements", "off"],
    ):
        assert parser.parse_args(argv).prepared_statements == "off"
    assert parser.parse_args(["status"]).prepared_statements is None


async def test_the_cli_worker_runs_behind_the_pooler_and_listens_on_the_listen_url(
    bouncer: PgBouncer, pg_url: str, pg_schema: str
) -> None:
    url = bouncer.conninfo()
    async with pooled_app(bouncer, pg_url, pg_schema).client(migrate=True):
        pass
    command = [sys.executable, "-m", "trioq.cli", "-v", "--prepared-statements", "off"]
    command += ["worker", "tests.pooler_app:app", "--database-url", url, "--listen-url", pg_url]
    env = {**os.environ, "TRIOQ_TEST_SCHEMA": pg_schema, "PYTHONUNBUFFERED": "1"}
    output = bytearray()

    async def says(text: str) -> bool:
        await trio.lowlevel.checkpoint()
        return text.encode() in output

    def enqueue_and_wait() -> Any:
        with SyncProducer(
            url, schema=pg_schema, prepared_statements="off", listen_url=pg_url
        ) as producer:
            return producer.wait_result(producer.enqueue("double", {"n": 21}).id, timeout=30)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            process = await nursery.start(
                functools.partial(
                    trio.run_process,
                    command,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
            )
            nursery.start_soon(_read_into, process.stdout, output)
            await wait_until(lambda: says("trioq worker "))
            result = await trio.to_thread.run_sync(enqueue_and_wait)
            process.send_signal(signal.SIGTERM)
            code = await process.wait()
    assert result == 42
    assert code == 0, output.decode()
    assert b"notifications off" not in output  # LISTEN on the listen URL, not poll-only


async def _read_into(stream: Any, into: bytearray) -> None:
    async for chunk in stream:
        into.extend(chunk)


# --- "auto" behind the pooler: the producers switch to unnamed statements by themselves -------

AUTO_ENQUEUES = 180  # the count: 131-137 of them raised "_pg3_0 does not exist"


def _pooler_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "unnamed statements" in r.getMessage()]


async def test_a_sync_producer_in_auto_mode_behind_the_pooler_switches_to_unnamed_statements(
    bouncer: PgBouncer, pg_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with pooled_app(bouncer, pg_url, pg_schema).client(migrate=True):
        pass

    def enqueue_all() -> list[int]:
        with SyncProducer(bouncer.conninfo(), schema=pg_schema, pool_size=4) as producer:
            ids: list[int] = []
            errors: list[BaseException] = []
            lock = threading.Lock()

            def enqueue_some(thread: int) -> None:
                try:
                    for n in range(AUTO_ENQUEUES // 4):
                        job = producer.enqueue("double", {"n": thread * 100 + n})
                        with lock:
                            ids.append(job.id)
                except BaseException as exc:  # the assertion below names it
                    errors.append(exc)

            threads = [threading.Thread(target=enqueue_some, args=(t,)) for t in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert errors == []
            assert producer.get_job(ids[0]).state == "ready"
            with pytest.raises(trioq.ResultTimeout):
                producer.wait_result(ids[0], timeout=0.3)  # no worker: nothing finishes it
            # Polled, not LISTENed through the pooler (whose server connections move on).
            assert producer.statistics() is None
            return ids

    with trio.fail_after(60):
        ids = await trio.to_thread.run_sync(enqueue_all)
    assert len(set(ids)) == AUTO_ENQUEUES
    assert sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.jobs") == AUTO_ENQUEUES
    [line] = _pooler_warnings(caplog)
    assert 'prepared_statements="off"' in line and "--prepared-statements off" in line
    assert "Results are polled" in line and "listen_url=" in line


async def test_an_async_producer_in_auto_mode_behind_the_pooler_switches_to_unnamed_statements(
    bouncer: PgBouncer, pg_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with pooled_app(bouncer, pg_url, pg_schema).client(migrate=True):
        pass

    async def enqueue_all() -> list[int]:
        async with AsyncProducer(bouncer.conninfo(), schema=pg_schema, pool_size=4) as producer:

            async def enqueue_some(thread: int) -> list[int]:
                return [
                    (await producer.enqueue("double", {"n": thread * 100 + n})).id
                    for n in range(AUTO_ENQUEUES // 4)
                ]

            batches = await asyncio.gather(*(enqueue_some(t) for t in range(4)))
            with pytest.raises(trioq.ResultTimeout):
                await producer.wait_result(batches[0][0], timeout=0.3)
            assert producer.statistics() is None  # polled, not LISTENed through the pooler
            return [job_id for batch in batches for job_id in batch]

    with trio.fail_after(60):
        ids = await trio.to_thread.run_sync(asyncio.run, enqueue_all())
    assert len(set(ids)) == AUTO_ENQUEUES
    assert sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.jobs") == AUTO_ENQUEUES
    assert len(_pooler_warnings(caplog)) == 1


def test_a_producer_that_loses_a_prepared_statement_switches_and_runs_the_call_again(
    bouncer: PgBouncer, pg_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The safety net under the check at open (a pooler that passes the server's process id
    through would not be found): one server connection, whose statements another client of it
    deallocates between two calls."""
    trio.run(_migrate, bouncer, pg_url, pg_schema)
    url = bouncer.conninfo("single")
    monkeypatch.setattr("trioq.producer.shared._pooler_answers", lambda pid, row: False)
    with (
        psycopg.connect(url, autocommit=True) as other,
        SyncProducer(url, schema=pg_schema, pool_size=1) as producer,
    ):
        other.execute("DEALLOCATE ALL")
        for n in range(8):  # past psycopg's prepare threshold: "_pg3_0" on the server
            producer.enqueue("double", {"n": n})
        other.execute("DEALLOCATE ALL")
        assert not _pooler_warnings(caplog)
        for n in range(8):
            producer.enqueue("double", {"n": n})
    assert sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.jobs") == 16
    [line] = _pooler_warnings(caplog)
    assert 'prepared statement "_pg3_0" does not exist' in line
    assert "--prepared-statements off" in line


def test_a_lost_prepared_statement_on_the_callers_connection_is_one_line_naming_its_fix(
    bouncer: PgBouncer, pg_url: str, pg_schema: str
) -> None:
    trio.run(_migrate, bouncer, pg_url, pg_schema)
    url = bouncer.conninfo("single")
    with (
        psycopg.connect(url, autocommit=True) as other,
        psycopg.connect(url, autocommit=True, prepare_threshold=0) as callers,
        SyncProducer(url, schema=pg_schema, prepared_statements="off") as producer,
    ):
        other.execute("DEALLOCATE ALL")
        producer.enqueue("double", {"n": 1}, conn=callers)
        other.execute("DEALLOCATE ALL")
        with pytest.raises(trioq.ProducerConnectionError, match="prepare_threshold") as raised:
            producer.enqueue("double", {"n": 2}, conn=callers)
    assert "\n" not in str(raised.value)
    assert "does not exist: the connection passed as conn=" in str(raised.value)


async def _migrate(bouncer: PgBouncer, pg_url: str, pg_schema: str) -> None:
    async with pooled_app(bouncer, pg_url, pg_schema).client(migrate=True):
        pass


async def test_an_app_in_auto_mode_behind_the_pooler_fails_at_open_with_the_line_naming_the_fix(
    bouncer: PgBouncer, pg_schema: str
) -> None:
    """The trio App sets session state in "auto" (startup options, session timeouts) that a
    switch could not take back, so it does not switch: PgBouncer refuses its startup options
    and the client's (or worker's) open fails, psycopg's error carrying the fix."""
    app = trioq.App(bouncer.conninfo(), schema=pg_schema)
    with trio.fail_after(30), pytest.raises(psycopg.OperationalError) as raised:
        async with app.client():
            pass
    [note] = raised.value.__notes__
    assert "refuses the startup parameter 'options'" in note
    assert 'prepared_statements="off"' in note and "\n" not in note
