"""The soak's history checker on synthetic histories: each broken history is reported with the
job ids at fault, and a correct history (retries, crashes, suspensions included) passes."""

from __future__ import annotations

import datetime
from typing import Any

import attrs

from tests.soak.checker import check
from tests.soak.model import Facts, History, JobRow, LogRow, Sent

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def run(
    job_id: int,
    run_id: str,
    start: float,
    end: float | None,
    *,
    attempt: int = 1,
    pid: int = 100,
    effects: tuple[tuple[float, str, str | None, Any], ...] = (),
    end_kind: str = "end",
) -> list[LogRow]:
    """A run's rows: start, its effects (at, kind, key, value), then its end unless None."""
    rows = [LogRow(job_id, run_id, attempt, pid, "start", at(start))]
    rows += [LogRow(job_id, run_id, attempt, pid, k, at(t), key, v) for t, k, key, v in effects]
    if end is not None:
        rows.append(LogRow(job_id, run_id, attempt, pid, end_kind, at(end)))
    return rows


def history(*runs: list[LogRow], jobs: list[JobRow]) -> History:
    rows = sorted((row for rows in runs for row in rows), key=lambda row: row.ts)
    return History(rows, {job.id: job for job in jobs})


def facts(*acknowledged: int, **fields: Any) -> Facts:
    return Facts(frozenset(acknowledged), **fields)


def rules(history: History, facts: Facts) -> list[tuple[str, tuple[int, ...]]]:
    return [(v.rule, v.job_ids) for v in check(history, facts).violations]


def step(t: float, name: str) -> tuple[float, str, str, None]:
    return (t, "step", name, None)


def correct_history() -> tuple[History, Facts]:
    """Retries, a crash with a repeated unfinished step, a suspension, keys, messages, events."""
    jobs = [
        JobRow(1, "completed", attempt=2),
        JobRow(2, "completed", partition_key="p"),
        JobRow(3, "completed", partition_key="p"),
        JobRow(4, "completed", concurrency_key="c", concurrency_limit=2),
        JobRow(5, "completed", concurrency_key="c", concurrency_limit=2),
        JobRow(6, "completed", attempt=2),  # a workflow: crashed mid-step, then suspended
        JobRow(7, "waiting"),
        JobRow(8, "completed", task="cron", run_at=at(10)),
        JobRow(9, "completed", task="cron", run_at=at(20)),
    ]
    h = history(
        run(1, "a", 0, 1, end_kind="end"),
        run(1, "b", 2, 3, attempt=2),
        run(2, "c", 0, 1),
        run(3, "d", 1, 2),
        run(4, "e", 0, 5),
        run(5, "f", 1, 2),
        run(6, "g", 0, None, pid=200, effects=(step(0.5, "s0"), step(0.6, "s1"))),
        run(
            6,
            "h",
            12,
            13,
            attempt=2,
            effects=(
                step(12.1, "s1"),
                (12.2, "message", "0:0", ["m1", "m2"]),
                (12.3, "message", "0:1", ["m3"]),
                (12.4, "event_woken", "go", {"ok": True}),
            ),
        ),
        run(6, "i", 14, 15, attempt=2),  # resumed after a sleep: same attempt
        run(7, "j", 0, 1),
        jobs=jobs,
    )
    f = facts(
        *range(1, 10),
        died={200: at(8)},
        killed=frozenset({200}),
        recovery_bound=5.0,
        messages={6: [Sent("m1"), Sent("m2"), Sent("m3"), Sent("m4", certain=False)]},
        event_waiters={"go": frozenset({6})},
        emitted=frozenset({"go"}),
        cron_tasks=frozenset({"cron"}),
        observations=[(at(4), 1, "completed"), (at(9), 1, "completed")],
    )
    return h, f


def test_a_correct_history_with_retries_crashes_and_suspensions_has_no_violations() -> None:
    h, f = correct_history()
    report = check(h, f)
    assert report.violations == []
    assert report.recoveries == {6: 4.0}  # died at 8, started again at 12


def test_a_step_run_again_after_its_run_went_past_it_is_reported() -> None:
    h = history(
        run(1, "a", 0, 2, effects=(step(0.5, "charge"), step(1, "ship"))),
        run(1, "b", 3, 4, effects=(step(3.5, "charge"),)),
        jobs=[JobRow(1, "completed")],
    )
    assert rules(h, facts(1)) == [("step side effect repeated after its run went past it", (1,))]


def test_a_step_whose_run_then_failed_may_run_again() -> None:
    failed = run(1, "a", 0, None, effects=(step(0.5, "charge"),))
    failed.append(LogRow(1, "a", 1, 100, "end", at(1), None, "CheckpointWriteFailed"))
    h = history(
        failed, run(1, "b", 3, 4, effects=(step(3.5, "charge"),)), jobs=[JobRow(1, "completed")]
    )
    assert rules(h, facts(1)) == []


def test_overlapping_runs_of_one_job_are_reported() -> None:
    h = history(run(1, "a", 0, 5), run(1, "b", 3, 6, attempt=2), jobs=[JobRow(1, "completed")])
    assert rules(h, facts(1)) == [("two runs of one job overlap", (1,))]


def test_a_run_whose_worker_died_does_not_overlap_the_run_after_the_death() -> None:
    h = history(
        run(1, "a", 0, None, pid=7), run(1, "b", 3, 6, attempt=2), jobs=[JobRow(1, "completed")]
    )
    assert rules(h, facts(1, died={7: at(2)})) == []
    assert rules(h, facts(1)) == [("two runs of one job overlap", (1,))]


def test_a_run_that_suspended_itself_may_still_unwind_when_its_resumed_run_starts() -> None:
    suspended = run(1, "a", 0, None, effects=((1, "continue", None, None),))
    suspended.append(LogRow(1, "a", 1, 100, "end", at(3), None, "SuspendExecution"))
    h = history(suspended, run(1, "b", 2, 4), jobs=[JobRow(1, "completed")])
    assert rules(h, facts(1)) == []
    early = history(suspended, run(1, "b", 0.5, 4), jobs=[JobRow(1, "completed")])
    assert rules(early, facts(1)) == [("two runs of one job overlap", (1,))]
    continued = run(1, "a", 0, 3, effects=((1, "continue", None, None),), end_kind="cancelled")
    h = history(continued, run(1, "b", 2, 4), jobs=[JobRow(1, "completed")])
    assert rules(h, facts(1)) == []


def test_a_continued_run_whose_worker_died_as_it_unwound_ends_at_its_continue() -> None:
    """continue_as_new releases the job before it raises: a worker stopped while the run
    unwinds leaves no end row, and the next generation may already run elsewhere (the soak,
    seed 3: started 2.7 ms before the old worker's death). Its run is suspended at `continue`;
    a run that starts before that row still overlaps it."""
    unwound = run(1, "a", 0, None, pid=7, effects=((1, "continue", None, None),))
    h = history(unwound, run(1, "b", 2, 4, pid=8), jobs=[JobRow(1, "completed")])
    assert rules(h, facts(1, died={7: at(3)})) == []
    early = history(unwound, run(1, "b", 0.5, 4, pid=8), jobs=[JobRow(1, "completed")])
    assert rules(early, facts(1, died={7: at(3)})) == [("two runs of one job overlap", (1,))]


def test_a_lost_job_and_a_job_stuck_ready_are_reported() -> None:
    h = history(run(1, "a", 0, 1), jobs=[JobRow(1, "completed"), JobRow(2, "ready")])
    assert rules(h, facts(1, 2, 3)) == [
        ("acknowledged job lost", (3,)),
        ("job not finished at quiescence", (2,)),
    ]


def test_two_jobs_of_one_partition_key_running_at_once_are_reported() -> None:
    h = history(
        run(1, "a", 0, 5),
        run(2, "b", 4, 6),
        jobs=[JobRow(1, "completed", partition_key="k"), JobRow(2, "completed", partition_key="k")],
    )
    assert rules(h, facts(1, 2)) == [("partition key ran two jobs at once", (1, 2))]


def test_a_concurrency_key_over_its_limit_is_reported_with_the_jobs_running() -> None:
    jobs = [JobRow(n, "completed", concurrency_key="t", concurrency_limit=2) for n in (1, 2, 3)]
    h = history(run(1, "a", 0, 5), run(2, "b", 1, 5), run(3, "c", 2, 3), jobs=jobs)
    assert rules(h, facts(1, 2, 3)) == [("concurrency key over its limit", (1, 2, 3))]


def test_a_queue_over_its_global_limit_and_its_rate_is_reported() -> None:
    jobs = [JobRow(n, "completed", queue="q") for n in (1, 2, 3)]
    h = history(run(1, "a", 0, 5), run(2, "b", 1, 5), run(3, "c", 2, 3), jobs=jobs)
    assert rules(h, facts(1, 2, 3, queue_limits={"q": 3})) == []
    assert rules(h, facts(1, 2, 3, queue_limits={"q": 2})) == [
        ("queue over its global limit", (1, 2, 3))
    ]
    rate = {"q": (2, 10.0)}  # 3 starts within 2 s; the window is 10 - 1 s
    assert rules(h, facts(1, 2, 3, queue_rates=rate)) == [("queue rate exceeded", (1, 2, 3))]
    assert rules(h, facts(1, 2, 3, queue_rates={"q": (2, 2.5)})) == []


def test_messages_received_out_of_send_order_or_twice_are_reported() -> None:
    def receiving(*batches: list[str]) -> History:
        effects = tuple((0.1 * n, "message", f"0:{n}", batch) for n, batch in enumerate(batches))
        return history(run(1, "a", 0, 1, effects=effects), jobs=[JobRow(1, "completed")])

    sent = {1: [Sent("m1"), Sent("m2"), Sent("m3")]}
    assert rules(receiving(["m1", "m2"], ["m3"]), facts(1, messages=sent)) == []
    assert rules(receiving(["m2"], ["m1", "m3"]), facts(1, messages=sent)) == [
        ("messages out of send order", (1,))
    ]
    assert rules(receiving(["m1", "m2"], ["m2", "m3"]), facts(1, messages=sent)) == [
        ("message delivered twice", (1,))
    ]
    assert rules(receiving(["m1"], ["m3"]), facts(1, messages=sent)) == [
        ("sent message never delivered", (1,))
    ]


def test_a_waiter_woken_twice_with_different_payloads_is_reported() -> None:
    effects = ((0.2, "event_woken", "go", 1), (0.4, "event_woken", "go", 2))
    h = history(run(1, "a", 0, 1, effects=effects), jobs=[JobRow(1, "completed")])
    waiters = {"go": frozenset({1})}
    assert rules(h, facts(1, event_waiters=waiters)) == [("event woke a waiter twice", (1,))]


def test_a_cron_occurrence_enqueued_twice_is_reported() -> None:
    jobs = [JobRow(n, "completed", task="tick", run_at=at(60)) for n in (1, 2)]
    h = history(jobs=[*jobs, JobRow(3, "completed", task="tick", run_at=at(120))])
    assert rules(h, facts(1, 2, 3, cron_tasks=frozenset({"tick"}))) == [
        ("cron occurrence enqueued twice", (1, 2))
    ]


def test_a_final_state_that_changed_is_reported_unless_the_job_was_redriven() -> None:
    h = history(jobs=[JobRow(1, "completed")])
    seen = [(at(1), 1, "failed"), (at(2), 1, "ready"), (at(3), 1, "completed")]
    assert rules(h, facts(1, observations=seen)) == [("final state changed", (1,))]
    assert rules(h, facts(1, observations=seen, redriven={1: [at(1.5)]})) == []


def test_a_lost_job_started_again_after_the_bound_is_reported_with_outages_added() -> None:
    h = history(
        run(1, "a", 0, None, pid=7), run(1, "b", 10, 11, attempt=2), jobs=[JobRow(1, "completed")]
    )
    killed = {"died": {7: at(1)}, "killed": frozenset({7}), "recovery_bound": 4.0}
    assert rules(h, facts(1, **killed)) == [("lost job recovered too late", (1,))]
    assert rules(h, facts(1, outages=[(at(2), at(8))], **killed)) == []
    assert check(h, facts(1, **killed)).worst_recovery == 9.0


def test_attempts_that_skip_a_number_without_a_fault_are_reported() -> None:
    h = history(run(1, "a", 0, 1), run(1, "b", 2, 3, attempt=3), jobs=[JobRow(1, "completed")])
    assert rules(h, facts(1)) == [("attempts not consecutive", (1,))]
    assert rules(h, facts(1, outages=[(at(1.5), at(1.8))])) == []


def test_every_violation_of_a_history_is_reported_not_only_the_first() -> None:
    h, f = correct_history()
    broken = history(
        *[[row] for row in h.rows],
        run(2, "x", 0.5, 0.7),  # overlaps run c of job 2
        run(8, "y", 0, 1),
        jobs=[*h.jobs.values(), JobRow(10, "completed", task="cron", run_at=at(10))],
    )
    found = {rule for rule, _ in rules(broken, attrs.evolve(f, acknowledged=f.acknowledged | {11}))}
    assert found == {
        "two runs of one job overlap",
        "acknowledged job lost",
        "cron occurrence enqueued twice",
    }


def test_an_outcome_without_its_record_and_an_unfinished_job_filed_nowhere_are_reported() -> None:
    h, f = correct_history()
    broken = attrs.evolve(f, orphan_outcomes=frozenset({11}), unfiled=frozenset({12, 13}))
    assert rules(h, broken) == [
        ("outcome without its record", (11,)),
        ("unfinished job filed nowhere", (12, 13)),
    ]
