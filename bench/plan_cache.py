"""Claim statements' server cost per job, this checkout against others, interleaved.

    python -m bench.plan_cache --repeats 5 --root /path/to/other/checkout

Each repeat drains, on one worker (concurrency 25) of each checkout in turn (the order rotated
each repeat), two backlogs: `plain`, 20,000 unkeyed no-op jobs (the plain rounds'
statements), and `keyed`, 10,000 no-op jobs over 100 partition keys with 100,000 sleeping
workflows and 50,000 delayed jobs in the table (the full settle-and-claim statement, the
load its `(SELECT %(x)s)` plan-stability wrappers were written for). Printed per drain:
jobs/s, worker CPU per job, and the server's execution and planning time per job with the
plan count of the worker's statements (pg_stat_statements, track_planning on). Checkouts
share the migrations (the same schema version), as in `bench.worker_cpu`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import attrs

from bench.config import FULL, QUICK
from bench.harness import REPO_ROOT, Database, Launcher, Process, open_database
from bench.jobs import TRIOQ, JobGroup, enqueue_committed
from bench.scenarios import Context, Results
from bench.scenarios.throughput import Drain, drain
from bench.scenarios.workflows import fill
from bench.stats import rotated
from bench.worker_cpu import trioq_worker

KEYS = 100

PLANNING_SQL = """
SELECT coalesce(sum(s.total_plan_time), 0), coalesce(sum(s.plans), 0)
FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
WHERE r.rolname = ANY(%s)
"""


def _keyed_enqueue(
    db: Database, schema: str, task: str, count: int, before_commit: Callable[[], None]
) -> float:
    groups = [JobGroup(task, count // KEYS, partition_key=f"k{key}") for key in range(KEYS)]
    return enqueue_committed(db, schema, groups, before_commit)


KEYED = attrs.evolve(TRIOQ, name="trioq-keyed", enqueue=_keyed_enqueue)


@attrs.frozen
class Measured:
    run: Drain
    plan_ms: float
    plans: int


def _measure(ctx: Context, root: Path, keyed: bool, jobs: int) -> Measured:
    planning: list[tuple[float, int]] = []
    workers: list[Process] = []

    def start(schema: str) -> list[Process]:
        workers.append(trioq_worker(ctx.launcher, schema, root))
        return workers[-1:]

    def read_planning(schema: str) -> None:
        [(plan_ms, plans)] = ctx.db.fetch(PLANNING_SQL, [[w.role for w in workers]])
        planning.append((float(plan_ms), int(plans)))

    run = drain(
        ctx,
        start,
        "noop",
        jobs,
        KEYED if keyed else TRIOQ,
        prepare=(lambda schema: fill(ctx, schema)) if keyed else None,
        before_stop=read_planning,
    )
    return Measured(run, *planning[0])


def line(name: str, measured: Measured) -> str:
    run = measured.run
    return (
        f"{name:>24}: {run.jobs_per_s:7.0f} jobs/s  {run.cpu_seconds / run.jobs * 1e6:6.1f} us "
        f"CPU/job  {run.db_us_per_job:6.1f} us exec/job  "
        f"{measured.plan_ms * 1000 / run.jobs:6.1f} us plan/job  {measured.plans} plans"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--root", action="append", default=[], type=Path)
    parser.add_argument("--plain-jobs", type=int, default=20_000)
    parser.add_argument("--keyed-jobs", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="small sizes and fill (a smoke run)")
    args = parser.parse_args()
    roots = {"this": REPO_ROOT, **{str(root): root for root in args.root}}
    figures: dict[tuple[str, str], list[Measured]] = {}
    with tempfile.TemporaryDirectory() as logs, open_database() as db:
        ctx = Context(db, Launcher(db, Path(logs)), QUICK if args.quick else FULL, Results())
        for repeat in range(args.repeats):
            print(f"repeat {repeat + 1}", flush=True)
            order = rotated(list(roots.items()), repeat)
            for workload, keyed, jobs in (
                ("plain", False, args.plain_jobs),
                ("keyed", True, args.keyed_jobs),
            ):
                for name, root in order:
                    measured = _measure(ctx, root, keyed, jobs)
                    figures.setdefault((workload, name), []).append(measured)
                    print(line(f"{workload} {name}", measured), flush=True)
    print("medians:")
    for (workload, name), runs in figures.items():
        print(
            f"{workload + ' ' + name:>24}: "
            f"{statistics.median(m.run.jobs_per_s for m in runs):7.0f} jobs/s  "
            f"{statistics.median(m.run.cpu_seconds / m.run.jobs * 1e6 for m in runs):6.1f} us "
            f"CPU/job  {statistics.median(m.run.db_us_per_job for m in runs):6.1f} us exec/job  "
            f"{statistics.median(m.plan_ms * 1000 / m.run.jobs for m in runs):6.1f} us plan/job  "
            f"{statistics.median(m.plans for m in runs):.0f} plans"
        )


if __name__ == "__main__":
    main()
