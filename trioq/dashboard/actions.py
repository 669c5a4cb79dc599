"""The dashboard's POST actions (only with `--admin`): retry, cancel (a job and its tree),
pause, resume, emit an event, purge.

Order per request: refuse unless admin (403); check the CSRF token (403); validate the form
(400 naming the field); write the audit row (who, from where, what); act; record the outcome
on the audit row; redirect back (303). An action whose audit row cannot be written is not done.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from .._core.errors import JobNotFound
from .._core.states import TERMINAL_IN_ORDER
from ..client import Client
from .security import CSRF_COOKIE, Csrf, parse_cookies
from .store import Store

MAX_FORM_BYTES = 256 * 1024
FINISHED = TERMINAL_IN_ORDER
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

Form = dict[str, list[str]]


class AdminSwitch(Protocol):
    @property
    def admin(self) -> bool: ...


class Dashboard(Protocol):
    """What an action uses of the dashboard (`app.Dashboard` is one). Named here, not imported
    from the app, which routes requests to this module: no import cycle, even for types."""

    @property
    def config(self) -> AdminSwitch: ...

    @property
    def csrf(self) -> Csrf: ...

    @property
    def store(self) -> Store: ...

    @property
    def actor(self) -> Client: ...

    def forget_overview(self) -> None: ...


async def act(dashboard: Dashboard, request: Request) -> Response:
    if not dashboard.config.admin:
        return PlainTextResponse(
            "forbidden: this dashboard is read-only (start it with --admin to act)\n", 403
        )
    body = await _body(request)
    if body is None:
        return PlainTextResponse("form too large\n", 413)
    form = urllib.parse.parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    cookies = parse_cookies({b"cookie": request.headers.get("cookie", "").encode("latin-1")})
    if not dashboard.csrf.valid(cookies.get(CSRF_COOKIE), _one(form, "csrf")):
        return PlainTextResponse("forbidden: missing or wrong CSRF token (reload the page)\n", 403)
    name = request.path_params["action"]
    action = ACTIONS.get(name)
    if action is None:
        return PlainTextResponse(f"no action {name!r}\n", 404)
    try:
        target, detail, run = action(dashboard, form)
    except ValueError as exc:
        return PlainTextResponse(f"{exc}\n", 400)
    audit_id = await dashboard.store.audit_start(
        actor=request.scope.get("state", {}).get("user", "unknown"),
        address=request.client.host if request.client else "",
        action=name,
        target=target,
        detail=detail,
    )
    try:
        outcome = await run()
    except (ValueError, JobNotFound) as exc:
        await dashboard.store.audit_finish(audit_id, f"error: {exc}")
        return PlainTextResponse(f"{exc}\n", 400)
    except BaseException as exc:
        await dashboard.store.audit_finish(audit_id, f"error: {type(exc).__name__}")
        raise
    await dashboard.store.audit_finish(audit_id, outcome)
    dashboard.forget_overview()  # the page the action redirects to shows its effect
    return RedirectResponse(_back(_one(form, "next")), status_code=303)


async def _body(request: Request) -> bytes | None:
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _one(form: Form, name: str) -> str | None:
    values = form.get(name)
    return values[0] if values else None


def _back(target: str | None) -> str:
    """Only a path of this site (never `//host` or a scheme): no open redirect."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


def _required(form: Form, name: str) -> str:
    value = (_one(form, name) or "").strip()
    if not value:
        raise ValueError(f"{name}: required")
    return value


def _job_id(form: Form) -> int:
    text = _required(form, "job_id")
    if not text.isdigit() or not 0 < int(text) < 2**63:
        raise ValueError(f"job_id: {text!r} is not a job id (a positive integer)")
    return int(text)


Run = Callable[[], Awaitable[str]]
Planned = tuple[str, dict[str, Any], Run]


def _retry(dashboard: Dashboard, form: Form) -> Planned:
    job_id = _job_id(form)

    async def run() -> str:
        return f"state {await dashboard.actor.retry(job_id)}"

    return f"job {job_id}", {}, run


def _cancel(dashboard: Dashboard, form: Form) -> Planned:
    job_id = _job_id(form)

    async def run() -> str:  # cancels the job's unfinished children too (job_cancel_tree)
        return f"state {await dashboard.actor.cancel(job_id)}"

    return f"job {job_id}", {"tree": True}, run


def _pause(dashboard: Dashboard, form: Form) -> Planned:
    queue = _required(form, "queue")

    async def run() -> str:
        return "paused" if await dashboard.actor.pause_queue(queue) else "already paused"

    return f"queue {queue}", {}, run


def _resume(dashboard: Dashboard, form: Form) -> Planned:
    queue = _required(form, "queue")

    async def run() -> str:
        return "resumed" if await dashboard.actor.resume_queue(queue) else "was not paused"

    return f"queue {queue}", {}, run


def _emit(dashboard: Dashboard, form: Form) -> Planned:
    key = _required(form, "key")
    text = (_one(form, "payload") or "").strip() or "null"
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("payload: not valid JSON") from None

    async def run() -> str:
        outcome = await dashboard.actor.emit_event(key, payload)
        return "emitted" if outcome.first else "already emitted (the first emit of a key wins)"

    return f"event {key}", {"payload": payload}, run


def _purge(dashboard: Dashboard, form: Form) -> Planned:
    states = form.get("state") or []
    if not states or set(states) - set(FINISHED):
        raise ValueError(f"state: choose among {', '.join(FINISHED)}")
    older_than = _duration(_required(form, "older_than"))
    if _one(form, "confirm") != "purge":
        raise ValueError("confirm: type purge to confirm")

    async def run() -> str:
        deleted = await dashboard.actor.purge(states=states, older_than=older_than)
        return f"deleted {deleted}"

    return "jobs", {"states": states, "older_than_seconds": older_than}, run


def _duration(text: str) -> float:
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"older_than: {text!r} is not a duration (7d, 12h, 30m, 90)")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


ACTIONS: dict[str, Callable[[Dashboard, Form], Planned]] = {
    "retry": _retry,
    "cancel": _cancel,
    "pause": _pause,
    "resume": _resume,
    "emit": _emit,
    "purge": _purge,
}
