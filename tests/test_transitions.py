"""The transition checker (trioq/testing/transitions.py): its method table covers the Driver
protocol and every statement that writes jobs, and it catches a change the state machine does
not allow. The conformance suite and the differential machines run through it."""

from __future__ import annotations

import re

import pytest
import trio

from trioq._core.states import CLAIM, DELETED_BY, INSERTED, TRANSITIONS, JobState
from trioq._memory import MemoryDriver
from trioq._seam.driver import DRIVER_METHODS, NewJob
from trioq._sql import functions, queries, query_names
from trioq.testing.transitions import (
    METHOD_STATEMENTS,
    NO_JOB_WRITES,
    CheckedDriver,
    TransitionViolation,
    transition_errors,
)

SCHEMA = "s"
# Forms of job_insert_many that the PostgreSQL driver picks by batch shape (and counts under
# that name).
INSERT_FORMS = {"job_insert_batch": "job_insert_many", "job_insert_one": "job_insert_many"}
# A job's record (job_rows), its run (job_runs) and its outcome (job_outcomes): what the `jobs`
# view reads (migrations 0047, 0049).
WRITES_JOBS = re.compile(
    rf'\b(UPDATE|INSERT INTO|DELETE FROM)\s+"{SCHEMA}"\.(job_rows|job_runs|job_outcomes)\b'
)
CALLS = re.compile(rf'"{SCHEMA}"\.(\w+)\(')
FUNCTION = re.compile(
    rf'CREATE (?:OR REPLACE )?FUNCTION "{SCHEMA}"\.(\w+)\(.*?\$\$(.*?)\$\$', re.DOTALL
)


def _functions_that_write_jobs() -> set[str]:
    """The plpgsql/sql functions (trioq/_sql/functions/) that write jobs, directly or through
    another."""
    bodies: dict[str, str] = {}
    for function in functions(SCHEMA):
        for name, body in FUNCTION.findall(function.sql):
            bodies[name] = bodies.get(name, "") + body
    writers = {name for name, body in bodies.items() if WRITES_JOBS.search(body)}
    while True:
        more = {n for n, body in bodies.items() if set(CALLS.findall(body)) & writers} - writers
        if not more:
            return writers
        writers |= more


def test_every_driver_method_is_listed_once_as_writing_jobs_or_not() -> None:
    writing = set(METHOD_STATEMENTS) - {"transaction"}
    assert writing | NO_JOB_WRITES | {"transaction"} == DRIVER_METHODS
    assert not writing & NO_JOB_WRITES
    for method, statements in METHOD_STATEMENTS.items():
        assert set(statements) <= query_names(), method


def test_every_statement_that_writes_jobs_is_run_by_a_listed_method() -> None:
    writers = _functions_that_write_jobs()
    assert {"job_cancel_tree", "parents_notify"} <= writers  # the scan finds what it must
    listed = {name for statements in METHOD_STATEMENTS.values() for name in statements}
    for name, text in queries(SCHEMA).items():
        if WRITES_JOBS.search(text) or set(CALLS.findall(text)) & writers:
            assert INSERT_FORMS.get(name, name) in listed, f"{name} writes jobs: list its method"


def test_every_statement_the_state_machine_names_is_run_by_a_listed_method() -> None:
    listed = {name for statements in METHOD_STATEMENTS.values() for name in statements}
    named = {name for statements in TRANSITIONS.values() for name in statements}
    named |= {name for table in (INSERTED, DELETED_BY) for s in table.values() for name in s}
    assert named <= listed


def test_changes_outside_the_state_machine_are_reported() -> None:
    ready, running = JobState.READY, JobState.RUNNING
    assert transition_errors({1: ready}, {1: running}, frozenset({CLAIM})) == []
    [skipped] = transition_errors({1: ready}, {1: "completed"}, frozenset({CLAIM}))
    assert "ready -> completed" in skipped
    [wrong_statement] = transition_errors({1: ready}, {1: running}, frozenset({"job_cancel"}))
    assert "job_claim" in wrong_statement  # names the statements that may
    [born_running] = transition_errors({}, {1: running}, frozenset({"job_insert_many"}))
    assert "inserted as running" in born_running
    [deleted_live] = transition_errors({1: ready}, {}, frozenset({"job_purge"}))
    assert "deleted while ready" in deleted_live
    assert transition_errors({1: "completed"}, {}, frozenset({"job_purge"})) == []


class _RogueDriver(MemoryDriver):
    """A memory driver whose queue_status (a read) completes every job."""

    async def queue_status(self) -> list[object]:  # type: ignore[override]
        for row in self._state.rows.values():
            row.state = "completed"
        return await super().queue_status()  # type: ignore[return-value]


async def test_a_call_that_makes_a_change_no_statement_of_it_may_make_fails() -> None:
    checked = CheckedDriver(_RogueDriver())
    [job] = await checked.job_insert_many([NewJob("default", "echo", "{}")])
    assert checked.seen_edges == {"insert ready": {"job_insert_many"}}
    with pytest.raises(TransitionViolation, match=rf"queue_status .*job {job.id}: ready -> comp"):
        await checked.queue_status()
    assert len(checked.violations) == 1


async def test_overlapping_calls_are_judged_together() -> None:
    """A read in flight while an insert commits sees the new row: allowed, since the insert
    overlapped it."""
    checked = CheckedDriver(MemoryDriver())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checked.queue_status)
        nursery.start_soon(checked.job_insert_many, [NewJob("default", "echo", "{}")])
    assert checked.violations == []
    assert checked.seen_edges["insert ready"] <= {
        "job_insert_many",
        "job_insert_many (overlapped)",
        "queue_status (overlapped)",
    }
