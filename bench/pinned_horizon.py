"""Pickup under a pinned horizon, open loop: a steady offered rate while a snapshot is held.

Run once (not part of the test suite):
`python -m bench.pinned_horizon [--rate 800] [--clean 60] [--held 150] [--after 60] [--busy]`.

What a nightly `pg_dump` or an analytics query does to a queue: while a REPEATABLE READ
snapshot is open anywhere in the cluster, no dead row version can be removed, and a claim that
scans the ready rows in claim order steps over every version left by the jobs claimed since.
`bench.long_transaction` measures the same fault on a closed-loop drain; this is the open-loop
shape of the storage targets: one `trioq worker` process (25 slots) on the durable cluster,
`probe` jobs offered at `--rate` per second by the harness (a batch every 50 ms, paced by the
clock, so a slow enqueue is caught up rather than thinning the load), three phases:
- clean: `--clean` seconds, nothing held;
- held: `--held` seconds while another session holds a REPEATABLE READ transaction that has read
  the jobs table (its snapshot taken and, as `pg_dump`'s, an ACCESS SHARE lock held);
- after: `--after` seconds once it has committed; then the harness waits for the backlog.
`--busy` runs a process spinning on one core for the whole run (the "busy machine" variant).

Per phase: pickup p50/p95/max (handler start less the enqueue call's start, one wall clock, for
the jobs enqueued in that phase), handler starts per second over offered, the backlog (jobs
enqueued and not yet started) at the phase's end, and the schema's dead tuples and size.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import trio
from psycopg import sql

from bench.app import make_app
from bench.harness import HARNESS_ROLE, Database, Launcher, open_database
from bench.stats import percentile

TICK = 0.05  # seconds between enqueue batches
CONCURRENCY = 25
RESULTS = Path(__file__).resolve().parent / "results_pinned_horizon.json"
PHASES = ("clean", "held", "after")


def schema_health(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT coalesce(sum(n_dead_tup), 0), "
        "coalesce(sum(pg_total_relation_size(relid)), 0) "
        "FROM pg_stat_user_tables WHERE schemaname = %s",
        (schema,),
    ).fetchone()
    assert row is not None
    return {"dead_tuples": int(row[0]), "bytes": int(row[1])}


def not_started(conn: psycopg.Connection[Any], schema: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}.jobs WHERE started_at IS NULL").format(
        sql.Identifier(schema)
    )
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


async def offer(
    db: Database, schema: str, args: argparse.Namespace, marks: dict[str, Any]
) -> dict[int, float]:
    """Enqueue `probe` jobs at the offered rate through the three phases; at the phase
    boundaries, take or release the snapshot and read the schema's health."""
    app = make_app(schema, db.conninfo(HARNESS_ROLE))
    per_tick = round(args.rate * TICK)
    called: dict[int, float] = {}
    ends = {"clean": args.clean, "held": args.clean + args.held}
    ends["after"] = ends["held"] + args.after
    holder = psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True)
    watcher = psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True)
    async with app.client() as client:
        start = trio.current_time()
        marks["start"] = time.time()
        tick = 0
        for phase in PHASES:
            while tick * TICK < ends[phase]:
                await trio.sleep_until(start + tick * TICK)
                at = time.time()
                jobs = await client.enqueue_many("probe", [{}] * per_tick)
                called.update((job.id, at) for job in jobs)
                tick += 1
            marks[f"{phase}_end"] = time.time()
            marks[f"{phase}_backlog"] = await trio.to_thread.run_sync(not_started, watcher, schema)
            marks[f"{phase}_health"] = await trio.to_thread.run_sync(schema_health, watcher, schema)
            if phase == "clean":
                holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                holder.execute(
                    sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema))
                )
            elif phase == "held":
                holder.execute("COMMIT")
    holder.close()
    watcher.close()
    return called


def one_run(db: Database, launcher: Launcher, args: argparse.Namespace) -> dict[str, Any]:
    schema = db.fresh_schema()
    try:
        worker = launcher.trioq_worker(schema, concurrency=CONCURRENCY)
        marks: dict[str, Any] = {}
        called = trio.run(offer, db, schema, args, marks)
        deadline = time.monotonic() + 600
        while db.scalar(f"SELECT count(*) FROM {schema}.jobs WHERE result IS NULL") > 0:
            worker.check_alive()
            assert time.monotonic() < deadline, "the backlog did not drain in 600 s"
            time.sleep(0.5)
        marks["drained"] = time.time()
        started = dict(db.fetch(f"SELECT id, result::float8 FROM {schema}.jobs"))
        worker.stop()
    finally:
        db.drop_schema(schema)
    return report(args, marks, called, started)


def report(
    args: argparse.Namespace,
    marks: dict[str, Any],
    called: dict[int, float],
    started: dict[int, float],
) -> dict[str, Any]:
    bounds = {"clean": marks["start"], "held": marks["clean_end"], "after": marks["held_end"]}
    out: dict[str, Any] = {"drain_after_s": marks["drained"] - marks["after_end"]}
    for phase in PHASES:
        low, high = bounds[phase], marks[f"{phase}_end"]
        pickups = [1000 * (started[job] - at) for job, at in called.items() if low <= at < high]
        starts = sum(1 for at in started.values() if low <= at < high)
        out[phase] = {
            "pickup_p50_ms": percentile(pickups, 50),
            "pickup_p95_ms": percentile(pickups, 95),
            "pickup_max_ms": max(pickups),
            "completions_over_offered": starts / (args.rate * (high - low)),
            "backlog_at_end": marks[f"{phase}_backlog"],
            **marks[f"{phase}_health"],
        }
    out["p95_held_over_clean"] = out["held"]["pickup_p95_ms"] / out["clean"]["pickup_p95_ms"]
    return out


@contextlib.contextmanager
def busy_core(enabled: bool) -> Any:
    """A process spinning on one core for the run (stopped by its own pid)."""
    if not enabled:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.terminate()
        spinner.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=800.0)
    parser.add_argument("--clean", type=float, default=60.0)
    parser.add_argument("--held", type=float, default=150.0)
    parser.add_argument("--after", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--busy", action="store_true")
    args = parser.parse_args()
    runs = []
    with open_database() as db, busy_core(args.busy):
        launcher = Launcher(db, Path(tempfile.mkdtemp(prefix="trioq-bench-pinned-")))
        try:
            for _ in range(args.repeats):
                run = one_run(db, launcher, args)
                print(json.dumps(run), flush=True)
                runs.append(run)
        finally:
            launcher.stop_all()
    medians = {
        phase: {key: statistics.median(run[phase][key] for run in runs) for key in runs[0][phase]}
        for phase in PHASES
    }
    print(json.dumps({"args": vars(args), "medians": medians}, indent=1))
    RESULTS.write_text(json.dumps({"args": vars(args), "runs": runs, "medians": medians}))


if __name__ == "__main__":
    main()
