"""Cron schedules: declaration errors, exactly-once firing across workers and a leader change
(Postgres, virtual database time via SqlClock), misfire policies after a downtime, leadership,
and the scheduler's idle cost and per-second precision in trio virtual time."""

from __future__ import annotations

import datetime
import functools
import itertools

import pytest
import trio
import trio.testing

import trioq
from tests.support import running_worker, sql_rows, wait_until
from trioq._memory import MemoryDriver
from trioq._pg import Connection
from trioq._pg.driver import open_pg_driver
from trioq._runtime.services.scheduler import Scheduler
from trioq._runtime.services.worker import Worker, WorkerConfig
from trioq._seam.driver import Driver
from trioq._seam.schedules import ScheduleFireReport
from trioq.testing import SqlClock

HOUR = datetime.timedelta(hours=1)


def scheduled_app(pg_url: str | None, schema: str, **periodic: object) -> trioq.App:
    app = trioq.App(pg_url, schema=schema)

    @app.periodic("every", **periodic)  # type: ignore[arg-type]
    @app.task("tick")
    async def tick(ctx: trioq.Context, payload: object) -> None:
        return None

    return app


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "61 * * * *"}, "cron: '61 * * * *' is not a valid cron expression"),
        ({"cron": "every day"}, "cron: 'every day' is not a valid cron expression"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "timezone: 'Mars/Olympus'"),
        ({"cron": "0 9 * * *", "timezone": "../../etc/passwd"}, "is not a known IANA"),
        ({"cron": "0 9 * * *", "misfire": "sometimes"}, "misfire: 'sometimes' must be one of"),
        ({"cron": "0 9 * * *", "catchup_limit": 0}, "catchup_limit: 0 must be an integer"),
    ],
)
async def test_bad_schedules_are_refused_at_declaration(
    options: dict[str, object], message: str
) -> None:
    app = trioq.App(schema="declared")

    @app.task("digest")
    async def digest(ctx: trioq.Context, payload: object) -> None:
        return None

    with pytest.raises(ValueError, match=message.replace("*", r"\*").replace(".", r"\.")):
        app.periodic("nightly", task="digest", **options)  # type: ignore[arg-type]
    async with app.client(driver=MemoryDriver()) as client:
        with pytest.raises(ValueError, match=message.split(":")[0]):
            await client.schedule("nightly", "digest", **options)  # type: ignore[arg-type]
        assert await client.schedules() == []
    assert app.schedules == {}


async def test_schedule_of_an_unknown_task_or_a_bad_payload_is_refused() -> None:
    app = scheduled_app(None, "declared", cron="0 9 * * *")
    with pytest.raises(ValueError, match="task: 'nope' is not registered"):
        app.periodic("other", cron="0 9 * * *", task="nope")
    with pytest.raises(ValueError, match="periodic: schedule 'every' is already declared"):
        app.periodic("every", cron="0 9 * * *", task="tick")
    with pytest.raises(trioq.PayloadError, match="payload"):
        app.periodic("bad-payload", cron="0 9 * * *", task="tick", payload={"x": float("nan")})
    async with app.client(driver=MemoryDriver()) as client:
        with pytest.raises(trioq.UnknownTask):
            await client.schedule("x", "nope", cron="0 9 * * *")


async def test_decorator_registers_an_undecorated_handler_as_a_task() -> None:
    app = trioq.App(schema="declared")

    @app.periodic("cleanup", cron="*/5 * * * *", timezone="Europe/Paris", misfire="skip")
    async def cleanup(ctx: trioq.Context, payload: object) -> None:
        return None

    assert app.tasks["cleanup"].handler is cleanup
    schedule = app.schedules["cleanup"]
    assert (schedule.task, schedule.timezone, schedule.misfire, schedule.origin) == (
        "cleanup",
        "Europe/Paris",
        "skip",
        "code",
    )


# --- Postgres, virtual database time --------------------------------------------------------


async def run_pg_worker(
    app: trioq.App,
    pg_url: str,
    schema: str,
    reports: list[tuple[int, ScheduleFireReport]],
    n: int,
    *,
    task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A worker with a driver (pool, sessions) of its own, like a separate process; cancel to
    stop it hard (its connections close, so its locks go with them)."""
    async with open_pg_driver(pg_url, schema, pool_size=3) as driver:
        worker = Worker(
            driver=driver,
            tasks=dict(app.tasks),
            config=WorkerConfig(concurrency=2, grace_seconds=0, write_timeout=10),
            schedules=tuple(app.schedules.values()),
        )
        worker.scheduler.on_tick = lambda report: reports.append((n, report))
        await worker.run(task_status=task_status)


async def job_runs(pg_url: str, schema: str) -> list[datetime.datetime]:
    rows = await trio.to_thread.run_sync(
        sql_rows, pg_url, f"SELECT run_at FROM {schema}.jobs WHERE task = 'tick' ORDER BY run_at"
    )
    return [row[0] for row in rows]


async def wait_fired(driver: Driver, name: str, count: int) -> None:
    async def fired() -> bool:
        return any(s.name == name and s.fired >= count for s in await driver.schedule_list())

    with trio.fail_after(20):
        await wait_until(fired)  # other sessions' progress: nothing to wait on here


async def test_three_workers_enqueue_every_occurrence_once_across_a_leader_change(
    pg_url: str, pg_schema: str
) -> None:
    app = scheduled_app(pg_url, pg_schema, cron="* * * * *", misfire="all")
    reports: list[tuple[int, ScheduleFireReport]] = []
    async with open_pg_driver(pg_url, pg_schema, pool_size=2) as driver:
        await driver.migrate()
        clock = await SqlClock.install(driver)
        async with trio.open_nursery() as nursery:
            scopes = {n: trio.CancelScope() for n in range(3)}
            workers: dict[int, Worker] = {}
            for n, scope in scopes.items():

                async def run(n: int = n, scope: trio.CancelScope = scope, *, task_status) -> None:
                    with scope:
                        await run_pg_worker(
                            app, pg_url, pg_schema, reports, n, task_status=task_status
                        )

                workers[n] = await nursery.start(run)
            await wait_until_timed(driver)
            for minute in range(1, 9):
                await clock.advance(60)
                for worker in workers.values():
                    worker.scheduler.wake()
                await wait_fired(driver, "every", minute)
                if minute == 4:
                    # The leader's tick report follows its commit, which wait_fired saw.
                    await wait_reported(reports, minute)
                    # Stop the worker that led the last tick, hard, mid-way.
                    leader = next(n for n, report in reversed(reports) if report.fired)
                    scopes[leader].cancel()
                    del workers[leader]
            nursery.cancel_scope.cancel()
        runs = await job_runs(pg_url, pg_schema)
    leaders = [n for n, report in reports if report.fired]
    assert len(runs) == 8 == len(set(runs)), runs
    assert all(b - a == datetime.timedelta(minutes=1) for a, b in itertools.pairwise(runs))
    assert len(set(leaders)) >= 2, f"no leader change: every occurrence came from {leaders}"


async def wait_reported(reports: list[tuple[int, ScheduleFireReport]], count: int) -> None:
    async def reported() -> bool:
        return sum(len(report.fired) for _, report in reports) >= count

    with trio.fail_after(20):
        await wait_until(reported)


async def wait_until_timed(driver: Driver) -> None:
    async def timed() -> bool:
        return not (await driver.schedule_next_due()).due

    with trio.fail_after(20):
        await wait_until(timed)


@pytest.mark.parametrize(
    ("misfire", "expected_hours"),
    [("all", [0, 1, 2, 3, 4]), ("latest", [4]), ("skip", [])],
)
async def test_misfire_policy_after_a_downtime(
    pg_url: str, pg_schema: str, misfire: str, expected_hours: list[int]
) -> None:
    app = scheduled_app(pg_url, pg_schema, cron="0 * * * *", misfire=misfire)
    async with open_pg_driver(pg_url, pg_schema, pool_size=2) as driver:
        await driver.migrate()
        clock = await SqlClock.install(driver)
        await driver.schedule_upsert_many(list(app.schedules.values()))
        assert await run_scheduler_until_quiet(driver) == []  # times the new schedule
        # Down from now until 4.5 hours after the first fire time (nobody running).
        due = await driver.schedule_next_due()
        assert due.next_fire_at is not None
        await clock.advance((due.next_fire_at - due.now).total_seconds() + 4.5 * 3600)
        fired = await run_scheduler_until_quiet(driver)
        first_fire = due.next_fire_at
        assert fired == [first_fire + hours * HOUR for hours in expected_hours]
        [schedule] = await driver.schedule_list()
        assert schedule.missed == 5 - len(expected_hours)
        assert schedule.next_fire_at == first_fire + 5 * HOUR
        # Back on time: the next occurrence fires under every policy.
        await clock.advance(1800)
        assert await run_scheduler_until_quiet(driver) == [first_fire + 5 * HOUR]


async def run_scheduler_until_quiet(driver: Driver) -> list[datetime.datetime]:
    """Run one Scheduler until nothing is due; return the fire times it enqueued (the first
    call on a new schedule returns [] after timing it)."""
    reports: list[ScheduleFireReport] = []
    scheduler = Scheduler(driver, on_tick=reports.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)

        async def quiet() -> bool:
            return bool(reports) and not (await driver.schedule_next_due()).due

        with trio.fail_after(20):
            await wait_until(quiet)
        nursery.cancel_scope.cancel()
    return [occurrence.fire_at for report in reports for occurrence in report.fired]


async def test_only_the_holder_of_the_scheduler_lock_enqueues(
    pg_url: str, pg_schema: str, observer: Connection
) -> None:
    from trioq._runtime.services.scheduler import plan_schedules
    from trioq._seam.schedules import ScheduleFireDue

    app = scheduled_app(pg_url, pg_schema, cron="* * * * *")
    async with open_pg_driver(pg_url, pg_schema, pool_size=2) as driver:
        await driver.migrate()
        await driver.schedule_upsert_many(list(app.schedules.values()))
        tick = functools.partial(driver.schedule_fire_due, ScheduleFireDue(plan=plan_schedules))
        async with observer.transaction():
            await observer.execute(
                "SELECT pg_advisory_xact_lock(hashtext('trioq-scheduler:' || %s))", [pg_schema]
            )
            blocked = await tick()
            assert (blocked.leader, blocked.due) == (False, 0)
            [schedule] = await driver.schedule_list()
            assert schedule.next_fire_at is None
        assert (await tick()).leader
        [schedule] = await driver.schedule_list()
        assert schedule.next_fire_at is not None


# --- trio virtual time, in-memory driver ----------------------------------------------------


async def test_idle_worker_with_ten_daily_schedules_makes_few_scheduler_statements(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = trioq.App(schema="virtual")

    @app.task("digest")
    async def digest(ctx: trioq.Context, payload: object) -> None:
        return None

    for n in range(10):
        app.periodic(f"digest-{n}", cron=f"{n} 9 * * *", task="digest")
    driver = MemoryDriver()
    async with app.client(driver=driver), running_worker(app, concurrency=25, poll_interval=1.0):
        await trio.sleep(1)
        before = dict(driver.statistics().calls)
        await trio.sleep(3600)  # an idle virtual hour (the schedules fire at 09:0n)
        calls = driver.statistics().calls
    scheduler = sum(
        calls.get(name, 0) - before.get(name, 0)
        for name in ("schedule_next_due", "scheduler_lead", "schedule_due_lock")
    )
    total = sum(calls.values()) - sum(before.values())
    assert scheduler <= 3600 / 60 + 1  # one read per idle_seconds
    # The whole worker stays within the idle budget of the benchmark (1.2 statements/s).
    assert total <= 1.2 * 3600


async def test_per_second_schedule_enqueues_every_fire_time_once_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = trioq.App(schema="virtual")
    ran: list[int] = []

    @app.periodic("heartbeat", cron="* * * * * *", misfire="all")
    async def heartbeat(ctx: trioq.Context, payload: object) -> None:
        ran.append(ctx.job.id)

    driver = MemoryDriver()
    async with (
        app.client(driver=driver) as client,
        running_worker(app, concurrency=5, poll_interval=1.0),
    ):
        await trio.sleep(300)
        [schedule] = await driver.schedule_list()
        jobs = [await client.get_job(n) for n in range(1, schedule.fired + 1)]
    assert 299 <= schedule.fired <= 301
    runs = [job.run_at for job in jobs]
    assert all(b - a == datetime.timedelta(seconds=1) for a, b in itertools.pairwise(runs))
    assert max(job.created_at - job.run_at for job in jobs) < datetime.timedelta(seconds=1)
    assert len(set(ran)) == len(ran) >= schedule.fired - 2  # the last may still be queued


async def test_schedules_command_lists_schedules_as_json(
    pg_url: str, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from trioq import cli

    app = scheduled_app(pg_url, pg_schema, cron="0 9 * * *", timezone="Europe/Paris")
    async with app.client(migrate=True) as client:
        assert await client.schedule("adhoc", "tick", cron="*/5 * * * *", payload={"n": 1})
        assert not await client.schedule("adhoc", "tick", cron="*/5 * * * *", payload={"n": 2})
        await client.driver.schedule_upsert_many(list(app.schedules.values()))
    argv = ["schedules", "--database-url", pg_url, "--schema", pg_schema, "--json"]
    assert await trio.to_thread.run_sync(cli.main, argv) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(s["name"], s["origin"], s["payload"]) for s in listed] == [
        ("adhoc", "runtime", {"n": 2}),
        ("every", "code", None),
    ]
    assert listed[1]["timezone"] == "Europe/Paris"
    async with app.client() as client:
        assert await client.unschedule("adhoc")
        assert not await client.unschedule("adhoc")
    assert await trio.to_thread.run_sync(cli.main, argv[:-1]) == 0
    assert "every" in capsys.readouterr().out
