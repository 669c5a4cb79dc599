"""The dashboard in a real browser (Debian's chromium, driven by playwright) against a real
worker and database. One server pair (admin, read-only) and one browser serve the module; each
test opens its own browser context (its own cookies). The screenshots in docs/images/ come from
these tests."""

from __future__ import annotations

import datetime
import json
import pathlib
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.dashboard_support import Harness

# Slow tier: a headless browser per test; `pytest -m "not slow"` leaves the module out.
pytestmark = pytest.mark.slow

IMAGES = pathlib.Path(__file__).parent.parent / "docs" / "images"
WAIT_MS = 15_000


@pytest.fixture(scope="module")
def live(pg_url: str) -> Iterator[Harness]:
    harness = Harness(pg_url).start()
    try:
        yield harness
    finally:
        harness.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("the dashboard's browser tests need Debian's chromium (.ci/run installs it)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert errors == [], errors  # no script error on any page (a CSP refusal would show here)


def _shoot(page: Page, name: str) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMAGES / f"dashboard-{name}.png"), full_page=True)


def _client(live: Harness) -> Any:
    assert live.client is not None
    return live.client


def test_overview_shows_a_queues_counts_changing_while_jobs_run(live: Harness, page: Page) -> None:
    client = _client(live)
    page.goto(live.read_only_url + "/")
    jobs = live.call(client.enqueue_many, "gated", [{"n": n} for n in range(3)])
    row = page.locator('tr[data-queue="live"]')
    expect(row.locator('[data-count="running"]')).to_have_text("3", timeout=WAIT_MS)
    expect(page.locator("#workers tbody tr")).to_have_count(1)
    live.run_sync(live.gate.set)
    for job in jobs:
        live.call(client.wait_result, job.id, timeout=20)
    expect(row.locator('[data-count="running"]')).to_have_text("0", timeout=WAIT_MS)
    expect(row.locator('[data-count="completed_hour"]')).to_have_text("3", timeout=WAIT_MS)


def test_filtering_the_job_list_by_task_state_and_payload_text(live: Harness, page: Page) -> None:
    client = _client(live)
    alpha = live.call(client.enqueue_many, "echo", [{"tag": "alpha-7f3"} for _ in range(3)])
    beta = live.call(client.enqueue_many, "echo", [{"tag": "beta-7f3"} for _ in range(2)])
    for job in alpha + beta:
        live.call(client.wait_result, job.id, timeout=20)
    page.goto(live.read_only_url + "/jobs")
    page.fill('#filters input[name="text"]', "beta-7f3")
    page.select_option('#filters select[name="state"]', "completed")
    page.fill('#filters input[name="task"]', "echo")
    page.click('#filters button[type="submit"]')
    rows = page.locator("#jobs tbody tr[data-job]")
    expect(rows).to_have_count(2)
    assert sorted(int(r.get_attribute("data-job") or 0) for r in rows.all()) == sorted(
        job.id for job in beta
    )
    page.fill('#filters input[name="text"]', "")
    page.click('#filters button[type="submit"]')
    expect(page.locator(f'#jobs tbody tr[data-job="{alpha[0].id}"]')).to_have_count(1)
    _shoot(page, "jobs")
    page.select_option('#filters select[name="state"]', "failed")
    page.fill('#filters input[name="text"]', "alpha-7f3")
    page.click('#filters button[type="submit"]')
    expect(rows).to_have_count(0)


def test_a_workflows_timeline_shows_its_steps_a_sleep_and_a_wait(live: Harness, page: Page) -> None:
    client = _client(live)
    job = live.call(client.enqueue, "approval", {"key": "approval:42"})
    # The first execution ends in the sleep; the second, after it, waits for the event.
    live.call(live.wait_executions, job.id, 2)
    page.goto(live.read_only_url + "/workflows")
    waiting = page.locator("#workflows tbody tr", has_text=str(job.id))
    expect(waiting).to_contain_text("waiting")
    expect(waiting).to_contain_text("approval:42")
    _shoot(page, "workflows")
    live.call(client.emit_event, "approval:42", {"approved": True})
    live.call(client.wait_result, job.id, timeout=20)
    page.goto(f"{live.read_only_url}/jobs/{job.id}")
    timeline = page.locator("#timeline li")
    assert [item.get_attribute("data-kind") for item in timeline.all()] == [
        "step",
        "sleep",
        "event",
        "step",
    ]
    expect(timeline.nth(0)).to_contain_text("ask approver")
    expect(timeline.nth(1)).to_contain_text("wakes at")
    expect(timeline.nth(2)).to_contain_text("approval:42")
    expect(timeline.nth(2)).to_contain_text("received")
    expect(page.locator("#job-state")).to_have_text("completed")
    _shoot(page, "job-timeline")


def test_an_admin_retry_of_a_failed_job_runs_it_again(live: Harness, page: Page) -> None:
    client = _client(live)
    job = live.call(client.enqueue, "flaky", {"message": "upstream said no"})
    assert live.call(client.wait_final, job.id, timeout=20).state == "failed"
    page.goto(f"{live.admin_url}/jobs/{job.id}")
    expect(page.locator(".attempt .error-message")).to_have_text("upstream said no")
    # The form's POST answers 303 back to the job page: wait for that navigation, or a
    # reload issued while it is in flight finds no page attached (it failed CI once).
    with page.expect_navigation(url=f"**/jobs/{job.id}"):
        page.click("#retry")
    assert live.call(client.wait_result, job.id, timeout=20) == "second attempt"
    page.goto(f"{live.admin_url}/jobs/{job.id}")
    expect(page.locator("#job-state")).to_have_text("completed")
    page.goto(live.admin_url + "/audit")
    first = page.locator("#audit tbody tr").first
    expect(first).to_contain_text("retry")
    expect(first).to_contain_text(f"job {job.id}")
    expect(first).to_contain_text("127.0.0.1")
    expect(first).to_contain_text("state ready")
    _shoot(page, "audit")


def _post(url: str, data: bytes, cookie: str = "") -> int:
    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("content-type", "application/x-www-form-urlencoded")
    if cookie:
        request.add_header("cookie", cookie)
    try:
        with urllib.request.urlopen(request) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        with error:
            return int(error.code)


def test_a_read_only_dashboard_has_no_action_buttons_and_refuses_a_forged_post(
    live: Harness, page: Page
) -> None:
    client = _client(live)
    job = live.call(client.enqueue, "flaky", {"message": "stays failed"})
    assert live.call(client.wait_final, job.id, timeout=20).state == "failed"
    for path in ("/", "/jobs", f"/jobs/{job.id}", "/workflows", "/schedules"):
        page.goto(live.read_only_url + path)
        expect(page.locator("form[method=post]")).to_have_count(0)
        expect(page.locator("button")).to_have_count(0 if path != "/jobs" else 1)  # Filter
    _shoot(page, "schedules")
    page.goto(f"{live.read_only_url}/jobs/{job.id}")
    expect(page.locator(".mode")).to_have_text("read-only")
    # A form copied from an admin page, CSRF pair included, is still refused here.
    admin = page.context.new_page()
    admin.goto(f"{live.admin_url}/jobs/{job.id}")
    token = admin.locator('input[name="csrf"]').first.get_attribute("value")
    cookie = next(c for c in page.context.cookies(live.admin_url) if c["name"] == "trioq_csrf")
    form = f"job_id={job.id}&csrf={token}".encode()
    pair = f"trioq_csrf={cookie['value']}"
    assert _post(live.read_only_url + "/actions/retry", form, pair) == 403
    # On the admin dashboard, a POST without the CSRF pair (a forged cross-site form) is refused.
    assert _post(live.admin_url + "/actions/retry", f"job_id={job.id}".encode()) == 403
    assert _post(live.admin_url + "/actions/retry", form, "trioq_csrf=forged") == 403
    assert live.call(client.get_job, job.id).state == "failed"
    page.goto(live.admin_url + "/api/audit")
    assert f"job {job.id}" not in page.content()  # nothing refused reached the audit table


HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


def _nested(depth: int) -> Any:
    value: Any = HOSTILE
    for _ in range(depth):
        value = {"deeper": value}
    return value


def test_a_hostile_payload_and_error_render_as_text(live: Harness, page: Page) -> None:
    client = _client(live)
    payload = {"html": HOSTILE, "long": "x" * 200_000, "deep": _nested(60)}
    shown = live.call(client.enqueue, "echo", payload)
    live.call(client.wait_result, shown.id, timeout=20)
    failing = live.call(client.enqueue, "flaky", {"message": HOSTILE})
    live.call(client.wait_final, failing.id, timeout=20)
    for url in (
        f"{live.read_only_url}/jobs/{shown.id}",
        f"{live.admin_url}/jobs/{failing.id}",
        f"{live.read_only_url}/jobs",
    ):
        page.goto(url)
        assert page.evaluate("window.__pwned") is None
        expect(page.locator("img[src=x]")).to_have_count(0)
    page.goto(f"{live.read_only_url}/jobs/{shown.id}")
    expect(page.locator("#payload")).to_contain_text("<script>window.__pwned = 1</script>")
    expect(page.locator("#payload details summary")).to_contain_text("characters")
    page.goto(f"{live.admin_url}/jobs/{failing.id}")
    expect(page.locator(".attempt .error-message")).to_have_text(HOSTILE)
    assert page.evaluate("window.__pwned") is None


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url) as response:
        assert response.headers["content-type"].startswith("application/json")
        return json.loads(response.read())


def test_every_page_answers_as_json_too(live: Harness, page: Page) -> None:
    client = _client(live)
    job = live.call(client.enqueue, "echo", {"json": "twin"})
    live.call(client.wait_result, job.id, timeout=20)
    overview = _get_json(live.read_only_url + "/api/overview")
    default = next(q for q in overview["queues"] if q["queue"] == "default")
    assert sum(default["completed_per_minute"]) >= 1 and len(default["completed_per_minute"]) == 60
    assert overview["workers"][0]["queues"] == ["default", "live"]
    jobs = _get_json(live.read_only_url + "/api/jobs?task=echo")["jobs"]
    assert jobs[0]["id"] == job.id
    assert jobs[0]["max_attempts"] == 5  # the row's, or the task's declaration
    one = _get_json(f"{live.read_only_url}/api/jobs/{job.id}")
    assert one["job"]["state"] == "completed" and one["explain"]["state"] == "completed"
    schedules = _get_json(live.read_only_url + "/api/schedules")["schedules"]
    assert [s["name"] for s in schedules] == ["nightly-digest"]
    assert "workflows" in _get_json(live.read_only_url + "/api/workflows")
    for path, status, message in [
        ("/api/jobs/999999999", 404, "no job 999999999"),
        ("/api/jobs?state=bogus", 400, "state: 'bogus' is not a job state"),
        ("/api/jobs?after=yesterday", 400, "after: 'yesterday' is not a date and time"),
    ]:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(live.read_only_url + path)
        with refused.value as error:
            assert error.code == status
            assert json.loads(error.read())["error"].startswith(message)
    page.goto(live.admin_url + "/")
    expect(page.locator('tr[data-queue="default"] [data-count="completed_hour"]')).not_to_have_text(
        "0"
    )
    _shoot(page, "overview")


def test_an_admin_pauses_and_resumes_a_queue_each_action_audited(live: Harness, page: Page) -> None:
    client = _client(live)
    page.goto(live.admin_url + "/")
    row = page.locator('tr[data-queue="live"]')
    row.locator('form[data-action="pause"] button').click()
    expect(row.locator(".badge")).to_have_text("paused")
    assert [p.queue for p in live.call(client.paused_queues)] == ["live"]
    row.locator('form[data-action="resume"] button').click()
    expect(row.locator(".badge")).to_have_text("active")
    assert live.call(client.paused_queues) == []
    audit = _get_json(live.admin_url + "/api/audit")["audit"]
    assert [(a["action"], a["target"], a["outcome"]) for a in audit[:2]] == [
        ("resume", "queue live", "resumed"),
        ("pause", "queue live", "paused"),
    ]


def test_an_admin_cancels_emits_and_purges_through_the_forms(live: Harness, page: Page) -> None:
    client = _client(live)
    later = live.call(
        client.enqueue, "echo", {"later": True}, delay=3600, deadline=datetime.timedelta(hours=2)
    )
    page.goto(f"{live.admin_url}/jobs/{later.id}")
    expect(page.locator("#deadline")).to_contain_text("(set at enqueue)")
    page.click("#cancel")
    expect(page.locator("#job-state")).to_have_text("cancelled")
    page.goto(live.admin_url + "/")
    emit = page.locator('form[data-action="emit"]')
    emit.locator('input[name="key"]').fill("dashboard:emitted")
    emit.locator('input[name="payload"]').fill('{"from": "the dashboard"}')
    emit.locator("button").click()
    purge = page.locator('form[data-action="purge"]')
    purge.locator('input[value="cancelled"]').check()
    purge.locator('input[name="older_than"]').fill("0")
    purge.locator("button").click()  # not confirmed: refused, nothing deleted
    expect(page.locator("body")).to_contain_text("confirm: type purge to confirm")
    assert live.call(client.get_job, later.id).state == "cancelled"
    page.goto(live.admin_url + "/")
    purge.locator('input[value="cancelled"]').check()
    purge.locator('input[name="older_than"]').fill("0")
    purge.locator('input[name="confirm"]').fill("purge")
    purge.locator("button").click()
    audit = _get_json(live.admin_url + "/api/audit")["audit"]
    assert [(a["action"], a["target"]) for a in audit[:3]] == [
        ("purge", "jobs"),
        ("emit", "event dashboard:emitted"),
        ("cancel", f"job {later.id}"),
    ]
    assert audit[0]["outcome"].startswith("deleted ") and audit[1]["outcome"] == "emitted"
    assert audit[2]["outcome"] == "state cancelled"
    assert live.call(client.jobs, states=["cancelled"]) == []
