"""`Connection.fetch_native` (trioq/_pg/native.py: one statement without a worker thread) keeps
the promises of the threaded methods: results and errors as psycopg gives them, a statement
prepared once per session (none with prepare_threshold=None), and cancellation that cancels on
the server and leaves the connection idle, usable and without a lock or a lost commit."""

from __future__ import annotations

import collections
import random

import psycopg
import psycopg.errors
import pytest
import trio
import trio.testing

from tests.test_pg_adapter import (
    PROMPT,
    app_name,
    assert_row_lock_free_and_value,
    cancel_once_sleeping,
    counters,
    wait_until_backend_waits,
)
from trioq._pg import Connection, connect, is_connection_lost, open_pool
from trioq._pg.pool import PoolStatistics

__all__ = ["app_name", "counters"]  # fixtures, imported for the tests below

SLEEP = b"SELECT pg_sleep($1::float8)"


async def test_rows_and_types_come_back_as_from_the_threaded_fetch(pg_url: str) -> None:
    conn = await connect(pg_url)
    try:
        sql = b"SELECT $1::bigint + 1, $2::text, $3::jsonb, $4::timestamptz IS NULL, $5::int[]"
        params = [41, "tëxt", '{"a": [1]}', None, "{1,2}"]
        native = await conn.fetch_native(sql, params)
        threaded = await conn.fetch_positional(sql, params)
        assert native == threaded == [(42, "tëxt", {"a": [1]}, True, [1, 2])]
        assert await conn.fetch_native(b"SELECT 1 WHERE false", []) == []
    finally:
        await conn.close()


async def test_typed_parameters_run_a_statement_written_for_psycopg_unchanged(pg_url: str) -> None:
    # No casts: the parameters' types come from psycopg's dumpers, as in the threaded fetch
    # (untyped, `array_length($4, 1)` could not be resolved). 25 dumps as int2 and 40,000 as
    # int4, so the statement gets one prepared version per set of types, and both answer.
    conn = await connect(pg_url)
    try:
        sql = b"SELECT $1 + 1, $2 || 'x', $3::text IS NULL, array_length($4, 1), $5 LIMIT $1"
        for value in (25, 40_000, 25):
            params = [value, "t", None, [1, 2, 3], 0.5]
            native = await conn.fetch_native(sql, params, typed=True)
            threaded = await conn.fetch_positional(sql, params)
            assert native == threaded == [(value + 1, "tx", True, 3, 0.5)]
        prepared = await conn.fetch_native(
            b"SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'trioq%'", []
        )
    finally:
        await conn.close()
    assert prepared == [(3,)]  # int2, int4, and this query


@pytest.mark.parametrize("prepare_threshold", [5, None])
async def test_a_statement_is_prepared_once_per_session_and_never_for_pgbouncer(
    pg_url: str, prepare_threshold: int | None
) -> None:
    conn = await connect(pg_url, prepare_threshold=prepare_threshold)
    try:
        for n in range(3):
            assert await conn.fetch_native(b"SELECT $1::int * 2", [n]) == [(n * 2,)]
        prepared = await conn.fetch_native(
            b"SELECT name FROM pg_prepared_statements WHERE name LIKE 'trioq%'", []
        )
    finally:
        await conn.close()
    expected = [] if prepare_threshold is None else [("trioq_0",), ("trioq_1",)]
    assert sorted(prepared) == expected  # the pg_prepared_statements query is prepared too


async def test_a_statement_psycopg_deallocated_is_prepared_again_in_and_out_of_transactions(
    pg_url: str,
) -> None:
    """psycopg answers a ROLLBACK it ran, once it has prepared statements of its own, with
    DEALLOCATE ALL before its next statement, which also drops trioq's. Outside a transaction
    the native fetch prepares again; inside one it never depends on a prepared statement (a
    failed EXECUTE would abort the caller's transaction)."""
    conn = await connect(pg_url)
    try:
        sql = b"SELECT $1::int + 10"
        assert await conn.fetch_native(sql, [1]) == [(11,)]
        for _ in range(6):  # psycopg prepares a statement from its 5th run
            assert await conn.fetchval("SELECT 1") == 1
        with pytest.raises(RuntimeError):
            async with conn.transaction():  # its ROLLBACK clears psycopg's prepared state
                raise RuntimeError
        assert await conn.fetchval("SELECT 2") == 2  # preceded by psycopg's DEALLOCATE ALL
        assert await conn.fetch("SELECT name FROM pg_prepared_statements") == []
        async with conn.transaction():
            assert await conn.fetch_native(sql, [2]) == [(12,)]
        assert await conn.fetch_native(sql, [3]) == [(13,)]
        await conn.execute("DEALLOCATE ALL")
        assert await conn.fetch_native(sql, [4]) == [(14,)]
        assert await conn.fetch("SELECT name FROM pg_prepared_statements") == [("trioq_2",)]
    finally:
        await conn.close()


async def test_a_prepared_statement_whose_result_type_a_migration_changed_is_prepared_again(
    pg_url: str, pg_schema: str
) -> None:
    """A migration that changes a returned column's type under a running worker (0032 made 14
    of the jobs table's columns domains) fails the session's prepared statement with "cached
    plan must not change result type" (0A000): outside a transaction it is prepared again."""
    table = f"{pg_schema}.retyped"
    conn = await connect(pg_url)
    try:
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {pg_schema}")
        await conn.execute(f"CREATE TABLE {table} (name text)")
        await conn.execute(f"INSERT INTO {table} VALUES ('a')")
        sql = f"SELECT name FROM {table} WHERE $1::int > 0".encode()
        assert await conn.fetch_native(sql, [1]) == [("a",)]
        await conn.execute(
            f"CREATE DOMAIN {pg_schema}.short_name AS text CHECK (length(VALUE) < 9)"
        )
        await conn.execute(f"ALTER TABLE {table} ALTER COLUMN name TYPE {pg_schema}.short_name")
        assert await conn.fetch_native(sql, [2]) == [("a",)]
    finally:
        await conn.close()


async def test_a_server_error_raises_its_psycopg_class_and_the_connection_stays_usable(
    pg_url: str,
) -> None:
    conn = await connect(pg_url)
    try:
        with pytest.raises(psycopg.errors.DivisionByZero):
            await conn.fetch_native(b"SELECT 1 / $1::int", [0])
        assert await conn.fetch_native(b"SELECT 1 / $1::int", [1]) == [(1,)]
        with pytest.raises(psycopg.errors.UndefinedTable) as info:
            await conn.fetch_native(b"SELECT * FROM no_such_table_here", [])
        assert info.value.sqlstate == "42P01"
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            async with conn.transaction():
                with pytest.raises(psycopg.errors.DivisionByZero):
                    await conn.fetch_native(b"SELECT 1 / $1::int", [0])
        assert not conn.in_transaction
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


async def test_cancelled_native_fetch_is_cancelled_on_the_server_and_conn_is_reusable(
    pg_url: str, observer: Connection
) -> None:
    conn = await connect(pg_url)
    try:

        async def work() -> None:
            await conn.fetch_native(SLEEP, [5])

        assert await cancel_once_sleeping(observer, conn.backend_pid, work) < PROMPT
        state = await observer.fetchval(
            "SELECT state FROM pg_stat_activity WHERE pid = %s", [conn.backend_pid]
        )
        assert state == "idle"
        assert await conn.fetch_native(b"SELECT $1::int", [7]) == [(7,)]
    finally:
        await conn.close()


async def test_cancelled_native_fetch_in_a_transaction_rolls_back_and_releases_its_lock(
    pg_url: str, counters: str, observer: Connection
) -> None:
    conn = await connect(pg_url)
    try:

        async def work() -> None:
            async with conn.transaction():
                update = f"UPDATE {counters} SET n = n + 1 WHERE id = $1::int".encode()
                await conn.fetch_native(update, [1])
                await conn.fetch_native(SLEEP, [5])

        assert await cancel_once_sleeping(observer, conn.backend_pid, work) < PROMPT
        assert not conn.in_transaction
        await assert_row_lock_free_and_value(observer, counters, expected=0)
    finally:
        await conn.close()


async def test_a_statement_whose_prepare_was_cancelled_is_prepared_again_under_a_new_name(
    pg_url: str, counters: str, observer: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PREPARE the caller gave up on may still be completed by the server (its cancel request
    can arrive too late); the next call of the statement must not prepare that name again
    ("already exists"). Made deterministic: the PREPARE waits for a table lock, and the
    "server-side cancel" releases the lock instead, so the server does complete it."""
    holder = psycopg.connect(pg_url)
    holder.execute(f"LOCK TABLE {counters} IN ACCESS EXCLUSIVE MODE")
    monkeypatch.setattr(Connection, "_cancel_on_server", lambda self: holder.rollback())
    conn = await connect(pg_url)
    sql = f"SELECT count(*) FROM {counters} WHERE id >= $1::int".encode()
    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def cancel_once_waiting() -> None:
                    with trio.fail_after(10):
                        pid = conn.backend_pid
                        await wait_until_backend_waits(observer, pid, event_type="Lock")
                    scope.cancel()

                nursery.start_soon(cancel_once_waiting)
                await conn.fetch_native(sql, [0])
        assert scope.cancelled_caught
        assert await conn.fetch_native(sql, [5]) == [(5,)]
        assert await conn.fetch_native(sql, [8]) == [(2,)]
    finally:
        await conn.close()
        holder.close()


async def test_a_connection_lost_during_a_native_fetch_is_a_connection_loss(
    pg_url: str, observer: Connection
) -> None:
    async with open_pool(pg_url, size=1) as pool:
        async with pool.connection() as conn:
            killed = conn.backend_pid
            await observer.fetchval("SELECT pg_terminate_backend(%s, 5000)", [killed])
            with pytest.raises(psycopg.OperationalError) as info:
                await conn.fetch_native(b"SELECT $1::int", [1])
            assert is_connection_lost(info.value)
            assert conn.closed
        async with pool.connection() as conn:
            assert conn.backend_pid != killed
        assert pool.statistics().replaced_total == 1


async def test_random_cancellations_of_native_fetches_lose_no_commits(
    pg_url: str, counters: str, observer: Connection, app_name: str
) -> None:
    """10 tasks, 300 transactions of a native UPDATE and a native pg_sleep(0-8 ms) under random
    0-40 ms deadlines: the counters add up to the commits, no session is left busy and no
    pooled connection had to be replaced."""
    rng = random.Random(7)
    tally: collections.Counter[str] = collections.Counter()
    update = f"UPDATE {counters} SET n = n + 1 WHERE id = $1::int".encode()
    async with open_pool(pg_url, size=5, application_name=app_name) as pool:

        async def worker() -> None:
            while tally["started"] < 300:
                tally["started"] += 1
                # Every other transaction has time to commit, however loaded the machine.
                deadline = 10.0 if tally["started"] % 2 else rng.uniform(0, 0.040)
                with trio.move_on_after(deadline) as scope:
                    async with pool.connection() as conn, conn.transaction():
                        await conn.fetch_native(update, [rng.randrange(10)])
                        await conn.fetch_native(SLEEP, [rng.uniform(0, 0.008)])
                    tally["committed"] += 1
                tally["cancelled"] += scope.cancelled_caught

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(worker)
        statistics = pool.statistics()
    # Every cancelled connection came back idle: none had to be replaced.
    assert (statistics.in_use, statistics.replaced_total) == (0, 0)
    assert tally["committed"] > 0 and tally["cancelled"] > 0
    assert await observer.fetchval(f"SELECT sum(n) FROM {counters}") == tally["committed"]
    busy = await observer.fetch(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND state <> 'idle'",
        [app_name],
    )
    assert busy == []


# --- Pool.fetch_native: the pool's hot path for one statement --------------------------------


async def test_pool_fetch_native_reuses_one_connection_and_keeps_the_pools_books(
    pg_url: str,
) -> None:
    """Sequential calls take the hot path on one connection; concurrent calls beyond the size
    wait for a slot (the full path) and never hold more connections than the size."""
    async with open_pool(pg_url, size=2) as pool:
        pids = {(await pool.fetch_native(b"SELECT pg_backend_pid()", []))[0][0] for _ in range(20)}
        assert len(pids) == 1
        assert pool.statistics() == PoolStatistics(2, 1, 0, 1, 0)
        peak = 0

        async def call() -> None:
            nonlocal peak
            peak = max(peak, pool.statistics().in_use + 1)
            sql = b"SELECT $2::int FROM pg_sleep($1::float8)"
            assert await pool.fetch_native(sql, [0.01, 1]) == [(1,)]

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(call)
        stats = pool.statistics()
    assert peak <= 2
    assert (stats.in_use, stats.idle, stats.opened_total, stats.replaced_total) == (0, 2, 2, 0)


async def test_pool_fetch_native_after_an_error_or_a_cancellation_frees_its_slot(
    pg_url: str, observer: Connection
) -> None:
    """A size-1 pool: a failed statement and a cancelled one each give the connection back (a
    slot kept by either would make the next call wait forever), idle and not replaced."""
    async with open_pool(pg_url, size=1) as pool:
        with pytest.raises(psycopg.errors.DivisionByZero):
            await pool.fetch_native(b"SELECT 1 / $1::int", [0])
        [(pid,)] = await pool.fetch_native(b"SELECT pg_backend_pid()", [])

        async def work() -> None:
            await pool.fetch_native(SLEEP, [5])

        assert await cancel_once_sleeping(observer, pid, work) < PROMPT
        with trio.fail_after(10):
            assert await pool.fetch_native(b"SELECT pg_backend_pid()", []) == [(pid,)]
        assert pool.statistics() == PoolStatistics(1, 1, 0, 1, 0)


async def test_pool_fetch_native_replaces_a_terminated_connection_and_pings_an_old_one(
    pg_url: str, observer: Connection
) -> None:
    """The hot path leaves what it cannot vouch for to `connection()`: a connection the server
    hung up on is replaced, one idle past `ping_idle_after` is pinged first."""
    async with open_pool(pg_url, size=1) as pool:
        [(killed,)] = await pool.fetch_native(b"SELECT pg_backend_pid()", [])
        assert await observer.fetchval("SELECT pg_terminate_backend(%s, 5000)", [killed])
        [(pid,)] = await pool.fetch_native(b"SELECT pg_backend_pid()", [])
        assert pid != killed
        assert pool.statistics().replaced_total == 1
    async with open_pool(pg_url, size=1, ping_idle_after=0) as pool:
        await pool.fetch_native(b"SELECT 1", [])
        async with pool.connection() as conn:
            executed = conn.statistics().statements_executed
        assert executed == 3  # the ping before the statement, the statement, the ping now


async def test_pool_fetch_native_on_a_closed_pool_raises(pg_url: str) -> None:
    async with open_pool(pg_url, size=1) as pool:
        pass
    with pytest.raises(trio.ClosedResourceError):
        await pool.fetch_native(b"SELECT 1", [])


async def test_a_session_lets_go_of_its_last_result(pg_url: str) -> None:
    # The per-session transformer must not keep the last reply's rows alive on an idle
    # pooled connection (a 200-row claim with history can be megabytes).
    conn = await connect(pg_url)
    try:
        rows = await conn.fetch_native(b"SELECT repeat('x', 1000) FROM generate_series(1, 50)", [])
        assert len(rows) == 50
        transformer = conn._native.transformer(conn._raw)
        assert transformer.pgresult is None
    finally:
        await conn.close()


async def test_settlement_array_literals_round_trip_through_postgres(pg_url: str) -> None:
    import datetime

    from trioq._pg.driver import _nullable_array

    class Float(float):  # numpy's float64 is one: its repr is np.float64(1.5)
        def __repr__(self) -> str:
            return f"Float({float(self)})"

    texts = ['{"a": "\\\\ \\" , } NULL"}', "", "NULL", "ünïcode", None]
    when = datetime.datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=datetime.UTC)
    conn = await connect(pg_url)
    try:
        rows = await conn.fetch_native(
            b"SELECT $1::text[], $2::float8[], $3::timestamptz[]",
            [
                _nullable_array(texts),
                _nullable_array([Float(1.5), None, 2]),
                _nullable_array([when, None]),
            ],
        )
    finally:
        await conn.close()
    assert rows == [(texts, [1.5, None, 2.0], [when, None])]
    with pytest.raises(TypeError, match="array element True"):
        _nullable_array([True])


# Every kind of JSON a payload, result or checkpoint can be, as jsonb.
JSON_VALUES = [
    "{}", "null", "[]", "0", "-12345678901234567890", "1.5e+100", "true", "false", '""',
    '"ünïcode \\\\ \\" \\n"', '{"a": {"b": [1, 2.5, null, true, "x"]}, "c": {}}',
    '[{}, [], [[]], {"": ""}]', '"\\ud83d\\ude00"', '{"k": "' + "x" * 5000 + '"}',
]  # fmt: skip


@pytest.mark.parametrize("binary", [False, True])
async def test_jsonb_of_every_kind_loads_as_psycopgs_own_loader_loads_it(
    pg_url: str, binary: bool
) -> None:
    """trioq's jsonb loaders (a fast path for `{}` and `null`) give exactly what psycopg's
    give, in text and binary result format; each `{}` is a new dict (handlers may mutate it)."""
    sql = (
        b"SELECT v::jsonb, NULL::jsonb FROM unnest($1::text[]) WITH ORDINALITY AS t(v, n)"
        b" ORDER BY n"
    )
    literal = (
        "{"
        + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in JSON_VALUES)
        + "}"
    )
    conn = await connect(pg_url)
    try:
        native = await conn.fetch_native(sql, [literal], binary=binary)
        threaded = await conn.fetch_positional(sql, [literal])
    finally:
        await conn.close()
    assert native == threaded
    assert [type(row[0]) for row in native] == [type(row[0]) for row in threaded]
    assert len(native) == len(JSON_VALUES) and all(row[1] is None for row in native)
    assert native[0][0] == {} and native[0][0] is not threaded[0][0]
    native[0][0]["mutated"] = True
    assert (await _first_empty_object(pg_url, binary)) == {}


async def _first_empty_object(pg_url: str, binary: bool) -> object:
    conn = await connect(pg_url)
    try:
        rows = await conn.fetch_native(
            b"SELECT '{}'::jsonb FROM generate_series(1, 2)", [], binary=binary
        )
    finally:
        await conn.close()
    assert rows[0][0] is not rows[1][0]
    return rows[0][0]


async def test_binary_results_are_the_values_text_results_are(pg_url: str) -> None:
    """Every column type the claim returns, with and without NULLs, decodes to equal values of
    equal types in binary and text result format (the claim reads binary)."""
    sql = (
        b"SELECT $1::bigint, $2::int, 7::smallint, 'caf\xc3\xa9'::text, $3::uuid, now(),"
        b" true, '{1,2}'::bigint[], '{a,\"b c\"}'::text[], '{\"a\": 1}'::jsonb,"
        b" NULL::bigint, NULL::int, NULL::text, NULL::uuid, NULL::timestamptz, NULL::boolean,"
        b" NULL::bigint[], NULL::text[], '{}'::bigint[], '{}'::text[]"
    )
    params = [2**40, 3, "0b9e4d5a-1c2f-4e3d-8a7b-6c5d4e3f2a1b"]
    conn = await connect(pg_url)
    try:
        async with conn.transaction():  # one transaction: now() is the same in both
            (text_row,) = await conn.fetch_native(sql, params)
            (binary_row,) = await conn.fetch_native(sql, params, binary=True)
    finally:
        await conn.close()
    assert [type(value) for value in text_row] == [type(value) for value in binary_row]
    assert text_row == binary_row
    assert text_row[3] == "caf\u00e9"


async def test_a_column_read_from_the_last_row_only_is_decoded_there_and_the_rest_as_before(
    pg_url: str,
) -> None:
    """`last_row_only` (the claims' `now`): the last row's value is the one a full decode
    gives; every other column of every row is unchanged; a single row is decoded whole."""
    sql = (
        b"SELECT g, now() + g * interval '1 second', 'caf\xc3\xa9'::text, NULL::timestamptz"
        b" FROM generate_series(1, $1::int) AS g"
    )
    conn = await connect(pg_url)
    try:
        async with conn.transaction():  # one transaction: now() is the same in every call
            for count in (1, 3):
                full = await conn.fetch_native(sql, [count], binary=True)
                rows = await conn.fetch_native(sql, [count], binary=True, last_row_only=(1,))
                assert rows[-1] == full[-1]
                assert [row[:1] + row[2:] for row in rows] == [row[:1] + row[2:] for row in full]
            assert all(type(row[1]) is bytes for row in rows[:-1])
            # The next statement on the session decodes every column again.
            assert await conn.fetch_native(sql, [3], binary=True) == full
    finally:
        await conn.close()


async def test_settlement_parameters_round_trip_through_postgres(pg_url: str) -> None:
    """The settle's arrays (tokens as 32 hex digits, the states the outcome rules decided,
    the all-complete batch's NULL arrays) and the claim's task arrays read back as the values
    they came from."""
    import datetime
    import uuid

    from trioq._core.outcomes import rule_of
    from trioq._pg.driver import claim_params, settle_params
    from trioq._seam.driver import Claim, Settlement
    from trioq._seam.lease import Lease

    leases = [Lease(n, n + 1, uuid.uuid4()) for n in range(1, 4)]
    when = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    batches = [
        tuple(Settlement(lease, "complete", result_json='{"r": "\\""}') for lease in leases),
        (
            Settlement(leases[0], "retry", error_json='{"e": 1}', delay_seconds=2.5),
            Settlement(leases[1], "sleep", wake_at=when),
            Settlement(leases[2], "complete", result_json="null"),
        ),
        (),
    ]
    sql = (
        b"SELECT $1::bigint[], $2::int[], $3::uuid[], $4::text[], $5::text[], $6::text[],"
        b" $7::float8[], $8::timestamptz[], $9::text[], $10::text[]"
    )
    names = ("ids", "attempts", "lease_tokens", "states", "results", "errors", "delays", "wake_ats")
    names += ("tasks", "task_versions")
    conn = await connect(pg_url)
    try:
        for batch in batches:
            params = settle_params(batch) | claim_params(
                Claim(
                    queue="q",
                    limit=0,
                    lease_seconds=1.0,
                    worker_id=uuid.uuid4(),
                    tasks=("t", 'q"uo\\te'),
                    task_versions=None if batch else ("t@1", "t@2"),
                )
            )
            ((*arrays,),) = await conn.fetch_native(sql, [params[name] for name in names])
            assert arrays == [
                [s.lease.id for s in batch],
                [s.lease.attempt for s in batch],
                [s.lease.lease_token for s in batch],
                [rule_of(s.kind).state.value for s in batch],
                [s.result_json for s in batch],
                [s.error_json for s in batch],
                [s.delay_seconds for s in batch],
                [s.wake_at for s in batch],
                ["t", 'q"uo\\te'],
                None if batch else ["t@1", "t@2"],
            ]
    finally:
        await conn.close()
