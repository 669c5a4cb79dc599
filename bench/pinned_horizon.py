"""Pickup under a pinned horizon, open loop: a steady offered rate while a snapshot is held.

Run once (not part of the test suite):
`python -m bench.pinned_horizon [--rate 800] [--clean 60] [--held 150] [--after 60] [--busy]`.
The 30-minute steady run is `--clean 1800 --held 0 --after 0 --rate <70% of capacity>` (its
per-minute windows give the throughput at the start and at the end).

What a nightly `pg_dump` or an analytics query does to a queue: while a REPEATABLE READ
snapshot is open anywhere in the cluster, no dead row version can be removed, and a claim that
scans the ready rows in claim order steps over every version left by the jobs claimed since.
`bench.long_transaction` measures the same fault on a closed-loop drain; this is the open-loop
shape of the storage targets (bench/open_loop.py: one worker, 25 slots, the durable cluster),
in three phases:
- clean: `--clean` seconds, nothing held;
- held: `--held` seconds while another session holds a REPEATABLE READ transaction that has read
  the jobs table (its snapshot taken and, as `pg_dump`'s, an ACCESS SHARE lock held);
- after: `--after` seconds once it has committed; then the harness waits for the backlog.
`--busy` runs a process spinning on one core for the whole run (the "busy machine" variant).
`--dump` holds what `pg_dump` holds: besides the snapshot, an ACCESS SHARE lock on every table of
the schema, taken at the start (the ready ring's slots included, so none can be truncated).
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import trio
from psycopg import sql

from bench.harness import HARNESS_ROLE, open_database
from bench.open_loop import Offer, Phase, run_repeats

RESULTS = Path(__file__).resolve().parent / "results_pinned_horizon.json"


def pinned_phases(args: argparse.Namespace) -> Callable[[Offer], list[Phase]]:
    def phases(offer: Offer) -> list[Phase]:
        holder = psycopg.connect(offer.db.conninfo(HARNESS_ROLE), autocommit=True)

        async def hold() -> None:
            table = sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(offer.schema))
            await trio.to_thread.run_sync(holder.execute, "BEGIN ISOLATION LEVEL REPEATABLE READ")
            await trio.to_thread.run_sync(holder.execute, table)
            if args.dump:
                tables = holder.execute(
                    "SELECT c.oid::regclass::text FROM pg_class c"
                    " WHERE c.relnamespace = %s::regnamespace AND c.relkind IN ('r', 'p')",
                    (offer.schema,),
                ).fetchall()
                for (name,) in tables:
                    lock = sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(sql.SQL(name))
                    await trio.to_thread.run_sync(holder.execute, lock)

        async def release() -> None:
            await trio.to_thread.run_sync(holder.execute, "COMMIT")
            holder.close()

        planned = [Phase("clean", args.clean)]
        if args.held:
            planned += [Phase("held", args.held, hold), Phase("after", args.after, release)]
        return planned

    return phases


@contextlib.contextmanager
def busy_core(enabled: bool) -> Iterator[None]:
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
    parser.add_argument("--dump", action="store_true")
    args = parser.parse_args()
    names = ["clean", "held", "after"] if args.held else ["clean"]
    with open_database() as db, busy_core(args.busy):
        run_repeats(db, args, names, RESULTS, lambda db: (db.fresh_schema(), pinned_phases(args)))


if __name__ == "__main__":
    main()
