"""The chaos soak: `python -m tests.soak.run --seconds 180 --seed N`.

Against its own embedded cluster (or `--database-url`, without the PostgreSQL restarts), three
`trioq worker` processes (one with `--processes 2`) run `tests.soak.app` while the workload
(tests/soak/workload.py) enqueues from trio, a SyncProducer thread and SQL, and faults
(tests/soak/faults.py) strike at times drawn from the seed. Then the soak waits for quiescence,
checks the whole history (tests/soak/checker.py), prints a summary and exits 1 on any violation.
The seed is printed at the start and in the verdict: the same seed gives the same faults.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import datetime
import random
import sys
import tempfile
from pathlib import Path

import attrs
import trio
from psycopg import sql

import trioq
from tests.procs import fetch, worker_group
from tests.soak import app as soak_app
from tests.soak import checker
from tests.soak.checker import check
from tests.soak.faults import (
    KINDS,
    LEASE,
    POLL,
    WITHOUT_OWN_CLUSTER,
    Fault,
    Injector,
    Workers,
    fault_schedule,
)
from tests.soak.history import read_soak_history, read_storage_gaps
from tests.soak.model import History, Report
from tests.soak.record import Record, now
from tests.soak.workload import Workload
from trioq.embedded import EmbeddedPostgres, EmbeddedSettings

QUIESCENCE_WITHIN = 240.0
TAIL_WITHIN = 60.0  # event emits and inbox feeds still going when the load stops

# Work that must still happen: due, claimable or running, or due within a few seconds. Sleeping
# and scheduled rows further out, and waits without a deadline, may stay.
UNSETTLED = """
SELECT count(*) FROM {s}.jobs
WHERE state IN ('ready', 'running')
   OR (state IN ('scheduled', 'sleeping', 'waiting') AND run_at < now() + interval '5 seconds')
"""


@attrs.frozen
class Outcome:
    report: Report
    history: History
    record: Record
    load_started: datetime.datetime
    load_ended: datetime.datetime


async def soak(
    pg_url: str, cluster: EmbeddedPostgres | None, seconds: float, seed: int, log_dir: Path
) -> Outcome:
    app = soak_app.build_app(pg_url)
    record = Record()
    kinds = KINDS if cluster is not None else WITHOUT_OWN_CLUSTER
    schedule = fault_schedule(seed, seconds, kinds)
    async with app.client(migrate=True) as client:
        await trio.to_thread.run_sync(soak_app.create_soak_log, pg_url)
        async with worker_group(pg_url, soak_app.SCHEMA, log_dir) as group:
            workers = Workers(group, record)
            await workers.start_all()
            workload = Workload(client, pg_url, record, random.Random(f"load-{seed}"))
            injector = Injector(pg_url, cluster, workers, record)
            load_started = now()
            async with trio.open_nursery() as background:
                background.start_soon(workload.sampler)
                async with trio.open_nursery() as tail:
                    with trio.move_on_after(seconds):
                        await load(workload, injector, schedule, tail, seconds)
                    load_ended = now()
                    print(f"load stopped after {seconds} s; finishing emits and feeds", flush=True)
                    tail.cancel_scope.deadline = trio.current_time() + TAIL_WITHIN
                await quiesce(client, pg_url, workers, workload)
                background.cancel_scope.cancel()
            await workers.stop_all()
    history = await read_soak_history(pg_url, soak_app.SCHEMA)
    gaps = await read_storage_gaps(pg_url, soak_app.SCHEMA)
    facts = record.facts(
        **gaps,
        queue_limits=soak_app.QUEUE_LIMITS,
        queue_rates=soak_app.QUEUE_RATES,
        cron_tasks=frozenset({soak_app.CRON_TASK}),
        recovery_bound=LEASE + POLL + 1.0,
    )
    return Outcome(check(history, facts), history, record, load_started, load_ended)


async def load(
    workload: Workload,
    injector: Injector,
    schedule: list[Fault],
    tail: trio.Nursery,
    seconds: float,
) -> None:
    """Producers, workflows, operators and faults, until cancelled."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(injector.run, schedule, trio.current_time())
        nursery.start_soon(workload.trio_producer)
        nursery.start_soon(workload.rated_bursts, seconds)
        nursery.start_soon(workload.sync_producer)
        nursery.start_soon(workload.sql_producer)
        nursery.start_soon(workload.workflows, tail)
        nursery.start_soon(workload.operator)


async def quiesce(client: trioq.Client, pg_url: str, workers: Workers, workload: Workload) -> None:
    """No more cron occurrences, every worker up, every event emitted; then wait until nothing
    is due or running (twice in a row, a second apart)."""
    await client.unschedule("tick")
    for slot, proc in enumerate(workers.procs):
        if proc.exited:
            await workers.replace(slot)
    for event in sorted(workload.pending_events):
        await workload.emit(event)
    query = sql.SQL(UNSETTLED).format(s=sql.Identifier(soak_app.SCHEMA))
    settled = 0
    with trio.move_on_after(QUIESCENCE_WITHIN) as waited:
        while settled < 2:
            await trio.sleep(1)
            rows = await fetch(pg_url, query)
            settled = settled + 1 if rows[0][0] == 0 else 0
    if waited.cancelled_caught:
        print(f"not quiescent after {QUIESCENCE_WITHIN} s: the checker reports what is stuck")


def summary(outcome: Outcome, seed: int) -> str:
    history, record, report = outcome.history, outcome.record, outcome.report
    states = collections.Counter(job.state for job in history.jobs.values())
    tasks = collections.Counter(job.task for job in history.jobs.values())
    workflows = sum(tasks[name] for name in ("flow", "inbox", "child"))
    minute = datetime.timedelta(seconds=60)
    ends = [row.ts for row in history.rows if row.kind == "end"]
    first = sum(outcome.load_started <= ts < outcome.load_started + minute for ts in ends)
    last = sum(outcome.load_ended - minute <= ts < outcome.load_ended for ts in ends)
    worst = report.worst_recovery
    lines = [
        f"soak summary (seed {seed})",
        f"  jobs: {len(history.jobs)} ({dict(states)}); acknowledged {len(record.acknowledged)}, "
        f"calls that raised {record.enqueue_errors}",
        f"  workflows: {workflows} ({tasks['flow']} flow, {tasks['inbox']} inbox, "
        f"{tasks['child']} child); runs {len(history.runs)}, re-runs {history.duplicates()}",
        f"  faults: {dict(record.faults)}; CLI cancels {record.cancels}, "
        f"redrives {sum(map(len, record.redriven.values()))}",
        f"  worst recovery: {'n/a' if worst is None else f'{worst:.2f} s'} "
        f"over {len(report.recoveries)} lost jobs",
        f"  throughput: {first / 60:.1f} runs/s in the first minute, {last / 60:.1f} in the last",
        f"  peaks (limits exercised): {peaks(history, record)}",
        f"  violations: {len(report.violations)}",
        *(f"    {violation}" for violation in report.violations[:50]),
        *evidence(history, report),
    ]
    return "\n".join(lines)


def peaks(history: History, record: Record) -> str:
    """The most runs at once of the limited queue and of the busiest tenant key, with their
    limits: a soak whose peaks stay far below the limits did not test them."""
    facts = record.facts()
    by_queue = collections.defaultdict(list)
    by_key = collections.defaultdict(list)
    for run in history.runs:
        job = history.jobs.get(run.job_id)
        if job is not None:
            by_queue[job.queue].append(run)
            if job.concurrency_key:
                by_key[job.concurrency_key].append(run)
    limited = soak_app.LIMITED
    queue_peak = checker.peak(by_queue[limited], facts)[0]
    key_peak = max((checker.peak(runs, facts)[0] for runs in by_key.values()), default=0)
    rate, period = soak_app.QUEUE_RATES[soak_app.RATED]
    starts = sorted(run.start for run in by_queue[soak_app.RATED])
    seconds = period - facts.rate_tolerance  # the checker's window (start rows lag claims)
    window = datetime.timedelta(seconds=seconds)
    rated = max(
        (bisect.bisect_left(starts, t + window) - n for n, t in enumerate(starts)), default=0
    )
    return (
        f"{limited} {queue_peak}/{soak_app.QUEUE_LIMITS[limited]} running, "
        f"tenant keys {key_peak}/{soak_app.TENANT_LIMIT} running, "
        f"{soak_app.RATED} {rated}/{rate} starts in {seconds:g} s"
    )


def evidence(history: History, report: Report, jobs: int = 5) -> list[str]:
    """The job rows and log rows of the first few jobs a violation names."""
    named = list(dict.fromkeys(job for v in report.violations for job in v.job_ids))[:jobs]
    lines = []
    for job_id in named:
        lines.append(f"  job {job_id}: {history.jobs.get(job_id)}")
        lines += [
            f"    {row.ts.time()} pid {row.pid} run {row.run_id[:8]} attempt {row.attempt} "
            f"{row.kind} {row.key or ''} {'' if row.value is None else row.value}"
            for row in history.rows_of(job_id)
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.run", description=__doc__)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--database-url", help="an existing server (no PostgreSQL restarts)")
    parser.add_argument("--log-dir", type=Path, help="worker logs (default: a temporary dir)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"soak: seed {seed}, {args.seconds:g} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="trioq-soak-") as tmp:
        log_dir = args.log_dir or Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        if args.database_url:
            outcome = trio.run(soak, args.database_url, None, args.seconds, seed, log_dir)
        else:
            settings = EmbeddedSettings(
                max_connections=250, server_settings={"synchronous_commit": True}
            )
            with EmbeddedPostgres(settings=settings) as cluster:
                outcome = trio.run(soak, cluster.conninfo, cluster, args.seconds, seed, log_dir)
    print(summary(outcome, seed), flush=True)
    if outcome.report.violations:
        print(f"soak FAILED with seed {seed}: {len(outcome.report.violations)} violations")
        return 1
    print(f"soak passed with seed {seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
