"""`trioq status`: queues, workers, the incident health list and the database pressure figures."""

from __future__ import annotations

import datetime
import json

import trio

import trioq
from tests.support import (
    apply_functions,
    apply_migration,
    force_running,
    in_thread,
    make_app,
    running_worker,
    scalar,
)
from trioq import cli


async def test_status_json_and_tables_carry_the_health_list_and_pressure_figures(
    pg_url: str, pg_schema: str, capsys: object
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("work")
    async def work(ctx: trioq.Context, payload: object) -> None:
        return None

    async with app.client(migrate=True) as client:
        async with running_worker(app, ["default"]):
            done = await client.enqueue("work", {})
            with trio.fail_after(10):
                await client.wait_result(done.id)
        await client.enqueue_many("work", [{}, {}])
        await client.enqueue("work", {}, delay=600)
        # A running row whose worker is gone and whose lease has expired.
        newest_due = await scalar(
            pg_url,
            f"SELECT max(id) FROM {pg_schema}.jobs WHERE state = 'ready' AND run_at <= now()",
        )
        await in_thread(
            force_running,
            pg_url,
            pg_schema,
            [newest_due],
            expires_in=datetime.timedelta(minutes=-1),
        )
    args = ["status", "--database-url", pg_url, "--schema", pg_schema]
    assert await trio.to_thread.run_sync(cli.main, [*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    health = data["health"]
    assert (health["ready_backlog"], health["expired_ownership"], health["stale_running"]) == (
        1,
        1,
        1,
    )
    assert health["deadlocks"] >= 0 and health["waiting_locks"] >= 0
    assert health["jobs_table_bytes"] > 0 and health["jobs_index_bytes"] > 0
    assert 0 <= health["cache_hit_ratio"] <= 1
    assert health["backends"] and all(n > 0 for n in health["backends"].values())
    [demand] = data["demand"]
    assert (demand["ready"], demand["running"], demand["scheduled"], demand["due_now"]) == (
        1,
        1,
        1,
        1,
    )
    assert await trio.to_thread.run_sync(cli.main, args) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    for text in ("health list", "expired ownership", "database pressure", "cache hit ratio"):
        assert text in out


def test_migration_tunes_the_runs_table_for_its_churn(pg_url: str, pg_schema: str) -> None:
    import psycopg

    import trioq._sql as sql

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {pg_schema}")
        apply_functions(conn, pg_schema)
        for migration in sql.migrations(pg_schema):
            apply_migration(conn, migration)
        row = conn.execute(
            # The records are written once (migration 0049): the churn is the runs' (a row
            # inserted and deleted per job, renewals in place).
            "SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
            (f"{pg_schema}.job_runs",),
        ).fetchone()
    assert row is not None
    options = dict(option.split("=") for option in row[0])
    assert options["fillfactor"] == "70"
    assert float(options["autovacuum_vacuum_scale_factor"]) <= 0.02


def test_vacuum_never_truncates_the_hot_tables_and_rows_survive(
    pg_url: str, pg_schema: str
) -> None:
    """Vacuum's tail truncation takes an ACCESS EXCLUSIVE lock that stalls every claim: the
    tables each state change writes turn it off (migration 24), keeping the rows they hold."""
    import psycopg

    import trioq._sql as sql

    # attempts and checkpoints are partitioned by job id epoch (migration 0043): their
    # partitions hold the rows, the first two from the migration on.
    hot = (
        "job_runs",
        "job_rows_e0",
        "job_rows_e1",
        "job_outcomes_e0",
        "job_outcomes_e1",
        "partition_locks",
        "attempts_e0",
        "attempts_e1",
        "checkpoints_e0",
        "checkpoints_e1",
        "workers",
    )
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {pg_schema}")
        apply_functions(conn, pg_schema)
        for migration in sql.migrations(pg_schema):
            if migration.version == 24:
                conn.execute(
                    f"INSERT INTO {pg_schema}.jobs (queue, task, payload, state, priority, run_at,"
                    " created_at) SELECT 'default', 'noop', '{}', 'ready', 0, now(), now()"
                    " FROM generate_series(1, 50)"
                )
            apply_migration(conn, migration)
        options = {
            table: conn.execute(
                "SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
                (f"{pg_schema}.{table}",),
            ).fetchone()
            for table in hot
        }
        ready = conn.execute(f"SELECT count(*) FROM {pg_schema}.jobs WHERE state = 'ready'")
        count = ready.fetchone()
    for table, row in options.items():
        assert row is not None and row[0] is not None, table
        stored = dict(option.split("=", 1) for option in row[0])
        assert stored.get("vacuum_truncate") in ("off", "false"), (table, row[0])
    assert count == (50,)


async def test_status_shows_every_task_a_worker_serves(
    pg_url: str, pg_schema: str, capsys: object
) -> None:
    app = make_app(pg_url, pg_schema)
    names = [f"reports_task_number_{n:02}" for n in range(20)]
    for name in names:

        @app.task(name)
        async def handler(ctx: trioq.Context, payload: object) -> None:
            return None

    async with app.client(migrate=True), running_worker(app, ["default"]):
        args = ["status", "--database-url", pg_url, "--schema", pg_schema]
        assert await trio.to_thread.run_sync(cli.main, args) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert [name for name in names if f"{name}@1" not in out] == [], out
