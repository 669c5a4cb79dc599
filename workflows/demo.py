"""Reference workflows: what an application built on trioq looks like.

- `send_reply`: reply to a conversation through the (simulated) chat API; replies of one
  conversation run one at a time, in order (partition key = conversation id, see `reply`).
- `react_to_event`: react to an application event; events of one account run in order
  (partition key = account).
- `sync_external`: page through a partner API that sometimes answers 503, one step (so one
  checkpoint) per page: a retry resumes at the page that failed, the pages already fetched are
  not fetched again; the failed attempts are kept in the attempts history.
- `approval_flow`: a multi-step approval: ask on the chat API (a step), a durable cool-off
  sleep (the slot is freed; a worker crash meanwhile loses nothing), the decision (a step), and
  a receipt to the requester (a step).
- `review_document`: a review driven by messages (`client.send` / `ctx.receive`): amend any
  number of times, then approve or reject; its stage and revision are readable from outside
  while it waits (`ctx.set_value` / `client.get_value`).
- `nightly_digest`: a scheduled automation: a cron schedule (`@app.periodic`) at 09:00 Paris
  time; the demo adds one firing every 2 seconds.

Provider calls go to `providers.py` (simulated in process, deterministic, with injected
failures). `trioq demo` enqueues a few hundred of these and runs a worker until they finish;
`tests/test_reference_workflows.py` runs each end to end.
"""

from __future__ import annotations

import datetime

import attrs
import trio

import trioq

from . import providers

app = trioq.App(schema="trioq")

QUEUES = ("default", "events", "sync", "automations", "approvals")
DIGEST_TASK = "nightly_digest"  # `trioq demo` schedules it every 2 s while it runs
BROKEN_SOURCE = 13  # its partner API always answers 503: the job fails with that reason
FLAKY_SOURCES = range(0, 1000, 5)  # page 1 answers 503 once: the job succeeds on a retry


@attrs.frozen
class SendReply:
    conversation_id: str
    text: str


@attrs.frozen
class AppEvent:
    account_id: str
    kind: str
    sequence: int


@attrs.frozen
class SyncRequest:
    source_id: int
    pages: int = 3


@app.task("send_reply", queue="default", max_attempts=5)
async def send_reply(ctx: trioq.Context, payload: SendReply) -> dict[str, object]:
    message_id = await providers.CHAT.post_message(
        payload.conversation_id, payload.text, idempotency_key=f"reply-{ctx.job.id}"
    )
    return {
        "conversation_id": payload.conversation_id,
        "message_id": message_id,
        "chars": len(payload.text),
    }


async def reply(client: trioq.Client, conversation_id: str, text: str) -> trioq.Job:
    """Enqueue a reply: one conversation's replies are sent one at a time, in order."""
    return await client.enqueue(
        "send_reply", SendReply(conversation_id, text), partition_key=conversation_id
    )


@app.task("react_to_event", queue="events", max_attempts=3)
async def react_to_event(ctx: trioq.Context, payload: AppEvent) -> dict[str, object]:
    await providers.CHAT.post_message(
        f"account-{payload.account_id}",
        f"{payload.kind} #{payload.sequence}",
        f"event-{ctx.job.id}",
    )
    return {"account_id": payload.account_id, "handled": payload.kind, "sequence": payload.sequence}


@app.task(
    "sync_external",
    queue="sync",
    max_attempts=4,
    retry=trioq.RetryPolicy(base_seconds=0.05, max_seconds=0.5),
)
async def sync_external(ctx: trioq.Context, payload: SyncRequest) -> dict[str, object]:
    records = 0
    for page in range(payload.pages):
        rows = await ctx.step(
            f"page {page}", providers.PARTNER.fetch_page, payload.source_id, page, payload.pages
        )
        records += len(rows)
    return {"source_id": payload.source_id, "records": records, "attempt": ctx.job.attempt}


@attrs.frozen
class ApprovalRequest:
    request_id: str
    requester: str
    amount_cents: int
    cool_off_seconds: float = 1.0
    decision_timeout_seconds: float = 3.0


AUTO_APPROVE_CENTS = 50_000


def approval_event(request_id: str) -> str:
    """The event an approver emits (`client.emit_event(key, {"approved": ..., "by": ...})`)."""
    return f"approval:{request_id}"


def decide(amount_cents: int) -> dict[str, object]:
    """The fallback policy when no approver answered in time (a step: recorded, so a replay
    never re-decides)."""
    approved = amount_cents <= AUTO_APPROVE_CENTS
    return {"approved": approved, "by": "policy"}


@app.task("approval_flow", queue="approvals", max_attempts=3)
async def approval_flow(ctx: trioq.Context, payload: ApprovalRequest) -> dict[str, object]:
    """Ask (a step), cool off (a durable sleep), wait for an approver's event (a durable wait
    with a timeout; the policy decides on timeout), then mail a receipt (a child job)."""
    channel = f"approvals-{payload.requester}"
    asked = await ctx.step(
        "ask approvers",
        providers.CHAT.post_message,
        channel,
        f"approve {payload.request_id}: {payload.amount_cents / 100:.2f}?",
        f"ask-{payload.request_id}",
    )
    await ctx.sleep("cool-off", datetime.timedelta(seconds=payload.cool_off_seconds))
    try:
        decision = await ctx.wait_for_event(
            approval_event(payload.request_id),
            timeout=datetime.timedelta(seconds=payload.decision_timeout_seconds),
        )
    except trioq.EventTimeout:
        decision = await ctx.step("decide by policy", decide, payload.amount_cents)
    verdict = "approved" if decision["approved"] else "rejected"
    receipt = await ctx.spawn(
        "send_receipt",
        {"to": payload.requester, "request_id": payload.request_id, "verdict": verdict},
    )
    mailed = await ctx.wait_result(receipt)
    return {
        "request_id": payload.request_id,
        "asked": asked,
        "verdict": verdict,
        "by": decision["by"],
        "receipt": mailed,
    }


@app.task("send_receipt", queue="approvals")
async def send_receipt(ctx: trioq.Context, payload: dict[str, str]) -> dict[str, str]:
    to = f"{payload['to']}@example.com"
    await providers.MAILER.send(to, f"{payload['request_id']} {payload['verdict']}")
    return {"mailed": to}


@attrs.frozen
class ReviewRequest:
    document_id: str
    author: str
    idle_timeout_seconds: float = 5.0


REVIEW_TOPIC = "review"


@app.task("review_document", queue="approvals", max_attempts=3)
async def review_document(ctx: trioq.Context, payload: ReviewRequest) -> dict[str, object]:
    """A review driven by a stream of messages (`client.send(job_id, "review", {...})`):
    reviewers ask for amendments any number of times, then approve or reject. Each amendment
    is published (a step); the stage and the revision are readable from outside while it
    waits (`client.get_value(job_id, "stage")`, `trioq job ID`). Nobody answering within the
    idle timeout expires the review."""
    revision = 1
    await ctx.set_value("stage", "in review")
    await ctx.set_value("revision", revision)
    timeout = datetime.timedelta(seconds=payload.idle_timeout_seconds)
    while True:
        messages = await ctx.receive(REVIEW_TOPIC, timeout=timeout)
        if not messages:
            await ctx.set_value("stage", "expired")
            return {"document_id": payload.document_id, "verdict": "expired", "revision": revision}
        for message in messages:
            if message.get("action") == "amend":
                revision += 1
                await ctx.step(
                    f"publish revision {revision}",
                    providers.CHAT.post_message,
                    f"docs-{payload.author}",
                    f"{payload.document_id} r{revision}: {message.get('note', '')}",
                    f"review-{payload.document_id}-r{revision}",
                )
                await ctx.set_value("revision", revision)
                continue
            verdict = "approved" if message.get("action") == "approve" else "rejected"
            await ctx.set_value("stage", verdict)
            return {
                "document_id": payload.document_id,
                "verdict": verdict,
                "by": message.get("by"),
                "revision": revision,
            }


async def drive_demo(client: trioq.Client, scale: int = 1) -> None:
    """What the people do during `trioq demo`: once the approvals are waiting, an approver
    answers the even-numbered requests; the others time out and the policy decides. Reviewers
    ask for an amendment on every document, then approve the even ones and reject the odd."""
    await trio.sleep(1.5)  # the demo's approvers take a moment (cool-off is 1 s)
    for n in range(0, 10 * scale, 2):
        await client.emit_event(approval_event(f"req-{n}"), {"approved": True, "by": "manager"})
    reviews = await client.jobs(task="review_document", limit=10_000)
    for job in reviews:
        await client.send(job.id, REVIEW_TOPIC, {"action": "amend", "note": "fix the intro"})
    await trio.sleep(0.5)
    for n, job in enumerate(sorted(reviews, key=lambda job: job.id)):
        action = "approve" if n % 2 == 0 else "reject"
        await client.send(job.id, REVIEW_TOPIC, {"action": action, "by": f"reviewer-{n % 3}"})


async def demo_notes(client: trioq.Client) -> list[str]:
    """Lines `trioq demo` prints under its summary: what a UI reads from a review."""
    reviews = await client.jobs(task="review_document", limit=1)
    if not reviews:
        return []
    job_id = reviews[0].id
    stage = await client.get_value(job_id, "stage")
    revision = await client.get_value(job_id, "revision")
    return [
        f"review job {job_id}: client.get_value -> stage {stage!r}, revision {revision} "
        f"(messages via client.send; `trioq job {job_id}` shows its timeline)"
    ]


@app.periodic("nightly-digest", cron="0 9 * * *", timezone="Europe/Paris", payload={"team": "core"})
@app.task("nightly_digest", queue="automations")
async def nightly_digest(ctx: trioq.Context, payload: dict[str, object]) -> dict[str, object]:
    team = str(payload["team"])
    await providers.MAILER.send(f"{team}@example.com", f"digest for {team}")
    return {"digest_for": team, "sent": True}


def inject_demo_faults() -> None:
    """The demo's failures: flaky sources fail their page 1 once, the broken one always."""
    for source in FLAKY_SOURCES:
        providers.FAULTS.times[f"partner:{source}:page1"] = 1
    providers.FAULTS.always.add(f"partner:{BROKEN_SOURCE}:page1")


async def enqueue_demo_jobs(client: trioq.Client, scale: int = 1) -> list[trioq.Job]:
    """The demo's workload: a few hundred jobs of every workflow (bulk and single enqueues)."""
    inject_demo_faults()
    jobs: list[trioq.Job] = []
    for conversation in range(50 * scale):
        jobs += await client.enqueue_many(
            "send_reply",
            [SendReply(f"conv-{conversation}", f"Thanks for message #{n}!") for n in range(4)],
            partition_key=f"conv-{conversation}",
        )
    for account in range(10):
        jobs += await client.enqueue_many(
            "react_to_event",
            [AppEvent(f"acct-{account}", "user.updated", seq) for seq in range(10 * scale)],
            partition_key=f"acct-{account}",
        )
    jobs += await client.enqueue_many(
        "sync_external", [SyncRequest(source_id=i) for i in range(40 * scale)]
    )
    jobs += await client.enqueue_many(
        "approval_flow",
        [
            ApprovalRequest(f"req-{n}", f"user-{n % 5}", amount_cents=10_000 * (n + 1))
            for n in range(10 * scale)
        ],
    )
    jobs += await client.enqueue_many(
        "review_document",
        [ReviewRequest(f"doc-{n}", f"user-{n % 5}") for n in range(4 * scale)],
    )
    for team in ("core", "growth"):
        jobs.append(
            await client.enqueue(
                "nightly_digest", {"team": team}, delay=0.5, dedup_key=f"digest:{team}"
            )
        )
    # The same automation enqueued twice: the dedup key returns the existing job.
    jobs.append(
        await client.enqueue("nightly_digest", {"team": "core"}, delay=0.5, dedup_key="digest:core")
    )
    return jobs
