"""Retention: prune `--finished` old finished jobs while a worker serves an offered load.

Run once (not part of the test suite):
`python -m bench.retention [--finished 1000000] [--rate 800] [--clean 30] [--after 30] [--busy]`.

A fresh schema is filled (in SQL, as `bench.migrate_stall` does) with `--finished` completed
jobs that finished two days ago, then one worker (25 slots) serves `probe` jobs offered at `--rate`
(bench/open_loop.py) in three phases: `clean` (`--clean` seconds), `prune` (until
`client.purge(states=(every final state), older_than=1 hour)` returns: what `trioq purge` and the
retention setting run) and `after` (`--after` seconds).
`--sleeping N`: N jobs of the same epoch sleep for a month (survivors: with at most 10,000 and
at most half of the epoch they are copied aside and written back, with more the expired jobs
are deleted row by row; functions/satellite_epochs_rotate.sql).
`--checkpoints N`: each finished job also has N checkpoints (a workflow's steps), in the
job id epoch that ended with their day, which the prune empties whole once no job of it is
kept. `--floor`: the filled epoch's partitions are detached before the run, and the prune
phase only DROPs them, in one transaction (what deleting an epoch's files costs the other
sessions' commits, whatever the purge does around it). `--busy`: a process spins on one core
for the whole run (as `bench.pinned_horizon --busy`). `--at-midnight`: just before the purge,
today's epoch is moved back a day, so the purge's rotation starts the next epoch (and attaches
the partitions of the one after, in a call of its own) right before it prunes the filled one,
as the leader's first rotation after a midnight (or `trioq purge` then) does when a retention
of whole days expires a day then. `--day-started SECONDS` (with `--at-midnight`): the day's
epoch is started by a call of its own, in a phase `day` of that many seconds, before the prune
(a leader that would prune a pass after starting the day: measured, and not kept; RESULTS.md,
"The day started a pass before its prune").
Reported per phase: pickup p50/p95/max, completions over offered, the schema's dead tuples and
size; and the prune's time. The storage target: the prune of 1,000,000 finished jobs under
1 s, pickup p95 during it <= 2x clean.
"""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path
from typing import Any

import psycopg
import trio
from psycopg import sql

from bench.harness import HARNESS_ROLE, Database, open_database
from bench.migrate_stall import add_checkpoints, fill
from bench.open_loop import Offer, Phase, PhasesOf, run_repeats
from bench.pinned_horizon import busy_core

RESULTS = Path(__file__).resolve().parent / "results_retention.json"
NAMES = ["clean", "prune", "after"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=800.0)
    parser.add_argument("--clean", type=float, default=30.0)
    parser.add_argument("--after", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--sleeping", type=int, default=0)
    parser.add_argument("--checkpoints", type=int, default=0)
    parser.add_argument("--floor", action="store_true")
    parser.add_argument(
        "--busy", action="store_true", help="a process spinning on one core for the whole run"
    )
    parser.add_argument(
        "--at-midnight",
        action="store_true",
        help="the prune's pass also starts the day's epoch (its partitions made ahead)",
    )
    parser.add_argument(
        "--day-started",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --at-midnight: the day's epoch started this long before the prune, in a "
        "call of its own (a phase `day`)",
    )
    parser.add_argument("--results", default=str(RESULTS), help="where the JSON goes")
    args = parser.parse_args()
    if args.day_started and not args.at_midnight:
        parser.error("--day-started: only with --at-midnight")
    names = ["clean", "day", "prune", "after"] if args.day_started else NAMES
    with open_database() as db, busy_core(args.busy):
        run_repeats(db, args, names, Path(args.results), lambda db: prepare(db, args))


def prepare(db: Database, args: argparse.Namespace) -> tuple[str, PhasesOf]:
    """A fresh schema holding `--finished` old completed jobs, and the phases around a prune."""
    schema = db.fresh_schema()
    # Two days ago: a whole UTC day of them is past the purge's cutoff (docs/concepts.md,
    # "Storage": a day that ends after the cutoff is deleted row by row).
    fill(db.conninfo(HARNESS_ROLE), args.finished, 0, schema=schema, days_ago=2)
    if args.sleeping:
        add_sleeping(db, schema, args.sleeping)
    if args.checkpoints:
        add_checkpoints(db.conn, schema, args.checkpoints)
    epochs_as_days_left_them(db, schema)
    # Written out, as a day-old epoch's files are: a prune of pages still dirty in the OS's cache
    # frees no disk blocks, and emptying 1,000,000 jobs' 330 MB took 120-150 ms more once they
    # were on disk (the deletion of their files, at the commit, after its locks are released).
    db.conn.execute("CHECKPOINT")
    days = detach_epoch(db, schema) if args.floor else []
    # Opened here: the window times the drop, not a connection being opened.
    dropper = psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True) if days else None
    checker = psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True)

    def phases(offer: Offer) -> list[Phase]:
        async def drop() -> None:
            assert dropper is not None
            with dropper:
                await trio.to_thread.run_sync(drop_all, dropper, days)

        async def start_day() -> None:
            # The day's epoch started by a call of its own (`--day-started`); the prune's own
            # first call then finds it started.
            def jump() -> None:
                checker.execute(midnight(schema))
                checker.execute(epochs_only(schema))

            await trio.to_thread.run_sync(jump)

        async def prune() -> None:
            # Every final state, no task or queue: whole days go as retention drops them
            # (a purge naming one state deletes row by row). Through the actions' client,
            # already open: the phase times the purge, not a client's connections, and the
            # purge holds a connection of its own, as the leader's or `trioq purge`'s does.
            if args.at_midnight and not args.day_started:
                # Today's epoch began yesterday: the purge's pass starts one.
                await trio.to_thread.run_sync(checker.execute, midnight(schema))
            started = time.monotonic()
            deleted = await offer.client.purge(
                states=("completed", "failed", "cancelled"),
                older_than=datetime.timedelta(hours=1),
            )
            offer.extra["purge_s"] = time.monotonic() - started
            offer.extra["pruned"] = deleted
            # After the phase's clock (action_s): the server's time in the rotation and in
            # the row-by-row purge, and with `--sleeping` every sleeper kept and filed once.
            with checker:
                offer.extra["statements_ms"] = await trio.to_thread.run_sync(
                    statement_times, checker, schema
                )
                if args.sleeping:
                    offer.extra["sleeping_kept"] = await trio.to_thread.run_sync(
                        count_sleeping, checker, schema
                    )

        action = drop if args.floor else prune
        day = [Phase("day", args.day_started, start_day)] if args.day_started else []
        return [
            Phase("clean", args.clean),
            *day,
            Phase("prune", None, action),
            Phase("after", args.after),
        ]

    return schema, phases


def epochs_only(schema: str) -> sql.Composed:
    """The rotation's epochs-and-partitions call (NULL: no retention, nothing pruned): what
    starts a day's epoch once the current one began before today."""
    return sql.SQL("SELECT * FROM {}(NULL)").format(
        sql.Identifier(schema, "satellite_epochs_rotate")
    )


def midnight(schema: str) -> sql.Composed:
    """The current epoch moved back a day (`--at-midnight`): set just before the purge, after
    the worker's leader made its first rotation, so that the purge's is the one to start the
    next epoch (and make the partitions of the one after) in the pass that prunes."""
    return sql.SQL(
        "UPDATE {} SET started_at = started_at - interval '1 day'"
        " WHERE started_at IS NOT NULL AND ended_at IS NULL"
    ).format(sql.Identifier(schema, "satellite_epochs"))


def add_sleeping(db: Database, schema: str, count: int) -> None:
    """`count` jobs of the filled jobs' epoch sleeping until a month from now (a workflow's
    long sleep): records that survive every prune of their epoch, filed in job_due by their
    insert trigger as a settle's sleep files them."""
    if db.fetch("SELECT to_regclass(%s) IS NULL", [f"{schema}.job_rows"]) == [(True,)]:
        raise SystemExit("--sleeping: no job_rows on this schema (migration 0049)")
    rows = sql.Identifier(schema, "job_rows")
    db.conn.execute(
        sql.SQL(
            "INSERT INTO {} (queue, task, payload, phase, run_at, created_at, attempt)"
            " SELECT 'default', 'noop', '{{}}', 'sleeping', now() + interval '30 days',"
            " now() - interval '2 days', 1 FROM generate_series(1, %s)"
        ).format(rows),
        (count,),
    )
    db.conn.execute(sql.SQL("VACUUM ANALYZE {}").format(rows))


def statement_times(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[float]]:
    """pg_stat_statements' calls and total execution (ms) of the rotation and of the purge's
    row-by-row delete on `schema` so far."""
    rows = conn.execute(
        "SELECT CASE WHEN query ~ 'satellite_epochs_rotate' THEN 'rotate' ELSE 'purge' END,"
        " sum(calls)::float8, sum(total_exec_time) FROM pg_stat_statements"
        " WHERE position(%s in query) > 0 AND (query ~ 'satellite_epochs_rotate\\(\\$'"
        " OR query ~ '^WITH doomed') GROUP BY 1",
        (f'"{schema}"',),
    ).fetchall()
    return {kind: [calls, total] for kind, calls, total in rows}


def count_sleeping(conn: psycopg.Connection[Any], schema: str) -> list[int]:
    """The sleeping records and job_due's sleeping rows (equal unless a sleeper was lost or
    filed twice)."""
    row = conn.execute(
        sql.SQL(
            "SELECT (SELECT count(*) FROM {} WHERE phase = 'sleeping'),"
            " (SELECT count(*) FROM {} WHERE state = 'sleeping')"
        ).format(sql.Identifier(schema, "job_rows"), sql.Identifier(schema, "job_due"))
    ).fetchone()
    assert row is not None
    return [int(row[0]), int(row[1])]


def epochs_as_days_left_them(db: Database, schema: str) -> None:
    """The job id epochs as two days of a leader's rotations leave them (a fresh schema's
    epoch started now): the filled jobs' epoch ended two days ago and today's has started, so
    the prune finds their checkpoints in an ended epoch (functions/satellite_epochs_rotate.sql)
    and new jobs are filed apart from them."""
    epochs = sql.Identifier(schema, "satellite_epochs")
    db.conn.execute(
        sql.SQL("UPDATE {} SET started_at = started_at - interval '3 days'").format(epochs)
    )
    # The new epoch starts, nothing is pruned yet.
    db.conn.execute(epochs_only(schema))
    db.conn.execute(
        sql.SQL("UPDATE {} SET ended_at = ended_at - interval '2 days' WHERE epoch = 0").format(
            epochs
        )
    )


def detach_epoch(db: Database, schema: str) -> list[sql.Identifier]:
    """Detach the filled epoch's partitions holding rows (the five tables partitioned by job id
    epoch; functions/satellite_epochs_rotate.sql), rename them, then CHECKPOINT (their pages
    written, as an ended epoch's are by the time retention empties it); the tables to drop.
    Renamed: the rotation finds an epoch's partitions by name (`<table>_e<n>`), and the
    worker's leader would empty them again."""
    tables = []
    for parent in ("job_outcomes", "attempts", "workflow_values", "checkpoints", "job_rows"):
        name = f"{parent}_e0"
        if not db.scalar("SELECT pg_relation_size(%s::regclass) > 0", [f"{schema}.{name}"]):
            continue
        db.conn.execute(
            sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
                sql.Identifier(schema, parent), sql.Identifier(schema, name)
            )
        )
        db.conn.execute(
            sql.SQL("ALTER TABLE {} RENAME TO {}").format(
                sql.Identifier(schema, name), sql.Identifier(f"floor_{name}")
            )
        )
        tables.append(sql.Identifier(schema, f"floor_{name}"))
    if not tables:
        raise SystemExit("--floor: the filled epoch (0) has no partition holding rows")
    db.conn.execute("CHECKPOINT")
    return tables


def drop_all(conn: psycopg.Connection[Any], tables: list[sql.Identifier]) -> None:
    """The tables dropped in one transaction: their files deleted at one commit, as a prune's
    truncation deletes an epoch's."""
    with conn.transaction():
        for table in tables:
            conn.execute(sql.SQL("DROP TABLE {}").format(table))


if __name__ == "__main__":
    main()
