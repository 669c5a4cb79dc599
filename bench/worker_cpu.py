"""Worker CPU per job, interleaved: the raw loop vs trioq from one or more checkouts.

    python -m bench.worker_cpu --jobs 20000 --repeats 5 --root /path/to/other/checkout

Each repeat drains one backlog of no-op jobs (concurrency 25, one worker) on the two raw floors
(`raw` marks the job completed with its result and keeps the row; `raw-del` deletes it), then
on this checkout's trioq and each `--root` checkout's, each on a schema its own migrations
made (a checkout's tables, indexes and CHECKs are part of its server CPU per job), the
checkouts' order rotated each repeat, so the systems see the same load.
Worker CPU is user+sys of the worker process from the backlog's COMMIT to the last completion
(throughput.py's `drain`); server CPU is that of the whole PostgreSQL cluster (its processes
read from /proc, less the harness's session) over the same window.
`--raw-async-claim` adds the two raw loops with their claim committed without waiting for its
WAL flush (as trioq's claims were until a crash's lost claims ran their jobs twice at once:
bench/RESULTS.md, "The asynchronous claim reverted") (`raw-async`, `raw-del-async`).
`--prefetch N` adds this checkout's trioq with `--prefetch N` (`prefetchN`).
`--awa` adds awa's Python worker (bench/awa_peer.py: awa-pg on its queue storage, the same 25
slots) as a system of each repeat.
`--trio-floor` adds three more systems to each repeat, the raw loop's algorithm on trio and
trioq's statement path (bench/trio_floor.py), with a cancel scope per job (`floor`) and without
(`floor-ns`): what trio and the driver cost before any of trioq's runtime; and `floor-del`,
`floor` with raw-del's completion (the row deleted, nothing kept).
`--contract-floor` adds two more, the same trio worker (a cancel scope per job) on the tables
and statements of the floor of trioq's contract (bench/contract_floor.py: a claim writing a
lease fenced by attempt and token, a completion fenced by id + attempt + token), the outcome
appended to a history (`contract`) or the record deleted, nothing kept (`contract-del`): the
least any storage layout costs in a live drain, the floor the drain targets are judged against.
`--trioq-statements` adds `floor-trioq`: the same trio worker sending trioq's own claim and
completion (job_claim_plain, job_complete_plain, as trioq's driver sends them) on trioq's
schema, so trioq's figure splits into what its statements cost the server and what its runtime
costs; `--variant NAME=DIR` adds the same worker sending a variant's statements instead
(bench/statement_variants.py; `bench/variants/lean` is the least a claim and a completion do on
trioq's tables).
Prints per repeat and the medians; ratios are taken within a repeat. `--py-spy OUT` records one
drain of this checkout's worker (or the first `--root`'s) with py-spy instead, only samples
holding the GIL (`--gil`: on 2 shared cores a process is often preempted mid-call, which plain
sampling counts as running).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import attrs

from bench.app import SCHEMA_ENV
from bench.config import FULL
from bench.harness import (
    CLOCK_TICKS,
    HARNESS_ROLE,
    REPO_ROOT,
    Database,
    Launcher,
    Process,
    open_database,
)
from bench.jobs import AWA, RAW, RAW_DELETE, TRIOQ, TRIOQ_UNKEPT, System, contract_system
from bench.scenarios import Context, Results
from bench.scenarios.throughput import Drain, drain
from bench.stats import rotated

# The worker under cProfile with a CPU-time clock of its main thread: py-spy and cProfile's
# default clock count wall time, and on 2 shared cores a process that wakes PostgreSQL is often
# preempted inside the send (py-spy put 15% of a drain on `send_query_prepared`).
PROFILED = """
import cProfile, runpy, sys, time
out = sys.argv.pop(1)
profile = cProfile.Profile(time.thread_time)
sys.argv[0] = "trioq"
try:
    profile.runcall(runpy.run_module, "trioq.cli", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    profile.dump_stats(out)
"""


# A checkout's own migrations: the drain's fresh schema was migrated by this checkout's.
MIGRATE = """
import sys, trio
from bench.app import make_app
async def main():
    async with make_app(sys.argv[2], sys.argv[1]).client(migrate=True):
        pass
trio.run(main)
"""


# The backlog of another checkout, enqueued by its own code (a stop-first schema change, as
# migration 0047's, leaves this checkout's insert unable to write the other's table): one
# transaction, as bench.jobs.enqueue_committed; prints the time right after COMMIT.
ENQUEUE = """
import sys, time, trio
from bench.app import make_app
async def main():
    async with make_app(sys.argv[2], sys.argv[1]).client() as client:
        async with client.transaction() as tx:
            await tx.enqueue_many(sys.argv[3], [{}] * int(sys.argv[4]))
    print(time.time())
trio.run(main)
"""


def trioq_system(root: Path) -> System:
    """TRIOQ, its backlog enqueued by `root`'s code when `root` is another checkout."""
    if root.resolve() == REPO_ROOT.resolve():
        return TRIOQ

    def enqueue(
        db: Database, schema: str, task: str, count: int, before_commit: Callable[[], None]
    ) -> float:
        before_commit()
        done = subprocess.run(
            [sys.executable, "-c", ENQUEUE, db.conninfo(HARNESS_ROLE), schema, task, str(count)],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            check=True,
            capture_output=True,
            text=True,
        )
        return float(done.stdout.split()[-1])

    return attrs.evolve(TRIOQ, enqueue=enqueue)


def own_schema(launcher: Launcher, schema: str, root: Path) -> None:
    """Give `schema` the migrations of `root` (another checkout's schema may differ: its
    tables, indexes and CHECKs are part of what its server CPU per job measures)."""
    if root.resolve() == REPO_ROOT.resolve():
        return
    launcher.db.drop_schema(schema)
    subprocess.run(
        [sys.executable, "-c", MIGRATE, launcher.db.conninfo(HARNESS_ROLE), schema],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=True,
    )


def trioq_worker(
    launcher: Launcher,
    schema: str,
    root: Path,
    profile: Path | None = None,
    prefetch: int = 0,
) -> Process:
    """`trioq worker` with the package imported from `root` (its cwd comes first on sys.path),
    on `schema` migrated by `root`'s migrations; with `profile`, under cProfile (main thread
    CPU time) writing there at exit."""
    own_schema(launcher, schema, root)
    role = launcher.db.new_role("bench_w")
    entry = ["-m", "trioq.cli"] if profile is None else ["-c", PROFILED, str(profile)]
    argv = [
        sys.executable,
        *entry,
        "worker",
        "bench.app:app",
        "--concurrency",
        "25",
        "--grace",
        "10",
        *(["--prefetch", str(prefetch)] if prefetch else []),
    ]
    env = {"TRIOQ_DATABASE_URL": launcher.db.conninfo(role), SCHEMA_ENV: schema}
    log_path = launcher.log_dir / f"{role}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            argv,
            cwd=root,
            env={**os.environ, **env, "PYTHONPATH": str(root)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
        )
    process = Process(f"trioq worker {role}", role, popen, log_path)
    launcher.started.append(process)
    process.wait_for_line(b"trioq worker ")
    return process


def line(name: str, run: Drain) -> str:
    us = run.cpu_seconds / run.jobs * 1e6
    return (
        f"{name:>12}: {run.jobs_per_s:8.0f} jobs/s  {us:6.1f} us CPU/job  "
        f"{run.statements_per_job:.3f} stmt/job  {run.db_us_per_job:6.1f} us server exec/job  "
        f"{run.server_us_per_job:6.1f} us server CPU/job"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--root", action="append", default=[], type=Path)
    parser.add_argument("--py-spy", type=Path, default=None)
    parser.add_argument("--cprofile", type=Path, default=None)
    parser.add_argument("--format", default="raw", help="py-spy's output format (raw, flamegraph)")
    parser.add_argument(
        "--trio-floor",
        action="store_true",
        help="also run the raw loop on trio and trioq's statement path (bench/trio_floor.py),"
        " with and without a cancel scope per job",
    )
    parser.add_argument(
        "--trioq-statements",
        action="store_true",
        help="also run the trio floor's worker with trioq's own claim and completion"
        " (job_claim_plain, job_complete_plain) on trioq's schema (`floor-trioq`)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=DIR: also run the trio floor's worker with the statement variants in DIR"
        " (bench/trio_floor.py --variant) on trioq's schema",
    )
    parser.add_argument(
        "--contract-floor",
        action="store_true",
        help="also run the trio floor on the contract's floor (bench/contract_floor.py), the"
        " outcome kept and nothing kept",
    )
    parser.add_argument(
        "--raw-async-claim",
        action="store_true",
        help="also drain both raw loops with their claim's commit asynchronous",
    )
    parser.add_argument(
        "--prefetch",
        action="append",
        default=[],
        type=int,
        help="N: also drain this checkout's trioq with `--prefetch N` (`prefetchN`)",
    )
    parser.add_argument(
        "--awa",
        action="store_true",
        help="also drain on awa (awa-pg's Python worker, queue storage) with the same slots",
    )
    parser.add_argument(
        "--unkept",
        action="store_true",
        help="also drain this checkout's trioq on a task that keeps nothing (keep=False)",
    )
    args = parser.parse_args()
    roots = {"this": REPO_ROOT, **{str(root): root for root in args.root}}
    # Each a trio floor on trioq's schema; `floor-trioq` sends trioq's own statements (None).
    variants: dict[str, Path | None] = {"floor-trioq": None} if args.trioq_statements else {}
    variants |= {
        name: Path(path).resolve()
        for name, path in (variant.split("=", 1) for variant in args.variant)
    }
    with tempfile.TemporaryDirectory() as logs, open_database() as db:
        launcher = Launcher(db, Path(logs))
        ctx = Context(db, launcher, FULL, Results())
        n = args.jobs
        if args.cprofile is not None:
            run = drain(
                ctx, lambda s: [trioq_worker(launcher, s, REPO_ROOT, args.cprofile)], "noop", n
            )
            print(line("cprofile", run))
            return
        if args.py_spy is not None:
            spies: list[subprocess.Popen[bytes]] = []

            spied_root = args.root[0] if args.root else REPO_ROOT  # the first --root, if any

            def spied(schema: str) -> list[Process]:
                worker = trioq_worker(launcher, schema, spied_root)
                argv = ["py-spy", "record", "-r", "400", "--gil", "-f", args.format]
                argv += ["-o", str(args.py_spy)]
                spies.append(subprocess.Popen([*argv, "--pid", str(worker.popen.pid)]))
                return [worker]

            run = drain(ctx, spied, "noop", n)
            spies[0].wait(60)  # it writes its output once the worker has exited
            print(line("py-spy", run))
            return
        figures: dict[str, dict[str, list[float]]] = {}

        def record(name: str, run: Drain, bases: dict[str, Drain]) -> None:
            # /proc counts CPU in clock ticks (10 ms): a drain shorter than one tick (the raw
            # loop's 200 jobs of the smoke test on a fast machine) reads 0, so count it as one.
            cpu_us = max(run.cpu_seconds, 1 / CLOCK_TICKS) / n * 1e6
            server_us = max(run.server_cpu_seconds, 1 / CLOCK_TICKS) / n * 1e6
            row = figures.setdefault(name, {})
            row.setdefault("jobs/s", []).append(run.jobs_per_s)
            row.setdefault("us CPU/job", []).append(cpu_us)
            row.setdefault("us server/job", []).append(server_us)
            row.setdefault("stmt/job", []).append(run.statements_per_job)
            for label, base in bases.items():
                base_cpu = max(base.cpu_seconds, 1 / CLOCK_TICKS) / n * 1e6
                base_server = max(base.server_cpu_seconds, 1 / CLOCK_TICKS) / n * 1e6
                row.setdefault(f"x {label} CPU/job", []).append(cpu_us / base_cpu)
                row.setdefault(f"x {label} server/job", []).append(server_us / base_server)
                row.setdefault(f"x {label} jobs/s", []).append(run.jobs_per_s / base.jobs_per_s)

        # Each system: its name, task, workers and how its drain is counted.
        systems: list[tuple[str, str, Callable[[str], list[Process]], System]] = []

        def add(
            name: str, start: Callable[[str], Process], system: System, task: str = "noop"
        ) -> None:
            systems.append((name, task, lambda s: [start(s)], system))

        for name, root in roots.items():
            add(name, lambda s, r=root: trioq_worker(launcher, s, r), trioq_system(root))
        if args.unkept:
            add(
                "unkept",
                lambda s: trioq_worker(launcher, s, REPO_ROOT),
                TRIOQ_UNKEPT,
                task="noop_unkept",
            )
        for prefetch in args.prefetch:
            add(
                f"prefetch{prefetch}",
                lambda s, p=prefetch: trioq_worker(launcher, s, REPO_ROOT, prefetch=p),
                TRIOQ,
            )
        if args.raw_async_claim:
            for delete in (False, True):
                add(
                    "raw-del-async" if delete else "raw-async",
                    lambda s, d=delete: launcher.baseline_worker(
                        s, expect=n, delete=d, async_claim=True
                    ),
                    RAW_DELETE if delete else RAW,
                )
        if args.awa:
            add("awa", launcher.awa_worker, AWA)
        if args.trio_floor:
            for scope in (True, False):
                add(
                    "floor" if scope else "floor-ns",
                    lambda s, c=scope: launcher.trio_floor_worker(s, expect=n, scope=c),
                    RAW,
                )
            # raw-del's statements on trio with the scope: the nothing-kept floor of any worker
            # that can cancel a job alone, whatever its storage.
            add(
                "floor-del",
                lambda s: launcher.trio_floor_worker(s, expect=n, delete=True),
                RAW_DELETE,
            )
        if args.contract_floor:
            for keep in (True, False):
                add(
                    "contract" if keep else "contract-del",
                    lambda s, k=keep: launcher.trio_floor_worker(
                        s, expect=n, contract="keep" if k else "delete"
                    ),
                    contract_system(keep=keep, jobs=n),
                )
        for name, directory in variants.items():
            add(
                name,
                lambda s, d=directory: launcher.trio_floor_worker(
                    s, expect=n, contract="trioq", variant=d
                ),
                TRIOQ,
            )
        for repeat in range(args.repeats):
            # The two floors: `raw` keeps the finished row and its result, `raw-del` deletes it
            # (no result); every system's ratios are stated against both.
            print(f"repeat {repeat + 1} (load {load()})", flush=True)
            floors: dict[str, Drain] = {}
            for floor in ("raw", "raw-del")[:: 1 if repeat % 2 == 0 else -1]:
                delete = floor == "raw-del"
                floors[floor] = drain(
                    ctx,
                    lambda s, d=delete: [launcher.baseline_worker(s, expect=n, delete=d)],
                    "noop",
                    n,
                    RAW_DELETE if delete else RAW,
                )
                print(line(floor, floors[floor]), flush=True)
            record("raw", floors["raw"], {"raw-del": floors["raw-del"]})
            record("raw-del", floors["raw-del"], {"raw": floors["raw"]})
            # Rotated each repeat: the drain right after the raw loop's paid more (server and
            # worker) in a first run, whichever checkout it was.
            order = rotated(systems, repeat)
            for name, task, start, system in order:
                run = drain(ctx, start, task, n, system)
                print(line(name, run), flush=True)
                record(name, run, floors)
        print(f"medians: ({args.repeats} repeats, load {load()})")
        for name, row in figures.items():
            cells = [f"{statistics.median(values):.3f} {label}" for label, values in row.items()]
            print(f"{name:>12}: " + "  ".join(cells))


def load() -> str:
    """The 1, 5 and 15-minute load averages, as uptime prints them."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


if __name__ == "__main__":
    main()
