"""The reference workflows (`workflows/`, shipped as `trioq_workflows`) end to end on Postgres:
each one's result and its side effects on the simulated providers, injected failures included."""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterator

import pytest
import trio
from trioq_workflows import demo, providers
from trioq_workflows.demo import AppEvent, ApprovalRequest, SyncRequest

import trioq
from tests.support import running_worker
from trioq.testing import drain


@pytest.fixture(autouse=True)
def fresh_providers() -> Iterator[None]:
    providers.reset()
    yield
    providers.reset()


@pytest.fixture
def app(pg_url: str, pg_schema: str) -> trioq.App:
    return demo.app.with_database(pg_url, pg_schema)


async def test_replies_of_one_conversation_are_sent_one_at_a_time_in_order(
    app: trioq.App,
) -> None:
    async with app.client(migrate=True) as client:
        jobs = [
            await demo.reply(client, conversation, f"{conversation} #{n}")
            for n in range(4)
            for conversation in ("c1", "c2")
        ]
        result = await drain(app, "default", concurrency=8)
        assert sorted(result.completed) == sorted(job.id for job in jobs)
        first = await client.wait_result(jobs[0].id)
    for conversation in ("c1", "c2"):
        sent = [text for conv, text in providers.CHAT.sent if conv == conversation]
        assert sent == [f"{conversation} #{n}" for n in range(4)]
    assert first["conversation_id"] == "c1" and first["message_id"].startswith("msg-")


async def test_events_of_one_account_are_handled_in_sequence(app: trioq.App) -> None:
    async with app.client(migrate=True) as client:
        for account in ("a", "b"):
            await client.enqueue_many(
                "react_to_event",
                [AppEvent(account, "user.updated", seq) for seq in range(5)],
                partition_key=account,
            )
        result = await drain(app, "events", concurrency=4)
    assert len(result.completed) == 10
    for account in ("a", "b"):
        texts = [text for conv, text in providers.CHAT.sent if conv == f"account-{account}"]
        assert texts == [f"user.updated #{seq}" for seq in range(5)]


async def test_sync_retries_an_injected_503_and_keeps_the_failed_attempt(app: trioq.App) -> None:
    providers.FAULTS.times["partner:7:page1"] = 1
    async with app.client(migrate=True) as client:
        job = await client.enqueue("sync_external", SyncRequest(source_id=7, pages=3))
        async with running_worker(app, ["sync"], poll_interval=0.1):
            result = await client.wait_result(job.id, timeout=20)
        [failed_attempt] = await client.attempts(job.id)
    assert result == {"source_id": 7, "records": 25 + 25 + 12, "attempt": 2}
    assert (failed_attempt.outcome, failed_attempt.error_type) == (
        "retried",
        "trioq_workflows.providers.ProviderUnavailable",
    )
    assert "partner:7:page1: 503" in (failed_attempt.error_message or "")
    # One checkpoint per page: the retry resumed at page 1, page 0 was not fetched again.
    assert providers.PARTNER.pages_served == [(7, 0), (7, 1), (7, 2)]


async def test_sync_of_a_broken_source_fails_with_the_stored_reason(app: trioq.App) -> None:
    providers.FAULTS.always.add(f"partner:{demo.BROKEN_SOURCE}:page1")
    async with app.client(migrate=True) as client:
        job = await client.enqueue("sync_external", SyncRequest(source_id=demo.BROKEN_SOURCE))
        async with running_worker(app, ["sync"], poll_interval=0.1):
            record = await client.wait_final(job.id, timeout=20)
        attempts = await client.attempts(job.id)
    assert (record.state, record.attempt) == ("failed", 4)
    assert "503 Service Unavailable" in record.error["message"]
    assert [a.outcome for a in attempts] == ["retried", "retried", "retried", "failed"]


async def test_the_scheduled_digest_is_mailed_by_its_cron_schedule(app: trioq.App) -> None:
    async with app.client(migrate=True) as client:
        await client.schedule(
            "test-digest", "nightly_digest", cron="* * * * * *", payload={"team": "ops"}
        )
        digest_done = trio.Event()

        def on_job_end(job: object, outcome: str) -> None:
            if getattr(job, "task", None) == "nightly_digest" and outcome == "completed":
                digest_done.set()

        hooks = trioq.WorkerHooks(on_job_end=on_job_end)
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(
                functools.partial(
                    app.run_worker,
                    ["automations"],
                    2,
                    hooks=hooks,
                    poll_interval=0.1,
                    grace_seconds=0,
                )
            )
            with trio.fail_after(20):
                await digest_done.wait()
            worker.request_drain()
        assert ("ops@example.com", "digest for ops") in providers.MAILER.outbox
        [schedule] = [s for s in await client.schedules() if s.name == "test-digest"]
        stored = [s for s in await client.schedules() if s.name == "nightly-digest"]
    assert schedule.fired >= 1
    assert [(s.cron, s.timezone, s.origin) for s in stored] == [
        ("0 9 * * *", "Europe/Paris", "code")
    ]


async def test_approval_flow_sleeps_waits_for_an_event_and_mails_a_receipt_across_a_crash(
    app: trioq.App,
) -> None:
    """r1 is released by an approver's event while it waits; r2 times out and the policy
    decides. Worker 1 is stopped hard while r2 sleeps; worker 2 finishes both, and nothing
    recorded before the crash (the question to the approvers) happens twice."""
    async with app.client(migrate=True) as client:
        r1 = await client.enqueue(
            "approval_flow", ApprovalRequest("r1", "ada", 20_000, 0.2, decision_timeout_seconds=30)
        )
        r2 = await client.enqueue(
            "approval_flow", ApprovalRequest("r2", "bob", 90_000, 0.5, decision_timeout_seconds=0.5)
        )
        outcomes: dict[tuple[int, str], trio.Event] = collections.defaultdict(trio.Event)

        def on_job_end(job: object, outcome: str) -> None:
            outcomes[(getattr(job, "id", 0), outcome)].set()

        hooks = trioq.WorkerHooks(on_job_end=on_job_end)
        async with trio.open_nursery() as nursery:
            first = trio.CancelScope()

            async def worker_one(task_status: trio.TaskStatus[None]) -> None:
                with first:
                    await app.run_worker(
                        ["approvals"], 4, hooks=hooks, poll_interval=0.1, task_status=task_status
                    )

            await nursery.start(worker_one)
            with trio.fail_after(20):
                await outcomes[(r2.id, "sleeping")].wait()
            first.cancel()  # stopped hard while r2 sleeps
        async with running_worker(app, ["approvals"], poll_interval=0.1, hooks=hooks):
            with trio.fail_after(20):
                await outcomes[(r1.id, "waiting")].wait()
            assert (await client.get_job(r1.id)).state == "waiting"
            await client.emit_event(demo.approval_event("r1"), {"approved": True, "by": "eve"})
            results = [await client.wait_result(job.id, timeout=20) for job in (r1, r2)]
        kinds = {(k.task, k.kind): k.jobs for k in await client.driver.task_history_kinds()}
    assert [(r["request_id"], r["verdict"], r["by"]) for r in results] == [
        ("r1", "approved", "eve"),
        ("r2", "rejected", "policy"),
    ]
    assert results[0]["receipt"] == {"mailed": "ada@example.com"}
    assert sorted(providers.MAILER.outbox) == [
        ("ada@example.com", "r1 approved"),
        ("bob@example.com", "r2 rejected"),
    ]
    asks = [text for _, text in providers.CHAT.sent if text.startswith("approve ")]
    assert sorted(asks) == ["approve r1: 200.00?", "approve r2: 900.00?"]  # once each
    for kind in ("sleep", "event", "spawn"):
        assert kinds[("approval_flow", kind)] == 2


async def test_review_takes_amendments_and_a_verdict_by_message_and_shows_its_stage(
    app: trioq.App,
) -> None:
    """d1 gets an amendment while it waits, then an approval; its stage is readable from
    outside at each point. d2 hears nothing within its idle timeout and expires."""
    async with app.client(migrate=True) as client:
        d1 = await client.enqueue("review_document", demo.ReviewRequest("d1", "ada", 30))
        d2 = await client.enqueue("review_document", demo.ReviewRequest("d2", "bob", 0.2))
        waits: dict[int, int] = collections.Counter()
        waited = trio.Event()

        def on_job_end(job: object, outcome: str) -> None:
            if outcome == "waiting" and getattr(job, "id", 0) == d1.id:
                waits[d1.id] += 1
                waited.set()

        hooks = trioq.WorkerHooks(on_job_end=on_job_end)
        async with running_worker(app, ["approvals"], poll_interval=0.1, hooks=hooks):
            with trio.fail_after(20):
                await waited.wait()
                assert await client.get_value(d1.id, "stage") == "in review"
                waited = trio.Event()
                await client.send(d1.id, demo.REVIEW_TOPIC, {"action": "amend", "note": "typo"})
                await waited.wait()  # amended, waiting again
                assert await client.get_value(d1.id, "revision") == 2
                await client.send(d1.id, demo.REVIEW_TOPIC, {"action": "approve", "by": "eve"})
                first = await client.wait_result(d1.id, timeout=20)
                second = await client.wait_result(d2.id, timeout=20)
        assert first == {"document_id": "d1", "verdict": "approved", "by": "eve", "revision": 2}
        assert second == {"document_id": "d2", "verdict": "expired", "revision": 1}
        assert await client.get_value(d1.id, "stage") == "approved"
        assert await client.get_value(d2.id, "stage") == "expired"
    assert [text for _, text in providers.CHAT.sent if text.startswith("d1")] == ["d1 r2: typo"]
