"""Rate limits per concurrency key (migration 0028): at most N starts of each matching key in
any window of the period, counted per key, whichever queue and worker start them; a key held
back by its rate leaves the claim's other slots to other keys and unkeyed jobs, and the claim
names when the key may start again."""

from __future__ import annotations

import collections
import datetime

from ..._core.explain import explain
from ..._core.limits import Rate
from ..._seam.driver import ClaimedJob, Driver, NewJob
from .harness import (
    DriverClock,
    claim,
    claim_round,
    complete,
    conformance_check,
    database_now,
    enqueue,
    expect,
    new_job,
)

ROOMY = 100  # a concurrency limit the checks never reach: only the rate holds keys back


def per_key(jobs: tuple[ClaimedJob, ...] | list[ClaimedJob]) -> dict[str | None, int]:
    return dict(collections.Counter(job.concurrency_key for job in jobs))


def keyed(key: str, n: int, count: int, **fields: object) -> list[NewJob]:
    """`count` jobs of concurrency key `key` (payloads n, n + 1, ...)."""
    return [
        new_job(n + i, concurrency_key=key, concurrency_limit=ROOMY, **fields) for i in range(count)
    ]


@conformance_check
async def check_key_rate_allows_n_starts_per_window_per_key(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(driver, *keyed("t:1", 0, 5), *keyed("t:2", 10, 5), new_job(20), new_job(21))
    expect(await driver.concurrency_rate_set("t:*", Rate(2, 60.0)), True, "the rate is set")
    before = await database_now(driver)
    first = await claim_round(driver, 20)
    expect(per_key(first.claimed), {"t:1": 2, "t:2": 2, None: 2}, "2 starts per key, unkeyed all")
    until = first.key_rate_limited_until
    assert until is not None, "a key held back by its rate names when it may start again"
    after = await database_now(driver)
    window = datetime.timedelta(seconds=60)
    assert before + window <= until <= after + window, (before, until, after)
    await complete(driver, *(job.lease for job in first.claimed))
    held = await claim_round(driver, 20)
    expect(held.claimed, (), "completions give no starts back")
    expect(held.key_rate_limited_until, until, "the held claim names the same time")
    status = {s.key: s for s in await driver.concurrency_rate_status()}
    expect(sorted(status), ["t:1", "t:2"], "both keys have starts in their window")
    expect((status["t:1"].rate, status["t:1"].recent_starts), (Rate(2, 60.0), 2), "listed")
    expect(status["t:1"].rate_limited_until, until, "listed: rate limited until")
    [listed] = await driver.concurrency_rate_list()
    expect((listed.pattern, listed.rate), ("t:*", Rate(2, 60.0)), "the pattern's rate")
    await clock.advance(61)
    expect(per_key(await claim(driver, 20)), {"t:1": 2, "t:2": 2}, "the next window's starts")


@conformance_check
async def check_key_rate_window_slides_start_by_start(driver: Driver, clock: DriverClock) -> None:
    await enqueue(driver, *keyed("k", 0, 10))
    await driver.concurrency_rate_set("k", Rate(2, 10.0))
    expect(len(await claim(driver, 1)), 1, "the first start")
    await clock.advance(5)
    expect(len(await claim(driver, 10)), 1, "the second start, 5 s later")
    await clock.advance(5.5)
    expect(len(await claim(driver, 10)), 1, "the first start left the window: one more")
    expect(len(await claim(driver, 10)), 0, "the second is still in it")


@conformance_check
async def check_a_rate_limited_key_leaves_free_slots_to_other_keys(
    driver: Driver, clock: DriverClock
) -> None:
    """A long backlog of one rated key, ahead in claim order, never fills the claim."""
    await enqueue(
        driver,
        *keyed("busy", 0, 30, priority=-1),
        *keyed("other:1", 100, 2),
        *keyed("other:2", 200, 2),
        new_job(300),
    )
    await driver.concurrency_rate_set("busy", Rate(1, 3600.0))
    first = await claim(driver, 4)
    expect(per_key(first).get("busy"), 1, "the rated key gives its one start")
    expect(len(first), 4, "the other slots go to other keys")
    second = await claim(driver, 4)
    expect(per_key(second).get("busy"), None, "the rated key gives nothing more this hour")
    expect(len(second), 2, "what is left of the other work")


@conformance_check
async def check_key_rate_and_limit_both_apply_and_a_lowered_rate_counts_the_window(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(driver, *keyed("t:9", 0, 6))
    await driver.concurrency_limit_set("t:*", 4)
    await driver.concurrency_rate_set("t:9", Rate(2, 3600.0))
    expect(len(await claim(driver, 10)), 2, "the rate is the tighter bound")
    expect(await driver.concurrency_rate_set("t:9", None), True, "the rate is removed")
    expect(await driver.concurrency_rate_set("t:9", None), False, "nothing left to remove")
    expect(len(await claim(driver, 10)), 2, "without the rate, the key's limit of 4")
    expect(await driver.concurrency_rate_list(), [], "no rate is left")
    await enqueue(driver, *keyed("r", 100, 10))
    await driver.concurrency_rate_set("r", Rate(5, 3600.0))
    expect(len(await claim(driver, 3)), 3, "3 of 5 starts")
    await driver.concurrency_rate_set("r", Rate(4, 3600.0))
    expect(len(await claim(driver, 10)), 1, "lowered to 4: the 3 starts in the window count")
    await driver.concurrency_rate_set("r", Rate(2, 3600.0))
    expect(len(await claim(driver, 10)), 0, "lowered below the starts in the window: none")


@conformance_check
async def check_explain_names_a_key_held_back_by_its_rate(
    driver: Driver, clock: DriverClock
) -> None:
    [first_id, waiting_id] = await enqueue(driver, *keyed("t:42", 0, 2))
    await driver.concurrency_rate_set("t:*", Rate(1, 60.0))
    expect(len(await claim(driver, 10)), 1, "one start a minute")
    facts = await driver.job_explain(waiting_id)
    assert facts is not None
    why = explain(facts)
    expect(why.blocked_by, "key_rate", "the waiting job is held back by its key's rate")
    assert why.verdict.startswith("rate limited until "), why.verdict
    assert why.verdict.endswith("(1/m, key t:42)"), why.verdict
    facts = await driver.job_explain(first_id)
    assert facts is not None
    assert explain(facts).blocked_by != "key_rate", "a started job is not held back by the rate"
