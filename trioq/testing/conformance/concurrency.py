"""Concurrency: two workers claiming, renewing and settling at once, over one backlog.

The workers run as two tasks of one trio run. On `MemoryDriver` they interleave at every
statement (each checkpoints first); on PostgreSQL their statements run at the same time on
separate pooled connections, so these checks exercise the row locks and `SKIP LOCKED`. Each
worker remembers what it holds; a worker forgets a job before it sends the job's settlement,
so the bookkeeping never claims more than the database does.
"""

from __future__ import annotations

import collections
import json
import uuid

import attrs
import trio

from ..._seam.driver import ClaimedJob, Driver, Settlement
from ..._seam.lease import Lease
from ..._seam.services import RenewLeases
from .harness import (
    LEASE_SECONDS,
    DriverClock,
    claim,
    claim_round,
    conformance_check,
    enqueue,
    expect,
    new_job,
    record,
    renew,
    settle,
)

KEYS = ("k1", "k2", "k3")
MAX_ROUNDS = 400  # a worker that needs more is spinning: fail instead of hanging


@attrs.define(eq=False)
class _Backlog:
    """What both workers saw, checked as they go and at the end."""

    total: int
    holders: dict[int, str] = attrs.field(factory=dict)  # job id -> the worker holding it
    last_holder: dict[int, str] = attrs.field(factory=dict)  # job id -> its last claimer
    claims: collections.Counter[int] = attrs.field(factory=collections.Counter)
    ended: collections.Counter[int] = attrs.field(factory=collections.Counter)
    key_order: dict[str, list[int]] = attrs.field(factory=dict)  # key -> ids in claim order
    claims_by: collections.Counter[str] = attrs.field(factory=collections.Counter)
    errors: list[str] = attrs.field(factory=list)

    def claimed(self, worker: str, job: ClaimedJob) -> None:
        if job.id in self.holders:
            self.errors.append(
                f"job {job.id} claimed by {worker} while {self.holders[job.id]} holds it"
            )
        key = job.partition_key
        if key is not None:
            same_key = self.key_order.setdefault(key, [])
            running = sorted(set(same_key) & set(self.holders))
            if running:
                self.errors.append(f"key {key}: job {job.id} claimed while {running} run")
            same_key.append(job.id)
        self.holders[job.id] = self.last_holder[job.id] = worker
        self.claims[job.id] += 1
        self.claims_by[worker] += 1


async def _work(
    driver: Driver, backlog: _Backlog, name: str, held_by: dict[str, list[ClaimedJob]]
) -> None:
    """One worker's claim loop: settle what it finished, claim, renew what it holds, and try
    to write with a forged lease for a job its rival holds."""
    worker_id = uuid.uuid4()
    held = held_by[name]
    cursor = ""
    for _ in range(MAX_ROUNDS):
        if not held and sum(backlog.ended.values()) >= backlog.total:
            return
        settlements = [_outcome(job, name) for job in held]
        for job in held:
            del backlog.holders[job.id]
        held.clear()
        forged = _forged_lease(held_by, name)
        if forged is not None:
            settlements.append(Settlement(forged, "complete", result_json='"forged"'))
        written = await driver.job_settle_many(settlements)
        result = await claim_round(driver, 3, worker_id=worker_id, key_cursor=cursor, key_window=2)
        cursor = result.key_cursor or cursor
        for job_id, state in written.settled:
            if forged is not None and job_id == forged.id:
                backlog.errors.append(f"{name}'s forged completion of job {job_id} took effect")
            if state == "completed":
                backlog.ended[job_id] += 1
        for job in result.claimed:
            backlog.claimed(name, job)
            held.append(job)
        await _renew(driver, backlog, name, worker_id, held, forged)
    backlog.errors.append(f"{name} did not drain the backlog in {MAX_ROUNDS} rounds")


def _outcome(job: ClaimedJob, worker: str) -> Settlement:
    """Unkeyed jobs with an even n are retried (at once) on their first attempt."""
    if job.partition_key is None and job.payload["n"] % 2 == 0 and job.attempt == 1:
        return Settlement(job.lease, "retry", error_json='{"type":"Again"}', delay_seconds=0.0)
    return Settlement(job.lease, "complete", result_json=json.dumps({"by": worker}))


def _forged_lease(held_by: dict[str, list[ClaimedJob]], name: str) -> Lease | None:
    """The lease of a job the rival holds, with the right attempt and a token of our own."""
    theirs = [job for worker, jobs in held_by.items() if worker != name for job in jobs]
    return None if not theirs else Lease(theirs[0].id, theirs[0].attempt, uuid.uuid4())


async def _renew(
    driver: Driver,
    backlog: _Backlog,
    name: str,
    worker_id: uuid.UUID,
    held: list[ClaimedJob],
    forged: Lease | None,
) -> None:
    leases = tuple(job.lease for job in held) + ((forged,) if forged is not None else ())
    renewal = await driver.lease_renew_many(
        RenewLeases(worker_id, "running", LEASE_SECONDS, leases)
    )
    renewed = {lease.id for lease in renewal.leases}
    if forged is not None and forged.id in renewed and forged.id not in {j.id for j in held}:
        backlog.errors.append(f"{name} renewed job {forged.id} with a forged lease")
    lost = {job.id for job in held} - renewed
    if lost:
        backlog.errors.append(f"{name} lost the leases of {sorted(lost)} it holds")


@conformance_check
async def check_two_workers_at_once_claim_each_job_once_and_end_it_once(
    driver: Driver, clock: DriverClock
) -> None:
    unkeyed = [new_job(n) for n in range(12)]
    keyed = [new_job(100 + n, partition_key=KEYS[n % 3]) for n in range(12)]
    job_ids = await enqueue(driver, *unkeyed, *keyed)
    backlog = _Backlog(total=len(job_ids))
    held: dict[str, list[ClaimedJob]] = {"a": [], "b": []}
    async with trio.open_nursery() as nursery:
        for name in held:
            nursery.start_soon(_work, driver, backlog, name, held)
    expect(backlog.errors, [], "what the two workers saw")
    expect(sorted(backlog.claims_by), ["a", "b"], "workers that claimed jobs")
    expect(dict(backlog.ended), dict.fromkeys(job_ids, 1), "completions per job")
    keyed_ids = job_ids[len(unkeyed) :]
    for key in KEYS:
        in_order = [job_id for n, job_id in enumerate(keyed_ids) if KEYS[n % 3] == key]
        expect(backlog.key_order.get(key), in_order, f"claim order of key {key}")
    for n, job_id in enumerate(job_ids):
        row = await record(driver, job_id)
        executions = 2 if n < len(unkeyed) and n % 2 == 0 else 1
        expect(
            (row.state, row.executions, backlog.claims[job_id], row.result),
            ("completed", executions, executions, {"by": backlog.last_holder[job_id]}),
            f"job {job_id}: state, executions, claims and the result its last claimer wrote",
        )


@conformance_check
async def check_two_settlements_of_one_lease_at_once_end_the_job_once(
    driver: Driver, clock: DriverClock
) -> None:
    job_ids = await enqueue(driver, *(new_job(n) for n in range(6)))
    jobs = await claim(driver, 6)
    outcomes: dict[int, list[tuple[str, list[tuple[int, str]]]]] = collections.defaultdict(list)

    async def send(job: ClaimedJob, settlement: Settlement) -> None:
        outcomes[job.id].append((settlement.kind, await settle(driver, settlement)))

    async with trio.open_nursery() as nursery:
        for job in jobs:
            error = json.dumps({"type": "Boom", "message": "from the second"})
            nursery.start_soon(send, job, Settlement(job.lease, "complete", result_json='"one"'))
            nursery.start_soon(send, job, Settlement(job.lease, "fail", error_json=error))
    for job_id in job_ids:
        winners = [(kind, settled) for kind, settled in outcomes[job_id] if settled]
        expect(len(winners), 1, f"settlements of job {job_id} that took effect")
        [(kind, settled)] = winners
        row = await record(driver, job_id)
        expect(settled, [(job_id, row.state)], f"the winning settlement of job {job_id}")
        expect(row.state, {"complete": "completed", "fail": "failed"}[kind], f"job {job_id}")
        history = [attempt.outcome for attempt in await driver.job_attempts(job_id)]
        expect(history, ["failed"] if kind == "fail" else [], f"attempts of job {job_id}")
    expect(await renew(driver, *(job.lease for job in jobs)), set(), "leases renewed once ended")
