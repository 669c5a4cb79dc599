"""Cluster-wide queue limits through the public API, the CLI and a running worker (the
drivers' rules are in trioq/testing/conformance/limits.py; the 4-process race is in
tests/test_queue_limits_race.py)."""

from __future__ import annotations

import datetime
import functools
import json
from typing import Any

import psycopg
import pytest
import trio
import trio.testing

import trioq
from tests.support import (
    Gate,
    force_running,
    in_thread,
    make_app,
    running_worker,
    scalar,
    wait_until,
)
from tests.test_metrics import samples_of
from trioq import cli
from trioq._core.explain import Gate as ExplainGate
from trioq._core.limits import Rate, parse_global_limit, parse_rate
from trioq._memory import MemoryDriver
from trioq.cli.ops import limit_line, read_status
from trioq.testing.conformance import claim


def trioq_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = cli.main([*argv])
    captured = capsys.readouterr()
    out = json.loads(captured.out) if "--json" in argv and code == 0 else captured.out
    return code, out, captured.err


@pytest.mark.parametrize(
    ("text", "rate"),
    [("100/m", Rate(100, 60)), ("5/s", Rate(5, 1)), (" 7 / hour ", Rate(7, 3600)), ("none", None)],
)
def test_rates_are_read_as_n_per_period(text: str, rate: Rate | None) -> None:
    assert parse_rate("rate", text) == rate


@pytest.mark.parametrize("text", ["0/s", "-1/m", "100/fortnight", "x/m", "100", "1.5/s", ""])
def test_a_bad_rate_names_the_accepted_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"^rate .*: expected N/PERIOD, .* one of s, m, h"):
        parse_rate("rate", text)


@pytest.mark.parametrize("value", [0, -1, "0", "-3", "x", 1.5, True, 100_001])
def test_a_bad_global_limit_names_the_accepted_form(value: object) -> None:
    with pytest.raises(ValueError, match=r"^limit .*: expected a whole number from 1 to 100000"):
        parse_global_limit("limit", value)


def test_the_app_refuses_bad_limits_naming_the_queue() -> None:
    with pytest.raises(ValueError, match=r"^queue_limits\['partner'\] 0: expected a whole"):
        trioq.App(queue_limits={"partner": 0})
    with pytest.raises(ValueError, match=r"^queue_rates\['partner'\] '100/fortnight': expected"):
        trioq.App(queue_rates={"partner": "100/fortnight"})


def test_queue_limit_and_rate_from_the_command_line_and_bad_values_change_nothing(
    pg_url: str, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--database-url", pg_url, "--schema", pg_schema]
    assert cli.main(["migrate", *base]) == 0
    capsys.readouterr()
    code, text, _ = trioq_cli(capsys, "queue", "limit", "partner", "5", *base)
    assert (code, text) == (0, "partner: global limit 5 (0 running)\n")
    code, shown, _ = trioq_cli(capsys, "queue", "rate", "partner", "100/m", *base, "--json")
    assert code == 0 and shown["limits"]["rate"] == "100/m"
    assert shown["limits"]["global_limit"] == 5
    for action, value in [("limit", "0"), ("limit", "-2"), ("rate", "100/fortnight")]:
        code, _, err = trioq_cli(capsys, "queue", action, "partner", value, *base)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "expected" in err and value in err, err
    code, _, err = trioq_cli(capsys, "queue", "rate", "partner", "x/m", *base)
    assert code == 2 and "N/PERIOD" in err
    code, text, _ = trioq_cli(capsys, "queue", "list", *base)
    assert text == "partner: global limit 5 (0 running), rate 100/m (0 in the current window)\n"
    assert trioq_cli(capsys, "queue", "limit", "partner", "none", *base)[0] == 0
    code, text, _ = trioq_cli(capsys, "queue", "rate", "partner", "none", *base)
    assert (code, text) == (0, "queue partner: no global or rate limit\n")
    assert trioq_cli(capsys, "queue", "list", *base)[1] == "no paused or limited queues\n"


async def test_a_limit_set_while_the_worker_runs_applies_without_a_restart(
    pg_url: str, pg_schema: str
) -> None:
    """A global limit of 1 lets one of 6 blocked jobs run; raised to 4 while the worker runs,
    four run within the poll interval; from the next claim on, never more than the limit."""
    app = make_app(pg_url, pg_schema, queue_limits={"partner": 1})
    gate = Gate()

    @app.task("call_partner", queue="partner")
    async def call_partner(ctx: trioq.Context, payload: object) -> None:
        gate.enter()
        await gate.release.wait()

    async with app.client(migrate=True) as client:
        await client.enqueue_many("call_partner", [{}] * 6)
        async with running_worker(app, ["partner"], concurrency=10, poll_interval=0.2):
            with trio.fail_after(10):
                await gate.wait_entered(1)
            [limit] = await client.queue_limits()
            assert (limit.global_limit, limit.running) == (1, 1)
            await client.set_queue_limit("partner", 4)
            with trio.fail_after(10):
                await gate.wait_entered(4)
            [limit] = await client.queue_limits()
            assert limit.running == 4
            gate.release.set()

            async def all_done() -> bool:
                jobs = await client.jobs(queue="partner")
                return {job.state for job in jobs} == {trioq.JobState.COMPLETED}

            with trio.fail_after(20):
                await wait_until(all_done)


async def test_a_listening_worker_reads_limits_once_and_again_when_told(
    pg_url: str, pg_schema: str
) -> None:
    """An idle worker whose listener works probes an unlimited queue's limits once (not once
    per poll interval: that doubled its idle statements), and reads them again when a limit is
    set from another process (the control channel's 'limits:QUEUE'), claiming through the
    gate from then on."""
    app = make_app(pg_url, pg_schema)

    @app.task("call_partner", queue="partner")
    async def call_partner(ctx: trioq.Context, payload: object) -> None:
        return None

    async with (
        app.client(migrate=True) as client,
        running_worker(app, ["partner"], concurrency=5, poll_interval=0.05) as worker,
    ):

        def calls(name: str) -> int:
            return worker.driver.statistics().calls.get(name, 0)

        async def idled() -> bool:  # 60 idle polls: 3 s or more, three old refresh periods
            return calls("job_claim_plain") >= 60

        with trio.fail_after(20):
            await wait_until(idled)
        assert calls("queue_limited") <= 2  # the first claim's, and after the self-probe
        assert calls("queue_limit_gate") == 0
        await client.set_queue_limit("partner", 3)  # the client's own driver, not the worker's

        async def gated() -> bool:
            return calls("queue_limit_gate") >= 1

        with trio.fail_after(10):
            await wait_until(gated)


async def test_a_polling_worker_reads_a_new_limit_within_a_refresh(
    pg_url: str, pg_schema: str
) -> None:
    """With notifications off nothing tells the worker: it reads an unlimited queue's limits
    again once per refresh (a second), so a limit set meanwhile still applies without a
    restart."""
    app = make_app(pg_url, pg_schema)

    @app.task("call_partner", queue="partner")
    async def call_partner(ctx: trioq.Context, payload: object) -> None:
        return None

    async with (
        app.client(migrate=True) as client,
        running_worker(
            app, ["partner"], concurrency=5, poll_interval=0.05, notifications=False
        ) as worker,
    ):

        def calls(name: str) -> int:
            return worker.driver.statistics().calls.get(name, 0)

        async def claimed() -> bool:
            return calls("job_claim_plain") >= 1

        with trio.fail_after(10):
            await wait_until(claimed)
        await client.set_queue_limit("partner", 3)

        async def gated() -> bool:
            return calls("queue_limit_gate") >= 1

        with trio.fail_after(10):
            await wait_until(gated)


async def test_a_rate_limited_queue_sleeps_until_its_next_start_instead_of_polling(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Virtual time on the memory driver: with 2/m, two of five jobs start at once; the claim
    loop then sends no claim until the window frees a start (60 s later), whatever its 1 s
    poll interval, and the next two start then."""
    app = trioq.App(schema="virtual", queue_rates={"partner": "2/m"})
    started: list[float] = []

    @app.task("call_partner", queue="partner")
    async def call_partner(ctx: trioq.Context, payload: object) -> None:
        started.append(trio.current_time())

    driver = MemoryDriver()
    async with app.client(driver=driver) as client:
        await client.enqueue_many("call_partner", [{}] * 5)
        t0 = trio.current_time()
        async with running_worker(app, ["partner"], concurrency=10, poll_interval=1.0) as worker:
            await trio.sleep(1)
            assert len(started) == 2
            samples = await samples_of(worker)
            assert samples[("trioq_queue_held_by_limit", (("limit", "rate"), ("queue", "partner")))]
            claims = driver.statistics().calls["queue_limit_gate"]
            await trio.sleep(57)  # the window is full until t0 + 60
            assert driver.statistics().calls["queue_limit_gate"] == claims
            assert len(started) == 2
            await trio.sleep(5)
            assert len(started) == 4
    assert started[2] - t0 == pytest.approx(60, abs=0.5)


async def test_explain_and_status_name_the_global_limit_and_the_rate_limit() -> None:
    app = trioq.App(schema="virtual", queue_limits={"partner": 1})

    @app.task("call_partner", queue="partner")
    async def call_partner(ctx: trioq.Context, payload: object) -> None:
        return None

    driver = MemoryDriver()
    async with app.client(driver=driver) as client:
        for change in app.queue_limits:
            await driver.queue_limit_set(change)
        first, second, third = await client.enqueue_many("call_partner", [{}, {}, {}])
        [claimed] = await claim(driver, 10, queue="partner", tasks=("call_partner",))
        assert claimed.id == first.id
        why = await client.explain(second.id)
        assert why.blocked_by == "limits"
        assert why.verdict == "queue 'partner' at its global limit 1/1 (all workers)"
        snapshot = await read_status(client)
        assert [limit_line(limit) for limit in snapshot.limits] == [
            "queue partner at its global limit 1/1"
        ]
        await client.set_queue_limit("partner", None)
        await client.set_queue_rate("partner", "1/h")
        gates = {gate.name: gate for gate in (await client.explain(second.id)).gates}
        assert gates["limits"] == ExplainGate("limits", False, "queue 'partner' under its rate 1/h")
        [limit] = await client.queue_limits()
        assert limit.recent_starts == 0  # the first start came before the rate was set
        assert len(await claim(driver, 10, queue="partner", tasks=("call_partner",))) == 1
        why = await client.explain(third.id)
        assert why.verdict.startswith("queue 'partner' rate limited until 20"), why.verdict
        assert why.verdict.endswith("(in 3600s) (1/h)"), why.verdict
        [line] = [limit_line(limit) for limit in (await read_status(client)).limits]
        assert line.startswith("queue partner rate 1/h: 1 started in the window, rate limited")


async def test_a_claim_waiting_for_the_gate_counts_the_jobs_claimed_while_it_waited(
    pg_url: str, pg_schema: str
) -> None:
    """Another session holds the queue's gate and has made 3 of its jobs running, not yet
    committed; a worker's claim waits for the lock (seen in pg_stat_activity) and, once the
    other commits, counts those 3 against the limit of 3 and claims none. A count on the
    snapshot from before the lock wait would have seen 0 running and claimed 3 more."""
    app = make_app(pg_url, pg_schema, queue_limits={"partner": 3})

    @app.task("call", queue="partner")
    async def call(ctx: trioq.Context, payload: object) -> None:
        return None

    async with app.client(migrate=True) as client:
        for change in app.queue_limits:
            await client.driver.queue_limit_set(change)
        jobs = [job.id for job in await client.enqueue_many("call", [{}] * 6, queue="partner")]
        other = await trio.to_thread.run_sync(
            functools.partial(psycopg.connect, pg_url, autocommit=True)
        )

        async def run(query: str, params: Any = None) -> None:
            await trio.to_thread.run_sync(other.execute, query, params)

        with other:
            await run("BEGIN")
            await run(f"SELECT * FROM {pg_schema}.queue_limit_gate('partner', 3)")
            await in_thread(
                force_running,
                other,
                pg_schema,
                jobs[:3],
                expires_in=datetime.timedelta(minutes=1),
            )
            claimed: list[int] = []

            async def claim_partner() -> None:
                found = await claim(client.driver, 10, queue="partner", tasks=("call",))
                claimed.extend(job.id for job in found)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(claim_partner)

                async def waits_for_the_lock() -> bool:
                    return bool(
                        await scalar(
                            pg_url,
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                            "'Lock' AND query LIKE '%%queue_limit_gate%%'",
                        )
                    )

                with trio.fail_after(10):
                    await wait_until(waits_for_the_lock)
                assert claimed == []
                await run("COMMIT")
            assert claimed == []
        [limit] = await client.queue_limits()
        assert limit.running == 3
