"""Concurrency keys: at most the key's limit running at once, across queues; a saturated key
never keeps other keys' or unkeyed jobs from free slots; every way out of `running` frees a
slot; a pattern's limit wins over the job's own and applies from the next claim."""

from __future__ import annotations

import collections
import datetime

from ..._core.explain import explain
from ..._seam.driver import ClaimedJob, Driver, Settlement
from ..._seam.services import MaintenancePass
from ..._seam.workflow import Spawn
from .harness import (
    DriverClock,
    claim,
    claim_round,
    complete,
    conformance_check,
    enqueue,
    expect,
    fail,
    ids,
    new_job,
    release,
    settle,
)


def per_key(jobs: list[ClaimedJob]) -> dict[str | None, int]:
    return dict(collections.Counter(job.concurrency_key for job in jobs))


@conformance_check
async def check_concurrency_key_runs_at_most_its_limit(driver: Driver, clock: DriverClock) -> None:
    await enqueue(
        driver,
        *[new_job(n, concurrency_key="t:1", concurrency_limit=2) for n in range(5)],
        *[new_job(10 + n, concurrency_key="t:2", concurrency_limit=3) for n in range(2)],
        new_job(20),
    )
    first = await claim(driver, limit=10)
    expect(per_key(first), {"t:1": 2, "t:2": 2, None: 1}, "first claim per key")
    expect(await claim(driver, limit=10), [], "claim while t:1 is at its limit")
    one = next(job for job in first if job.concurrency_key == "t:1")
    await complete(driver, one.lease)
    expect(per_key(await claim(driver, limit=10)), {"t:1": 1}, "claim after one t:1 completed")


@conformance_check
async def check_key_at_its_limit_leaves_free_slots_to_other_keys(
    driver: Driver, clock: DriverClock
) -> None:
    """A long backlog of one key, ahead in claim order, never fills the claim: the key gives
    its limit and the other keys and unkeyed jobs fill the rest."""
    busy = [new_job(n, concurrency_key="busy", concurrency_limit=2, priority=-1) for n in range(30)]
    others = [new_job(100 + n, concurrency_key=f"other:{n}") for n in range(4)]
    await enqueue(driver, *busy, *others, new_job(200), new_job(201))
    first = await claim(driver, limit=5)
    expect(per_key(first).get("busy"), 2, "the busy key gives its limit")
    expect(len(first), 5, "the other three slots go to other work")
    second = await claim(driver, limit=5)
    expect(per_key(second).get("busy"), None, "the saturated key gives nothing more")
    expect(len(second), 3, "every other ready job is claimed")


@conformance_check
async def check_concurrency_key_limit_holds_across_queues(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(
        driver,
        new_job(1, queue="a", concurrency_key="shared"),
        new_job(2, queue="b", concurrency_key="shared"),
    )
    [running] = await claim(driver, queue="a")
    expect(await claim(driver, queue="b"), [], "queue b while the key runs in queue a")
    await complete(driver, running.lease)
    expect(len(await claim(driver, queue="b")), 1, "queue b once the key is free")


@conformance_check
async def check_every_way_out_of_running_frees_the_key_slot(
    driver: Driver, clock: DriverClock
) -> None:
    """Retry, fail, release (drain), sleep and lease recovery each free the job's slot; a key
    without any limit runs one job at a time."""
    await enqueue(driver, *[new_job(n, concurrency_key="k") for n in range(6)])
    for way in ("retry", "fail", "release", "sleep"):
        [job] = await claim(driver, limit=5)
        expect(await claim(driver, limit=5), [], f"claim while the key's one slot runs ({way})")
        if way == "retry":
            await fail(driver, job.lease, retry_delay=3600)
        elif way == "fail":
            await fail(driver, job.lease, None)
        elif way == "release":
            await release(driver, job.lease)
        else:
            next_year = job.run_at + datetime.timedelta(days=365)
            await settle(driver, Settlement(job.lease, "sleep", wake_at=next_year))
    [job] = await claim(driver, limit=5, lease_seconds=10)
    await clock.advance(11)
    report = await driver.maintenance_pass(MaintenancePass())
    expect(dict(report.recovered).get(job.id), "ready", "the expired lease is recovered")
    expect(len(await claim(driver, limit=5)), 1, "claim after the lease recovery")


@conformance_check
async def check_pattern_limit_wins_and_applies_from_the_next_claim(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(
        driver,
        *[new_job(n, concurrency_key="tenant:1", concurrency_limit=1) for n in range(6)],
        *[new_job(10 + n, concurrency_key="tenant:2", concurrency_limit=1) for n in range(3)],
    )
    expect(await driver.concurrency_limit_set("tenant:*", 3), True, "set the pattern")
    expect(await driver.concurrency_limit_set("tenant:2", 2), True, "set the whole key")
    expect(per_key(await claim(driver)), {"tenant:1": 3, "tenant:2": 2}, "claim under patterns")
    status = {s.key: (s.running, s.limit) for s in await driver.concurrency_key_status()}
    expect(status, {"tenant:1": (3, 3), "tenant:2": (2, 2)}, "key status")
    limits = [(limit.pattern, limit.max_running) for limit in await driver.concurrency_limit_list()]
    expect(limits, [("tenant:*", 3), ("tenant:2", 2)], "the limits, by pattern")
    await driver.concurrency_limit_set("tenant:*", 4)
    expect(per_key(await claim(driver)), {"tenant:1": 1}, "a raised limit, from the next claim")
    expect(await driver.concurrency_limit_set("tenant:*", None), True, "remove the pattern")
    expect(await driver.concurrency_limit_set("tenant:*", None), False, "remove it again")
    expect(await claim(driver), [], "4 running above the job's own limit of 1: nothing more")


@conformance_check
async def check_concurrency_keyed_due_job_is_claimed_through_its_key(
    driver: Driver, clock: DriverClock
) -> None:
    """A delayed keyed job becomes claimable when due, under its key's limit."""
    [later] = await enqueue(driver, new_job(1, concurrency_key="d", delay_seconds=60))
    [now] = await enqueue(driver, new_job(2, concurrency_key="d"))
    [job] = await claim(driver)
    expect(job.id, now, "the due job")
    await clock.advance(61)
    first = await claim_round(driver)
    second = await claim_round(driver) if first.promoted else first
    expect(ids(list(first.claimed) + list(second.claimed)), [], "due, but the key is at its limit")
    await complete(driver, job.lease)
    expect(ids(await claim(driver)), [later], "claimed once the key is free")


@conformance_check
async def check_a_lowered_limit_starts_nothing_until_running_is_below_it(
    driver: Driver, clock: DriverClock
) -> None:
    """Running jobs above a lowered limit finish; no new one starts until fewer than the new
    limit run, and then only up to it."""
    await enqueue(driver, *[new_job(n, concurrency_key="low") for n in range(8)])
    await driver.concurrency_limit_set("low", 4)
    running = await claim(driver)
    expect(len(running), 4, "claimed under the limit of 4")
    await driver.concurrency_limit_set("low", 2)
    await complete(driver, running[0].lease)
    expect(await claim(driver), [], "3 running, limit 2: nothing starts")
    await complete(driver, running[1].lease, running[2].lease)
    expect(len(await claim(driver)), 1, "1 running (its slot above the new limit): 1 more")
    expect(await claim(driver), [], "2 running: at the new limit")


@conformance_check
async def check_a_spawned_child_keeps_its_concurrency_key(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(driver, new_job(1))
    [parent] = await claim(driver)
    child = new_job(2, concurrency_key="kid", concurrency_limit=1)
    [spawned] = await driver.job_spawn_many([Spawn(parent.lease, 0, child)])
    await enqueue(driver, new_job(3, concurrency_key="kid"))
    claimed = await claim(driver)
    expect([job.concurrency_key for job in claimed], ["kid"], "one job of the key runs")
    expect(ids(claimed), [spawned.child_id], "the child, first in claim order")


@conformance_check
async def check_explain_reports_the_limit_the_claim_applies_to_a_key(
    driver: Driver, clock: DriverClock
) -> None:
    """Jobs of one key that carry different limits: the claim takes the key's limit from its
    next job (its first ready one in claim order), and explain reports that limit for every
    job of the key, not the job's own (`_core.concurrency.claim_limit`)."""

    async def key_gate(job_id: int) -> tuple[bool, str]:
        facts = await driver.job_explain(job_id)
        assert facts is not None
        [gate] = [gate for gate in explain(facts).gates if gate.name == "concurrency_key"]
        return gate.blocking, gate.detail.split(" (")[0]

    await enqueue(driver, new_job(0, concurrency_key="k", concurrency_limit=3))
    await claim(driver)
    [strict, loose] = await enqueue(
        driver,
        new_job(1, concurrency_key="k", concurrency_limit=1),
        new_job(2, concurrency_key="k", concurrency_limit=3),
    )
    expect(await claim(driver), [], "the next job's limit of 1, with one running")
    for job_id in (strict, loose):
        expect(await key_gate(job_id), (True, "key k at its limit 1/1"), f"explain {job_id}")
    # The other way round: a next job that allows 3 lets a job that carries 1 start beside it.
    [head, second, carries_one] = await enqueue(
        driver,
        new_job(3, concurrency_key="j", concurrency_limit=3, priority=-1),
        new_job(4, concurrency_key="j", concurrency_limit=3, priority=-1),
        new_job(5, concurrency_key="j", concurrency_limit=1),
    )
    expect(ids(await claim(driver, limit=1)), [head], "the first job of j")
    expect(await key_gate(carries_one), (False, "key j runs 1/3"), "explain the one carrying 1")
    expect(ids(await claim(driver)), [second, carries_one], "both start, under the next's 3")
