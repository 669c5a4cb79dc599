"""`python -m bench.trees`: the 3-step workflow drain of `bench.scenarios.workflows`, run by the
workers of several checkouts of trioq in one embedded cluster, interleaved, so their rates
compare as ratios within one run (a shared, loaded machine makes figures from separate runs
noise).

python -m bench.trees --tree base=/work/wt-base --tree head=. --repeats 5
python -m bench.trees --tree base=/work/wt-base --tree head=. --task noop --jobs 20000

Each checkout needs its own `.venv` (`pip install -e .`). Per repeat, every tree drains
`--jobs` workflows of 3 no-op steps on a fresh schema that its own worker migrates (its own
migrations); the backlog is enqueued by that tree's code too, in one transaction. The order of
the trees rotates with the repeat. `--task noop` drains plain no-op jobs instead (each tree on
its own schema, so each pays its own migrations' triggers and indexes). Reported per tree:
the median workflows (jobs) per second (t0 = the backlog's COMMIT, end = the last
`finished_at`), the worker's CPU ms, its statements and their server execution ms per
workflow, and every tree's rate as a ratio to the first tree's in the
same repeat (median of the ratios).
`--fanout N`: each workflow is a parent that spawns N no-op children and gathers them
(`fanout_parent`): every child's completion wakes its parent through the settle statement;
`settle_ms_per_workflow` is the server execution of the settle statement alone (job_settle_many;
job_settle_and_claim in checkouts from before the claim and the settle were split).
`--delay S`: the backlog is enqueued `S` seconds ahead (scheduled: every job is promoted or
claimed as due, through the due path), and the drain is timed from the first job's run_at (or
the COMMIT, if later): choose S above the enqueue's own time. `--task sleep_1s` drains
workflows that each sleep durably for a second (sleeping, then due) the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench.config import FULL
from bench.harness import HARNESS_ROLE, Database, Launcher, open_database
from bench.jobs import TRIOQ
from bench.stats import rotated

ENQUEUE = """
import sys, time, trio
from bench.app import make_app
async def main():
    app = make_app(sys.argv[2], sys.argv[1])
    async with app.client() as client:
        async with client.transaction() as tx:
            payload = {"children": int(sys.argv[5])} if sys.argv[4] == "fanout_parent" else {}
            delay = float(sys.argv[6]) or None
            await tx.enqueue_many(sys.argv[4], [payload] * int(sys.argv[3]), delay=delay)
        print(time.time())
trio.run(main)
"""


# The settle statement's text as pg_stat_statements shows it, either seam (its plain form
# starts otherwise; checkpoint writes start with the same CTE name but read no moves_run_at).
SETTLE_QUERY = "WITH%input AS MATERIALIZED%moves_run_at%"


def settle_ms(db: Database, role: str) -> float:
    rows = db.fetch(
        "SELECT coalesce(sum(s.total_exec_time), 0) FROM pg_stat_statements s"
        " JOIN pg_roles r ON r.oid = s.userid WHERE r.rolname = %s AND s.query LIKE %s",
        [role, SETTLE_QUERY],
    )
    return float(rows[0][0])


def drain(
    db: Database,
    launcher: Launcher,
    tree: Path,
    jobs: int,
    task: str = "three_steps",
    fanout: int = 0,
    delay: float = 0.0,
    breakdown: list[dict[str, tuple[int, float]]] | None = None,
) -> dict[str, float]:
    schema = db.fresh_schema(migrate=False)
    try:
        worker = launcher.trioq_worker(
            schema, concurrency=FULL.concurrency, tree=tree, migrate=True
        )
        cpu_before = worker.cpu_seconds()
        server_before = db.server_cpu_seconds()
        db.reset_statements()
        out = subprocess.run(
            [str(tree / ".venv/bin/python"), "-c", ENQUEUE, db.conninfo(HARNESS_ROLE), schema,
             str(jobs), task, str(fanout), str(delay)],
            cwd=tree, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"enqueue in {tree} failed: {out.stderr[-2000:]}")
        t0 = float(out.stdout.strip())
        if delay:
            first_due = db.scalar(f"SELECT extract(epoch FROM min(run_at)) FROM {schema}.jobs")
            t0 = max(t0, float(first_due))
        finished = jobs * (fanout + 1)
        db.wait_count(
            TRIOQ.completed(schema), [], finished, FULL.timeout, worker.check_alive, paced=True
        )
        cpu = worker.cpu_seconds() - cpu_before
        server = db.server_cpu_seconds() - server_before
        statements, db_ms = db.statement_totals([worker.role])
        if breakdown is not None:
            breakdown.append(db.statement_breakdown([worker.role]))
        settle = settle_ms(db, worker.role)
        last = db.scalar(TRIOQ.last_finished(schema))
        worker.stop()
    finally:
        db.drop_schema(schema)
    return {
        "workflows_per_s": jobs / (last - t0),
        "cpu_ms_per_workflow": cpu * 1000 / jobs,
        "statements_per_workflow": statements / jobs,
        "server_ms_per_workflow": db_ms / jobs,
        # the cluster's CPU from before the enqueue (its insert included) to the last job
        "server_cpu_ms_per_workflow": server * 1000 / jobs,
        "settle_ms_per_workflow": settle / jobs,
    }


def print_breakdown(
    name: str, repeats: list[dict[str, tuple[int, float]]], jobs: int, top: int
) -> None:
    """The tree's costliest statements by median execution time, per workflow."""
    queries = {query for run in repeats for query in run}
    rows = []
    for query in queries:
        calls = statistics.median(run.get(query, (0, 0.0))[0] for run in repeats)
        ms = statistics.median(run.get(query, (0, 0.0))[1] for run in repeats)
        rows.append((ms * 1000 / jobs, calls / jobs, query))
    rows.sort(reverse=True)
    print(f"{name}: statements by execution time (median of {len(repeats)} repeats)")
    for us, calls, query in rows[:top]:
        print(f"  {us:8.2f} us {calls:7.3f} calls  {query}")
    print(f"  {sum(r[0] for r in rows):8.2f} us in all ({len(rows)} statements)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trees", description=__doc__)
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=FULL.workflow_jobs)
    parser.add_argument("--output", type=Path, default=None, help="JSON of every repeat")
    parser.add_argument(
        "--task", default="three_steps", help="bench.app's task to drain (noop: a plain job)"
    )
    parser.add_argument("--fanout", type=int, default=0, help="N children per workflow")
    parser.add_argument(
        "--delay", type=float, default=0.0, help="enqueue the backlog S seconds ahead"
    )
    parser.add_argument(
        "--statements",
        type=int,
        default=0,
        help="print each tree's N costliest statements: calls and execution us per workflow",
    )
    args = parser.parse_args(argv)
    task = "fanout_parent" if args.fanout else args.task
    trees = [(name, Path(path).resolve()) for name, path in (t.split("=", 1) for t in args.tree)]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    ratios: dict[str, list[float]] = {name: [] for name, _ in trees}
    breakdowns: dict[str, list[dict[str, tuple[int, float]]]] = {name: [] for name, _ in trees}
    with open_database() as db:
        launcher = Launcher(db, Path(tempfile.mkdtemp(prefix="trioq-bench-trees-")))
        try:
            for repeat in range(args.repeats):
                order = rotated(trees, repeat)
                load = os.getloadavg()[0]
                got = {
                    name: drain(
                        db,
                        launcher,
                        path,
                        args.jobs,
                        task,
                        args.fanout,
                        args.delay,
                        breakdowns[name] if args.statements else None,
                    )
                    for name, path in order
                }
                for name, _ in trees:
                    runs[name].append(got[name])
                    rate = got[name]["workflows_per_s"]
                    ratios[name].append(rate / got[trees[0][0]]["workflows_per_s"])
                print(
                    f"repeat {repeat + 1} (load {load:.2f}): "
                    + ", ".join(
                        f"{name} {got[name]['workflows_per_s']:.0f}/s "
                        f"{got[name]['cpu_ms_per_workflow']:.2f} cpu ms"
                        for name, _ in trees
                    ),
                    flush=True,
                )
        finally:
            launcher.stop_all()
    summary = {
        name: {key: statistics.median(run[key] for run in runs[name]) for key in runs[name][0]}
        | {f"vs_{trees[0][0]}": statistics.median(ratios[name])}
        for name, _ in trees
    }
    summary["_load_average_at_end"] = {"1min": os.getloadavg()[0]}
    for name, _ in trees:
        if args.statements:
            print_breakdown(name, breakdowns[name], args.jobs, args.statements)
    print(json.dumps(summary, indent=2))
    if args.output is not None:
        args.output.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
