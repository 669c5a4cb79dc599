"""`python -m bench.settle_rounds`: server time of the settle statement, per call, for the
checkouts given, interleaved in one embedded cluster (a ratio within one run is the figure).

    python -m bench.settle_rounds --tree base=/path/to/checkout --tree head=. --repeats 5

Each checkout needs its own `.venv`. Per repeat and mode, each tree's code (its PgDriver, its
migrations, on a fresh schema) runs `--rounds` rounds of 25 settlements in one statement
each round after a claim of the 25 jobs, and pg_stat_statements gives the mean server
execution of the settle statement (job_settle_many; in checkouts from before the claim and the
settle were split, job_settle_and_claim, whose calls include the claims):
- `children`: 25 parents, each waiting for one child; the 25 children complete (each round
  wakes 25 parents);
- `no_children`: 25 jobs without a parent fail (the full statement; no parent to wake).
The trees' order alternates with the repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from pathlib import Path

import psycopg

from trioq.embedded import EmbeddedPostgres, EmbeddedSettings

ROUNDS = """
import sys, uuid, trio
from trioq._pg.driver import open_pg_driver
try:
    import trioq._seam.driver as seam
    from trioq._seam.workflow import Spawn, WaitChildren
except ImportError:  # a checkout from before the seam had a folder
    import trioq._driver as seam
    from trioq._driver import Spawn, WaitChildren
NewJob, Settlement = seam.NewJob, seam.Settlement
SPLIT = hasattr(seam, "Claim")  # the claim and the settle are two methods

conninfo, schema, mode, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
BATCH = 25

async def claim(driver, queue):
    claimed = []
    while len(claimed) < BATCH:
        if SPLIT:
            params = seam.Claim(queue, ("echo",), BATCH - len(claimed), 600.0, uuid.uuid4())
            claimed += (await driver.job_claim(params)).claimed
        else:
            params = seam.SettleAndClaim(
                queue, ("echo",), BATCH - len(claimed), 600.0, uuid.uuid4(), ()
            )
            claimed += (await driver.job_settle_and_claim(params)).claimed
    return claimed

async def main():
    async with open_pg_driver(conninfo, schema, pool_size=2) as driver:
        await driver.migrate()
        for n in range(rounds):
            queue = f"q{n}"
            await driver.job_insert_many([NewJob(queue, "echo", "{}") for _ in range(BATCH)])
            if mode == "children":
                parents = await claim(driver, queue)
                spawns = [Spawn(p.lease, 0, NewJob(queue, "echo", "{}")) for p in parents]
                children = await driver.job_spawn_many(spawns)
                for parent, child in zip(parents, children):
                    waits = WaitChildren(parent.lease, 1, (child.child_id,))
                    assert (await driver.job_wait_children(waits)).state == "waiting"
            jobs = await claim(driver, queue)
            kind = "complete" if mode == "children" else "fail"
            error = '{"type": "Boom", "message": "no"}'
            settlements = tuple(
                Settlement(j.lease, kind, result_json="1", error_json=error) for j in jobs
            )
            if SPLIT:
                assert len((await driver.job_settle_many(settlements)).settled) == BATCH
            else:
                params = seam.SettleAndClaim(queue, ("echo",), 0, 600.0, uuid.uuid4(), settlements)
                assert len((await driver.job_settle_and_claim(params)).settled) == BATCH

trio.run(main)
"""
# The settle statement's text as pg_stat_statements shows it, either seam (checkpoint writes
# start with the same CTE name but read no moves_run_at).
SETTLE_QUERY = "WITH%input AS MATERIALIZED%moves_run_at%"
MODES = ("children", "no_children")


def run_tree(conn: psycopg.Connection, conninfo: str, tree: Path, schema: str, mode: str,
             rounds: int) -> float:  # fmt: skip
    """Mean server ms per settle statement call of one run of `tree`'s code."""
    conn.execute("SELECT pg_stat_statements_reset()")
    argv = [str(tree / ".venv/bin/python"), "-c", ROUNDS, conninfo, schema, mode, str(rounds)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(argv, cwd=tree, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: {out.stderr[-2000:]}")
    row = conn.execute(
        "SELECT sum(calls), sum(total_exec_time) FROM pg_stat_statements"
        " WHERE query LIKE %s AND query LIKE %s",
        [SETTLE_QUERY, f'%"{schema}".%'],
    ).fetchone()
    assert row is not None and row[0], f"no settle statement of {schema} in pg_stat_statements"
    return float(row[1]) / int(row[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.settle_rounds", description=__doc__)
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    trees = [(name, Path(path).resolve()) for name, path in (t.split("=", 1) for t in args.tree)]
    ms: dict[tuple[str, str], list[float]] = {(n, m): [] for n, _ in trees for m in MODES}
    settings = EmbeddedSettings(shared_preload_libraries=("pg_stat_statements",))
    with (
        EmbeddedPostgres(settings=settings) as cluster,
        psycopg.connect(cluster.conninfo, autocommit=True) as conn,
    ):
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for repeat in range(args.repeats):
            order = trees if repeat % 2 == 0 else trees[::-1]
            for mode in MODES:
                for name, tree in order:
                    schema = f"{name}_{mode}_{repeat}"
                    mean = run_tree(conn, cluster.conninfo, tree, schema, mode, args.rounds)
                    ms[(name, mode)].append(mean)
                got = {name: round(ms[(name, mode)][-1], 3) for name, _ in trees}
                load = os.getloadavg()[0]
                print(f"repeat {repeat + 1} {mode}: {got} ms (load {load:.2f})", flush=True)
    first = trees[0][0]
    summary = {
        mode: {
            name: {
                "ms_per_call": statistics.median(ms[(name, mode)]),
                f"vs_{first}": statistics.median(
                    [b / a for a, b in zip(ms[(first, mode)], ms[(name, mode)], strict=True)]
                ),
            }
            for name, _ in trees
        }
        for mode in MODES
    }
    summary["_load_average_at_end"] = {"1min": os.getloadavg()[0]}  # type: ignore[assignment]
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
