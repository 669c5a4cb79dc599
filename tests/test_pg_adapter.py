"""The Postgres driver against a real server: connection options, the cancellation matrix from
research/driver.md, the randomised cancellation stress test, and pool recovery."""

from __future__ import annotations

import collections
import math
import os
import random
import resource
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager

import psycopg
import psycopg.errors
import pytest
import trio

from tests.support import wait_until
from trioq._pg import Connection, connect, is_connection_lost, open_pool

# A cancelled pg_sleep(5) must come back well before the sleep would have ended.
PROMPT = 1.5


@pytest.fixture
def app_name() -> str:
    """An application_name no other test uses, to find this test's backends."""
    return f"trioq-test-{secrets.token_hex(4)}"


@pytest.fixture
async def counters(pg_schema: str, observer: Connection) -> str:
    """A table of ten counter rows (id 0..9, n = 0), dropped with the test's schema."""
    table = f"{pg_schema}.counters"
    await observer.execute(
        f"CREATE SCHEMA {pg_schema};"
        f"CREATE TABLE {table} (id int PRIMARY KEY, n int NOT NULL);"
        f"INSERT INTO {table} SELECT g, 0 FROM generate_series(0, 9) g"
    )
    return table


async def wait_until_sleeping(observer: Connection, pid: int) -> None:
    """Poll pg_stat_activity until backend `pid` is inside pg_sleep."""
    with trio.fail_after(5):
        await wait_until_backend_waits(observer, pid, event="PgSleep")


async def wait_until_backend_waits(
    observer: Connection, pid: int, *, event: str | None = None, event_type: str | None = None
) -> None:
    """Poll pg_stat_activity until backend `pid` shows the wait event (or event type) given
    (there is no notification for "the server reached this point"); bound it by the caller's
    `trio.fail_after`."""
    while True:
        row = await observer.fetchrow(
            "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", [pid]
        )
        if (
            row is not None
            and (event is None or row[1] == event)
            and (event_type is None or row[0] == event_type)
        ):
            return
        await trio.sleep(0.005)


async def cancel_once_sleeping(
    observer: Connection, pid: int, work: Callable[[], Awaitable[None]]
) -> float:
    """Run `work` and cancel it once backend `pid` sleeps; return seconds from cancel to return."""
    scope = trio.CancelScope()
    finished = trio.Event()

    async def run() -> None:
        with scope:
            await work()
        finished.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await wait_until_sleeping(observer, pid)
        cancelled_at = trio.current_time()
        scope.cancel()
        with trio.fail_after(10):
            await finished.wait()
    assert scope.cancelled_caught
    return trio.current_time() - cancelled_at


async def assert_row_lock_free_and_value(observer: Connection, table: str, expected: int) -> None:
    """A second session can update row 1 at once (no lock left behind); its value was `expected`."""
    await observer.execute("SET lock_timeout = '300ms'")
    try:
        value = await observer.fetchval(
            f"UPDATE {table} SET n = n + 100 WHERE id = 1 RETURNING n - 100"
        )
    finally:
        await observer.execute("RESET lock_timeout")
    assert value == expected


# --- connections -------------------------------------------------------------------------------


async def test_connect_applies_trioq_session_settings(pg_url: str) -> None:
    conn = await connect(pg_url)
    try:
        assert await conn.fetchval("SHOW application_name") == "trioq"
        assert await conn.fetchval("SHOW statement_timeout") == "30s"
        assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "1min"
        assert await conn.fetchval("SHOW client_connection_check_interval") == "1s"
        assert await conn.fetchrow("SELECT 1, 'a'") == (1, "a")
        assert await conn.fetch("SELECT g FROM generate_series(1, 3) g") == [(1,), (2,), (3,)]
        assert await conn.fetchrow("SELECT 1 WHERE false") is None
        assert await conn.fetchval("SELECT %(x)s::int + %(y)s::int", {"x": 1, "y": 2}) == 3
        assert not conn.in_transaction
        assert conn.statistics().statements_executed == 8
    finally:
        await conn.close()
    assert conn.closed


async def test_connect_options_can_be_overridden_or_disabled(pg_url: str) -> None:
    conn = await connect(
        pg_url,
        application_name="trioq-custom",
        statement_timeout=None,
        idle_in_transaction_session_timeout=2.5,
        prepare_threshold=None,
    )
    try:
        assert await conn.fetchval("SHOW application_name") == "trioq-custom"
        assert await conn.fetchval("SHOW statement_timeout") == "0"
        assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "2500ms"
    finally:
        await conn.close()


async def test_close_is_idempotent_and_the_closed_connection_raises_connection_lost(
    pg_url: str,
) -> None:
    conn = await connect(pg_url)
    await conn.close()
    await conn.close()
    with pytest.raises(psycopg.OperationalError) as info:
        await conn.fetchval("SELECT 1")
    assert is_connection_lost(info.value)


async def test_transaction_commits_and_rolls_back_on_error(
    pg_url: str, counters: str, observer: Connection
) -> None:
    conn = await connect(pg_url)
    try:
        async with conn.transaction():
            assert conn.in_transaction
            await conn.execute(f"UPDATE {counters} SET n = 5 WHERE id = 1")
        assert not conn.in_transaction
        with pytest.raises(ValueError, match="undo"):
            async with conn.transaction():
                await conn.execute(f"UPDATE {counters} SET n = 7 WHERE id = 1")
                raise ValueError("undo")
        assert not conn.in_transaction
        assert await observer.fetchval(f"SELECT n FROM {counters} WHERE id = 1") == 5
    finally:
        await conn.close()


async def test_transaction_whose_error_was_swallowed_is_rolled_back_not_reported_committed(
    pg_url: str, counters: str, observer: Connection
) -> None:
    conn = await connect(pg_url)
    try:
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            async with conn.transaction():
                await conn.execute(f"UPDATE {counters} SET n = 9 WHERE id = 1")
                with pytest.raises(psycopg.errors.DivisionByZero):
                    await conn.execute("SELECT 1 / 0")
        assert not conn.in_transaction
        assert await observer.fetchval(f"SELECT n FROM {counters} WHERE id = 1") == 0
    finally:
        await conn.close()


async def test_nested_transaction_raises_and_keeps_the_outer_one(pg_url: str) -> None:
    conn = await connect(pg_url)
    try:
        async with conn.transaction():
            with pytest.raises(RuntimeError, match="nested"):
                async with conn.transaction():
                    pass
            assert conn.in_transaction
        assert not conn.in_transaction
    finally:
        await conn.close()


async def test_two_tasks_using_one_connection_get_busy_resource_error(pg_url: str) -> None:
    conn = await connect(pg_url)
    started = trio.Event()
    try:
        async with trio.open_nursery() as nursery:

            async def sleeper() -> None:
                started.set()
                await conn.execute("SELECT pg_sleep(0.2)")

            nursery.start_soon(sleeper)
            await started.wait()
            with pytest.raises(trio.BusyResourceError):
                await conn.fetchval("SELECT 1")
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


async def test_cancelled_connect_returns_promptly_while_the_server_does_not_answer() -> None:
    # A TCP server that accepts and never speaks: libpq waits for it until connect_timeout.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, hold_forever, listeners)
        with trio.move_on_after(0.2) as scope:
            await connect(f"host=127.0.0.1 port={port} user=x dbname=x connect_timeout=2")
        assert scope.cancelled_caught
        nursery.cancel_scope.cancel()


async def hold_forever(stream: trio.SocketStream) -> None:
    await trio.sleep_forever()


def test_is_connection_lost_separates_lost_sessions_from_statement_errors() -> None:
    assert is_connection_lost(psycopg.OperationalError("server closed the connection"))
    assert is_connection_lost(psycopg.errors.AdminShutdown("terminating connection"))
    assert is_connection_lost(psycopg.errors.CannotConnectNow("starting up"))
    assert is_connection_lost(psycopg.errors.ConnectionFailure("08006"))
    assert not is_connection_lost(psycopg.errors.QueryCanceled("canceling statement"))
    assert not is_connection_lost(psycopg.errors.LockNotAvailable("lock timeout"))
    assert not is_connection_lost(psycopg.errors.UniqueViolation("duplicate"))
    assert not is_connection_lost(ValueError("not a database error"))


# --- the cancellation matrix (research/driver.md) ------------------------------------------------


async def test_cancelled_query_returns_promptly_is_cancelled_on_the_server_and_conn_is_reusable(
    pg_url: str, observer: Connection
) -> None:
    conn = await connect(pg_url)
    try:

        async def work() -> None:
            await conn.execute("SELECT pg_sleep(5)")

        assert await cancel_once_sleeping(observer, conn.backend_pid, work) < PROMPT
        state = await observer.fetchval(
            "SELECT state FROM pg_stat_activity WHERE pid = %s", [conn.backend_pid]
        )
        assert state == "idle"
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


async def test_cancelled_transaction_rolls_back_and_releases_its_row_lock(
    pg_url: str, counters: str, observer: Connection
) -> None:
    conn = await connect(pg_url)
    try:

        async def work() -> None:
            async with conn.transaction():
                await conn.execute(f"UPDATE {counters} SET n = n + 1 WHERE id = 1")
                await conn.execute("SELECT pg_sleep(5)")

        assert await cancel_once_sleeping(observer, conn.backend_pid, work) < PROMPT
        assert not conn.in_transaction
        await assert_row_lock_free_and_value(observer, counters, expected=0)
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


async def test_pooled_connection_cancelled_mid_transaction_comes_back_clean(
    pg_url: str, counters: str, observer: Connection
) -> None:
    async with open_pool(pg_url, size=1) as pool:
        async with pool.connection() as conn:
            pid = conn.backend_pid

        async def work() -> None:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute(f"UPDATE {counters} SET n = n + 1 WHERE id = 1")
                await conn.execute("SELECT pg_sleep(5)")

        assert await cancel_once_sleeping(observer, pid, work) < PROMPT
        await assert_row_lock_free_and_value(observer, counters, expected=0)
        async with pool.connection() as conn:
            assert conn.backend_pid == pid
            assert not conn.in_transaction
            assert await conn.fetchval("SELECT 1") == 1
        assert pool.statistics().replaced_total == 0


async def test_pool_release_rolls_back_a_transaction_left_open(
    pg_url: str, counters: str, observer: Connection
) -> None:
    async with open_pool(pg_url, size=1) as pool:
        async with pool.connection() as conn:
            await conn.execute("BEGIN")
            await conn.execute(f"UPDATE {counters} SET n = n + 1 WHERE id = 1")
        await assert_row_lock_free_and_value(observer, counters, expected=0)
        async with pool.connection() as conn:
            assert not conn.in_transaction


async def test_sibling_failure_cancels_the_database_task_and_its_transaction_rolls_back(
    pg_url: str, counters: str, observer: Connection
) -> None:
    conn = await connect(pg_url)
    try:

        async def database_task() -> None:
            async with conn.transaction():
                await conn.execute(f"UPDATE {counters} SET n = n + 1 WHERE id = 1")
                await conn.execute("SELECT pg_sleep(5)")

        async def failing_sibling() -> None:
            await wait_until_sleeping(observer, conn.backend_pid)
            raise ValueError("sibling failed")

        started = trio.current_time()
        with pytest.RaisesGroup(pytest.RaisesExc(ValueError, match="sibling failed")):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(database_task)
                nursery.start_soon(failing_sibling)
        assert trio.current_time() - started < 5
        assert not conn.in_transaction
        await assert_row_lock_free_and_value(observer, counters, expected=0)
    finally:
        await conn.close()


# --- randomised cancellation stress (research/driver/stress_cancel.py) ---------------------------

STRESS_OPS = 600
STRESS_TASKS = 25


async def run_stress(
    borrow: Callable[[int], AbstractAsyncContextManager[Connection]], table: str
) -> collections.Counter[str]:
    """25 tasks run 600 operations: borrow a connection, BEGIN, UPDATE a counter, pg_sleep(0-8 ms),
    COMMIT. Three in four run under a random 0-60 ms deadline so cancellations land everywhere;
    the fourth has none, so each of those must commit however slow the machine is (on a loaded
    machine a reconnect after a cancellation can outlast every 0-60 ms deadline, and a run once
    committed nothing). Returns the tally (committed, cancelled, unbounded, and any unexpected
    error messages)."""
    rng = random.Random(42)
    tally: collections.Counter[str] = collections.Counter()

    async def worker(index: int) -> None:
        while tally["started"] < STRESS_OPS:
            tally["started"] += 1
            key = rng.randrange(10)
            sleep_seconds = rng.uniform(0, 0.008)
            deadline = rng.uniform(0, 0.060) if rng.random() < 0.75 else math.inf
            tally["unbounded"] += deadline == math.inf
            with trio.move_on_after(deadline) as scope:
                try:
                    async with borrow(index) as conn, conn.transaction():
                        await conn.execute(f"UPDATE {table} SET n = n + 1 WHERE id = %s", [key])
                        await conn.execute("SELECT pg_sleep(%s)", [sleep_seconds])
                    tally["committed"] += 1
                except Exception as exc:
                    tally[f"error: {exc!r}"[:120]] += 1
            if scope.cancelled_caught:
                tally["cancelled"] += 1

    async with trio.open_nursery() as nursery:
        for index in range(STRESS_TASKS):
            nursery.start_soon(worker, index)
    return tally


async def assert_stress_consistent(
    tally: collections.Counter[str], table: str, observer: Connection, app_name: str
) -> None:
    errors = {key: count for key, count in tally.items() if key.startswith("error")}
    assert errors == {}
    assert tally["unbounded"] > 0
    assert tally["committed"] >= tally["unbounded"]
    assert tally["cancelled"] > 0
    assert await observer.fetchval(f"SELECT sum(n) FROM {table}") == tally["committed"]
    busy = await observer.fetch(
        "SELECT pid, state FROM pg_stat_activity WHERE application_name = %s AND state <> 'idle'",
        [app_name],
    )
    assert busy == []


async def test_random_cancellations_through_a_pool_lose_no_commits_and_leave_no_mess(
    pg_url: str, counters: str, observer: Connection, app_name: str
) -> None:
    async with open_pool(pg_url, size=5, application_name=app_name) as pool:
        tally = await run_stress(lambda index: pool.connection(), counters)
        await assert_stress_consistent(tally, counters, observer, app_name)
        assert pool.statistics().in_use == 0

        # every pool connection still works: hold all five at once
        pids: set[int] = set()
        all_held = trio.Event()

        async def check() -> None:
            async with pool.connection() as conn:
                assert await conn.fetchval("SELECT 1") == 1
                pids.add(conn.backend_pid)
                if len(pids) == 5:
                    all_held.set()
                with trio.fail_after(5):
                    await all_held.wait()

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(check)
        assert len(pids) == 5


async def test_random_cancellations_on_dedicated_connections_lose_no_commits(
    pg_url: str, counters: str, observer: Connection, app_name: str
) -> None:
    # No pool release tidies up after a cancellation here: transaction() alone must.
    conns = [await connect(pg_url, application_name=app_name) for _ in range(STRESS_TASKS)]
    try:

        @asynccontextmanager
        async def own(index: int) -> AsyncIterator[Connection]:
            yield conns[index]

        tally = await run_stress(own, counters)
        await assert_stress_consistent(tally, counters, observer, app_name)
        for conn in conns:
            assert not conn.in_transaction
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        for conn in conns:
            await conn.close()


# --- pool recovery -------------------------------------------------------------------------------


async def test_pool_replaces_a_connection_the_server_terminated(
    pg_url: str, observer: Connection
) -> None:
    async with open_pool(pg_url, size=1) as pool:
        async with pool.connection() as conn:
            killed = conn.backend_pid
        # the timeout argument makes pg_terminate_backend wait until the backend has exited
        assert await observer.fetchval("SELECT pg_terminate_backend(%s, 5000)", [killed])
        async with pool.connection() as conn:
            assert conn.backend_pid != killed
            assert await conn.fetchval("SELECT 1") == 1
        stats = pool.statistics()
        assert (stats.replaced_total, stats.opened_total, stats.idle, stats.in_use) == (1, 2, 1, 0)


async def test_pool_replaces_a_connection_lost_while_in_use(
    pg_url: str, observer: Connection
) -> None:
    async with open_pool(pg_url, size=1) as pool:
        async with pool.connection() as conn:
            killed = conn.backend_pid
            await observer.fetchval("SELECT pg_terminate_backend(%s, 5000)", [killed])
            with pytest.raises(psycopg.OperationalError) as info:
                await conn.fetchval("SELECT 1")
            assert is_connection_lost(info.value)
            assert conn.closed
        async with pool.connection() as conn:
            assert conn.backend_pid != killed
            assert await conn.fetchval("SELECT 1") == 1
        assert pool.statistics().replaced_total == 1


async def test_pool_pings_a_connection_idle_longer_than_the_threshold(pg_url: str) -> None:
    async with open_pool(pg_url, size=1, ping_idle_after=0) as pool, pool.connection() as conn:
        assert conn.statistics().statements_executed == 1  # the ping
    async with open_pool(pg_url, size=1) as pool, pool.connection() as conn:
        assert conn.statistics().statements_executed == 0


async def test_an_idle_pooled_connection_is_borrowed_and_returned_without_a_scheduling_round(
    pg_url: str,
) -> None:
    """The hot path of `connection()` (a free slot, an idle connection needing no ping) awaits
    nothing of its own: under an already-cancelled scope the block is entered (the slow path
    would raise Cancelled at the slot), its first statement is the cancellation point, and the
    connection goes back idle and usable, not replaced."""
    async with open_pool(pg_url, size=1) as pool:
        async with pool.connection() as conn:
            pid = conn.backend_pid
        entered = False
        with trio.CancelScope() as scope:
            scope.cancel()
            async with pool.connection() as conn:
                entered = True
                assert conn.backend_pid == pid
                await conn.fetchval("SELECT 1")
        assert entered and scope.cancelled_caught
        async with pool.connection() as conn:
            assert conn.backend_pid == pid
            assert await conn.fetchval("SELECT 1") == 1
        stats = pool.statistics()
        assert (stats.idle, stats.in_use, stats.opened_total, stats.replaced_total) == (1, 0, 1, 0)


async def test_pool_opens_connections_lazily_up_to_its_size(pg_url: str) -> None:
    async with open_pool(pg_url, size=3) as pool:
        assert (pool.statistics().idle, pool.statistics().opened_total) == (1, 1)
        all_held = trio.Event()
        release = trio.Event()
        held = 0

        async def hold() -> None:
            nonlocal held
            async with pool.connection():
                held += 1
                if held == 3:
                    all_held.set()
                await release.wait()

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(hold)
            with trio.fail_after(5):
                await all_held.wait()
            assert pool.statistics().in_use == 3
            release.set()
        stats = pool.statistics()
        assert (stats.size, stats.idle, stats.in_use, stats.opened_total) == (3, 3, 0, 3)
    with pytest.raises(trio.ClosedResourceError):
        async with pool.connection():
            pass


async def test_open_pool_with_unreachable_server_raises_connection_error_promptly() -> None:
    with trio.fail_after(10), pytest.raises(psycopg.OperationalError) as info:
        async with open_pool("host=/nonexistent-trioq-socket-dir user=x dbname=x"):
            pass
    assert is_connection_lost(info.value)


async def test_open_pool_with_malformed_conninfo_raises_programming_error() -> None:
    """Without libpq's quote of the URL (it may hold the password)."""
    with trio.fail_after(10), pytest.raises(psycopg.ProgrammingError) as bad:
        async with open_pool("this is not a conninfo"):
            pass
    assert "this is not" not in str(bad.value)


@contextmanager
def low_descriptors_taken(above: int = 1100) -> Iterator[None]:
    """Occupy every free descriptor below `above`, so the next socket gets a higher number."""
    taken: list[int] = []
    try:
        while True:
            fd = os.open(os.devnull, os.O_RDONLY)
            taken.append(fd)
            if fd >= above:
                break
        yield
    finally:
        for fd in taken:
            os.close(fd)


async def test_connection_on_a_descriptor_above_1024_is_checked_and_returned_to_the_pool(
    pg_url: str,
) -> None:
    # select.select() raises ValueError for descriptors >= FD_SETSIZE (1024); the pool's
    # "has the server hung up?" check used it, so such a connection was neither returned to the
    # pool nor closed.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard > 1200, "the test needs > 1200 descriptors"
    if soft != resource.RLIM_INFINITY and soft <= 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    try:
        with low_descriptors_taken():
            async with open_pool(pg_url, size=1) as pool:
                async with pool.connection() as conn:
                    assert conn._raw.fileno() > 1024
                    pid = conn.backend_pid
                    assert await conn.fetchval("SELECT 1") == 1
                stats = pool.statistics()
                assert (stats.idle, stats.in_use, stats.replaced_total) == (1, 0, 0)
                async with pool.connection() as conn:
                    assert conn.backend_pid == pid  # the same connection, reused
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# --- trioq's statement timeouts are trioq's only ------------------------------------------------


async def test_callers_transaction_and_migrations_run_under_the_servers_timeouts(
    pg_url: str,
) -> None:
    conn = await connect(pg_url, statement_timeout=0.2, idle_in_transaction_session_timeout=0.3)
    try:
        assert await conn.fetchval("SHOW statement_timeout") == "200ms"
        async with conn.transaction(trioq_timeouts=False):
            assert await conn.fetchval("SHOW statement_timeout") == "0"
            assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "0"
            await conn.execute("SELECT pg_sleep(0.3)")  # longer than trioq's statement_timeout
        async with conn.transaction():
            assert await conn.fetchval("SHOW statement_timeout") == "200ms"
        # back to trioq's values once the caller's transaction has ended
        assert await conn.fetchval("SHOW statement_timeout") == "200ms"
        assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "300ms"
        with pytest.raises(psycopg.errors.QueryCanceled):
            await conn.execute("SELECT pg_sleep(0.5)")
    finally:
        await conn.close()


async def test_trioq_sessions_plan_without_jit_unless_the_conninfo_asks_for_it(
    pg_url: str,
) -> None:
    """With 1,000,000 ready jobs the claim's estimated cost passed jit_above_cost and every
    claim compiled 80 functions (50 ms): trioq's sessions run with jit off, pooled ones per
    transaction; a conninfo that sets it still wins."""
    for conn in (
        await connect(pg_url),
        await connect(pg_url, statement_timeout=None, idle_in_transaction_session_timeout=None),
    ):
        try:
            assert await conn.fetchval("SHOW jit") == "off"
        finally:
            await conn.close()
    pooled = await connect(pg_url, transaction_pooler=True)
    try:
        async with pooled.transaction():
            assert await pooled.fetchval("SHOW jit") == "off"
    finally:
        await pooled.close()
    asked = psycopg.conninfo.make_conninfo(pg_url, options="-c jit=on")
    conn = await connect(asked)
    try:
        assert await conn.fetchval("SHOW jit") == "on"
    finally:
        await conn.close()


async def test_timeouts_set_in_the_conninfo_options_win_inside_and_outside_transactions(
    pg_url: str,
) -> None:
    conninfo = psycopg.conninfo.make_conninfo(pg_url, options="-c statement_timeout=7s")
    conn = await connect(conninfo)
    try:
        assert await conn.fetchval("SHOW statement_timeout") == "7s"
        assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "1min"
        async with conn.transaction(trioq_timeouts=False):
            assert await conn.fetchval("SHOW statement_timeout") == "7s"
            assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "0"
    finally:
        await conn.close()


async def test_driver_runs_migrations_and_client_transactions_without_trioqs_timeouts(
    pg_url: str, pg_schema: str, observer: Connection
) -> None:
    from trioq._pg.driver import open_pg_driver

    async with open_pg_driver(pg_url, pg_schema, pool_size=2, statement_timeout=0.1) as driver:
        # A migration that has to wait longer than trioq's statement_timeout (here: for the
        # migration lock another session holds) still runs to the end.
        lock = "SELECT pg_advisory_lock(hashtext('trioq-migrate:' || %s))"
        await observer.execute(lock, [pg_schema])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver.migrate)

            async def migrate_is_blocked() -> bool:
                return bool(
                    await observer.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND wait_event = 'advisory' AND query LIKE %s",
                        ["%trioq-migrate:%"],
                    )
                )

            with trio.fail_after(10):
                await wait_until(migrate_is_blocked)

            async def migrate_waited_past_the_timeout() -> bool:
                return bool(
                    await observer.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' "
                        "AND query LIKE %s AND clock_timestamp() - state_change > '0.3 s'",
                        ["%trioq-migrate:%"],
                    )
                )

            # The timeout (0.1 s) would have fired by now, as the server's clock says.
            with trio.fail_after(10):
                await wait_until(migrate_waited_past_the_timeout)
            await observer.execute(
                "SELECT pg_advisory_unlock(hashtext('trioq-migrate:' || %s))", [pg_schema]
            )
        async with driver.transaction() as tx:
            assert await tx.fetch("SHOW statement_timeout") == [("0",)]
            await tx.execute("SELECT pg_sleep(0.2)")
        assert await driver.queue_status() == []
