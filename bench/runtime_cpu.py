"""The runtime's own work per job, without a database: claim loop, executor and completer on a
stub driver, this checkout against others, interleaved.

    python -m bench.runtime_cpu --jobs 40000 --repeats 5 --root /path/to/other/checkout

Each repeat drains `--jobs` no-op jobs (concurrency 25) through the real `ClaimLoop` of each
checkout (the order rotated each repeat) on a driver that answers at once, or after
`--claim-ms` / `--flush-ms` (a flush slower than the claim fills the completer's backlog,
as a durable drain does). Prints CPU per job (noisy on a shared machine) and two counts that
load does not move: trio task steps per job and Python calls per job (cProfile's count, in a
second drain of the same size, so its overhead is not in the CPU figure). Claimed jobs are
built before the timed part: their decode is the driver's cost (`bench.worker_cpu` has it).

`--instructions` counts instead of timing: each checkout's drain runs under valgrind's
callgrind, once with `--jobs` and once with a third as many, and the difference of their
instruction counts per job is printed (start-up and imports cancel out; the claimed jobs'
construction is counted, as a worker's decode builds them). The count does not move with the
machine's load (the same tree gives the same figure to 0.1%), where CPU time on 2 shared
cores moves by half from run to run; valgrind runs a drain ~50x slower, so `--jobs 3000`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from bench.harness import REPO_ROOT
from bench.stats import rotated

# Run in a child process whose sys.path starts with the checkout measured: it uses only what
# every checkout's runtime has (ClaimLoop, WorkerMetrics, instrument_driver, TaskSpec).
CHILD = """
import cProfile, datetime, json, pstats, sys, time, uuid
import trio
try:
    import trioq._seam.driver as seam
    from trioq._runtime.workflow.checkpoints import CheckpointWriter
    from trioq._runtime.job.claim_loop import ClaimLoop, WorkerHooks
    from trioq._runtime.services.metrics import WorkerMetrics, instrument_driver
    from trioq._runtime.job.tasks import TaskSpec
except ImportError:  # a checkout from before the seam and the runtime had folders
    import trioq._driver as seam
    from trioq._runtime.checkpoints import CheckpointWriter
    from trioq._runtime.claim_loop import ClaimLoop, WorkerHooks
    from trioq._runtime.metrics import WorkerMetrics, instrument_driver
    from trioq._runtime.tasks import TaskSpec
ClaimedJob = seam.ClaimedJob

jobs, claim_s, flush_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
NOW = datetime.datetime.now(datetime.timezone.utc)


class Steps(trio.abc.Instrument):
    steps = 0

    def before_task_step(self, task):
        Steps.steps += 1


class Stub:
    def __init__(self, claimed):
        self.claimed, self.done, self.finished = claimed, 0, trio.Event()

    def is_connection_lost(self, exc):
        return False

    async def _answer(self, limit, settlements):
        delay = flush_s if settlements else claim_s
        if delay:
            await trio.sleep(delay)
        else:
            await trio.lowlevel.checkpoint()
        claimed = ()
        if limit:
            claimed = tuple(self.claimed[:limit])
            del self.claimed[:limit]
        self.done += len(settlements)
        if self.done >= jobs:
            self.finished.set()
        return tuple((s.lease.id, "completed") for s in settlements), claimed

    # A checkout's seam: one fused round (before the split) or a claim and a settle.
    async def job_settle_and_claim(self, p):
        settled, claimed = await self._answer(p.limit, p.settlements)
        return seam.SettleAndClaimResult(settled=settled, claimed=claimed, now=NOW)

    async def job_claim(self, p):
        _, claimed = await self._answer(p.limit, ())
        return seam.ClaimResult(claimed=claimed, now=NOW)

    async def job_settle_many(self, settlements):
        settled, _ = await self._answer(0, settlements)
        return seam.SettleResult(settled=settled, now=NOW)


async def noop(ctx, payload):
    return None


async def drain(profile):
    claimed = [
        ClaimedJob(i, "default", "noop", {}, 1, None, uuid.uuid4(), None, 0, NOW, NOW, False)
        for i in range(1, jobs + 1)
    ]
    metrics = WorkerMetrics()
    stub = Stub(claimed)
    driver = instrument_driver(stub, metrics)
    loop = ClaimLoop(
        queue="default", concurrency=25, driver=driver,
        tasks={"noop": TaskSpec("noop", noop, max_attempts=1)}, worker_id=uuid.uuid4(),
        lease_seconds=30, poll_interval=1.0, hooks=WorkerHooks(on_round=metrics.on_round),
        checkpoints=CheckpointWriter(driver), tally=metrics.jobs,
    )
    steps = Steps()
    trio.lowlevel.add_instrument(steps)
    async with trio.open_nursery() as nursery:
        Steps.steps = 0
        started = time.process_time()
        if profile is not None:
            profile.enable()
        nursery.start_soon(loop.run)
        await stub.finished.wait()
        if profile is not None:
            profile.disable()
        cpu = time.process_time() - started
        trio.lowlevel.remove_instrument(steps)
        loop.stop_claiming()
    return cpu, Steps.steps


if sys.argv[4:] == ["count"]:  # --instructions: one drain, counted by callgrind outside
    trio.run(drain, None)
    raise SystemExit
cpu, steps = trio.run(drain, None)
profile = cProfile.Profile()
trio.run(drain, profile)
calls = pstats.Stats(profile).total_calls
print(json.dumps({"us": cpu / jobs * 1e6, "steps": steps / jobs, "calls": calls / jobs}))
"""


def measure(root: Path, jobs: int, claim_ms: float, flush_ms: float) -> dict[str, float]:
    argv = [sys.executable, "-c", CHILD, str(jobs), str(claim_ms / 1000), str(flush_ms / 1000)]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(argv, cwd=root, env=env, check=True, capture_output=True, text=True)
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def instructions(root: Path, jobs: int, claim_ms: float, flush_ms: float) -> float:
    """Instructions a job: callgrind's count of a drain of `jobs` less that of a third as many,
    per job between them."""
    counts = []
    for size in (jobs // 3, jobs):
        argv = [
            "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
            "-c", CHILD, str(size), str(claim_ms / 1000), str(flush_ms / 1000), "count",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}
        out = subprocess.run(argv, cwd=root, env=env, check=True, capture_output=True, text=True)
        found = re.search(r"Collected : (\d+)", out.stderr)
        if found is None:
            raise RuntimeError(f"no instruction count from callgrind: {out.stderr[-500:]}")
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / (jobs - jobs // 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--root", action="append", default=[], type=Path)
    parser.add_argument("--claim-ms", type=float, default=0.0)
    parser.add_argument("--flush-ms", type=float, default=0.0)
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions a job under callgrind instead (one pass: the count is stable)",
    )
    args = parser.parse_args()
    roots = {"this": REPO_ROOT, **{str(root): root for root in args.root}}
    if args.instructions:
        for name, root in roots.items():
            count = instructions(root, args.jobs, args.claim_ms, args.flush_ms)
            print(f"{name:>10}: {count:,.0f} instructions/job", flush=True)
        return
    figures: dict[str, dict[str, list[float]]] = {}
    for repeat in range(args.repeats):
        order = rotated(list(roots.items()), repeat)
        print(f"repeat {repeat + 1} (load {os.getloadavg()[0]:.2f})", flush=True)
        for name, root in order:
            run = measure(root, args.jobs, args.claim_ms, args.flush_ms)
            row = figures.setdefault(name, {})
            for key, value in run.items():
                row.setdefault(key, []).append(value)
            print(
                f"{name:>10}: {run['us']:6.2f} us CPU/job  {run['steps']:.3f} task steps/job  "
                f"{run['calls']:6.1f} calls/job",
                flush=True,
            )
    print(f"medians: ({args.repeats} repeats, load {os.getloadavg()[0]:.2f})")
    for name, row in figures.items():
        print(
            f"{name:>10}: {statistics.median(row['us']):6.2f} us CPU/job  "
            f"{statistics.median(row['steps']):.3f} task steps/job  "
            f"{statistics.median(row['calls']):6.1f} calls/job"
        )


if __name__ == "__main__":
    main()
