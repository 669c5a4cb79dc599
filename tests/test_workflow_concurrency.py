"""Durable workflows on PostgreSQL, part 3: parallel blocks, continue-as-new and the history
limit, patches, and cancellation with cleanup (docs/workflows.md)."""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from psycopg import sql

import trioq
from tests.procs import fetch
from tests.support import make_app, running_worker, wait_until
from trioq._memory import MemoryDriver

N = 4
# The order in which the block's steps finish in the crashed execution (not code order): a
# crash after each of them leaves the history with these positions recorded.
FINISH_ORDER = (2, 0, 3, 1)

# Jobs are enqueued by name before a worker serves them: the unserved-name warning is expected.
pytestmark = pytest.mark.filterwarnings("ignore::trioq.UnservedTaskWarning")


def parallel_app(pg_url: str, pg_schema: str, calls: list[tuple[int, int]]) -> trioq.App:
    app = make_app(pg_url, pg_schema)

    def square(job: int, n: int) -> int:
        calls.append((job, n))
        return n * n

    @app.task("fan")
    async def fan(ctx: trioq.Context, payload: dict[str, int]) -> list[int]:
        async with ctx.parallel() as p:
            handles = [p.step(f"square {n}", square, ctx.job.id, n) for n in range(N)]
        return [h.result for h in handles]

    return app


async def test_parallel_replay_after_a_crash_at_each_position_reruns_no_finished_step(
    pg_url: str, pg_schema: str
) -> None:
    calls: list[tuple[int, int]] = []
    app = parallel_app(pg_url, pg_schema, calls)
    async with app.client(migrate=True) as client:
        jobs = await client.enqueue_many("fan", [{}] * (N + 1))
        recorded: dict[int, tuple[int, ...]] = {}
        for crash_after, job in enumerate(jobs):  # the crash state, written as a worker would
            done = FINISH_ORDER[:crash_after]
            recorded[job.id] = done
            for n in done:
                await fetch(
                    pg_url,
                    _q(
                        pg_schema,
                        "INSERT INTO {s}.checkpoints (job_id, position, kind, name, value, "
                        "created_at) VALUES (%s, %s, 'step', %s, %s, now()) RETURNING job_id",
                    ),
                    (job.id, n, f"square {n}", json.dumps(n * n)),
                )
            await fetch(
                pg_url,
                _q(
                    pg_schema,
                    "UPDATE {s}.job_rows_legacy SET checkpoint_count = %s WHERE id = %s"
                    " RETURNING id",
                ),
                (max(done, default=-1) + 1, job.id),
            )
        async with running_worker(app):
            with trio.fail_after(30):
                results = [await client.wait_result(job.id) for job in jobs]
    assert results == [[n * n for n in range(N)]] * (N + 1)
    for job in jobs:
        called = sorted(n for j, n in calls if j == job.id)
        assert called == sorted(set(range(N)) - set(recorded[job.id])), job.id


async def test_ten_parallel_steps_cost_at_most_two_statements(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)

    async def fetch_page(n: int) -> dict[str, int]:
        await trio.lowlevel.checkpoint()
        return {"page": n}

    @app.task("pages")
    async def pages(ctx: trioq.Context, payload: object) -> list[Any]:
        async with ctx.parallel() as p:
            handles = [p.step(f"page {n}", fetch_page, n) for n in range(10)]
        return [h.result["page"] for h in handles]

    async with app.client(migrate=True) as client, running_worker(app) as worker:
        job = await client.enqueue("pages", {})
        with trio.fail_after(20):
            assert await client.wait_result(job.id) == list(range(10))
        statements, written = worker.checkpoints.statistics()
        history = await client.history(job.id)
    assert written == 10
    assert statements <= 2
    assert [(h.position, h.name) for h in history] == [(n, f"page {n}") for n in range(10)]


async def test_a_changed_parallel_block_fails_with_nondeterminism(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    code = {"names": ["a", "b"]}
    gate = trio.Event()

    @app.task("block", max_attempts=3, retry=trioq.RetryPolicy(base_seconds=0, jitter=0))
    async def block(ctx: trioq.Context, payload: object) -> None:
        async with ctx.parallel() as p:
            for name in code["names"]:
                p.step(name, lambda: 1)
        if not gate.is_set():
            # The code changes before the retry replays this block (a deploy between attempts).
            gate.set()
            code["names"] = ["a", "c"]
            raise RuntimeError("crash after the block: the next attempt replays it")

    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("block", {})
        with trio.fail_after(20):
            record = await client.wait_final(job.id)
    assert record.state == "failed"
    assert record.error["type"] == "trioq._core.errors.NondeterminismError"
    assert "position 1" in record.error["message"]


async def test_a_block_runs_steps_spawns_a_sleep_and_an_event_wait_together(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("child")
    async def child(ctx: trioq.Context, payload: dict[str, int]) -> int:
        return payload["n"] + 100

    @app.task("mixed")
    async def mixed(ctx: trioq.Context, payload: object) -> dict[str, Any]:
        async with ctx.parallel() as p:
            a = p.step("a", lambda: "A")
            kids = [p.spawn("child", {"n": n}) for n in range(3)]
            p.sleep("pause", datetime.timedelta(milliseconds=300))
            go = p.wait_for_event("mixed:go", timeout=datetime.timedelta(seconds=30))
            late = p.wait_for_event("mixed:never", timeout=datetime.timedelta(0))
        try:
            _ = late.result
        except trioq.EventTimeout:
            timed_out = True
        children = await ctx.gather(*[k.result for k in kids])
        return {"a": a.result, "children": children, "go": go.result, "late": timed_out}

    async with app.client(migrate=True) as client, running_worker(app):
        await client.emit_event("mixed:go", {"ok": 1})
        job = await client.enqueue("mixed", {})
        with trio.fail_after(30):
            result = await client.wait_result(job.id)
        kinds = [(h.position, h.kind) for h in await client.history(job.id)]
    assert result == {"a": "A", "children": [100, 101, 102], "go": {"ok": 1}, "late": True}
    assert kinds[:7] == [
        (0, "step"), (1, "spawn"), (2, "spawn"), (3, "spawn"), (4, "sleep"), (5, "event"),
        (6, "event"),
    ]  # fmt: skip


# --- continue-as-new and the history limit ----------------------------------------------------


def looping_app(app: trioq.App, iterations: int, seen: list[int]) -> trioq.App:
    @app.task("poll", history_limit=3)
    async def poll(ctx: trioq.Context, payload: dict[str, int]) -> dict[str, int]:
        seen.append(len(await ctx.client.history(ctx.job.id)))
        value = await ctx.step("read", lambda: payload["i"])
        await ctx.step("write", lambda: value + 1)
        if payload["i"] + 1 < iterations:
            await ctx.continue_as_new({"i": payload["i"] + 1})
        return {"iterations": payload["i"] + 1, "attempt": ctx.job.attempt}

    return app


async def test_a_looping_workflow_continues_as_new_1000_times_with_a_bounded_history(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The runtime on the in-memory driver (virtual time), 1,000 iterations: each starts with
    an empty history, and the task's history_limit of 3 is never reached."""
    seen: list[int] = []
    app = looping_app(trioq.App(schema="virtual"), 1000, seen)
    async with app.client(driver=MemoryDriver()) as client, running_worker(app):
        job = await client.enqueue("poll", {"i": 0})
        with trio.fail_after(600):
            result = await client.wait_result(job.id)
        history = await client.history(job.id)
    assert result == {"iterations": 1000, "attempt": 1}
    assert seen == [0] * 1000
    assert [h.name for h in history] == ["read", "write"]


async def test_continue_as_new_on_postgres_keeps_the_job_id_and_ends_each_history(
    pg_url: str, pg_schema: str
) -> None:
    seen: list[int] = []
    app = looping_app(make_app(pg_url, pg_schema), 50, seen)
    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("poll", {"i": 0})
        with trio.fail_after(60):
            result = await client.wait_result(job.id)
        history = await client.history(job.id)
        record = await client.get_job(job.id)
    assert result == {"iterations": 50, "attempt": 1}
    assert seen == [0] * 50
    assert len(history) == 2  # the last iteration's history only
    assert record.payload == {"i": 49}


async def test_the_history_limit_fails_the_workflow_naming_continue_as_new_after_a_warning(
    pg_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("forever", history_limit=10, max_attempts=3)
    async def forever(ctx: trioq.Context, payload: object) -> None:
        n = 0
        while True:
            n = await ctx.step(f"tick {n}", lambda n=n: n + 1)

    caplog.set_level(logging.WARNING, logger="trioq.worker")
    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("forever", {})
        with trio.fail_after(20):
            record = await client.wait_final(job.id)
        history = await client.history(job.id)
    assert record.state == "failed"
    assert record.attempt == 1  # not retried: the same history would reach the same limit
    assert record.error["type"] == "trioq._core.errors.HistoryLimitExceeded"
    assert "continue_as_new" in record.error["message"]
    assert len(history) == 10
    warnings = [
        r.getMessage() for r in caplog.records if "history at 8 of its 10" in r.getMessage()
    ]
    assert len(warnings) == 1


def test_a_history_limit_below_one_is_refused_naming_the_field() -> None:
    app = trioq.App("postgresql://unused")
    with pytest.raises(ValueError, match="history_limit"):

        @app.task("t", history_limit=0)
        async def t(ctx: trioq.Context, payload: object) -> None: ...


# --- patches --------------------------------------------------------------------------------


async def test_a_patch_keeps_in_flight_workflows_on_the_old_path_and_new_ones_on_the_new(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    deployed = {"patch": False}

    @app.task("invoice")
    async def invoice(ctx: trioq.Context, payload: dict[str, int]) -> dict[str, Any]:
        if deployed["patch"] and await ctx.patched("fix-tax"):
            tax = await ctx.step("tax v2", lambda: payload["amount"] // 5)
        else:
            tax = await ctx.step("tax", lambda: payload["amount"] // 10)
        approval = await ctx.wait_for_event(
            f"invoice:{ctx.job.id}", timeout=datetime.timedelta(minutes=5)
        )
        return {"tax": tax, "approval": approval}

    async with app.client(migrate=True) as client:
        async with running_worker(app):
            old = await client.enqueue("invoice", {"amount": 100})
            with trio.fail_after(20):
                await wait_until(lambda: _in_state(client, old.id, "waiting"))
        deployed["patch"] = True  # the deploy: workers restart on the patched code
        async with running_worker(app):
            new = await client.enqueue("invoice", {"amount": 100})
            with trio.fail_after(20):
                await wait_until(lambda: _in_state(client, new.id, "waiting"))
                for job in (old, new):
                    await client.emit_event(f"invoice:{job.id}", "ok")
                old_result = await client.wait_result(old.id)
                new_result = await client.wait_result(new.id)
        old_history = await client.history(old.id)
        new_history = await client.history(new.id)
    assert old_result == {"tax": 10, "approval": "ok"}
    assert new_result == {"tax": 20, "approval": "ok"}
    assert [h.kind for h in old_history] == ["step", "event"]
    assert [(h.kind, h.name) for h in new_history][:2] == [
        ("patch", "fix-tax"),
        ("step", "tax v2"),
    ]


# --- cancellation with cleanup --------------------------------------------------------------


async def test_cancelling_a_workflow_cancels_its_step_and_runs_shielded_cleanup_steps(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    started = trio.Event()
    undone: list[str] = []

    async def charge() -> None:
        started.set()
        await trio.sleep_forever()

    async def refund() -> str:
        await trio.lowlevel.checkpoint()  # a real await, inside the cancelled run
        undone.append("refund")
        return "refunded"

    @app.task("order")
    async def order(ctx: trioq.Context, payload: object) -> None:
        try:
            await ctx.step("charge", charge)
        finally:
            await ctx.step("refund", refund, shielded=True)

    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("order", {})
        with trio.fail_after(20):
            await started.wait()
            await client.cancel(job.id)
            record = await client.wait_final(job.id)
        history = await client.history(job.id)
    assert record.state == "cancelled"
    assert undone == ["refund"]
    assert [(h.name, h.value) for h in history] == [("refund", "refunded")]


async def test_cancelling_a_sleeping_workflow_runs_its_cleanup_before_it_is_final(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    calls: list[str] = []

    @app.task("trial")
    async def trial(ctx: trioq.Context, payload: object) -> None:
        await ctx.step("start", lambda: calls.append("start"))
        try:
            await ctx.sleep("trial period", datetime.timedelta(days=14))
            await ctx.step("bill", lambda: calls.append("bill"))
        finally:
            await ctx.step("close", lambda: calls.append("close"), shielded=True)

    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("trial", {})
        with trio.fail_after(20):
            await wait_until(lambda: _in_state(client, job.id, "sleeping"))
            assert await client.cancel(job.id) == "ready"  # woken to run its cleanup
            record = await client.wait_final(job.id)
        history = await client.history(job.id)
    assert record.state == "cancelled"
    assert calls == ["start", "close"]
    assert [h.name for h in history] == ["start", "trial period", "close"]


async def test_cancel_follows_each_spawns_policy_and_tree_cancels_them_all(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    release = trio.Event()

    @app.task("kid")
    async def kid(ctx: trioq.Context, payload: dict[str, str]) -> str:
        await release.wait()
        return payload["policy"]

    @app.task("family")
    async def family(ctx: trioq.Context, payload: object) -> None:
        for policy in ("cancel", "abandon", "wait"):
            await ctx.spawn("kid", {"policy": policy}, on_parent_cancel=policy)
        await ctx.wait_for_event(f"family:{ctx.job.id}", timeout=datetime.timedelta(hours=1))

    async with app.client(migrate=True) as client, running_worker(app, concurrency=10):
        plain = await client.enqueue("family", {})
        whole = await client.enqueue("family", {})
        with trio.fail_after(30):
            for job in (plain, whole):
                await wait_until(lambda job=job: _children_running(client, job.id, 3))
            assert await client.cancel(plain.id) == "waiting"
            assert await client.cancel(whole.id, tree=True) == "waiting"
            await wait_until(lambda: _in_state(client, whole.id, "cancelled"))
            # A parent is final only after its "wait" and "cancel" children; an "abandon" one
            # (cancelled here by the tree cancel) ends on its own worker's next look at the
            # request, which may come after.
            await wait_until(lambda: _kid_final(client, whole.id, "abandon"))
            await wait_until(lambda: _kid_final(client, plain.id, "cancel"))
            kids = {p: await _kid_states(client, p) for p in (plain.id, whole.id)}
            assert kids[whole.id] == {
                "cancel": "cancelled", "abandon": "cancelled", "wait": "cancelled",
            }  # fmt: skip
            assert kids[plain.id] == {
                "cancel": "cancelled",
                "abandon": "running",
                "wait": "running",
            }
            # Its "cancel" child's end wakes it (ready, then running to unwind); it suspends
            # again for its "wait" child (one made final without that child never reads as
            # waiting, and the wait fails).
            await wait_until(lambda: _in_state(client, plain.id, "waiting"))
            release.set()
            assert (await client.wait_final(plain.id)).state == "cancelled"
            # Its "abandon" child completes on its own, not necessarily before the parent ends.
            await wait_until(lambda: _kid_final(client, plain.id, "abandon"))
            kids[plain.id] = await _kid_states(client, plain.id)
    assert kids[plain.id] == {"cancel": "cancelled", "abandon": "completed", "wait": "completed"}


async def test_a_cancelled_parent_is_final_only_after_its_cancel_policy_children_unwind(
    pg_url: str, pg_schema: str
) -> None:
    """Its first "cancel" child ends at once and wakes it; the second is still in its cleanup:
    the woken parent waits again for that one instead of recording itself cancelled."""
    app = make_app(pg_url, pg_schema)
    cleaning, cleaned = trio.Event(), trio.Event()

    @app.task("kid")
    async def kid(ctx: trioq.Context, payload: dict[str, bool]) -> None:
        try:
            await trio.sleep_forever()
        finally:
            if payload["slow_cleanup"]:
                with trio.CancelScope(shield=True):
                    cleaning.set()
                    await cleaned.wait()

    @app.task("parent")
    async def parent(ctx: trioq.Context, payload: object) -> None:
        for slow in (False, True):
            await ctx.spawn("kid", {"slow_cleanup": slow})  # on_parent_cancel="cancel"
        await ctx.wait_for_event(f"parent:{ctx.job.id}", timeout=datetime.timedelta(hours=1))

    async with app.client(migrate=True) as client, running_worker(app, concurrency=10):
        job = await client.enqueue("parent", {})
        with trio.fail_after(30):
            try:
                await _cancel_while_a_child_cleans_up(client, job.id, cleaning)
            finally:
                cleaned.set()  # a failed assertion must not leave the worker's drain waiting
            assert (await client.wait_final(job.id)).state == "cancelled"
            slow = (await _children(client, job.id))[1]
            assert slow.state == "cancelled"


async def _cancel_while_a_child_cleans_up(
    client: trioq.Client, job_id: int, cleaning: trio.Event
) -> None:
    await wait_until(lambda: _children_running(client, job_id, 2))
    await wait_until(lambda: _in_state(client, job_id, "waiting"))
    assert await client.cancel(job_id) == "waiting"
    await cleaning.wait()  # the slow child unwinds; the quick one ends and wakes the parent
    fast, slow = await _children(client, job_id)
    await wait_until(lambda: _in_state(client, fast.id, "cancelled"))
    # The wake-up's execution has ended: suspended again, or (wrongly) final.
    await wait_until(lambda: _executions_then_settled(client, job_id, 2))
    assert (await client.get_job(job_id)).state == "waiting"
    assert (await client.get_job(slow.id)).state == "running"


async def _executions_then_settled(client: trioq.Client, job_id: int, executions: int) -> bool:
    record = await client.get_job(job_id)
    return record.executions >= executions and record.state in ("waiting", "cancelled")


async def test_cancelling_a_running_parent_waits_for_its_wait_policy_child(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    release = trio.Event()
    spawned = trio.Event()

    @app.task("kid")
    async def kid(ctx: trioq.Context, payload: object) -> str:
        await release.wait()
        return "done"

    @app.task("parent")
    async def parent(ctx: trioq.Context, payload: object) -> None:
        await ctx.spawn("kid", {}, on_parent_cancel="wait")
        spawned.set()
        await trio.sleep_forever()  # still running when cancelled

    async with app.client(migrate=True) as client, running_worker(app, concurrency=4):
        job = await client.enqueue("parent", {})
        with trio.fail_after(30):
            await spawned.wait()
            await wait_until(lambda: _children_running(client, job.id, 1))
            await client.cancel(job.id)
            await wait_until(lambda: _in_state(client, job.id, "waiting"))
            release.set()
            record = await client.wait_final(job.id)
            [child] = await _children(client, job.id)
    assert record.state == "cancelled"
    assert child.state == "completed"
    assert child.finished_at <= record.finished_at


def _q(schema: str, template: str) -> sql.Composed:
    return sql.SQL(template).format(s=sql.Identifier(schema))


async def _in_state(client: trioq.Client, job_id: int, state: str) -> bool:
    return (await client.get_job(job_id)).state == state


async def _children(client: trioq.Client, parent_id: int) -> list[Any]:
    spawned = [h.value["child_id"] for h in await client.history(parent_id) if h.kind == "spawn"]
    return [await client.get_job(i) for i in spawned]


async def _children_running(client: trioq.Client, parent_id: int, n: int) -> bool:
    kids = await _children(client, parent_id)
    return len(kids) == n and all(k.state == "running" for k in kids)


async def _kid_states(client: trioq.Client, parent_id: int) -> dict[str, str]:
    return {k.payload["policy"]: k.state for k in await _children(client, parent_id)}


async def _kid_final(client: trioq.Client, parent_id: int, policy: str) -> bool:
    return (await _kid_states(client, parent_id))[policy] not in ("ready", "running")


def test_trioq_job_shows_patch_markers_and_cancel_tree_from_the_command_line(
    pg_url: str, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from trioq import cli
    from trioq.producer import SyncProducer

    base = ["--database-url", pg_url, "--schema", pg_schema]
    assert cli.main(["migrate", *base]) == 0
    with SyncProducer(pg_url, schema=pg_schema) as producer:
        job = producer.enqueue("invoice", {})
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            _q(
                pg_schema,
                "INSERT INTO {s}.checkpoints (job_id, position, kind, name, value, created_at) "
                "VALUES (%s, 0, 'patch', 'fix-tax', 'null', now())",
            ),
            (job.id,),
        )
    capsys.readouterr()
    assert cli.main(["job", *base, str(job.id)]) == 0
    assert "patches: fix-tax (position 0)" in capsys.readouterr().out
    assert cli.main(["job", *base, str(job.id), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["patches"] == ["fix-tax"]
    assert cli.main(["cancel", *base, str(job.id), "--tree", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"jobs": [{"id": job.id, "state": "cancelled"}]}


async def test_cancel_tree_from_the_command_line_says_what_became_of_the_descendants(
    pg_url: str, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`trioq cancel 78 --tree` printed `78: waiting` / `1 cancelled` while it also cancelled
    three running children: now a line under the job counts its descendants by outcome."""
    from trioq import cli

    app = make_app(pg_url, pg_schema)
    spawned = trio.Event()

    @app.task("kid")
    async def kid(ctx: trioq.Context, payload: dict[str, bool]) -> str:
        if payload["block"]:
            await trio.sleep_forever()
        return "done"

    @app.task("parent")
    async def parent(ctx: trioq.Context, payload: object) -> None:
        done = await ctx.spawn("kid", {"block": False}, on_parent_cancel="abandon")
        await ctx.wait_result(done)
        for _ in range(3):
            await ctx.spawn("kid", {"block": True}, on_parent_cancel="abandon")
        spawned.set()
        await trio.sleep_forever()

    base = ["--database-url", pg_url, "--schema", pg_schema]
    async with app.client(migrate=True) as client, running_worker(app, concurrency=6):
        job = await client.enqueue("parent", {})
        with trio.fail_after(30):
            await spawned.wait()
            await wait_until(lambda: _running_kids(client, job.id, 3))
            kids = [member.id for member in await client.descendants(job.id)]
            capsys.readouterr()
            argv = ["cancel", *base, str(job.id), "--tree"]
            assert await trio.to_thread.run_sync(cli.main, argv) == 0
            out = capsys.readouterr().out.splitlines()
            argv = ["cancel", *base, str(job.id), "--tree", "--json"]
            assert await trio.to_thread.run_sync(cli.main, argv) == 0
            again = json.loads(capsys.readouterr().out)
    assert out[0] == f"{job.id}: running"  # its handler is being cancelled
    # Each running kid is either still running with its cancel requested or already cancelled
    # by its worker: the line counts whichever it was when read, e.g.
    # "  4 descendant(s): 3 running, cancel requested (3, 4, 5); 1 already finished".
    prefix = "  4 descendant(s): "
    assert out[1].startswith(prefix)
    *parts, finished = out[1][len(prefix) :].split("; ")
    assert finished == "1 already finished"
    counted = 0
    for part in parts:
        count, outcome = part.split(" (")[0].split(" ", 1)
        assert outcome in ("running, cancel requested", "cancelled"), part
        counted += int(count)
    assert counted == 3
    for running_kid in kids[1:]:
        assert str(running_kid) in out[1]
    assert out[2] == "1 cancelled"
    [entry] = again["jobs"]
    assert [d["id"] for d in entry["descendants"]] == kids
    assert entry["descendants"][0] == {"id": kids[0], "before": "completed", "state": "completed"}


async def _running_kids(client: trioq.Client, parent_id: int, n: int) -> bool:
    states = [member.state for member in await client.descendants(parent_id)]
    return states.count("running") == n
