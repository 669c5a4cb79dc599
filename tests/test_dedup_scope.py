"""Dedup keys are global (queues are not a tenant boundary): an enqueue whose key a job of
another task holds is refused with one line naming the holder, from every entry point, and
writes nothing; the same task still gets its job back (docs/uniqueness.md, "Keys are global").
Both drivers: trioq/testing/conformance/keys.py."""

from __future__ import annotations

import psycopg
import pytest
import trio
from psycopg import sql

import trioq
from tests.support import make_app
from trioq.producer import SyncProducer

INVOICE = trioq.declare_task("send_invoice", queue="billing")
REPORT = trioq.declare_task("build_report", queue="reports")


async def test_a_key_held_by_another_tasks_job_is_refused_in_one_line(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        held = await client.enqueue(INVOICE, {"n": 1}, dedup_key="customer-7")
        with pytest.raises(trioq.DedupKeyConflict) as refused:
            await client.enqueue(REPORT, {"n": 2}, dedup_key="customer-7")
        message = str(refused.value)
        assert message == (
            f"dedup_key 'customer-7' is held by job {held.id} of task 'send_invoice', not "
            "'build_report': dedup keys are global across tasks and queues (put the task in "
            "the key)"
        )
        assert "\n" not in message
        # A batch with one such key writes nothing, its other keys included.
        with pytest.raises(trioq.DedupKeyConflict):
            await client.enqueue_many(REPORT, [{}, {}], dedup_keys=["report-1", "customer-7"])
        again = await client.enqueue(INVOICE, {"n": 3}, dedup_key="customer-7")
        assert again.id == held.id  # the same task: its job, as before
        fresh = await client.enqueue(REPORT, {}, dedup_key="report-1")
        assert fresh.id != held.id
        # Inside the caller's transaction, too.
        with pytest.raises(trioq.DedupKeyConflict):
            async with client.transaction() as tx:
                await tx.enqueue(REPORT, {}, dedup_key="customer-7")


def test_the_sql_function_and_the_producers_refuse_it_too(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)

    async def migrate_and_hold() -> int:
        async with app.client(migrate=True) as client:
            return (await client.enqueue(INVOICE, {}, dedup_key="shared")).id

    held = trio.run(migrate_and_hold)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        enqueue = sql.SQL("SELECT {}.enqueue(%s, '{{}}', queue => 'reports', dedup_key => %s)")
        query = enqueue.format(sql.Identifier(pg_schema))
        with pytest.raises(psycopg.errors.UniqueViolation) as refused:
            conn.execute(query, ("build_report", "shared"))
        assert refused.value.diag.message_primary == (
            f"dedup_key 'shared' is held by job {held} of task 'send_invoice', not "
            "'build_report': dedup keys are global across tasks and queues (put the task in "
            "the key)"
        )
        assert conn.execute(query, ("send_invoice", "shared")).fetchone() == (held,)
        reports = sql.SQL("SELECT count(*) FROM {}.jobs WHERE task = 'build_report'")
        assert conn.execute(reports.format(sql.Identifier(pg_schema))).fetchone() == (0,)
    with SyncProducer(pg_url, schema=pg_schema, tasks=[INVOICE, REPORT]) as producer:
        with pytest.raises(trioq.DedupKeyConflict, match=f"is held by job {held} of task"):
            producer.enqueue(REPORT, {}, dedup_key="shared")
        assert producer.enqueue(INVOICE, {}, dedup_key="shared").id == held
