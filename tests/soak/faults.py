"""The soak's faults, at times drawn from the seed: a PostgreSQL crash and restart, trioq's
backends terminated, a worker killed -9 or stopped with SIGTERM (then replaced), a snapshot held
open, a storm of junk notifications on trioq's channels.

`fault_schedule(seed, seconds)` is a pure function: the same seed gives the same faults at the
same offsets, on the same targets. Every fault is recorded in the `Record` (deaths, outages,
counts) for the checker.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import threading
from collections.abc import Sequence

import attrs
import psycopg
import trio
from psycopg import sql

from tests.procs import WorkerGroup, WorkerProc, fetch
from tests.soak.app import QUEUES, SCHEMA
from tests.soak.record import Record, now
from trioq.embedded import EmbeddedPostgres

KINDS = ("pg_restart", "terminate_backends", "kill_9", "sigterm", "snapshot", "notify_storm")
WITHOUT_OWN_CLUSTER = tuple(kind for kind in KINDS if kind != "pg_restart")
LEASE, POLL, MAINTENANCE, GRACE = 2.0, 0.5, 0.5, 1.0


@attrs.frozen
class Fault:
    at: float  # seconds from the start of the load
    kind: str
    target: int  # which worker (an index into the soak's workers), or a duration's seed
    seconds: float = 0.0  # how long a held snapshot stays open


def fault_schedule(seed: int, seconds: float, kinds: Sequence[str] = KINDS) -> list[Fault]:
    """Faults every 6 to 16 s, from 5 s in until 10 s before the end; each kind in turn, in an
    order shuffled per round, so a run long enough has every kind."""
    rng = random.Random(f"faults-{seed}")
    faults: list[Fault] = []
    at, round_ = 5.0 + rng.uniform(0, 5), list(kinds)
    while at < seconds - 10:
        if not round_:
            round_ = list(kinds)
        rng.shuffle(round_)
        kind = round_.pop()
        faults.append(Fault(round(at, 2), kind, rng.randrange(1000), round(rng.uniform(10, 60), 1)))
        at += rng.uniform(6, 16)
    return faults


@attrs.define(eq=False)
class Workers:
    """The soak's workers: two plain ones and one `--processes 2` supervisor, each replaced
    when a fault stops it."""

    group: WorkerGroup
    record: Record
    procs: list[WorkerProc] = attrs.field(factory=list)
    generation: int = 0

    SHAPES = ((8, None), (8, None), (4, 2))  # (concurrency, processes)

    async def start_all(self) -> None:
        for slot in range(len(self.SHAPES)):
            self.procs.append(await self._start(slot))

    async def _start(self, slot: int) -> WorkerProc:
        concurrency, processes = self.SHAPES[slot]
        self.generation += 1
        return await self.group.start(
            f"w{slot}-{self.generation}",
            concurrency=concurrency,
            lease=LEASE,
            poll=POLL,
            grace=GRACE,
            maintenance=MAINTENANCE,
            app_path="tests.soak.app:app",
            queues=QUEUES,
            processes=processes,
            ready_within=60,
        )

    async def replace(self, slot: int) -> None:
        self.procs[slot] = await self._start(slot)

    def pids_of(self, proc: WorkerProc) -> list[int]:
        return proc.child_pids() if proc.processes else [proc.pid]

    async def kill_9(self, target: int) -> None:
        """SIGKILL a plain worker (then start another), or one child of the supervisor (which
        starts another itself)."""
        slot = target % len(self.procs)
        proc = self.procs[slot]
        pids = self.pids_of(proc)
        if not pids:
            return
        pid = pids[target % len(pids)]
        os.kill(pid, signal.SIGKILL)  # by pid: a process this soak started
        self.record.death(pid, killed=True)
        if not proc.processes:
            await proc.wait_exit(10)
            await self.replace(slot)

    async def sigterm(self, target: int) -> None:
        """SIGTERM a worker (the supervisor drains its children), wait for its drain, start
        another."""
        slot = target % len(self.procs)
        proc = self.procs[slot]
        pids = self.pids_of(proc)
        proc.signal(signal.SIGTERM)
        await proc.wait_exit(GRACE + 30)
        for pid in pids:
            self.record.death(pid, killed=False)
        await self.replace(slot)

    async def stop_all(self) -> None:
        """SIGTERM every worker and wait for the drains."""
        for proc in self.procs:
            proc.signal(signal.SIGTERM)
        for proc in self.procs:
            await proc.wait_exit(GRACE + 30)


async def terminate_backends(pg_url: str) -> int:
    """pg_terminate_backend on every session of trioq's (the workers' and producers')."""
    query = (
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name LIKE 'trioq%' AND pid <> pg_backend_pid()"
    )
    return int((await fetch(pg_url, query))[0][0])


async def notify_storm(pg_url: str, notifications: int = 2000) -> None:
    """Junk payloads on every ready channel of the soak's queues, the control channel and a
    few result channels, in batches."""

    def storm() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for _ in range(notifications // 200):
                junk = [secrets.token_urlsafe(n % 40 + 1) for n in range(200)]
                conn.execute(
                    sql.SQL(
                        "SELECT count(pg_notify(c, j)) FROM unnest(%s::text[]) WITH ORDINALITY "
                        "AS t(j, n), LATERAL (SELECT (ARRAY[{s}.ready_channel(%s), "
                        "{s}.ready_channel(%s), %s, %s])[1 + n %% 4] AS c) ch"
                    ).format(s=sql.Identifier(SCHEMA)),
                    (junk, QUEUES[0], QUEUES[3], f"{SCHEMA}_control", f"{SCHEMA}_result_7"),
                )

    await trio.to_thread.run_sync(storm)


async def hold_snapshot(pg_url: str, seconds: float) -> None:
    """A REPEATABLE READ transaction that read the jobs table, left open `seconds` (less when
    the soak ends first: cancelling this ends the transaction within 0.1 s)."""
    done = threading.Event()

    def hold() -> None:
        with psycopg.connect(pg_url, connect_timeout=5) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            conn.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(SCHEMA)))
            done.wait(seconds)
            conn.rollback()

    try:
        # Abandoned when the soak ends first: `done` then ends the transaction within a moment.
        await trio.to_thread.run_sync(hold, abandon_on_cancel=True)
    except psycopg.OperationalError:
        pass  # the server restarted under it: the snapshot is gone, as it would be
    finally:
        done.set()


@attrs.define(eq=False)
class Injector:
    pg_url: str
    cluster: EmbeddedPostgres | None
    workers: Workers
    record: Record

    async def run(self, schedule: Sequence[Fault], started: float) -> None:
        """Make each fault at its offset from `started` (trio's clock); snapshots are held in
        the background."""
        async with trio.open_nursery() as nursery:
            for fault in schedule:
                await trio.sleep_until(started + fault.at)
                print(f"  fault at {fault.at:6.1f} s: {fault.kind}", flush=True)
                if fault.kind == "snapshot":
                    nursery.start_soon(hold_snapshot, self.pg_url, fault.seconds)
                else:
                    try:
                        await self.make(fault)
                    except (OSError, psycopg.Error, AssertionError, trio.TooSlowError) as exc:
                        print(f"  fault {fault.kind} at {fault.at} s failed: {exc!r}", flush=True)
                        self.record.faults[f"{fault.kind} (failed)"] += 1
                        continue
                self.record.faults[fault.kind] += 1

    async def make(self, fault: Fault) -> None:
        if fault.kind == "pg_restart":
            assert self.cluster is not None
            down = now()
            await trio.to_thread.run_sync(self.cluster.restart, "immediate")
            self.record.outages.append((down, now()))
        elif fault.kind == "terminate_backends":
            print(f"    terminated {await terminate_backends(self.pg_url)} sessions", flush=True)
        elif fault.kind == "kill_9":
            await self.workers.kill_9(fault.target)
        elif fault.kind == "sigterm":
            await self.workers.sigterm(fault.target)
        elif fault.kind == "notify_storm":
            await notify_storm(self.pg_url)
        else:
            raise ValueError(f"unknown fault {fault.kind!r}")
