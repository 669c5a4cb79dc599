"""Flow control inside one worker: each queue's own slots (`--queue default=25 --queue mail=2`),
and the bad values that are refused before anything runs (docs/flow-control.md)."""

from __future__ import annotations

import collections

import pytest
import trio
import trio.testing

import trioq
from tests.support import running_worker
from trioq import cli
from trioq._memory import MemoryDriver
from trioq._runtime.services.health import render_metrics
from trioq._runtime.services.worker import WorkerConfig
from trioq.cli.worker import parse_queues


async def test_a_busy_default_queue_never_takes_the_mail_queues_slots(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = trioq.App(schema="virtual")
    release = trio.Event()
    running: collections.Counter[str] = collections.Counter()
    peak: collections.Counter[str] = collections.Counter()
    mail_done = 0
    all_mail_done = trio.Event()
    default_full = trio.Event()

    @app.task("work", queue="default")
    async def work(ctx: trioq.Context, payload: object) -> None:
        running["default"] += 1
        peak["default"] = max(peak["default"], running["default"])
        if running["default"] == 3:
            default_full.set()
        await release.wait()
        running["default"] -= 1

    @app.task("mail", queue="mail")
    async def mail(ctx: trioq.Context, payload: object) -> None:
        nonlocal mail_done
        running["mail"] += 1
        peak["mail"] = max(peak["mail"], running["mail"])
        await trio.sleep(1)
        running["mail"] -= 1
        mail_done += 1
        if mail_done == 6:
            all_mail_done.set()

    async with (
        app.client(driver=MemoryDriver()) as client,
        running_worker(app, {"default": 3, "mail": 2}, concurrency=50) as worker,
    ):
        await client.enqueue_many("work", [{}] * 20)
        with trio.fail_after(30):
            await default_full.wait()
        await client.enqueue_many("mail", [{}] * 6)
        with trio.fail_after(60):
            await all_mail_done.wait()  # while every default slot is still taken
        assert running["default"] == 3
        release.set()
        assert worker.admission.concurrency == {"default": 3, "mail": 2}
        assert {loop.queue: loop.concurrency for loop in worker.statistics().loops} == {
            "default": 3,
            "mail": 2,
        }
        metrics = (await render_metrics(worker)).decode()
        assert 'trioq_queue_concurrency{queue="default"} 3.0' in metrics
        assert 'trioq_queue_concurrency{queue="mail"} 2.0' in metrics
        [info] = await client.driver.worker_list()
        assert (info.queues, info.queue_concurrency, info.concurrency) == (
            ("default", "mail"),
            (3, 2),
            5,
        )
    assert peak == {"default": 3, "mail": 2}


async def test_status_and_explain_name_each_queues_slots(pg_url: str, pg_schema: str) -> None:
    app = trioq.App(database_url=pg_url, schema=pg_schema)

    @app.task("mail", queue="mail")
    async def mail(ctx: trioq.Context, payload: object) -> None:
        return None

    async with app.client(migrate=True) as client:
        await client.driver.queue_pause("mail")
        job = await client.enqueue("mail", {})
        async with running_worker(app, {"default": 25, "mail": 2}):
            [info] = await client.driver.worker_list()
            assert info.queue_concurrency == (25, 2)
            assert info.slots("mail") == 2
            explanation = await client.explain(job.id)
            gates = {gate.name: gate.detail for gate in explanation.gates}
            assert gates["workers"] == "1 live worker(s) serve queue 'mail' with 2 slot(s)"
            from trioq.cli.ops import queues_cell

            assert queues_cell(info) == "default=25,mail=2"


def test_plain_queue_names_take_the_concurrency() -> None:
    assert parse_queues(None, 7) == {"default": 7}
    assert parse_queues(["default", "mail=2"], 7) == {"default": 7, "mail": 2}
    config = WorkerConfig(queues=("default", "mail"), concurrency=7, queue_concurrency={"mail": 2})
    assert (config.slots("default"), config.slots("mail"), config.total_slots) == (7, 2, 9)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--queue", "mail=x"], "--queue mail=x: expected --queue NAME or --queue NAME=SLOTS"),
        (["--queue", "mail=0"], "--queue mail=0: expected --queue NAME or --queue NAME=SLOTS"),
        (["--queue", "mail=-3"], "--queue mail=-3: expected --queue NAME or --queue NAME=SLOTS"),
        (["--queue", "mail=²"], "--queue mail=²: expected --queue NAME or --queue NAME=SLOTS"),
        (["--queue", "a", "--queue", "a=2"], "queue 'a' is given twice"),
        (["--concurrency", "0"], "--concurrency 0: must be a whole number from 1 to 10000"),
        (["--processes", "0"], "--processes 0: must be a whole number from 1 to 256"),
        (["--processes", "-2"], "--processes -2: must be a whole number from 1 to 256"),
    ],
)
def test_bad_slot_values_end_in_one_line_before_anything_runs(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    # The app path does not exist: the values are refused before it is even imported.
    code = cli.main(["worker", "no_such_module:app", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert expected in err[0]


@pytest.mark.parametrize(
    "slots", [{"mail": 0}, {"mail": -1}, {"mail": 10_001}, {"mail": True}, {"mail": 2.5}]
)
def test_bad_slots_in_code_are_refused_with_the_accepted_form(slots: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="queue 'mail': concurrency must be a whole number"):
        WorkerConfig(queues=("mail",), queue_concurrency=slots)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not among the queues"):
        WorkerConfig(queues=("default",), queue_concurrency={"mail": 2})
