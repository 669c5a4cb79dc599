"""The reply columns the driver reads by name (trioq/_pg/replies.py) are the statements' own, as
PostgreSQL describes them: a statement that gains, loses, renames or moves a column fails here
until its class in replies.py follows."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest
import trio
from psycopg import pq, sql

from trioq._pg import replies
from trioq._pg.driver import open_pg_driver
from trioq._seam.admin import (
    AttemptRecord,
    ConcurrencyKeyStatus,
    ConcurrencyLimit,
    HealthReport,
    QueueDemand,
    QueuePause,
    QueueStatus,
    TaskHistoryKind,
    TaskStatus,
    WorkflowRecord,
)
from trioq._seam.driver import ClaimedJob, JobRecord, ValueRead, WorkflowValue
from trioq._seam.schedules import ScheduleRecord
from trioq._seam.services import RenewedLease
from trioq._seam.workflow import Checkpoint, ChildOutcome, SpawnOutcome
from trioq._sql import positional_queries
from trioq.dashboard import store

# The statements whose rows (from column `start` on) are passed whole, by position, to a record's
# constructor: the record's fields are the statement's columns, in order.
RECORDS: dict[str, tuple[type[Any], int]] = {
    "job_get": (JobRecord, 0),
    "job_list": (JobRecord, 0),
    "job_attempts": (AttemptRecord, 0),
    "checkpoint_list": (Checkpoint, 0),
    "status_health": (HealthReport, 0),
    "queue_demand": (QueueDemand, 0),
    "queue_status": (QueueStatus, 0),
    "queue_pause_list": (QueuePause, 0),
    "concurrency_limit_list": (ConcurrencyLimit, 0),
    "concurrency_key_status": (ConcurrencyKeyStatus, 0),
    "task_history_kinds": (TaskHistoryKind, 0),
    "task_status": (TaskStatus, 0),
    "schedule_list": (ScheduleRecord, 0),
    "schedule_due_lock": (ScheduleRecord, 0),
    "job_value_get": (ValueRead, 0),
    "job_values": (WorkflowValue, 0),
    "workflow_list": (WorkflowRecord, 0),
    "lease_renew_many": (RenewedLease, replies.LeaseRenewal.id),
    "job_spawn_many": (SpawnOutcome, replies.Spawned.child_id),
    "job_wait_children": (ChildOutcome, replies.ChildrenWait.id),
}

# The dashboard reads these statements' rows into dicts by these names; a search statement's
# rows carry three columns of its walk after the job's.
DASHBOARD: dict[str, tuple[str, ...]] = {
    "dashboard_queue_counts": store._QUEUE_COLUMNS,
    "dashboard_job_get": store._JOB_COLUMNS,
    "dashboard_workflows": store._WORKFLOW_COLUMNS,
    "dashboard_audit_list": store._AUDIT_COLUMNS,
    **{
        name: store._SEARCH_COLUMNS
        for name in (
            "dashboard_job_search",
            "dashboard_job_search_suspended",
            "dashboard_job_search_unfinished",
            "dashboard_job_search_ready",
            "dashboard_job_search_finished",
        )
    },
}


def _reply_classes() -> Iterator[type[replies.Reply]]:
    pending = list(replies.Reply.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__ == replies.__name__:  # not a test's (a failed class may linger)
            yield cls


def _described(conninfo: str, schema: str, names: set[str]) -> dict[str, tuple[str, ...]]:
    """Each named statement's result columns, from the server's description of it prepared
    (nothing runs: PostgreSQL plans no statement to describe it)."""
    statements = positional_queries(schema)
    columns = {}
    with psycopg.connect(conninfo, autocommit=True) as conn:
        pgconn = conn.pgconn
        for name in sorted(names):
            prepared = pgconn.prepare(b"described_" + name.encode(), statements[name].text)
            assert prepared.status == pq.ExecStatus.COMMAND_OK, (name, prepared.error_message)
            description = pgconn.describe_prepared(b"described_" + name.encode())
            columns[name] = tuple(
                (description.fname(index) or b"").decode() for index in range(description.nfields)
            )
    return columns


async def _migrate(conninfo: str, schema: str) -> None:
    async with open_pg_driver(conninfo, schema, pool_size=1) as driver:
        await driver.migrate()


@pytest.fixture(scope="module")
def described(pg_url: str) -> Iterator[dict[str, tuple[str, ...]]]:
    """The described columns of every statement these tests check, on one migrated schema."""
    schema = f"t_{secrets.token_hex(8)}"
    names = {name for cls in _reply_classes() for name in cls.statements}
    names |= set(RECORDS) | set(DASHBOARD)
    try:
        trio.run(_migrate, pg_url, schema)
        yield _described(pg_url, schema, names)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_each_reply_class_names_its_statements_columns_in_order(
    described: dict[str, tuple[str, ...]],
) -> None:
    mismatched = {
        name: (cls.__name__, cls.all_columns(), described[name])
        for cls in _reply_classes()
        for name in cls.statements
        if cls.all_columns() != described[name]
    }
    assert mismatched == {}, "\n".join(f"{k}: {v}" for k, v in mismatched.items())


def test_a_record_built_from_a_whole_row_has_the_statements_columns_as_its_fields(
    described: dict[str, tuple[str, ...]],
) -> None:
    mismatched = {}
    for name, (record, start) in RECORDS.items():
        fields = tuple(field.name for field in attrs.fields(record) if field.init)
        if fields != described[name][start:]:
            mismatched[name] = (record.__name__, fields, described[name][start:])
    assert mismatched == {}, "\n".join(f"{k}: {v}" for k, v in mismatched.items())


def test_the_dashboards_column_names_are_its_statements_columns(
    described: dict[str, tuple[str, ...]],
) -> None:
    mismatched = {
        name: (columns, described[name])
        for name, columns in DASHBOARD.items()
        if described[name][: len(columns)] != columns
        or len(described[name]) != len(columns) + (3 if "search" in name else 0)
    }
    assert mismatched == {}, "\n".join(f"{k}: {v}" for k, v in mismatched.items())


def test_both_claims_share_the_columns_one_decode_reads() -> None:
    """`_claimed_jobs` reads either claim's reply through ClaimedRow's positions, and `now`
    and `next_due` are at the same positions in both."""
    shared = ("promoted", "now", "next_due", "concurrency_cursor")
    assert [getattr(replies.PlainClaimed, name) for name in shared] == [
        getattr(replies.Claimed, name) for name in shared
    ]
    assert replies.PlainClaimed.then is replies.Claimed.then is replies.ClaimedRow


def test_a_claimed_row_has_the_claimed_jobs_fields_in_order() -> None:
    """`_claimed_job` passes the claimed columns to ClaimedJob by position."""
    fields = tuple(field.name for field in attrs.fields(ClaimedJob) if field.init)
    assert replies.ClaimedRow.columns[: len(fields)] == fields


def test_each_statement_has_one_reply_class_and_columns_are_numbered_in_order() -> None:
    named = [name for cls in _reply_classes() for name in cls.statements]
    assert len(named) == len(set(named))
    for cls in _reply_classes():
        positions = [getattr(cls, column) for column in cls.columns]
        assert positions == list(range(positions[0], positions[0] + len(positions)))


def test_a_following_class_must_start_where_the_columns_before_it_end() -> None:
    with pytest.raises(TypeError, match="starts at column 6, after 1 columns"):

        class Wrong(replies.Reply, then=replies.ClaimedRow):
            only: int
