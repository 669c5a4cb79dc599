"""The dashboard's ASGI application (Starlette, Jinja2) and its server (hypercorn's trio
worker, as the health server).

Each page is also JSON under `/api/...` (the same data, without presentation). Pages render on
the server; htmx (vendored in static/) refreshes the overview's live parts. Every value shown
goes through Jinja2's autoescape; nothing is marked safe.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import attrs
import jinja2
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .._core.errors import JobNotFound, SchemaNotMigrated, TrioqError
from .._core.states import JobState
from ..client import Client
from . import actions, views
from .security import (
    CSRF_COOKIE,
    Auth,
    AuthMiddleware,
    Csrf,
    HostGuard,
    parse_cookies,
    served_names,
    served_over_https,
)
from .store import PAGE_SIZE, JobSearch, Store

log = logging.getLogger("trioq.dashboard")

STATES = tuple(JobState)
SUSPENDED_OR_DELAYED = (JobState.SCHEDULED, JobState.SLEEPING, JobState.WAITING)
# The overview's unfinished columns, in its order, and those whose counts may be capped.
_SHOWN_STATES = (JobState.READY, JobState.RUNNING, *SUSPENDED_OR_DELAYED)


@attrs.frozen
class DashboardConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    admin: bool = False
    auth: Auth = attrs.field(factory=Auth)
    refresh_seconds: float = 2.0
    # Host names besides the loopback ones and the bound address (a proxy's, say); "*": any.
    allowed_hosts: tuple[str, ...] = ()


@attrs.define(eq=False)
class Dashboard:
    """The pages' shared state: where to read, where to act, how to render."""

    config: DashboardConfig
    store: Store
    actor: Client  # actions go through this client (the read store may use a read-only role)
    csrf: Csrf = attrs.field(factory=Csrf)
    templates: jinja2.Environment = attrs.field(init=False)
    # The overview's data and when it was read: every open tab polls it, so within half a
    # refresh interval (at most 1 s) they share one read (ten wall screens cost one).
    _overview: tuple[float, dict[str, Any]] | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("trioq.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            enable_async=False,
        )
        self.templates.filters["age"] = views.age_text
        self.templates.filters["when"] = _when
        self.templates.filters["instant"] = _instant

    def forget_overview(self) -> None:
        self._overview = None

    def render(self, request: Request, template: str, context: dict[str, Any]) -> Response:
        cookies = parse_cookies({b"cookie": request.headers.get("cookie", "").encode("latin-1")})
        nonce = cookies.get(CSRF_COOKIE) or self.csrf.new_nonce()
        body = self.templates.get_template(template).render(
            **context,
            admin=self.config.admin,
            csrf=self.csrf.token(nonce),
            refresh_seconds=self.config.refresh_seconds,
            path=request.url.path,
            user=request.scope.get("state", {}).get("user", ""),
        )
        response = HTMLResponse(body)
        if CSRF_COOKIE not in cookies:
            secure = served_over_https(request.scope)
            response.set_cookie(CSRF_COOKIE, nonce, httponly=True, samesite="strict", secure=secure)
        return response


def _when(moment: Any) -> str:
    if isinstance(moment, datetime.datetime):
        return moment.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    return "-" if moment is None else str(moment)


def _instant(moment: Any) -> str:
    """To the millisecond, for the timeline (checkpoints often commit within one second)."""
    if isinstance(moment, datetime.datetime):
        return moment.astimezone(datetime.UTC).strftime("%H:%M:%S.%f")[:-3]
    return "-"


def _json(data: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(data, default=str, indent=1),
        status_code=status,
        media_type="application/json",
    )


Handler = Callable[[Dashboard, Request, bool], Awaitable[Response]]


def _page(dashboard: Dashboard, handler: Handler, api: bool) -> Callable[..., Any]:
    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await handler(dashboard, request, api)
        except (ValueError, TrioqError) as exc:  # a bad filter, no such job, not migrated
            status = _status(exc)
            if api:
                response = _json({"error": str(exc)}, status)
            else:
                response = dashboard.render(request, "error.html", {"message": str(exc)})
                response.status_code = status
        elapsed = (time.perf_counter() - started) * 1000
        response.headers["server-timing"] = f"app;dur={elapsed:.2f}"
        return response

    return endpoint


def _status(exc: Exception) -> int:
    if isinstance(exc, JobNotFound):
        return 404
    return 503 if isinstance(exc, SchemaNotMigrated) else 400


# --- pages ------------------------------------------------------------------------------------


async def overview(dashboard: Dashboard, request: Request, api: bool) -> Response:
    data = await _overview_data(dashboard)
    if api:
        return _json(data)
    fragment = request.url.path.startswith("/fragments/")
    template = "overview_live.html" if fragment else "overview.html"
    return dashboard.render(request, template, _overview_page(data))


async def _overview_data(dashboard: Dashboard) -> dict[str, Any]:
    fresh_for = min(1.0, dashboard.config.refresh_seconds / 2)
    cached = dashboard._overview
    if cached is not None and trio.current_time() - cached[0] < fresh_for:
        return cached[1]
    read_at = trio.current_time()
    data = await _read_overview(dashboard)
    dashboard._overview = (read_at, data)
    return data


async def _read_overview(dashboard: Dashboard) -> dict[str, Any]:
    data = await dashboard.store.overview()
    now = data["now"]
    workers = []
    for worker in await dashboard.store.client.workers():
        record = attrs.asdict(worker)
        record["heartbeat_seconds"] = (now - worker.heartbeat_at).total_seconds()
        workers.append(record)
    data["workers"] = workers
    return data


def _overview_page(data: dict[str, Any]) -> dict[str, Any]:
    """The overview's presentation: charts, and counts past the cap shown as estimates."""
    cap = data["count_cap"]
    queues = []
    for queue in data["queues"]:
        shown = {}
        for state in _SHOWN_STATES:
            capped = queue["due_capped"] and state in SUSPENDED_OR_DELAYED
            estimate = queue["estimates"].get(state)
            shown[state] = views.count_text(queue[state], cap, estimate, capped=capped)
        chart = views.chart_bars(queue["completed_per_minute"], queue["failed_per_minute"])
        queues.append({**queue, "shown": shown, "chart": chart})
    capped = data["health"]["capped"]
    health = {
        key: "-" if n is None else (f"{n:,}+" if key in capped else f"{n:,}")
        for key, n in data["health"].items()
        if key != "capped"
    }
    return {**data, "queues": queues, "health": health}


async def jobs(dashboard: Dashboard, request: Request, api: bool) -> Response:
    search, form = _job_search(request)
    data = await dashboard.store.search(search)
    if api:
        return _json(data)
    return dashboard.render(request, "jobs.html", {**data, "form": form, "states": STATES})


def _job_search(request: Request) -> tuple[JobSearch, dict[str, str]]:
    """The filters from the query string, validated (a bad one is a 400 naming it)."""
    query = request.query_params
    names = ("state", "task", "queue", "partition_key", "after", "before", "text", "before_id",
             "before_finished")  # fmt: skip
    form = {name: query.get(name, "").strip() for name in names}
    state = form["state"] or None
    if state is not None and state not in STATES:
        raise ValueError(f"state: {state!r} is not a job state ({', '.join(STATES)})")
    if len(form["text"]) > 200:
        raise ValueError("text: at most 200 characters")
    for name in ("task", "queue", "partition_key"):
        if len(form[name]) > 512:
            raise ValueError(f"{name}: at most 512 characters")
    search = JobSearch(
        state=state,
        task=form["task"] or None,
        queue=form["queue"] or None,
        partition_key=form["partition_key"] or None,
        created_after=_moment("after", form["after"]),
        created_before=_moment("before", form["before"]),
        text=form["text"] or None,
        before_id=_job_id("before_id", form["before_id"]) if form["before_id"] else None,
        before_finished=_moment("before_finished", form["before_finished"]),
        limit=PAGE_SIZE,
    )
    return search, form


def _moment(name: str, text: str) -> datetime.datetime | None:
    if not text:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{name}: {text!r} is not a date and time (2026-01-31T12:00)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def _job_id(name: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 2**63:
        raise ValueError(f"{name}: {text!r} is not a job id (a positive integer)")
    return int(text)


async def job(dashboard: Dashboard, request: Request, api: bool) -> Response:
    job_id = _job_id("job id", request.path_params["job_id"])
    client = dashboard.store.client
    found = await dashboard.store.job(job_id)
    if found is None:
        raise JobNotFound(f"no job {job_id}")
    attempts = [attrs.asdict(a) for a in await client.attempts(job_id)]
    explanation = await client.explain(job_id)
    data = {**found, "attempts": attempts, "explain": attrs.asdict(explanation)}
    if api:
        return _json(data)
    record = found["job"]
    entries = views.timeline(record, found["history"], found["children"])
    views.timeline_bars(entries)
    shown = {
        "payload": views.pretty_json(record["payload"], record["payload_length"]),
        "result": views.pretty_json(record["result"], record["result_length"]),
        "error": views.pretty_json(record["error"]) if record["error"] else None,
    }
    return dashboard.render(
        request, "job.html", {**data, "timeline": entries, "shown": shown, "states": STATES}
    )


async def workflows(dashboard: Dashboard, request: Request, api: bool) -> Response:
    before = request.query_params.get("before_id", "")
    data = await dashboard.store.workflows(_job_id("before_id", before) if before else None)
    if api:
        return _json(data)
    return dashboard.render(request, "workflows.html", data)


async def schedules(dashboard: Dashboard, request: Request, api: bool) -> Response:
    data = {"schedules": [attrs.asdict(s) for s in await dashboard.store.client.schedules()]}
    if api:
        return _json(data)
    return dashboard.render(request, "schedules.html", data)


async def audit(dashboard: Dashboard, request: Request, api: bool) -> Response:
    before = request.query_params.get("before_id", "")
    rows = await dashboard.store.audit(_job_id("before_id", before) if before else None)
    data = {"audit": rows, "next_before_id": rows[-1]["id"] if len(rows) == PAGE_SIZE else None}
    if api:
        return _json(data)
    return dashboard.render(request, "audit.html", data)


# --- application ------------------------------------------------------------------------------


def build_app(dashboard: Dashboard) -> Any:
    """The ASGI application: pages, `/api/...` twins, actions, static files, behind auth."""
    pages: list[tuple[str, Handler]] = [
        ("/", overview),
        ("/jobs", jobs),
        ("/jobs/{job_id}", job),
        ("/workflows", workflows),
        ("/schedules", schedules),
        ("/audit", audit),
    ]
    routes: list[Any] = []
    for path, handler in pages:
        routes.append(Route(path, _page(dashboard, handler, False), methods=["GET"]))
        api_path = "/api" + (path if path != "/" else "/overview")
        routes.append(Route(api_path, _page(dashboard, handler, True), methods=["GET"]))
    routes.append(Route("/fragments/overview", _page(dashboard, overview, False)))
    routes.append(
        Route("/actions/{action}", functools.partial(actions.act, dashboard), methods=["POST"])
    )
    routes.append(Mount("/static", StaticFiles(packages=[("trioq.dashboard", "static")])))
    app = Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_allowed})
    config = dashboard.config
    names = served_names(config.host, config.allowed_hosts)
    return HostGuard(AuthMiddleware(cast(Any, app), config.auth), names)


async def _not_found(request: Request, exc: Exception) -> Response:
    return PlainTextResponse("not found\n", status_code=404)


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return PlainTextResponse("method not allowed\n", status_code=405)


def _hypercorn_config(host: str, port: int) -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = log
    config.graceful_timeout = 1.0
    config.keep_alive_timeout = 5.0
    return config


async def serve_dashboard(
    config: DashboardConfig,
    store: Store,
    actor: Client | None = None,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; reports the bound port (0 picks a free one) through task_status.
    Binding fails with OSError before anything is reported (a port in use, say)."""
    dashboard = Dashboard(config, store, actor or store.client)
    app = build_app(dashboard)
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(
            functools.partial(serve, app, _hypercorn_config(config.host, config.port))
        )
        task_status.started(int(binds[0].rsplit(":", 1)[1]))
