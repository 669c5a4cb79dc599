"""The dashboard without a browser: authentication, CSRF, redirects, the timeline and chart
maths, and the command line's refusals. The pages themselves: tests/test_dashboard_browser.py."""

from __future__ import annotations

import base64
import datetime
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest
import trio

import trioq
from tests.support import make_app
from trioq._core.errors import ConfigurationError
from trioq._seam.driver import Claim
from trioq.cli import main
from trioq.dashboard import actions, views
from trioq.dashboard.security import (
    PASSWORD_ENV,
    TOKEN_ENV,
    Auth,
    AuthMiddleware,
    Csrf,
    HostGuard,
    is_loopback,
    served_names,
)
from trioq.dashboard.store import JobSearch, Store

SECRET = "correct horse battery staple"
T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)


def test_binding_beyond_loopback_without_auth_is_refused_naming_the_option() -> None:
    with pytest.raises(ConfigurationError, match=r"--auth: required when binding '0\.0\.0\.0'"):
        Auth.from_environment(None, "0.0.0.0")
    for host in ("127.0.0.1", "::1", "localhost"):
        assert Auth.from_environment(None, host).mode is None


def test_auth_secret_comes_from_the_environment_and_must_be_long_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "short")
    with pytest.raises(ConfigurationError, match=f"set \\${TOKEN_ENV}"):
        Auth.from_environment("token", "0.0.0.0")
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    assert Auth.from_environment("basic", "0.0.0.0").secret == SECRET


def test_the_command_line_refuses_a_public_bind_without_auth_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["dashboard", "--host", "0.0.0.0", "--database-url", "postgresql:///nowhere"])
    assert code == 2
    assert "--auth: required when binding '0.0.0.0'" in capsys.readouterr().err


def test_loopback_addresses_are_recognised() -> None:
    assert is_loopback("127.0.0.5") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    assert not is_loopback("example.org")


async def _call(
    middleware: AuthMiddleware, headers: list[tuple[bytes, bytes]], query: bytes = b""
) -> dict[str, Any]:
    seen: dict[str, Any] = {"status": None, "headers": {}}

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        seen["user"] = scope["state"]["user"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            seen["status"] = message["status"]
            seen["headers"] = dict(message["headers"])

    middleware.app = inner
    scope = {"type": "http", "path": "/jobs", "headers": headers, "query_string": query}
    await middleware(scope, receive, send)
    return seen


async def test_basic_auth_refuses_wrong_credentials_and_names_the_user() -> None:
    middleware = AuthMiddleware(None, Auth("basic", "ops", SECRET))  # type: ignore[arg-type]
    refused = await _call(middleware, [])
    assert refused["status"] == 401 and b"www-authenticate" in refused["headers"]
    wrong = base64.b64encode(b"ops:guess").decode()
    assert (await _call(middleware, [(b"authorization", f"Basic {wrong}".encode())]))[
        "status"
    ] == 401
    right = base64.b64encode(f"ops:{SECRET}".encode()).decode()
    allowed = await _call(middleware, [(b"authorization", f"Basic {right}".encode())])
    assert allowed["status"] == 200 and allowed["user"] == "ops"
    assert b"default-src 'none'" in allowed["headers"][b"content-security-policy"]


async def test_a_token_in_the_link_becomes_an_http_only_cookie() -> None:
    middleware = AuthMiddleware(None, Auth("token", secret=SECRET))  # type: ignore[arg-type]
    assert (await _call(middleware, [(b"authorization", b"Bearer nope")]))["status"] == 401
    bearer = await _call(middleware, [(b"authorization", f"Bearer {SECRET}".encode())])
    assert bearer["status"] == 200
    query = f"token={SECRET.replace(' ', '+')}".encode()
    redirected = await _call(middleware, [], query)
    assert redirected["status"] == 303
    cookie = redirected["headers"][b"set-cookie"].decode()
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    by_cookie = await _call(middleware, [(b"cookie", cookie.split(";")[0].encode())])
    assert by_cookie["status"] == 200


async def _guarded(names: frozenset[str] | None, method: str, headers: dict[str, str]) -> int:
    """The status HostGuard answers for one request (200: it passed the request on)."""
    statuses: list[int] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    raw = [(name.encode(), value.encode()) for name, value in headers.items()]
    scope = {"type": "http", "method": method, "path": "/", "headers": raw}
    await HostGuard(inner, names)(scope, None, send)  # type: ignore[arg-type]
    return statuses[0]


async def test_a_request_for_another_host_name_is_refused_dns_rebinding() -> None:
    """A page whose name an attacker re-binds to 127.0.0.1 reaches a loopback dashboard with
    its own name as Host: refused. The loopback names, the bound address and --allowed-host
    names are served; '*' turns the check off."""
    names = served_names("127.0.0.1", ())
    for host in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080", "LOCALHOST"):
        assert await _guarded(names, "GET", {"host": host}) == 200, host
    for host in ("attacker.example", "attacker.example:8080", "127.0.0.1.nip.io", ""):
        assert await _guarded(names, "GET", {"host": host}) == 400, host
    proxied = served_names("0.0.0.0", ("dash.example.com",))
    assert await _guarded(proxied, "GET", {"host": "dash.example.com"}) == 200
    assert await _guarded(proxied, "GET", {"host": "0.0.0.0"}) == 400  # a wildcard is no name
    assert await _guarded(served_names("0.0.0.0", ("*",)), "GET", {"host": "any"}) == 200


async def test_a_post_from_another_sites_page_is_refused() -> None:
    names = served_names("127.0.0.1", ())
    host = {"host": "127.0.0.1:8080"}
    assert await _guarded(names, "POST", {**host, "origin": "http://attacker.example"}) == 403
    # The dashboard's own forms send `Origin: null` (its no-referrer policy): left to the CSRF
    # token, as a POST without an Origin is.
    assert await _guarded(names, "POST", {**host, "origin": "null"}) == 200
    assert await _guarded(names, "POST", {**host, "origin": "http://127.0.0.1:8080"}) == 200
    assert await _guarded(names, "POST", host) == 200  # not a browser: the CSRF check decides
    assert await _guarded(names, "GET", {**host, "origin": "http://attacker.example"}) == 200


def test_a_csrf_token_is_valid_only_for_its_own_cookie_and_key() -> None:
    csrf = Csrf()
    nonce = csrf.new_nonce()
    assert csrf.valid(nonce, csrf.token(nonce))
    assert not csrf.valid(csrf.new_nonce(), csrf.token(nonce))
    assert not csrf.valid(nonce, Csrf().token(nonce))  # another server's key
    assert not csrf.valid(None, csrf.token(nonce)) and not csrf.valid(nonce, None)


def test_an_action_redirects_only_within_the_dashboard() -> None:
    assert actions._back("/jobs/5") == "/jobs/5"
    for hostile in ("//evil.example/", "https://evil.example/", "/\\evil.example", None, ""):
        assert actions._back(hostile) == "/"


def test_purge_needs_finished_states_a_duration_and_the_typed_confirmation() -> None:
    with pytest.raises(ValueError, match="state: choose among"):
        actions._purge(None, {"state": ["ready"], "older_than": ["7d"]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="older_than"):
        actions._purge(None, {"state": ["failed"], "older_than": ["soon"]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="confirm: type purge"):
        actions._purge(None, {"state": ["failed"], "older_than": ["7d"]})  # type: ignore[arg-type]
    _, detail, _ = actions._purge(
        None,  # type: ignore[arg-type]
        {"state": ["failed"], "older_than": ["2h"], "confirm": ["purge"]},
    )
    assert detail == {"states": ["failed"], "older_than_seconds": 7200.0}


def test_a_value_nested_past_pythons_recursion_limit_is_shown_as_stored() -> None:
    deep = "[" * 5000 + "]" * 5000
    shown = views.pretty_json(deep)
    assert shown["text"] == deep and shown["collapsed"]
    cut = views.pretty_json('{"a": "xx', full_length=90_000)
    assert cut["truncated"] and cut["length"] == 90_000
    assert views.pretty_json('{"a": 1}')["text"] == '{\n  "a": 1\n}'


def _point(position: int, kind: str, name: str, value: Any, at: datetime.datetime) -> Any:
    return {"position": position, "kind": kind, "name": name, "value": json.dumps(value),
            "created_at": at, "emitted_at": None}  # fmt: skip


def test_a_step_after_a_sleep_is_timed_from_the_wake_up_not_from_the_sleep() -> None:
    wake = T0 + datetime.timedelta(minutes=10)
    history = [
        _point(0, "step", "fetch", 1, T0 + datetime.timedelta(seconds=2)),
        _point(
            1, "sleep", "nap", {"wake_at": wake.isoformat()}, T0 + datetime.timedelta(seconds=3)
        ),
        _point(2, "step", "send", 2, wake + datetime.timedelta(seconds=4)),
        _point(3, "spawn", "receipt", {"child_id": 77}, wake + datetime.timedelta(seconds=5)),
    ]
    entries = views.timeline({"created_at": T0}, history, [{"id": 77, "state": "completed"}])
    assert [e["duration_seconds"] for e in entries] == [2.0, 597.0, 4.0, None]
    assert entries[1]["detail"].startswith("wakes at ")
    assert entries[3]["link"] == 77 and entries[3]["detail"] == "child 77: completed"
    views.timeline_bars(entries)
    assert [e["bar_percent"] for e in entries] == [1, 100, 1, 0]


def test_the_chart_stacks_failed_on_completed_and_scales_to_the_busiest_minute() -> None:
    completed = [0] * 58 + [10, 30]
    failed = [0] * 58 + [10, 0]
    chart = views.chart_bars(completed, failed)
    last, before = chart["bars"][-1], chart["bars"][-2]
    assert last["done_height"] == pytest.approx(views.CHART_HEIGHT - 2)
    total = before["done_height"] + before["bad_height"]
    assert total == pytest.approx(last["done_height"] * 2 / 3, abs=0.02)
    assert before["bad_y"] + before["bad_height"] == pytest.approx(before["done_y"])
    assert (chart["completed"], chart["failed"], chart["peak"]) == (40, 10, 30)


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return int(error.code), error.read().decode()


async def _schema_with_a_schedule(pg_url: str, pg_schema: str) -> None:
    async with trioq.App(pg_url, schema=pg_schema).client(migrate=True) as client:
        await client.schedule("hourly", trioq.TaskDeclaration("report", queue="reports"),
                              cron="0 * * * *")  # fmt: skip


def test_the_command_serves_its_pages_read_only_behind_token_auth(
    pg_url: str, pg_schema: str
) -> None:
    trio.run(_schema_with_a_schedule, pg_url, pg_schema)
    env = {**os.environ, TOKEN_ENV: SECRET}
    # Read-only, the pages read through --read-only-url; --database-url is never opened.
    argv = [sys.executable, "-m", "trioq.cli", "dashboard", "--database-url",
            "postgresql://127.0.0.1:1/nowhere", "--read-only-url", pg_url,
            "--schema", pg_schema, "--port", "0", "--auth", "token"]  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert "(read-only)" in line, line
            url = line.split(" on ", 1)[1].split()[0].rstrip("/")
            assert _get(url + "/schedules")[0] == 401
            status, body = _get(url + "/schedules", {"authorization": f"Bearer {SECRET}"})
            assert status == 200 and "hourly" in body and "<form" not in body
            rebound = {"authorization": f"Bearer {SECRET}", "host": "attacker.example"}
            assert _get(url + "/schedules", rebound)[0] == 400
        finally:
            proc.terminate()
            proc.wait(timeout=30)


async def test_the_ready_page_and_counts_show_keyed_ready_jobs_and_not_a_claimed_one(
    pg_url: str, pg_schema: str
) -> None:
    """Keyed ready jobs are counted and listed from ready_keyed (migration 0048), beside the
    ring's unkeyed ones; a keyed job the claim took is neither ready in the counts nor on the
    ready page (the job queued behind it on its key still is)."""
    app = make_app(pg_url, pg_schema)
    task = trioq.TaskDeclaration("noop")
    async with app.client(migrate=True) as client:
        plain = await client.enqueue(task, {})
        first = await client.enqueue(task, {}, partition_key="p", priority=-1)
        second = await client.enqueue(task, {}, partition_key="p")
        limited = await client.enqueue(task, {}, concurrency_key="c")
        claim = Claim("default", ("noop",), 1, 30.0, uuid.uuid4())
        [claimed] = (await client.driver.job_claim(claim)).claimed
        assert claimed.id == first.id
        store = Store(client)
        page = await store.search(JobSearch(state="ready"))
        assert [job["id"] for job in page["jobs"]] == [limited.id, second.id, plain.id]
        [queue] = (await store.overview())["queues"]
        assert (queue["queue"], queue["ready"], queue["running"]) == ("default", 3, 1)
