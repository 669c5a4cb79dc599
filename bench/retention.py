"""Retention: prune `--finished` old finished jobs while a worker serves an offered load.

Run once (not part of the test suite):
`python -m bench.retention [--finished 1000000] [--rate 800] [--clean 30] [--after 30]`.

A fresh schema is filled (in SQL, as `bench.migrate_stall` does) with `--finished` completed
jobs that finished two days ago, then one worker (25 slots) serves `probe` jobs offered at `--rate`
(bench/open_loop.py) in three phases: `clean` (`--clean` seconds), `prune` (until
`client.purge(states=(every final state), older_than=1 hour)` returns: what `trioq purge` and the
retention setting run) and `after` (`--after` seconds).
`--checkpoints N`: each finished job also has N checkpoints (a workflow's steps), which the
prune deletes row by row before it drops their jobs' day. `--floor`: the day partitions are
detached before the run, and the prune phase only DROPs them
(what deleting a day's files costs the other sessions' commits, whatever the purge does
around it). Reported per phase: pickup p50/p95/max,
completions over offered, the schema's dead tuples and size; and the prune's time. The storage
target: the prune of 1,000,000 finished jobs under 1 s, pickup p95 during it <= 2x clean.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import Any

import psycopg
import trio
from psycopg import sql

from bench.harness import HARNESS_ROLE, Database, open_database
from bench.migrate_stall import fill
from bench.open_loop import Offer, Phase, PhasesOf, run_repeats

RESULTS = Path(__file__).resolve().parent / "results_retention.json"
NAMES = ["clean", "prune", "after"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=800.0)
    parser.add_argument("--clean", type=float, default=30.0)
    parser.add_argument("--after", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--checkpoints", type=int, default=0)
    parser.add_argument("--floor", action="store_true")
    args = parser.parse_args()
    with open_database() as db:
        run_repeats(db, args, NAMES, RESULTS, lambda db: prepare(db, args))


def prepare(db: Database, args: argparse.Namespace) -> tuple[str, PhasesOf]:
    """A fresh schema holding `--finished` old completed jobs, and the phases around a prune."""
    schema = db.fresh_schema()
    # Two days ago: a whole UTC day of them is past the purge's cutoff (docs/concepts.md,
    # "Storage": a day that ends after the cutoff is deleted row by row).
    fill(db.conninfo(HARNESS_ROLE), args.finished, 0, schema=schema, days_ago=2)
    if args.checkpoints:
        add_checkpoints(db, schema, args.checkpoints)
    days = detach_days(db, schema) if args.floor else []
    # Opened here: the window times the drop, not a connection being opened.
    dropper = psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True) if days else None

    def phases(offer: Offer) -> list[Phase]:
        async def drop() -> None:
            assert dropper is not None
            with dropper:
                await trio.to_thread.run_sync(drop_all, dropper, days)

        async def prune() -> None:
            # Every final state, no task or queue: whole days go as retention drops them
            # (a purge naming one state deletes row by row). Through the actions' client,
            # already open: the phase times the purge, not a client's connections, and the
            # purge holds a connection of its own, as the leader's or `trioq purge`'s does.
            deleted = await offer.client.purge(
                states=("completed", "failed", "cancelled"),
                older_than=datetime.timedelta(hours=1),
            )
            offer.extra["pruned"] = deleted

        action = drop if args.floor else prune
        return [
            Phase("clean", args.clean),
            Phase("prune", None, action),
            Phase("after", args.after),
        ]

    return schema, phases


def add_checkpoints(db: Database, schema: str, steps: int) -> None:
    """`steps` step checkpoints for every job in `schema`, vacuumed and checkpointed (written
    long before the prune, as a finished workflow's are)."""
    checkpoints = sql.Identifier(schema, "checkpoints")
    db.conn.execute(
        sql.SQL(
            "INSERT INTO {} (job_id, position, kind, name, value, created_at)"
            " SELECT j.id, p, 'step', 's' || p, 'null', j.created_at"
            " FROM {} j, generate_series(0, %s - 1) AS p"
        ).format(checkpoints, sql.Identifier(schema, "jobs")),
        (steps,),
    )
    db.conn.execute(sql.SQL("VACUUM ANALYZE {}").format(checkpoints))
    db.conn.execute("CHECKPOINT")


def detach_days(db: Database, schema: str) -> list[sql.Identifier]:
    """Detach every day partition holding rows (the filled day), then CHECKPOINT (their pages
    written, as a day's are by the time retention drops it); the tables to drop."""
    names = [
        name
        for (name,) in db.fetch(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            f" WHERE i.inhparent = '{schema}.jobs'::regclass AND c.relname ~ '^jobs_d'"
            " AND pg_relation_size(c.oid) > 1000000"
        )
    ]
    tables = []
    for name in names:
        db.conn.execute(
            sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
                sql.Identifier(schema, "jobs"), sql.Identifier(schema, name)
            )
        )
        # Renamed: job_history_drop() (the worker's leader) drops detached days itself.
        db.conn.execute(
            sql.SQL("ALTER TABLE {} RENAME TO {}").format(
                sql.Identifier(schema, name), sql.Identifier(f"floor_{name}")
            )
        )
        tables.append(sql.Identifier(schema, f"floor_{name}"))
    db.conn.execute("CHECKPOINT")
    return tables


def drop_all(conn: psycopg.Connection[Any], tables: list[sql.Identifier]) -> None:
    for table in tables:
        conn.execute(sql.SQL("DROP TABLE {}").format(table))


if __name__ == "__main__":
    main()
