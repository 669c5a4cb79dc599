"""The `trioq` command line: the parser (its summary names every command) and `main`, which runs
one command and turns any failure into one line and an exit code (errors.py)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._core.capacity import DEFAULT_PREFETCH
from .._core.identifiers import PREPARED_STATEMENTS, validate_schema
from .._pg.libpq import DATABASE_URL_ENV
from ..dashboard import cli as dashboard_cli
from . import admin as cli_admin
from . import devdb as cli_devdb
from . import errors as cli_errors
from . import workflows as cli_workflows

# Each command imports what it runs (trio, the app, the worker runtime) when it runs, so that
# `trioq --help` and `trioq --version` load only the parser (docs/cli.md, "Start-up cost").
if TYPE_CHECKING:
    import trio

    from .._runtime.services.health import HealthTarget
    from .._runtime.services.worker import Worker
    from ..app import App
    from . import worker as cli_worker

log = logging.getLogger("trioq.cli")


def _with_url(app: App, args: argparse.Namespace) -> App:
    """The app with the command line's connection options applied (over the app's own)."""
    if args.database_url:
        app.database_url = args.database_url
    if getattr(args, "prepared_statements", None):
        app.prepared_statements = args.prepared_statements
    if getattr(args, "listen_url", None):
        app.listen_url = args.listen_url
    return app


# --- commands ---------------------------------------------------------------------------------


async def cmd_migrate(args: argparse.Namespace) -> int:
    from ..app import App

    if not args.lock_wait >= 0:
        raise ValueError(f"--lock-wait: {args.lock_wait} is not 0 or more seconds")

    app = _with_url(App(schema=validate_schema(args.schema)), args)
    from .._pg.driver import open_pg_driver

    async with open_pg_driver(
        app.resolve_database_url(),
        app.schema,
        pool_size=1,
        prepared_statements=app.prepared_statements,
    ) as driver:
        applied = await driver.migrate(lock_wait=args.lock_wait)
    # A count, not the version list: the numbering has gaps (numbers retired before a release),
    # and a list with holes read as migrations missing.
    if applied:
        print(
            f"schema {app.schema}: applied {len(applied)} migration(s), "
            f"now at version {applied[-1]}"
        )
    else:
        print(f"schema {app.schema}: up to date, nothing applied")
    return 0


async def cmd_worker(args: argparse.Namespace) -> int:
    import trio

    from .._runtime.services.health import HealthTarget
    from ..app import load_app
    from . import worker as cli_worker
    from .processes import (
        ProcessGroup,
        is_supervised_child,
        stop_when_supervisor_dies,
        validate_processes,
    )

    validate_processes(args.processes)
    queues = cli_worker.parse_queues(args.queue, args.concurrency)  # bad values: before loading
    app = _with_url(load_app(args.app), args)  # a bad APP_PATH fails once, not in each child
    # Warned once per command: by the supervisor (its children run the same command), and not
    # at all with --split (a deployment whose workers serve the queues between them on purpose).
    if not args.split and not is_supervised_child():
        cli_worker.warn_unserved_queues(app, list(queues))
    if args.processes > 1:
        return await ProcessGroup(args.argv, args.processes, args.health_port).run()
    # The health server answers from process start: /livez while the command still waits for
    # the database (a liveness probe must not restart a pod for an outage), /readyz "starting".
    health = HealthTarget()
    serving = _Serving()
    # Signals are taken from here on, not from the worker's start: a SIGTERM in between (a
    # `--processes` child whose supervisor died while it started) found the default handler and
    # killed the process with its worker row still registered.
    # Only the main thread can take signals (a command run from another thread, as tests do,
    # has none to take).
    in_main_thread = threading.current_thread() is threading.main_thread()
    receiver = (
        trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM)
        if in_main_thread
        else contextlib.nullcontext(None)
    )
    with receiver as signals:
        async with trio.open_nursery() as nursery:
            if signals is not None:
                nursery.start_soon(_on_signals, signals, serving, nursery.cancel_scope)
            nursery.start_soon(stop_when_supervisor_dies)  # a child of `--processes N`
            if args.health_port is not None:
                port = await _start_health(nursery, health, args)
                log.info("health on %s:%d", args.health_host, port)
            try:
                serving.code = await _start_and_serve(app, args, health, serving)
            finally:
                nursery.cancel_scope.cancel()
    return serving.code


class _Serving:
    """What a signal acts on: nothing yet (start-up is cancelled, exit 0), or the running worker
    (drained, then stopped), with its nursery's scope and its stop record."""

    def __init__(self) -> None:
        self.worker: Worker | None = None
        self.scope: trio.CancelScope | None = None
        self.stopped: cli_worker.StopRecord | None = None
        self.code = 0


async def _start_and_serve(
    app: App, args: argparse.Namespace, health: HealthTarget, serving: _Serving
) -> int:
    from . import worker as cli_worker

    while True:
        await cli_worker.wait_for_database(app)
        stopped = cli_worker.StopRecord()
        try:
            return await _serve_worker(app, args, stopped, health, serving)
        except BaseException as exc:
            health.worker = None
            if not cli_worker.lost_database_while_starting(exc, stopped):
                raise
            print(
                "trioq: the database went away while the worker was starting; waiting for it",
                file=sys.stderr,
                flush=True,
            )


async def _serve_worker(
    app: App,
    args: argparse.Namespace,
    stopped: cli_worker.StopRecord,
    health: HealthTarget,
    serving: _Serving,
) -> int:
    import trio

    async with app.client(migrate=args.migrate) as _client, trio.open_nursery() as nursery:
        worker: Worker = await nursery.start(_run_worker, app, args, nursery.cancel_scope)
        stopped.started = True
        health.worker = worker
        serving.worker, serving.scope, serving.stopped = worker, nursery.cancel_scope, stopped
        print(
            f"trioq worker {worker.worker_id} queues={','.join(worker.config.queues)} "
            f"concurrency={','.join(str(worker.config.slots(q)) for q in worker.config.queues)}",
            flush=True,
        )
    stopped.finished = True
    if stopped.abandoned:
        print(
            f"trioq: stopped with {stopped.abandoned} job(s) abandoned (their leases expire and "
            "another worker retries them)",
            file=sys.stderr,
        )
        return cli_errors.ABANDONED
    return 0


async def _start_health(
    nursery: trio.Nursery, health: HealthTarget, args: argparse.Namespace
) -> int:
    from .._runtime.services.health import (
        serve_health,  # the web server (hypercorn): only on request
    )

    try:
        port: int = await nursery.start(serve_health, health, args.health_port, args.health_host)
    except* OSError as group:  # the bind's own error does not say which address
        if not any(
            getattr(leaf, "errno", None) == errno.EADDRINUSE for leaf in cli_errors.leaves(group)
        ):
            raise
        raise cli_errors.PortInUse(
            f"--health-port {args.health_port}: address already in use on {args.health_host} "
            f"(another process listens there): choose another --health-port"
        ) from None
    return port


async def _run_worker(
    app: App,
    args: argparse.Namespace,
    done: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[Worker],
) -> None:
    """Run the worker; once it has drained, stop the signal handler and health server too."""
    from . import worker as cli_worker

    await app.run_worker(
        queues=cli_worker.parse_queues(args.queue, args.concurrency),
        concurrency=args.concurrency,
        poll_interval=args.poll_interval,
        lease_seconds=args.lease,
        grace_seconds=args.grace,
        maintenance_interval=args.maintenance_interval,
        admission=args.admission,
        prefetch=args.prefetch,
        # Not given: the app decides (on, unless behind a transaction pooler without a listen URL).
        **({} if args.notifications is None else {"notifications": args.notifications == "on"}),
        task_status=task_status,
    )
    done.cancel()


async def _on_signals(
    signals: AsyncIterator[int], serving: _Serving, command: trio.CancelScope
) -> None:
    """Before the worker runs, SIGINT/SIGTERM cancels the start-up (a worker registered on the
    way is unregistered as it unwinds). Once it runs, the first signal drains it and a second
    stops it at once (leases then expire)."""
    from . import worker as cli_worker

    async for signum in signals:
        worker, scope, stopped = serving.worker, serving.scope, serving.stopped
        if worker is None or scope is None or stopped is None:
            print(
                f"{signal.Signals(signum).name} before the worker started: stopping",
                file=sys.stderr,
                flush=True,
            )
            command.cancel()
            return
        if worker.statistics().draining:
            stopped.abandoned = sum(
                loop.running + loop.pending_writes for loop in worker.statistics().loops
            )
            print("second signal: stopping now", file=sys.stderr, flush=True)
            cli_worker.exit_if_still_running(cli_worker.HARD_STOP_MARGIN_SECONDS, stopped)
            scope.cancel()
            return
        print(
            f"{signal.Signals(signum).name}: draining (stop claiming, grace "
            f"{worker.config.grace_seconds}s)",
            file=sys.stderr,
            flush=True,
        )
        worker.request_drain()
        cli_worker.exit_if_still_running(
            worker.config.grace_seconds + cli_worker.HARD_STOP_MARGIN_SECONDS, stopped
        )


async def cmd_enqueue(args: argparse.Namespace) -> int:
    from .._core import codec
    from ..app import load_app

    app = _with_url(load_app(args.app), args)
    text = _json_argument(args.payload)
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"JSON: not valid JSON: {exc}") from None
    except RecursionError:  # the decoder recurses once per level: thousands of levels overflow
        raise ValueError(
            f"JSON: nested too deeply (payloads may nest at most {codec.MAX_DEPTH} levels)"
        ) from None
    async with app.client() as client:
        job = await client.enqueue(
            args.task,
            payload,
            queue=args.queue,
            delay=args.delay,
            partition_key=args.partition_key,
            priority=args.priority,
            dedup_key=args.dedup_key,
        )
    print(json.dumps({"id": job.id, "task": job.task, "queue": job.queue, "created": job.created}))
    return 0


def _json_argument(value: str) -> str:
    """`JSON` itself, `@PATH` (a file: a large payload would not fit on a command line) or `-`
    (standard input)."""
    if value == "-":
        return sys.stdin.read()
    if not value.startswith("@"):
        return value
    try:
        with open(value[1:], encoding="utf-8") as source:
            return source.read()
    except OSError as exc:
        raise ValueError(f"JSON: cannot read {value[1:]!r} ({exc.strerror})") from None


async def cmd_status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..app import App
    from .ops import run_status

    if args.watch is not None and not args.watch > 0:
        raise ValueError("--watch: must be a number of seconds > 0")
    app = _with_url(App(schema=validate_schema(args.schema)), args)
    async with app.client() as client:
        return await run_status(client, args, _console(Console))


def _console(console_type: Any) -> Any:
    """A rich console; when not writing to a terminal, wide enough that tables never wrap."""
    return console_type() if sys.stdout.isatty() else console_type(width=200)


async def cmd_explain(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..app import App
    from .ops import explanation_json, print_explanation

    app = _with_url(App(schema=validate_schema(args.schema)), args)
    async with app.client() as client:
        why = await client.explain(args.job_id)
    if args.json:
        print(explanation_json(why))
    else:
        print_explanation(why, _console(Console))
    return 0


async def cmd_schedules(args: argparse.Namespace) -> int:
    from ..app import App

    app = _with_url(App(schema=validate_schema(args.schema)), args)
    async with app.client() as client:
        schedules = await client.schedules()
    if args.json:
        print(json.dumps([_plain(s) for s in schedules], default=str, indent=2))
        return 0
    print(
        f"{'schedule':<20}{'task':<20}{'cron':<16}{'timezone':<16}{'misfire':<8}"
        f"{'next fire (UTC)':<21}{'fired':>7}{'missed':>7}  origin"
    )
    for s in schedules:
        next_fire = "-" if s.next_fire_at is None else f"{s.next_fire_at:%Y-%m-%d %H:%M:%S}"
        print(
            f"{s.name:<20}{s.task:<20}{s.cron:<16}{s.timezone:<16}{s.misfire:<8}"
            f"{next_fire:<21}{s.fired:>7}{s.missed:>7}  {s.origin}"
        )
    if not schedules:
        print("(no schedules)")
    return 0


def _plain(record: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(record)


async def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    return await run_demo(
        database_url=args.database_url,
        app_path=args.app,
        scale=args.scale,
        concurrency=args.concurrency,
    )


# --- parsing ----------------------------------------------------------------------------------


def _logging_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """-v and --log-level, accepted before or after the subcommand (`trioq worker ... -v`)."""
    default: Any = None if top else argparse.SUPPRESS
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="log at INFO and print tracebacks of errors",
    )
    parser.add_argument(
        "--log-level",
        default=default,
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="log level (default: WARNING, INFO with -v)",
    )


def _connection_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--prepared-statements, accepted before or after the subcommand, like -v."""
    parser.add_argument(
        "--prepared-statements",
        choices=PREPARED_STATEMENTS,
        default=None if top else argparse.SUPPRESS,
        help="off: behind a transaction pooler (PgBouncer, RDS Proxy, Supavisor): unnamed "
        "statements, no startup options, no session SET (None: the app's, else auto)",
    )


class _DefaultsOnce(argparse.ArgumentDefaultsHelpFormatter):
    """Appends `(default: X)` only where the help does not already say its default, and not
    for options whose default is "not given" (None, False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action) or text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trioq",
        epilog="Exit codes: 0 ok, 1 not found or not changed, 2 usage or configuration, "
        "3 database, 4 forced stop abandoned jobs, 130 interrupted (docs/cli.md).",
    )
    parser.add_argument("--version", action=_PrintVersion)
    _logging_options(parser, top=True)
    _connection_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            formatter_class=_DefaultsOnce,
        )
        cmd.add_argument(
            "--database-url",
            default=None,
            help=f"libpq URL or conninfo (default: ${DATABASE_URL_ENV})",
        )
        _logging_options(cmd, top=False)
        _connection_options(cmd, top=False)
        return cmd

    migrate = command("migrate", "create or upgrade the schema (safe to run concurrently)")
    migrate.add_argument("--schema", default="trioq", help="trioq's schema")
    migrate.add_argument(
        "--lock-wait",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long to keep trying for locks another session holds (each try waits 0.5 s,"
        " so enqueues and claims never queue behind it for longer); default 600",
    )

    worker = command("worker", "run a worker: claim and run jobs until SIGINT/SIGTERM")
    worker.add_argument("app", metavar="APP_PATH", help="module:attribute of the trioq.App")
    worker.add_argument(
        "--queue",
        action="append",
        metavar="NAME[=SLOTS]",
        help="queue to serve, its own slots if given (repeatable; default: the default queue)",
    )
    worker.add_argument(
        "--concurrency", type=int, default=10, help="slots of each queue given without =SLOTS"
    )
    worker.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="claim at least this often without a notification",
    )
    worker.add_argument(
        "--prefetch",
        type=int,
        default=DEFAULT_PREFETCH,
        metavar="N",
        help=f"jobs each queue keeps claimed ahead of its free slots (0: off; default "
        f"{DEFAULT_PREFETCH})",
    )
    worker.add_argument(
        "--lease", type=float, default=30.0, metavar="SECONDS", help="job lease length"
    )
    worker.add_argument(
        "--grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long running jobs may finish before they are released",
    )
    worker.add_argument(
        "--maintenance-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="lease recovery, retention and the idle heartbeat (default: lease / 3, at most 60)",
    )
    worker.add_argument(
        "--admission",
        choices=("off", "observe", "on"),
        default="on",
        help="admission control: lower the claimed slots under sustained overload",
    )
    worker.add_argument(
        "--notifications",
        choices=("on", "off"),
        default=None,
        help="off: poll only, no LISTEN connection (None: on, but off with "
        "--prepared-statements off and no --listen-url)",
    )
    worker.add_argument(
        "--listen-url",
        default=None,
        help="a direct connection for LISTEN, when --database-url is a transaction pooler",
    )
    worker.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="json: one object per line (job failures carry job_id, attempt, task, ...)",
    )
    worker.add_argument(
        "--health-port", type=int, default=None, help="serve /livez /readyz /metrics here"
    )
    worker.add_argument("--health-host", default="127.0.0.1", help="address of the health server")
    worker.add_argument("--migrate", action="store_true", help="migrate before starting")
    worker.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="run N worker processes under one supervisor (health ports P..P+N-1)",
    )
    worker.add_argument(
        "--split",
        action="store_true",
        help="the app's other queues are served by other workers on purpose: do not warn",
    )

    enqueue = command("enqueue", "enqueue one job")
    enqueue.add_argument("app", metavar="APP_PATH", help="module:attribute of the trioq.App")
    enqueue.add_argument("task", metavar="TASK", help="the task's name")
    enqueue.add_argument(
        "payload", metavar="JSON", help="the payload: JSON, @FILE (read from FILE) or - (stdin)"
    )
    enqueue.add_argument("--queue", default=None, help="queue (None: the task's)")
    enqueue.add_argument(
        "--delay", type=float, default=None, metavar="SECONDS", help="run this much later"
    )
    enqueue.add_argument("--partition-key", default=None, help="run one at a time per key")
    enqueue.add_argument("--priority", type=int, default=0, help="lower runs first")
    enqueue.add_argument("--dedup-key", default=None, help="unique among unfinished jobs")

    status = command(
        "status", "queues, workers, the incident health list and database pressure figures"
    )
    status.add_argument("--schema", default="trioq", help="trioq's schema")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument(
        "--watch", type=float, default=None, metavar="SECONDS", help="redraw every SECONDS"
    )

    explain = command("explain", "why a job is not running: its claim gates in order")
    explain.add_argument("job_id", metavar="JOB_ID", type=int)
    explain.add_argument("--schema", default="trioq", help="trioq's schema")
    explain.add_argument("--json", action="store_true", help="print JSON")

    schedules = command("schedules", "cron schedules: next fire time, fired and missed counts")
    schedules.add_argument("--schema", default="trioq", help="trioq's schema")
    schedules.add_argument("--json", action="store_true", help="print JSON")

    demo = command("demo", "run the reference workflows (embedded PostgreSQL when no URL)")
    demo.add_argument(
        "--app", default="trioq_workflows.demo:app", metavar="APP_PATH", help="the app to run"
    )
    demo.add_argument("--scale", type=int, default=1, help="multiply the demo workload")
    demo.add_argument("--concurrency", type=int, default=25, help="slots per queue")
    cli_admin.add_commands(command, COMMANDS)
    cli_workflows.add_commands(command, COMMANDS)
    dashboard = command("dashboard", "a web dashboard: queues, jobs, workflows, schedules")
    dashboard_cli.add_arguments(dashboard)
    COMMANDS["dashboard"] = dashboard_cli.cmd_dashboard
    cli_devdb.add_command(command, COMMANDS)
    parser.description = "trioq: durable jobs on PostgreSQL. Commands: " + ", ".join(sub.choices)
    return parser


class _PrintVersion(argparse.Action):
    """argparse's version action, reading the installed version only when asked (the package
    metadata costs more to import than the rest of the parser)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs=0, **kwargs)
        self.help = "show program's version number and exit"
        self.default = argparse.SUPPRESS

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"trioq {_version()}")
        parser.exit()


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("trioq")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "unknown"


COMMANDS: dict[str, Callable[[argparse.Namespace], Awaitable[int]]] = {
    "migrate": cmd_migrate,
    "worker": cmd_worker,
    "enqueue": cmd_enqueue,
    "status": cmd_status,
    "explain": cmd_explain,
    "demo": cmd_demo,
    "schedules": cmd_schedules,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure ends in one line and a documented exit code
    (trioq/cli/errors.py, docs/cli.md)."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `--processes` children reuse it
    level = args.log_level or ("INFO" if args.verbose else "WARNING")
    if getattr(args, "log_format", "text") == "json":
        from .._runtime.services.logs import configure_logging

        configure_logging("json", level)
    else:
        from .._runtime.services.logs import text_handler

        logging.basicConfig(level=level, handlers=[text_handler()])
    try:
        import trio

        return trio.run(COMMANDS[args.command], args)
    except SystemExit:
        raise
    except BaseException as exc:
        return cli_errors.report(exc, verbose=bool(args.verbose))
