"""The soak's load: producers from trio (`trioq.App`'s client), a `SyncProducer` in a thread and
SQL `enqueue()` calls; a mix of plain, slow, failing, keyed, limited, rated and deadline jobs,
workflows (steps, sleeps, events, children, continue-as-new) and inboxes fed messages; cancels
and redrives through the CLI; and a sampler of job states for the checker.

An enqueue that raises (the database restarting) has an unknown outcome: its job is not counted
as acknowledged. Every id a producer got back is.
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import psycopg
import trio
from psycopg import sql

import trioq
from tests.procs import REPO_ROOT, fetch
from tests.soak.app import FLOWS, SCHEMA, WORK
from tests.soak.model import Sent
from tests.soak.record import Record, now
from trioq.producer import SyncProducer

PRINTED_ERRORS = 5

# (weight, task, payload maker, enqueue options maker)
Maker = Callable[[random.Random], Any]
MIX: list[tuple[int, str, Maker, Maker]] = [
    (30, "noop", lambda r: {}, lambda r: {}),
    (15, "slow", lambda r: {"seconds": round(r.uniform(1, 5), 2)}, lambda r: {}),
    (10, "flaky", lambda r: {"fail": r.choice([0, 1, 2, 7])}, lambda r: {}),
    (15, "keyed", lambda r: {}, lambda r: {"partition_key": f"p{r.randrange(4)}"}),
    (10, "tenant", lambda r: {"tenant": r.randrange(3)}, lambda r: {}),
    (8, "limited", lambda r: {}, lambda r: {}),
    (4, "late", lambda r: {"seconds": r.choice([0.5, 6.0])}, lambda r: {}),
]


@attrs.define(eq=False)
class Workload:
    client: trioq.Client
    pg_url: str
    record: Record
    rng: random.Random
    pending_events: set[str] = attrs.field(factory=set)

    def failed(self, what: str, exc: BaseException) -> None:
        self.record.enqueue_errors += 1
        if self.record.enqueue_errors <= PRINTED_ERRORS:
            print(f"  {what} failed (outcome unknown): {exc!r}", flush=True)

    async def attempt(
        self, what: str, call: Callable[..., Awaitable[Any]], *args: Any, **options: Any
    ) -> Any:
        """`await call(*args, **options)`, or None when it raised a database error."""
        try:
            return await call(*args, **options)
        except (psycopg.Error, trioq.TrioqError, OSError) as exc:
            self.failed(what, exc)
            return None

    # --- producers ----------------------------------------------------------------------------

    async def trio_producer(self) -> None:
        weights = [weight for weight, *_ in MIX]
        while True:
            _, task, payload, options = self.rng.choices(MIX, weights)[0]
            if self.rng.random() < 0.05:
                payloads = [payload(self.rng) for _ in range(10)]
                jobs = await self.attempt("enqueue_many", self.client.enqueue_many, task, payloads)
                self.record.ack(*(job.id for job in jobs or ()))
            else:
                args = (task, payload(self.rng))
                job = await self.attempt("enqueue", self.client.enqueue, *args, **options(self.rng))
                if job is not None:
                    self.record.ack(job.id)
            await trio.sleep(self.rng.uniform(0.05, 0.3))

    async def rated_bursts(self, seconds: float, size: int = 30) -> None:
        """Bursts of jobs on the rated queue, at the start and halfway: each fills the queue's
        window, and the rest of the burst waits for it to slide."""
        for _ in range(2):
            jobs = await self.attempt(
                "enqueue_many", self.client.enqueue_many, "rated", [{}] * size
            )
            self.record.ack(*(job.id for job in jobs or ()))
            await trio.sleep(seconds / 2)

    async def sync_producer(self) -> None:
        """A `SyncProducer` in a worker thread; cancelling this stops it within 0.3 s."""
        stop = threading.Event()
        pauses = [self.rng.uniform(0.1, 0.3) for _ in range(10_000)]

        def produce() -> None:
            with SyncProducer(self.pg_url, schema=SCHEMA) as producer:
                for pause in pauses:
                    if stop.wait(pause):
                        return
                    try:
                        self.record.ack(producer.enqueue("noop", {"from": "sync"}, queue=WORK).id)
                    except (psycopg.Error, trioq.TrioqError, OSError) as exc:
                        self.failed("SyncProducer.enqueue", exc)

        try:
            await trio.to_thread.run_sync(produce, abandon_on_cancel=True)
        finally:
            stop.set()

    async def sql_producer(self) -> None:
        statement = sql.SQL(
            "SELECT {}.enqueue('keyed', '{{}}'::jsonb, queue => %s, partition_key => %s)"
        ).format(sql.Identifier(SCHEMA))
        while True:
            key = f"p{self.rng.randrange(4)}"
            rows = await self.attempt("SQL enqueue()", fetch, self.pg_url, statement, (WORK, key))
            if rows:
                self.record.ack(rows[0][0])
            await trio.sleep(self.rng.uniform(0.3, 1.0))

    # --- workflows ----------------------------------------------------------------------------

    async def workflows(self, tail: trio.Nursery) -> None:
        """Flows and inboxes; their events and messages come from tasks in `tail`, which run
        to the end even after the load stops."""
        for n in range(1_000_000):
            if self.rng.random() < 0.7:
                await self.flows(n, tail)
            else:
                job = await self.attempt("enqueue inbox", self.client.enqueue, "inbox")
                if job is not None:
                    self.record.ack(job.id)
                    self.record.workflows.add(job.id)
                    self.record.messages[job.id] = []
                    tail.start_soon(self.feed_inbox, job.id, random.Random(self.rng.random()))
            await trio.sleep(self.rng.uniform(0.5, 2.5))

    async def flows(self, n: int, tail: trio.Nursery) -> None:
        event = f"ev{n}" if self.rng.random() < 0.6 else None
        waiters = 2 if event and self.rng.random() < 0.3 else 1
        for _ in range(waiters):
            payload = {
                "gens": self.rng.choice([0, 0, 1, 2]),
                "event": event,
                "child": self.rng.random() < 0.5,
                "nap": round(self.rng.uniform(0.2, 2), 2),
            }
            job = await self.attempt("enqueue flow", self.client.enqueue, "flow", payload)
            if job is None:
                continue
            self.record.ack(job.id)
            self.record.workflows.add(job.id)
            if event:
                self.record.event_waiters.setdefault(event, set()).add(job.id)
        if event and event in self.record.event_waiters:
            self.pending_events.add(event)
            tail.start_soon(self.emit_later, event, self.rng.uniform(1, 10))

    async def emit_later(self, event: str, delay: float) -> None:
        await trio.sleep(delay)
        await self.emit(event)

    async def emit(self, event: str) -> None:
        """Emit until an emit returns (the first emit wins, so a repeat changes nothing)."""
        while event in self.pending_events:
            emitted = await self.attempt("emit_event", self.client.emit_event, event, {"e": event})
            if emitted is not None:
                self.pending_events.discard(event)
                self.record.emitted.add(event)
            else:
                await trio.sleep(1)

    async def feed_inbox(self, job_id: int, rng: random.Random) -> None:
        sent = self.record.messages[job_id]
        for i in range(rng.randint(2, 6)):
            await trio.sleep(rng.uniform(0.2, 1.5))
            await self.send(job_id, f"{job_id}:{i}", sent)
        for k in range(20):  # a stop whose send failed is sent again, under a new name
            if await self.send(job_id, f"stop:{k}", sent):
                return
            await trio.sleep(1)

    async def send(self, job_id: int, item: str, sent: list[Sent]) -> bool:
        try:
            await self.client.send(job_id, "items", item)
        except trioq.JobFinished:
            return True  # cancelled meanwhile: nothing more to send
        except (psycopg.Error, trioq.TrioqError, OSError) as exc:
            self.failed("send", exc)
            sent.append(Sent(item, certain=False))
            return False
        sent.append(Sent(item))
        return True

    # --- operators: the CLI's cancel and retry, and the state sampler ---------------------------

    failed_jobs = sql.SQL(
        "SELECT id FROM {}.jobs WHERE state = 'failed' ORDER BY id LIMIT 20"
    ).format(sql.Identifier(SCHEMA))

    async def operator(self) -> None:
        while True:
            await trio.sleep(self.rng.uniform(3, 8))
            if self.record.acknowledged and self.rng.random() < 0.6:
                job_id = self.rng.choice(sorted(self.record.acknowledged))
                await self.cli("cancel", str(job_id))
                self.record.cancels += 1
                continue
            rows = await self.attempt("read failed jobs", fetch, self.pg_url, self.failed_jobs)
            if rows:
                job_id = self.rng.choice(rows)[0]
                self.record.redriven.setdefault(job_id, []).append(now())
                await self.cli("retry", str(job_id))

    async def cli(self, *args: str) -> None:
        command = [sys.executable, "-m", "trioq.cli", *args, "--database-url", self.pg_url]
        await trio.run_process(
            command, cwd=REPO_ROOT, check=False, capture_stdout=True, capture_stderr=True
        )

    async def sampler(self, every: float = 2.0) -> None:
        """Every job's state, recorded on change (the checker needs only the changes)."""
        last: dict[int, str] = {}
        query = sql.SQL("SELECT id, state FROM {}.jobs").format(sql.Identifier(SCHEMA))
        while True:
            when = now()
            rows = await self.attempt("sample", fetch, self.pg_url, query)
            for job_id, state in rows or ():
                if last.get(job_id) != state:
                    last[job_id] = state
                    self.record.observations.append((when, job_id, state))
            await trio.sleep(every)


__all__ = ["FLOWS", "Workload"]
