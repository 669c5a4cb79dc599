"""The example alerts fire on the two commonest failures: every worker stopped with a backlog
(nothing exports metrics then, so only an `absent()` rule can fire) and a worker killed with
jobs (counted by the leader that recovers them, since the dead worker counts nothing).

The rules live in docs/prometheus-alerts.yaml and docs/operations.md shows them as they
are; `promtool` (Debian's `prometheus` package: .ci/run installs it) checks them and runs the
unit tests of tests/prometheus/alerts_test.yaml."""

from __future__ import annotations

import datetime
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import trio

import trioq
from tests.support import force_running, in_thread, make_app, running_worker, wait_until
from tests.test_metrics import samples_of

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "docs" / "prometheus-alerts.yaml"
UNIT_TESTS = ROOT / "tests" / "prometheus" / "alerts_test.yaml"


def promtool(*args: str, cwd: Path = ROOT) -> str:
    found = shutil.which("promtool")
    if found is None:
        raise RuntimeError("promtool is not installed: apt-get install prometheus (.ci/run does)")
    done = subprocess.run([found, *args], cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_docs_show_the_example_alerts_as_the_rules_file_holds_them() -> None:
    rules = RULES.read_text()
    body = rules[rules.index("groups:") :]
    assert body in (ROOT / "docs" / "operations.md").read_text()


@pytest.mark.slow
def test_promtool_accepts_the_example_alerts() -> None:
    assert "SUCCESS" in promtool("check", "rules", str(RULES))


@pytest.mark.slow
def test_each_example_alert_fires_on_the_failure_it_names() -> None:
    assert "SUCCESS" in promtool("test", "rules", UNIT_TESTS.name, cwd=UNIT_TESTS.parent)


async def test_the_leader_counts_the_jobs_it_recovers_from_expired_leases(
    pg_url: str, pg_schema: str
) -> None:
    """The state a kill -9 leaves, built in SQL: a running job whose lease has expired and
    whose worker is gone. The worker that becomes leader recovers it and counts it."""
    app = make_app(pg_url, pg_schema)
    ran = trio.Event()

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        ran.set()

    async with app.client(migrate=True) as client:
        job = await client.enqueue("noop", {})
        await in_thread(
            force_running,
            pg_url,
            pg_schema,
            [job.id],
            expires_in=datetime.timedelta(minutes=-1),
            lease_token=uuid.uuid4(),
            started_ago=datetime.timedelta(minutes=2),
        )
        async with running_worker(app) as worker:
            with trio.fail_after(30):
                await ran.wait()
                await wait_until(lambda: recovered(worker))
            samples = await samples_of(worker)
    assert samples[("trioq_recovered_jobs_total", ())] == 1
    assert samples[("trioq_lost_leases_total", ())] == 0


async def recovered(worker: trioq.Worker) -> bool:
    return (await samples_of(worker))[("trioq_recovered_jobs_total", ())] >= 1
