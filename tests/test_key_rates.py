"""Rate limits per concurrency key through the public API, the CLI and a running worker (the
drivers' rules are in trioq/testing/conformance/key_rates.py; the 4-process races are in
tests/test_key_rates_race.py)."""

from __future__ import annotations

import functools
import json
import uuid
from typing import Any

import attrs
import psycopg
import pytest
import trio
import trio.testing

import trioq
from tests.support import make_app, running_worker, scalar, wait_until
from trioq import cli
from trioq._memory import MemoryDriver
from trioq._seam.driver import Claim
from trioq.cli.ops import read_status, status_tables
from trioq.testing.conformance import claim


@pytest.mark.parametrize(
    ("pattern", "rate", "message"),
    [
        ("tenant:*", "0/s", r"^rate '0/s': expected N/PERIOD, N a whole number from 1 to 10000"),
        ("tenant:*", "10/fortnight", r"^rate '10/fortnight': expected N/PERIOD"),
        ("tenant:*", "x/s", r"^rate 'x/s': expected N/PERIOD"),
        ("", "10/s", r"^pattern: '' must be a key"),
        ("ten*ant:*", "10/s", r"^pattern: 'ten\*ant:\*' must be a key"),
    ],
)
async def test_bad_key_rates_are_refused_in_one_line_and_write_nothing(
    pg_url: str, pg_schema: str, pattern: str, rate: str, message: str
) -> None:
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        with pytest.raises(ValueError, match=message):
            await client.set_key_rate(pattern, rate)
        assert await client.key_rates() == []


def test_the_app_refuses_bad_key_rates_naming_the_pattern() -> None:
    with pytest.raises(ValueError, match=r"^key_rates\['tenant:\*'\] '0/s': expected N/PERIOD"):
        trioq.App(key_rates={"tenant:*": "0/s"})
    with pytest.raises(ValueError, match=r"^pattern: 'a\*b' must be a key"):
        trioq.App(key_rates={"a*b": "1/s"})


def test_trioq_key_rate_sets_lists_and_removes_rates_and_status_names_a_full_window(
    pg_url: str, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--database-url", pg_url, "--schema", pg_schema]
    assert cli.main(["migrate", *base]) == 0
    capsys.readouterr()
    assert cli.main(["key", "rate", "tenant:*", "1/h", *base]) == 0
    assert capsys.readouterr().out == "key tenant:*: at most 1/h starts\n"
    for bad in ("0/s", "10/fortnight", "5"):
        assert cli.main(["key", "rate", "tenant:*", bad, *base]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"key rate {bad!r}: expected N/PERIOD" in err, err
    assert cli.main(["key", "rate", "a*b", "1/s", *base]) == 2
    assert "pattern: 'a*b' must be a key" in capsys.readouterr().err
    assert cli.main(["key", "rate", "tenant:*", *base]) == 2
    assert "trioq key rate PATTERN N/PERIOD|none" in capsys.readouterr().err

    async def start_one() -> None:
        app = make_app(pg_url, pg_schema)
        async with app.client() as client:
            work = trioq.declare_task("work")
            await client.enqueue_many(
                work, [{}] * 2, concurrency_key="tenant:42", concurrency_limit=5
            )
            round_ = Claim("default", ("work",), 10, 30, uuid.uuid4())
            result = await client.driver.job_claim(round_)
            assert len(result.claimed) == 1  # the rate's one start this hour
            assert result.key_rate_limited_until is not None

    trio.run(start_one)
    assert cli.main(["key", "list", *base, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(row["pattern"], row["rate"]) for row in listed["rates"]] == [("tenant:*", "1/h")]
    [rated] = listed["rated_keys"]
    assert (rated["key"], rated["rate"], rated["recent_starts"]) == ("tenant:42", "1/h", 1)
    assert rated["rate_limited_until"] is not None
    assert cli.main(["key", "list", *base]) == 0
    text = capsys.readouterr().out
    assert "tenant:*: at most 1/h starts" in text
    assert "key tenant:42 rate 1/h: 1 started in the window, rate limited until" in text
    assert cli.main(["status", *base]) == 0
    assert "key tenant:42 rate 1/h: rate limited until" in capsys.readouterr().out
    assert cli.main(["key", "rate", "tenant:*", "none", *base]) == 0
    assert capsys.readouterr().out == "key tenant:*: rate removed\n"
    assert cli.main(["key", "rate", "tenant:*", "none", *base]) == 0
    assert capsys.readouterr().out == "key tenant:*: rate removed (it had none)\n"


async def test_a_rate_limited_key_waits_for_its_window_while_other_work_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Virtual time on the memory driver, with a 25 s poll interval: of 5 jobs of a key rated
    2/m, two start at once; an unkeyed job enqueued meanwhile starts at once; the loop sends
    no claim but its polls while the key waits, and the next two start when the window frees
    a start (60 s after the first), not at the next poll (75 s)."""
    app = trioq.App(schema="virtual", key_rates={"t:*": "2/m"})
    started: list[tuple[str, float]] = []

    @app.task("sync", concurrency_key="t:{tenant}", concurrency_limit=10)
    async def sync(ctx: trioq.Context, payload: dict[str, Any]) -> None:
        started.append((str(ctx.job.concurrency_key), trio.current_time()))

    @app.task("other")
    async def other(ctx: trioq.Context, payload: object) -> None:
        started.append(("-", trio.current_time()))

    driver = MemoryDriver()
    async with app.client(driver=driver) as client:
        await client.enqueue_many("sync", [{"tenant": 1}] * 5)
        t0 = trio.current_time()
        async with running_worker(app, ["default"], concurrency=10, poll_interval=25.0):
            await trio.sleep(1)
            assert [key for key, _ in started] == ["t:1", "t:1"]
            await client.enqueue("other", {})
            await trio.sleep(1)
            assert started[2][0] == "-" and started[2][1] - t0 < 2
            claims = driver.statistics().calls["job_claim"]
            await trio.sleep(56)  # until t0 + 58: the key's window is full until t0 + 60
            assert len(started) == 3
            polls = driver.statistics().calls["job_claim"] - claims
            assert polls <= 3, polls  # the polls at 25 s and 50 s, no more
            await trio.sleep(5)
            assert len(started) == 5
    assert started[3][1] - t0 == pytest.approx(60, abs=0.1)


async def test_explain_and_status_name_a_key_held_back_by_its_rate() -> None:
    app = trioq.App(schema="virtual")
    driver = MemoryDriver()
    async with app.client(driver=driver) as client:
        await client.set_key_rate("tenant:*", "2/m")
        work = trioq.declare_task("work")
        jobs = await client.enqueue_many(
            work, [{}] * 3, concurrency_key="tenant:42", concurrency_limit=5
        )
        gates = {gate.name: gate for gate in (await client.explain(jobs[0].id)).gates}
        assert gates["key_rate"].detail == "key tenant:42 under its rate 2/m (0 in the window)"
        assert len(await claim(driver, 10, tasks=("work",))) == 2
        why = await client.explain(jobs[2].id)
        assert why.blocked_by == "key_rate"
        assert why.verdict.startswith("rate limited until 20"), why.verdict
        assert why.verdict.endswith("(in 60s) (2/m, key tenant:42)"), why.verdict
        snapshot = await read_status(client)
        [rated] = snapshot.rated_keys
        assert (rated.key, rated.recent_starts) == ("tenant:42", 2)
        assert rated.rate_limited_until is not None
        assert status_tables(snapshot) is not None


async def test_without_key_rates_claims_run_the_statements_they_ran_before(
    pg_url: str, pg_schema: str
) -> None:
    """A cluster with no key rate never runs the rated statement: unkeyed claims are plain
    (only a queue's first claim is a full one, and asks whether a rate exists), keyed claims
    run job_claim, asking at most once a second; once a rate is set, keyed claims run the
    rated one. Each claim asks for the form its predecessor said (`plain_next`), as the claim
    loop does."""
    app = make_app(pg_url, pg_schema)
    work = trioq.declare_task("work")
    async with app.client(migrate=True) as client:
        driver = client.driver
        await client.enqueue_many(work, [{}] * 30)
        params = Claim("default", ("work",), 10, 30, uuid.uuid4())
        plain = False

        async def claim() -> None:
            nonlocal plain
            plain = (await driver.job_claim(attrs.evolve(params, plain=plain))).plain_next

        for _ in range(4):
            await claim()
        calls = dict(driver.statistics().calls)
        assert calls["job_claim_plain"] == 3 and calls["job_claim"] == 1
        assert calls.get("key_rated", 0) <= 1 and "job_claim_rated" not in calls
        await client.enqueue_many(work, [{}] * 20, concurrency_key="k", concurrency_limit=50)
        for _ in range(3):
            await claim()
        calls = dict(driver.statistics().calls)
        assert calls["job_claim"] >= 3, calls  # keyed rounds: the full statement
        assert calls["key_rated"] <= calls["job_claim"], calls
        assert "job_claim_rated" not in calls, calls
        await client.set_key_rate("k", "5/h")
        await client.enqueue_many(work, [{}] * 10, concurrency_key="k", concurrency_limit=50)
        result = await driver.job_claim(params)
        assert driver.statistics().calls["job_claim_rated"] == 1
        assert len(result.claimed) == 5 and result.key_rate_limited_until is not None


async def test_a_claim_racing_for_a_start_slot_rechecks_it_after_the_other_commits(
    pg_url: str, pg_schema: str
) -> None:
    """Another session has taken the only start slot of a key rated 1/h and not committed; a
    worker's claim, whose snapshot saw the slot free, waits for that row (seen in
    pg_stat_activity) and, once the other commits, finds the slot's newest start inside the
    window and claims nothing. A slot judged on the claim's snapshot would have started a
    second job in the same hour."""
    app = make_app(pg_url, pg_schema)
    work = trioq.declare_task("work")
    async with app.client(migrate=True) as client:
        await client.set_key_rate("k", "1/h")
        first, _ = await client.enqueue_many(
            work, [{}] * 2, concurrency_key="k", concurrency_limit=10
        )
        other = await trio.to_thread.run_sync(
            functools.partial(psycopg.connect, pg_url, autocommit=True)
        )

        async def run(query: str, params: Any = None) -> None:
            await trio.to_thread.run_sync(other.execute, query, params)

        with other:
            await run("BEGIN")
            await run(
                f"INSERT INTO {pg_schema}.concurrency_rate_starts "
                "(concurrency_key, slot, started_at, rate_period, job_id) "
                f"VALUES ('k', 0, {pg_schema}.db_now(), 3600, %s)",
                (first.id,),
            )
            claimed: list[int] = []

            async def claim_k() -> None:
                found = await claim(client.driver, 10, tasks=("work",))
                claimed.extend(job.id for job in found)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(claim_k)

                async def waits_for_the_slot() -> bool:
                    # The claim waits for the other transaction (its uncommitted slot row);
                    # pg_stat_activity keeps only the statement's first 1 KiB.
                    return bool(
                        await scalar(
                            pg_url,
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                            "'Lock' AND wait_event = 'transactionid' "
                            "AND query LIKE 'WITH RECURSIVE%%due AS MATERIALIZED%%'",
                        )
                    )

                with trio.fail_after(10):
                    await wait_until(waits_for_the_slot)
                assert claimed == []
                await run("COMMIT")
            assert claimed == []
        [rated] = await client.key_rate_status()
        assert (rated.key, rated.recent_starts) == ("k", 1)
        assert (
            await scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.concurrency_holds") == 0
        )  # no hold was left behind for the job not claimed
