"""Reference workflows: what an application built on trioq looks like.

- `send_reply`: reply to a conversation through an (simulated) chat API.
- `react_to_event`: react to an application event; events of one account run in order
  (partition key = account).
- `sync_external`: page through an external API that sometimes answers 503: retried with
  backoff, the failed attempts kept in the attempts history.
- `nightly_digest`: a scheduled automation: a cron schedule (`@app.periodic`) at 09:00 Paris
  time; the demo adds one firing every 2 seconds.

`trioq demo` enqueues a few hundred of these and runs a worker until they finish;
`tests/test_workflows.py` runs them end to end.
"""

from __future__ import annotations

import random

import attrs
import trio

import trioq

app = trioq.App(schema="trioq")

QUEUES = ("default", "events", "sync", "automations")
DIGEST_TASK = "nightly_digest"  # `trioq demo` schedules it every 2 s while it runs
BROKEN_SOURCE = 13  # its partner API always answers 503: the job fails with that reason


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


class PartnerUnavailable(Exception):
    """The simulated partner API answered 503."""


@app.task("send_reply", queue="default", max_attempts=5)
async def send_reply(ctx: trioq.Context, payload: SendReply) -> dict[str, object]:
    await trio.sleep(random.uniform(0.002, 0.02))  # the chat API round trip
    return {
        "conversation_id": payload.conversation_id,
        "message_id": f"msg-{ctx.job.id}",
        "chars": len(payload.text),
    }


@app.task("react_to_event", queue="events", max_attempts=3)
async def react_to_event(ctx: trioq.Context, payload: AppEvent) -> dict[str, object]:
    await trio.sleep(random.uniform(0.001, 0.01))
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
        await trio.sleep(0.005)  # one page of the partner API
        # Every fifth source is flaky: its first attempt fails on the second page.
        flaky = payload.source_id % 5 == 0 and ctx.job.attempt == 1
        if (flaky or payload.source_id == BROKEN_SOURCE) and page == 1:
            raise PartnerUnavailable(f"source {payload.source_id}: 503 on page {page}")
        records += 25
    return {"source_id": payload.source_id, "records": records, "attempt": ctx.job.attempt}


@app.periodic("nightly-digest", cron="0 9 * * *", timezone="Europe/Paris", payload={"team": "core"})
@app.task("nightly_digest", queue="automations")
async def nightly_digest(ctx: trioq.Context, payload: dict[str, object]) -> dict[str, object]:
    await trio.sleep(0.01)
    return {"digest_for": payload["team"], "sent": True}


async def enqueue_demo_jobs(client: trioq.Client, scale: int = 1) -> list[trioq.Job]:
    """The demo's workload: a few hundred jobs of every workflow (bulk and single enqueues)."""
    jobs = await client.enqueue_many(
        "send_reply",
        [SendReply(f"conv-{i}", f"Thanks for your message #{i}!") for i in range(200 * scale)],
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
