"""`trioq explain` / `client.explain`: the gate that keeps a job from running, on Postgres."""

from __future__ import annotations

import contextlib
import datetime
import json
import uuid

import pytest
import trio

import trioq
from tests.support import Gate as Latch
from tests.support import make_app, running_worker, scalar, wait_until
from trioq import cli
from trioq._core.admission import AdmissionPolicy
from trioq._core.explain import ExplainFacts, explain
from trioq._seam.driver import Claim
from trioq.cli.ops import admission_cell

NOW = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)


def make(pg_url: str, pg_schema: str) -> trioq.App:
    app = make_app(pg_url, pg_schema)

    @app.task("work", queue="default")
    async def work(ctx: trioq.Context, payload: object) -> None:
        return None

    @app.task("elsewhere", queue="nobody")
    async def elsewhere(ctx: trioq.Context, payload: object) -> None:
        return None

    return app


async def test_a_delayed_job_is_not_due_until_its_run_at(pg_url: str, pg_schema: str) -> None:
    app = make(pg_url, pg_schema)
    async with app.client(migrate=True) as client, running_worker(app, ["default"]):
        job = await client.enqueue("work", {}, delay=3600)
        why = await client.explain(job.id)
    assert why.blocked_by == "due"
    assert why.verdict.startswith("not due until ") and "(in 3" in why.verdict


async def test_a_keyed_job_names_the_job_holding_its_partition_key(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    latch = Latch()

    @app.task("keyed")
    async def keyed(ctx: trioq.Context, payload: object) -> None:
        latch.enter()
        await latch.release.wait()

    async with app.client(migrate=True) as client, running_worker(app, ["default"]):
        first = await client.enqueue("keyed", {}, partition_key="account-7")
        with trio.fail_after(10):
            await latch.wait_entered(1)
        second = await client.enqueue("keyed", {}, partition_key="account-7")
        why = await client.explain(second.id)
        running = await client.explain(first.id)
        latch.release.set()
    assert why.blocked_by == "partition_key"
    assert f"partition key 'account-7' held by job {first.id} (lease until " in why.verdict
    assert running.blocked_by == "lease" and running.verdict.startswith("running on worker ")


async def test_no_live_worker_for_the_queue_is_named(pg_url: str, pg_schema: str) -> None:
    app = make(pg_url, pg_schema)
    async with app.client(migrate=True) as client, running_worker(app, ["default"]):
        job = await client.enqueue("elsewhere", {})
        why = await client.explain(job.id)
    assert (why.blocked_by, why.verdict) == ("workers", "no live worker serves queue 'nobody'")


async def test_no_live_worker_for_the_handler_version_is_named(pg_url: str, pg_schema: str) -> None:
    app = make(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        # A job enqueued for version 2 (as a producer declaring that version does), and a
        # worker that reports the (task, version) pairs it serves (migration 0007's column):
        # only version 1.
        job = await client.enqueue(trioq.declare_task("work", version=2), {})
        await register_worker(pg_url, pg_schema, "running", "{work@1}")
        why = await client.explain(job.id)
    assert why.blocked_by == "version"
    assert why.verdict == "no live worker serves task 'work' version 2"


async def test_exhausted_attempts_name_the_last_stored_error(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("doomed", max_attempts=2, retry=trioq.RetryPolicy(base_seconds=0.01, jitter=0))
    async def doomed(ctx: trioq.Context, payload: object) -> None:
        raise LookupError(f"no such account (attempt {ctx.job.attempt})")

    async with app.client(migrate=True) as client, running_worker(app, ["default"]):
        job = await client.enqueue("doomed", {})
        with trio.fail_after(10):
            with contextlib.suppress(trioq.JobFailed):
                await client.wait_result(job.id)
        why = await client.explain(job.id)
    assert why.state == "failed" and why.blocked_by == "final"
    assert why.verdict == (
        "failed: attempts exhausted (2/2); last error builtins.LookupError: "
        "no such account (attempt 2)"
    )


async def register_worker(pg_url: str, pg_schema: str, state: str, versions: str = "{}") -> None:
    """A worker row registered from the outside (a live heartbeat, no process behind it)."""
    await scalar(
        pg_url,
        f"INSERT INTO {pg_schema}.workers (id, hostname, pid, queues, concurrency, state, "
        "started_at, heartbeat_at, task_versions) VALUES (%s, 'host-a', 1, '{default}', 5, "
        "%s, now(), now(), %s) RETURNING 1",
        (uuid.uuid4(), state, versions),
    )


async def test_every_serving_worker_draining_is_named(pg_url: str, pg_schema: str) -> None:
    app = make(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        job = await client.enqueue("work", {})
        await register_worker(pg_url, pg_schema, "draining")
        draining = await client.explain(job.id)
        await register_worker(pg_url, pg_schema, "running")
        claimable = await client.explain(job.id)
    assert draining.blocked_by == "draining"
    assert draining.verdict == "every worker serving queue 'default' is draining"
    assert claimable.blocked_by is None and claimable.verdict.startswith("claimable now")


def test_waiting_for_an_event_or_children_is_named() -> None:
    """The wait gate reads the wait columns (migration 0003) when the row has them."""
    base = {
        "id": 5,
        "queue": "q",
        "task": "t",
        "state": "waiting",
        "priority": 0,
        "attempt": 1,
        "max_attempts": 5,
        "partition_key": None,
    }
    timeout = (NOW + datetime.timedelta(minutes=5)).isoformat()
    event = explain(ExplainFacts(NOW, {**base, "run_at": timeout, "wait_event_key": "approval:42"}))
    assert (event.blocked_by, event.verdict) == (
        "wait",
        "waiting for event 'approval:42' (times out 2030-01-01T00:05:00+00:00 (in 300s))",
    )
    children = explain(ExplainFacts(NOW, {**base, "run_at": None, "wait_children": [7, 9]}))
    assert children.verdict == "waiting for child job(s) 7, 9"


def test_a_dead_workers_lease_names_its_recovery() -> None:
    job = {
        "id": 5,
        "queue": "q",
        "task": "t",
        "state": "running",
        "priority": 0,
        "attempt": 1,
        "max_attempts": 5,
        "partition_key": None,
        "run_at": NOW.isoformat(),
        "worker_id": "w1",
        "lease_expires_at": (NOW + datetime.timedelta(seconds=20)).isoformat(),
    }
    gone = {"id": "w1", "heartbeat_at": (NOW - datetime.timedelta(minutes=10)).isoformat()}
    why = explain(ExplainFacts(NOW, job, workers=(gone,)))
    assert why.blocked_by == "lease"
    assert why.verdict.startswith("lease held by a dead worker w1 until 2030-01-01T00:00:20")


async def test_cli_explain_prints_the_verdict_and_json(
    pg_url: str, pg_schema: str, capsys: object
) -> None:
    app = make(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        job = await client.enqueue("work", {}, delay=60)
    args = ["explain", str(job.id), "--database-url", pg_url, "--schema", pg_schema]
    assert await trio.to_thread.run_sync(cli.main, [*args, "--json"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    data = json.loads(out)
    assert data["blocked_by"] == "due" and data["gates"][0]["name"] == "due"
    assert await trio.to_thread.run_sync(cli.main, args) == 0
    assert "not due until" in capsys.readouterr().out  # type: ignore[attr-defined]
    assert (
        await trio.to_thread.run_sync(
            cli.main, ["explain", "999999", "--database-url", pg_url, "--schema", pg_schema]
        )
        == 1  # docs/cli.md: what was asked for does not exist
    )


async def test_a_sleeping_workflow_is_explained_by_its_wake_time(
    pg_url: str, pg_schema: str
) -> None:
    """A real durable sleep (the workflow seam): the job is `sleeping`, not due until it wakes."""
    app = make_app(pg_url, pg_schema)
    slept = trio.Event()

    @app.task("nap")
    async def nap(ctx: trioq.Context, payload: object) -> None:
        slept.set()
        await ctx.sleep("nap", datetime.timedelta(hours=1))

    async with app.client(migrate=True) as client, running_worker(app, ["default"]):
        job = await client.enqueue("nap", {})
        with trio.fail_after(20):
            await slept.wait()

            async def sleeping() -> bool:  # the suspension is written by the settle statement
                return (await client.get_job(job.id)).state == "sleeping"

            await wait_until(sleeping)
        why = await client.explain(job.id)
    assert (why.state, why.blocked_by) == ("sleeping", "due")
    assert why.verdict.startswith("sleeping until ") and "(in 3" in why.verdict


async def test_a_paused_queue_is_named_before_the_workers(pg_url: str, pg_schema: str) -> None:
    app = make(pg_url, pg_schema)
    async with app.client(migrate=True) as client, running_worker(app, ["default"]):
        assert await client.pause_queue("default")
        job = await client.enqueue("work", {})
        paused = await client.explain(job.id)
        assert await client.resume_queue("default")
        with trio.fail_after(10):
            await client.wait_result(job.id)
    assert paused.blocked_by == "paused"
    assert paused.verdict.startswith("queue 'default' is paused since ")
    assert paused.verdict.endswith("(trioq queue resume default)")
    assert [gate.name for gate in paused.gates][:3] == ["due", "wait", "lease"]


async def test_a_worker_at_a_reduced_admission_limit_is_named(pg_url: str, pg_schema: str) -> None:
    """Injected database errors cut the worker's limit to 1 of 4; the next lease renewal
    (early, because the snapshot changed) writes it on the worker row, and a ready job behind
    the one running is explained by it."""
    app = make_app(pg_url, pg_schema)
    latch = Latch()

    @app.task("hold")
    async def hold(ctx: trioq.Context, payload: object) -> None:
        latch.enter()
        await latch.release.wait()

    published: list[tuple[object, ...]] = []
    cut_written = trio.Event()

    def on_publish(snapshot: tuple[object, ...]) -> None:
        published.append(snapshot)
        if any(entry.limit == 1 for entry in snapshot):  # type: ignore[attr-defined]
            cut_written.set()

    async with app.client(migrate=True) as client, trio.open_nursery() as nursery:
        worker = app.worker(["default"], 4, grace_seconds=0, admission="on")
        worker.admission.sample_interval = 0.05
        # Every sample with an error cuts at once, down to 1; it never grows back here.
        worker.admission.policy = AdmissionPolicy(
            sustain_seconds=0, decrease_every=0, increase_every=1e6, min_limit=1
        )
        worker.admission.on_publish = on_publish
        await nursery.start(worker.run)
        first = await client.enqueue("hold", {})
        with trio.fail_after(20):
            await latch.wait_entered(1)
            worker.admission.record_error("job_claim", ConnectionError("injected"))
            await cut_written.wait()
        second = await client.enqueue("hold", {})
        why = await client.explain(second.id)
        [info] = await client.workers()
        latch.release.set()
        worker.request_drain()
    assert why.state == "ready" and why.blocked_by == "admission", why
    assert why.verdict.startswith(
        f"admission reduced to 1 of 4 because database errors (worker {worker.worker_id} on "
    ), why.verdict
    assert ", since " in why.verdict
    assert first.id != second.id
    # `trioq status` shows the same snapshot in its workers table.
    assert [(a.queue, a.limit, a.concurrency, a.reason) for a in info.admission] == [
        ("default", 1, 4, "db_errors")
    ]
    assert admission_cell(info).startswith("default 1/4 db_errors ")


def _ready_job() -> dict[str, object]:
    return {
        "id": 5,
        "queue": "q",
        "task": "t",
        "state": "ready",
        "priority": 0,
        "attempt": 0,
        "max_attempts": 5,
        "partition_key": None,
        "run_at": NOW.isoformat(),
    }


def _worker(name: str, admission: dict[str, object] | None) -> dict[str, object]:
    return {
        "id": name,
        "hostname": "host",
        "pid": 1,
        "state": "running",
        "heartbeat_at": NOW.isoformat(),
        "admission": admission,
    }


def test_admission_gate_needs_every_accepting_worker_reduced() -> None:
    since = (NOW - datetime.timedelta(seconds=40)).isoformat()
    lag = {"q": {"limit": 2, "concurrency": 8, "reason": "scheduler_lag", "cause": "scheduler_lag",
                 "since": since}}  # fmt: skip
    healing = {"q": {"limit": 3, "concurrency": 8, "reason": "recovering", "cause": "db_errors",
                     "since": since}}  # fmt: skip
    other_queue = {"elsewhere": lag["q"]}
    both = explain(
        ExplainFacts(NOW, _ready_job(), workers=(_worker("a", lag), _worker("b", healing)))
    )
    assert both.blocked_by == "admission"
    assert both.verdict == (
        "admission reduced to 5: 2 of 8 because scheduler lag (worker a on host:1, since "
        "2029-12-31T23:59:20+00:00 (40s ago)); 3 of 8 because it is recovering from database "
        "errors (worker b on host:1, since 2029-12-31T23:59:20+00:00 (40s ago))"
    )
    one_full = explain(
        ExplainFacts(NOW, _ready_job(), workers=(_worker("a", lag), _worker("b", other_queue)))
    )
    assert one_full.blocked_by is None
    assert one_full.gates[-1] == trioq.Gate(
        "admission", False, "1 accepting worker(s) at full concurrency"
    )
    draining = {**_worker("c", None), "state": "draining"}
    behind_drain = explain(ExplainFacts(NOW, _ready_job(), workers=(_worker("a", lag), draining)))
    assert behind_drain.blocked_by == "admission"  # a draining worker claims nothing either


async def test_a_workflow_waiting_for_an_event_is_explained_by_its_key(
    pg_url: str, pg_schema: str
) -> None:
    """A real durable wait (wait_for_event): the job is `waiting`, named by its event key and
    its timeout."""
    app = make_app(pg_url, pg_schema)
    entered = trio.Event()

    @app.task("approve")
    async def approve(ctx: trioq.Context, payload: object) -> object:
        entered.set()
        return await ctx.wait_for_event("approval:7", timeout=datetime.timedelta(hours=1))

    async with app.client(migrate=True) as client, running_worker(app, ["default"]):
        job = await client.enqueue("approve", {})
        with trio.fail_after(20):
            await entered.wait()

            async def waiting() -> bool:  # the suspension is written by the settle statement
                return (await client.get_job(job.id)).state == "waiting"

            await wait_until(waiting)
        why = await client.explain(job.id)
    assert (why.state, why.blocked_by) == ("waiting", "wait")
    assert why.verdict.startswith("waiting for event 'approval:7' (times out ")
    assert "(in 3" in why.verdict  # about an hour from now


async def test_a_job_of_a_task_no_worker_registers_names_the_task_not_the_queue(
    pg_url: str, pg_schema: str
) -> None:
    """A misspelt task enqueued by name lands on the default queue, which the live workers (of
    the right task's queue) do not serve: `trioq status` names the task, so does explain."""
    from trioq.producer import SyncProducer

    app = make_app(pg_url, pg_schema)

    @app.task("send_email", queue="emails")
    async def send_email(ctx: trioq.Context, payload: object) -> None:
        return None

    async with app.client(migrate=True) as client, running_worker(app, ["emails"]):
        with SyncProducer(pg_url, schema=pg_schema) as producer:
            with pytest.warns(trioq.UnservedTaskWarning):  # the producer's own warning
                misspelt = producer.enqueue("send_emial", {})
            why = await client.explain(misspelt.id)
            argv = ["explain", str(misspelt.id), "--database-url", pg_url, "--schema", pg_schema]
            code = await trio.to_thread.run_sync(cli.main, argv)
    assert why.blocked_by == "workers"
    assert why.verdict.startswith(
        "no live worker registers task 'send_emial' (nor serves queue 'default'): a misspelt "
        "task name, or its worker is not running?"
    )
    assert code == 0


async def test_the_job_ahead_in_its_key_and_a_concurrency_keys_head_are_ready_entries(
    pg_url: str, pg_schema: str
) -> None:
    """`key_ahead` and a concurrency key's head are read from ready_keyed (migration 0048): the
    earlier ready job of the key while it is ready, none once a claim took it (then it holds
    the key); the key's first ready job and its limit, the next one once the first is taken."""
    app = make_app(pg_url, pg_schema)
    task = trioq.TaskDeclaration("noop")
    async with app.client(migrate=True) as client:
        driver = client.driver
        first = await client.enqueue(task, {}, partition_key="p", priority=-2)
        second = await client.enqueue(task, {}, partition_key="p")
        head = await client.enqueue(task, {}, concurrency_key="c", concurrency_limit=2, priority=-1)
        behind = await client.enqueue(task, {}, concurrency_key="c", concurrency_limit=2)
        facts = await driver.job_explain(second.id)
        assert facts is not None and facts.key_ahead is not None
        assert facts.key_ahead["id"] == first.id
        facts = await driver.job_explain(behind.id)
        assert facts is not None and facts.concurrency is not None
        assert (facts.concurrency["head_id"], facts.concurrency["limit"]) == (head.id, 2)
        claim = Claim("default", ("noop",), 2, 30.0, uuid.uuid4())
        claimed = (await driver.job_claim(claim)).claimed
        assert sorted(job.id for job in claimed) == sorted([first.id, head.id])
        facts = await driver.job_explain(second.id)
        assert facts is not None and facts.key_ahead is None
        assert facts.key_holder is not None and facts.key_holder["id"] == first.id
        facts = await driver.job_explain(behind.id)
        assert facts is not None and facts.concurrency is not None
        assert facts.concurrency["head_id"] == behind.id
        assert facts.concurrency["running"] == 1
