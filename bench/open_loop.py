"""An offered load in phases: what the storage scenarios share (`bench.pinned_horizon`,
`bench.retention`, the steady run).

One `trioq worker` process (25 slots) on the durable cluster; `probe` jobs (their result is the
handler's start, `time.time()`) offered by the harness at a fixed rate, a batch every 50 ms paced
by the clock (a slow enqueue is caught up, not thinned). A run is a list of phases; each opens
with an optional action (take a snapshot, start a prune) and ends after its seconds, or, with
`seconds=None`, when its action returns. Per phase: pickup p50/p95/max (handler start less the
enqueue call's start, one wall clock, for the jobs enqueued in the phase), handler starts per
second over offered, the backlog (offered jobs enqueued, not yet started) at its end, the
schema's dead tuples and size, the action's duration. Per minute of the whole run: handler
starts per second and pickup p95 (the steady run's start and end).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import psycopg
import trio

from bench.app import make_app
from bench.harness import HARNESS_ROLE, Database, Launcher
from bench.stats import percentile

TICK = 0.05  # seconds between enqueue batches
CONCURRENCY = 25
MINUTE = 60.0


@attrs.frozen
class Phase:
    name: str
    seconds: float | None  # None: until its action returns
    action: Callable[[], Awaitable[None]] | None = None


def schema_health(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT coalesce(sum(n_dead_tup), 0), coalesce(sum(pg_total_relation_size(relid)), 0) "
        "FROM pg_stat_user_tables WHERE schemaname = %s",
        (schema,),
    ).fetchone()
    assert row is not None
    return {"dead_tuples": int(row[0]), "bytes": int(row[1])}


@attrs.define(eq=False)
class Offer:
    """The harness's side of one run: enqueue through the phases, mark their bounds."""

    db: Database
    schema: str
    rate: float
    called: dict[int, float] = attrs.Factory(dict)  # job id -> the enqueue call's start
    marks: dict[str, Any] = attrs.Factory(dict)
    extra: dict[str, Any] = attrs.Factory(dict)  # what a phase's action reports
    # A client for the phases' actions, open for the whole run beside the offering one: an
    # action's phase does not time a client's connections being opened, and the action holds
    # none of the offering client's connections (a purge through the offering client made the
    # next enqueue open a connection: bench/RESULTS.md, "The prune's window").
    client: Any = None

    async def run(self, phases: list[Phase]) -> None:
        app = make_app(self.schema, self.db.conninfo(HARNESS_ROLE))
        watcher = psycopg.connect(self.db.conninfo(HARNESS_ROLE), autocommit=True)
        # Its own app: clients of one app share its pool (App.client).
        actions_app = make_app(self.schema, self.db.conninfo(HARNESS_ROLE))
        async with app.client() as client, actions_app.client() as actions:
            self.client = actions
            await actions.paused_queues()  # its connection opened before the phases
            self.marks["start"] = time.time()
            clock = trio.current_time()
            tick = 0
            for phase in phases:
                self.marks[f"{phase.name}_start"] = time.time()
                done = trio.Event()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._act, phase, done)
                    end = None if phase.seconds is None else trio.current_time() + phase.seconds
                    while not (done.is_set() if end is None else trio.current_time() >= end):
                        await trio.sleep_until(clock + tick * TICK)
                        await self._enqueue(client, tick)
                        tick += 1
                self.marks[f"{phase.name}_end"] = time.time()
                # The backlog at the phase's end is counted after the run, from the enqueue
                # calls and the handlers' starts (`report`): counted here through the `jobs`
                # view, over 1,000,000 records, it paused the offering for ~430 ms, and the
                # next phase opened with the missed ticks enqueued at once, a burst that was
                # the pickup p95 of a short phase (a prune replaced by pg_sleep(0.2) read
                # 4.0-4.5x the clean phase's; bench/RESULTS.md, "The prune's phase measured
                # its own burst").
                self.marks[f"{phase.name}_health"] = await trio.to_thread.run_sync(
                    schema_health, watcher, self.schema
                )
        watcher.close()

    async def _act(self, phase: Phase, done: trio.Event) -> None:
        started = time.monotonic()
        if phase.action is not None:
            await phase.action()
        self.marks[f"{phase.name}_action_s"] = time.monotonic() - started
        done.set()

    async def _enqueue(self, client: Any, tick: int) -> None:
        at = time.time()
        jobs = await client.enqueue_many("probe", [{}] * round(self.rate * TICK))
        self.called.update((job.id, at) for job in jobs)


def run_phases(
    db: Database,
    launcher: Launcher,
    schema: str,
    rate: float,
    phases: Callable[[Offer], list[Phase]],
) -> dict[str, Any]:
    """One run on a migrated `schema` (dropped after); the report of `report`."""
    try:
        worker = launcher.trioq_worker(schema, concurrency=CONCURRENCY)
        offer = Offer(db, schema, rate)
        planned = phases(offer)
        trio.run(offer.run, planned)
        deadline = time.monotonic() + 600
        # The offered jobs only: a run may keep others unfinished (bench.retention --sleeping).
        unfinished = f"SELECT count(*) FROM {schema}.jobs WHERE task = 'probe' AND result IS NULL"
        while db.scalar(unfinished) > 0:
            worker.check_alive()
            assert time.monotonic() < deadline, "the backlog did not drain in 600 s"
            time.sleep(0.5)
        offer.marks["drained"] = time.time()
        started = dict(
            db.fetch(f"SELECT id, result::float8 FROM {schema}.jobs WHERE task = 'probe'")
        )
        worker.stop()
    finally:
        db.drop_schema(schema)
    return report(rate, [phase.name for phase in planned], offer, started)


def report(
    rate: float, names: list[str], offer: Offer, started: dict[int, float]
) -> dict[str, Any]:
    marks, called = offer.marks, offer.called
    last = names[-1]
    out: dict[str, Any] = {
        "drain_after_s": marks["drained"] - marks[f"{last}_end"],
        **offer.extra,
    }
    for name in names:
        low, high = marks[f"{name}_start"], marks[f"{name}_end"]
        out[name] = {
            **window(called, started, low, high, rate),
            "seconds": high - low,
            "action_s": marks[f"{name}_action_s"],
            "backlog_at_end": sum(
                1 for job, at in called.items() if at < high and started.get(job, high) >= high
            ),
            **marks[f"{name}_health"],
        }
        if marks[f"{name}_action_s"] > 0.001:
            # The same second from the action's start whatever its length: a shorter action
            # has fewer pickups, and its stalls (locks, the commit, the files' deletion) are
            # more of them (a prune 18% faster read 2.04 against 1.44x clean by its own
            # phase's p95; bench/RESULTS.md, "The prune's read through the claims' tables").
            out[name]["first_second"] = window(called, started, low, low + 1.0, rate)
    minutes = []
    low = marks["start"]
    while low + MINUTE <= marks[f"{last}_end"]:
        minutes.append(window(called, started, low, low + MINUTE, rate))
        low += MINUTE
    out["minutes"] = minutes
    return out


def window(
    called: dict[int, float], started: dict[int, float], low: float, high: float, rate: float
) -> dict[str, float]:
    pickups = [1000 * (started[job] - at) for job, at in called.items() if low <= at < high]
    starts = sum(1 for at in started.values() if low <= at < high)
    return {
        "pickup_p50_ms": percentile(pickups, 50),
        "pickup_p95_ms": percentile(pickups, 95),
        "pickup_max_ms": max(pickups),
        "completions_over_offered": starts / (rate * (high - low)),
    }


def medians(runs: list[dict[str, Any]], names: list[str]) -> dict[str, dict[str, Any]]:
    return {name: _medians([run[name] for run in runs]) for name in names}


def _medians(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the runs (a window within a phase: its figures')."""
    return {
        key: _medians([r[key] for r in reports])
        if isinstance(reports[0][key], dict)
        else statistics.median(r[key] for r in reports)
        for key in reports[0]
    }


PhasesOf = Callable[[Offer], list[Phase]]


def run_repeats(
    db: Database,
    args: Any,
    names: list[str],
    results: Path,
    prepare: Callable[[Database], tuple[str, PhasesOf]],
) -> None:
    """`args.repeats` runs, each on the schema and phases `prepare` makes; each run printed,
    then the medians, all written to `results`."""
    launcher = Launcher(db, Path(tempfile.mkdtemp(prefix="trioq-bench-open-loop-")))
    runs = []
    try:
        for _ in range(args.repeats):
            schema, phases = prepare(db)
            run = run_phases(db, launcher, schema, args.rate, phases)
            print(json.dumps(run), flush=True)
            runs.append(run)
    finally:
        launcher.stop_all()
    summary = {"args": vars(args), "medians": medians(runs, names)}
    print(json.dumps(summary, indent=1))
    results.write_text(json.dumps({**summary, "runs": runs}))
