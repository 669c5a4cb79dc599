"""Invariants over a whole history (the Jepsen method): what the handlers logged as they ran, what
the database stored, and what the driver did and saw (tests/soak/model.py). `check(history,
facts)` returns every violation it finds, each naming its job ids, instead of stopping at the
first; each invariant is also a function of its own, which the fault suites call on their own.

Both fault harnesses read into the one model (tests/soak/history.py): the soak's `soak_log` and
the fault suite's `exec_log`.
"""

from __future__ import annotations

import collections
import datetime
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tests.soak.model import (
    FAR,
    FINAL,
    SUSPENDED,
    Facts,
    History,
    JobRow,
    LogRow,
    Report,
    Run,
    Violation,
)


def check(history: History, facts: Facts) -> Report:
    recoveries: dict[int, float] = {}
    violations = [
        *nothing_lost(history, facts),
        *runs_never_overlap(history, facts),
        *steps_once(history),
        *attempts_consecutive(history, facts),
        *partition_keys_exclusive(history, facts),
        *concurrency_limits_hold(history, facts),
        *queue_limits_hold(history, facts),
        *queue_rates_hold(history, facts),
        *messages_once_in_order(history, facts),
        *events_wake_once(history, facts),
        *cron_occurrences_once(history, facts),
        *lost_jobs_recovered(history, facts, recoveries),
        *final_states_stay(facts),
        *storage_exact(facts),
    ]
    return Report(violations, recoveries)


def end_of(run: Run, facts: Facts) -> datetime.datetime:
    """Its end row, its worker's death or its lease's recovery, whichever came first."""
    recovered = facts.recovered.get((run.job_id, run.attempt, run.pid))
    return min((t for t in (run.end, facts.died.get(run.pid), recovered) if t), default=FAR)


# --- nothing lost, no overlap, steps once, attempts --------------------------------------------


def nothing_lost(history: History, facts: Facts) -> Iterator[Violation]:
    missing = sorted(facts.acknowledged - set(history.jobs))
    if missing:
        yield Violation("acknowledged job lost", tuple(missing), "no row in jobs")
    stuck = sorted(  # children and cron occurrences too: every job in the table
        job.id for job in history.jobs.values() if job.state not in FINAL | facts.pending_ok
    )
    if stuck:
        states = {job_id: history.jobs[job_id].state for job_id in stuck[:20]}
        yield Violation("job not finished at quiescence", tuple(stuck), f"states {states}")


def _overlaps(runs: list[Run], facts: Facts) -> Iterator[tuple[Run, Run]]:
    """Each run that starts before an earlier-starting one (of `runs`) has ended."""
    latest: Run | None = None
    for run in sorted(runs, key=lambda run: run.start):
        if latest is not None and run.start < end_of(latest, facts):
            yield latest, run
        if latest is None or end_of(run, facts) > end_of(latest, facts):
            latest = run


def runs_never_overlap(history: History, facts: Facts) -> Iterator[Violation]:
    by_job = _runs_by_job(history)
    for job_id, runs in by_job.items():
        for earlier, later in _overlaps(runs, facts):
            yield Violation(
                "two runs of one job overlap",
                (job_id,),
                f"run {later.run_id} (pid {later.pid}) started at {later.start} before run "
                f"{earlier.run_id} (pid {earlier.pid}) ended ({end_of(earlier, facts)})",
            )


def steps_once(history: History) -> Iterator[Violation]:
    """A step's side effect is logged inside the step; its checkpoint is committed before the
    step returns, so a run that logged anything after the effect (its next step, its end) had
    the step recorded, and no later run may execute it again. (A run that died between the
    effect and the checkpoint legitimately repeats it: steps are at least once.)"""
    for runs in _runs_by_job(history).values():
        for run in runs:
            yield from _steps_repeated_after(run, runs)


def _steps_repeated_after(run: Run, runs: list[Run]) -> Iterator[Violation]:
    for index, row in enumerate(run.rows):
        if row.kind != "step":
            continue
        if not any(_went_on(after) for after in run.rows[index + 1 :]):
            continue  # the run may have stopped before the step's checkpoint committed
        again = [
            other.run_id
            for other in runs
            if other is not run
            and other.start > row.ts
            and any(r.kind == "step" and r.key == row.key for r in other.rows)
        ]
        if again:
            yield Violation(
                "step side effect repeated after its run went past it",
                (run.job_id,),
                f"step {row.key!r} ran in run {run.run_id} and again in runs {again}",
            )


def _went_on(row: LogRow) -> bool:
    """The row proves the run went on past the steps before it: a later effect, a return, or a
    suspension by a later primitive. A cancellation or an error does not (the step's own
    checkpoint write may be what failed)."""
    if row.kind == "end":
        return row.value is None or row.value == SUSPENDED
    return row.kind in ("step", "message", "event_woken", "continue")


def _runs_by_job(history: History) -> dict[int, list[Run]]:
    by_job: dict[int, list[Run]] = collections.defaultdict(list)
    for run in history.runs:  # in start order
        by_job[run.job_id].append(run)
    return by_job


def _fault_between(
    facts: Facts, job_id: int, start: datetime.datetime, end: datetime.datetime
) -> bool:
    """A fault, or a redrive of the job (a claim cancelled before its handler logged), in
    between."""
    return (
        any(start <= when <= end for when in facts.died.values())
        or any(down < end and up > start for down, up in facts.outages)
        or any(start <= when <= end for when in facts.redriven.get(job_id, ()))
    )


def attempts_consecutive(history: History, facts: Facts) -> Iterator[Violation]:
    """Within a generation (continue-as-new resets the attempt), attempt numbers never go back,
    and skip one only when a fault or a redrive could have ended a claim before its handler
    logged."""
    by_job = _runs_by_job(history)
    for job_id, runs in by_job.items():
        for prev, run in itertools.pairwise(runs):
            if any(row.kind == "continue" for row in prev.rows):
                continue
            if run.attempt < prev.attempt:
                yield Violation(
                    "attempt went back",
                    (job_id,),
                    f"attempt {run.attempt} (run {run.run_id}) after {prev.attempt}",
                )
            elif run.attempt > prev.attempt + 1 and not _fault_between(
                facts, job_id, prev.start, run.start
            ):
                yield Violation(
                    "attempts not consecutive",
                    (job_id,),
                    f"attempt {run.attempt} after {prev.attempt} with no fault in between",
                )


# --- keys and limits --------------------------------------------------------------------------


def partition_keys_exclusive(history: History, facts: Facts) -> Iterator[Violation]:
    by_key: dict[tuple[str, str], list[Run]] = collections.defaultdict(list)
    for run in history.runs:
        job = history.jobs.get(run.job_id)
        if job is not None and job.partition_key is not None:
            by_key[job.queue, job.partition_key].append(run)
    for (_, key), runs in by_key.items():
        for earlier, later in _overlaps(runs, facts):
            if earlier.job_id != later.job_id:  # one job's own overlap is reported above
                yield Violation(
                    "partition key ran two jobs at once",
                    (earlier.job_id, later.job_id),
                    f"key {key!r}: {later.job_id} started at {later.start} before "
                    f"{earlier.job_id} ended ({end_of(earlier, facts)})",
                )


def peak(runs: Iterable[Run], facts: Facts) -> tuple[int, list[Run]]:
    """The most runs going at one instant, and which (an end at t frees before a start at t)."""
    edges = sorted(
        [(run.start, 1, run) for run in runs] + [(end_of(run, facts), 0, run) for run in runs],
        key=lambda edge: (edge[0], edge[1]),
    )
    going: dict[str, Run] = {}
    peak: list[Run] = []
    for _, is_start, run in edges:
        if is_start:
            going[run.run_id] = run
            if len(going) > len(peak):
                peak = list(going.values())
        else:
            going.pop(run.run_id, None)
    return len(peak), peak


def _limit_excess(
    groups: Mapping[str, list[Run]], limit_of: Mapping[str, int], rule: str, facts: Facts
) -> Iterator[Violation]:
    for name, runs in groups.items():
        limit = limit_of.get(name)
        if limit is None:
            continue
        most, going = peak(runs, facts)
        if most > limit:
            yield Violation(
                rule,
                tuple(sorted({run.job_id for run in going})),
                f"{name!r}: {most} running at once, limit {limit}",
            )


def concurrency_limits_hold(history: History, facts: Facts) -> Iterator[Violation]:
    groups: dict[str, list[Run]] = collections.defaultdict(list)
    limits: dict[str, int] = {}
    for run in history.runs:
        job = history.jobs.get(run.job_id)
        if job is not None and job.concurrency_key is not None:
            groups[job.concurrency_key].append(run)
            if job.concurrency_limit is not None:
                limits[job.concurrency_key] = job.concurrency_limit
    yield from _limit_excess(groups, limits, "concurrency key over its limit", facts)


def _runs_by_queue(history: History) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = collections.defaultdict(list)
    for run in history.runs:
        job = history.jobs.get(run.job_id)
        if job is not None:
            groups[job.queue].append(run)
    return groups


def queue_limits_hold(history: History, facts: Facts) -> Iterator[Violation]:
    groups = _runs_by_queue(history)
    yield from _limit_excess(groups, facts.queue_limits, "queue over its global limit", facts)


def queue_rates_hold(history: History, facts: Facts) -> Iterator[Violation]:
    """At most n starts in any window of the period, shortened by the tolerance (a start row is
    written a little after its claim; the claims are what the rate counts)."""
    groups = _runs_by_queue(history)
    for queue, (n, seconds) in facts.queue_rates.items():
        window = datetime.timedelta(seconds=max(seconds - facts.rate_tolerance, 0))
        starts = sorted(groups.get(queue, []), key=lambda run: run.start)
        first = 0
        for last, run in enumerate(starts):
            while run.start - starts[first].start >= window:
                first += 1
            if last - first + 1 > n:
                in_window = starts[first : last + 1]
                yield Violation(
                    "queue rate exceeded",
                    tuple(sorted({r.job_id for r in in_window})),
                    f"{queue!r}: {len(in_window)} starts within {window.total_seconds()} s "
                    f"from {starts[first].start}, rate {n} per {seconds} s",
                )
                break


# --- messages, events, cron -------------------------------------------------------------------


def _once_per_key(rows: Iterable[LogRow], kind: str) -> dict[str, list[Any]]:
    """Values logged under each key (a step re-executed after a crash logs its key again)."""
    values: dict[str, list[Any]] = collections.defaultdict(list)
    for row in rows:
        if row.kind == kind and row.key is not None:
            values[row.key].append(row.value)
    return values


def messages_once_in_order(history: History, facts: Facts) -> Iterator[Violation]:
    """Each receive logs its batch under its position; the batches in order must be the sent
    messages in send order, each once (a send whose outcome is unknown may be missing)."""
    for job_id, sent in facts.messages.items():
        batches = _once_per_key(history.rows_of(job_id), "message")
        received: list[Any] = []
        for key in sorted(batches, key=_position):
            first, *repeats = batches[key]
            if any(repeat != first for repeat in repeats):
                yield Violation("receive replayed differently", (job_id,), f"{key}: {batches[key]}")
            received += first
        items = [message.item for message in sent]
        twice = sorted({item for item in received if received.count(item) > 1}, key=str)
        if twice:
            yield Violation("message delivered twice", (job_id,), f"items {twice}")
        unknown = [item for item in received if item not in items]
        if unknown:
            yield Violation("message received but never sent", (job_id,), f"items {unknown}")
        order = [items.index(item) for item in received if item in items]
        if order != sorted(order):
            yield Violation("messages out of send order", (job_id,), f"received {received}")
        if history.jobs.get(job_id, JobRow(job_id, "?")).state == "completed":
            lost = [m.item for m in sent if m.certain and m.item not in received]
            if lost:
                yield Violation("sent message never delivered", (job_id,), f"items {lost}")


def _position(key: str) -> tuple[int, ...]:
    return tuple(int(part) for part in key.split(":") if part.isdigit())


def events_wake_once(history: History, facts: Facts) -> Iterator[Violation]:
    """Every waiter of an emitted event that completed was woken by it, with one payload."""
    for event_key, waiters in facts.event_waiters.items():
        for job_id in sorted(waiters):
            woken = _once_per_key(history.rows_of(job_id), "event_woken").get(event_key, [])
            state = history.jobs.get(job_id, JobRow(job_id, "?")).state
            if len({repr(value) for value in woken}) > 1:
                yield Violation("event woke a waiter twice", (job_id,), f"{event_key}: {woken}")
            if not woken and state == "completed" and event_key in facts.emitted:
                yield Violation("waiter completed without its event", (job_id,), event_key)


def cron_occurrences_once(history: History, facts: Facts) -> Iterator[Violation]:
    occurrences: dict[tuple[str, datetime.datetime | None], list[int]] = collections.defaultdict(
        list
    )
    for job in history.jobs.values():
        if job.task in facts.cron_tasks:
            occurrences[job.task, job.run_at].append(job.id)
    for (task, fire_time), job_ids in occurrences.items():
        if len(job_ids) > 1:
            yield Violation(
                "cron occurrence enqueued twice", tuple(sorted(job_ids)), f"{task} at {fire_time}"
            )


# --- recovery, observed states ----------------------------------------------------------------


def _outage_seconds(facts: Facts, start: datetime.datetime, end: datetime.datetime) -> float:
    return sum(
        max((min(up, end) - max(down, start)).total_seconds(), 0) for down, up in facts.outages
    )


def lost_jobs_recovered(
    history: History, facts: Facts, recoveries: dict[int, float]
) -> Iterator[Violation]:
    """A run cut by a kill -9 (no end row) is started again within the bound of its worker's
    death, plus any time the database was down meanwhile."""
    by_job = _runs_by_job(history)
    for job_id, runs in by_job.items():
        for index, run in enumerate(runs):
            died = facts.died.get(run.pid)
            if run.pid not in facts.killed or died is None or run.end is not None:
                continue
            later = [other for other in runs[index + 1 :] if other.start >= died]
            if not later:
                state = history.jobs.get(job_id, JobRow(job_id, "?")).state
                if state not in FINAL:  # cancelled or failed meanwhile by recovery: done
                    yield Violation("lost job never started again", (job_id,), f"died {died}")
                continue
            seconds = (later[0].start - died).total_seconds()
            recoveries[job_id] = max(recoveries.get(job_id, 0.0), seconds)
            bound = facts.recovery_bound + _outage_seconds(facts, died, later[0].start)
            if seconds > bound:
                yield Violation(
                    "lost job recovered too late",
                    (job_id,),
                    f"started again {seconds:.1f} s after its worker died (bound {bound:.1f} s)",
                )


def final_states_stay(facts: Facts) -> Iterator[Violation]:
    """Once a job was seen final it stays in that state, unless the driver redrove it since."""
    seen_final: dict[int, tuple[datetime.datetime, str]] = {}
    for when, job_id, state in sorted(facts.observations, key=lambda o: o[0]):
        prior = seen_final.get(job_id)
        if prior is not None and state != prior[1]:
            since, final = prior
            if not any(since <= t <= when for t in facts.redriven.get(job_id, ())):
                yield Violation(
                    "final state changed", (job_id,), f"{final} at {since}, then {state} at {when}"
                )
        if state not in FINAL:
            seen_final.pop(job_id, None)
        elif prior is None or state != prior[1]:
            seen_final[job_id] = (when, state)


def storage_exact(facts: Facts) -> Iterator[Violation]:
    """Every outcome has its record, and every unfinished job is where a claim or the leader
    finds it (functions/satellite_epochs_rotate.sql trusts the first; the claims need the
    second)."""
    if facts.orphan_outcomes:
        yield Violation(
            "outcome without its record",
            tuple(sorted(facts.orphan_outcomes)),
            "a record deleted with its outcome kept: retention would miscount the unfinished",
        )
    if facts.unfiled:
        yield Violation(
            "unfinished job filed nowhere",
            tuple(sorted(facts.unfiled)),
            "not in the ring, ready_keyed, job_due or job_runs: no claim finds it",
        )
