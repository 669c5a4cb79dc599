"""`trioq dashboard`: its options and its entry point (the CLI package registers both)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import signal
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from .._core.identifiers import validate_schema

# security.AUTH_MODES (tests/test_import_costs.py checks they agree): importing that module for
# the parser's choices cost `trioq --help` a third of its imports (hashlib, ipaddress, attrs).
AUTH_MODES = ("basic", "token")

if TYPE_CHECKING:  # imported when the dashboard runs: `trioq --help` builds its parser
    from ..client import Client


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--schema", default="trioq", help="trioq's schema")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (not loopback: --auth)"
    )
    parser.add_argument("--port", type=int, default=8080, help="port to bind (0: any free one)")
    parser.add_argument(
        "--admin",
        action="store_true",
        help="allow actions (retry, cancel, pause, resume, emit, purge), each audited",
    )
    parser.add_argument(
        "--auth",
        choices=AUTH_MODES,
        default=None,
        help="basic ($TRIOQ_DASHBOARD_USER / $TRIOQ_DASHBOARD_PASSWORD) or token "
        "($TRIOQ_DASHBOARD_TOKEN); required off loopback",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name the dashboard is served as besides loopback and --host (a proxy's); "
        "repeat for more; '*' turns the check off",
    )
    parser.add_argument(
        "--read-only-url",
        default=None,
        metavar="URL",
        help="read the pages through this URL (a read-only role); actions use --database-url",
    )
    parser.add_argument(
        "--refresh",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often the overview's live parts refresh",
    )


@contextlib.asynccontextmanager
async def _clients(args: argparse.Namespace, schema: str) -> AsyncIterator[tuple[Client, Client]]:
    """(reader, actor): without --admin only the reading URL is ever opened. Both honour the
    global `--prepared-statements` (behind a transaction pooler: off)."""
    from ..app import App

    prepared = getattr(args, "prepared_statements", None) or "auto"

    def app(url: str | None) -> App:
        return App(url, schema=schema, prepared_statements=prepared)

    if not args.admin:
        async with app(args.read_only_url or args.database_url).client() as reader:
            yield reader, reader
        return
    async with app(args.database_url).client() as actor:
        if args.read_only_url is None:
            yield actor, actor
            return
        async with app(args.read_only_url).client() as reader:
            yield reader, actor


async def cmd_dashboard(args: argparse.Namespace) -> int:
    import trio

    from . import security
    from .app import DashboardConfig, serve_dashboard  # the web stack, only when serving
    from .store import Store

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port: {args.port} is not a port (0-65535)")
    if not args.refresh > 0:
        raise ValueError("--refresh: must be a number of seconds > 0")
    schema = validate_schema(args.schema)
    config = DashboardConfig(
        host=args.host,
        port=args.port,
        admin=args.admin,
        auth=security.Auth.from_environment(args.auth, args.host),
        refresh_seconds=args.refresh,
        allowed_hosts=tuple(args.allowed_host),
    )
    async with _clients(args, schema) as (reader, actor), trio.open_nursery() as nursery:
        try:
            port = await nursery.start(serve_dashboard, config, Store(reader, actor), actor)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            from ..cli.errors import UsageError  # the CLI package imports this module

            raise UsageError(
                f"--port: {args.port} is in use ({exc.strerror}): choose another (0: any free one)"
            ) from None
        host = f"[{args.host}]" if ":" in args.host else args.host
        mode = "admin: actions allowed and audited" if args.admin else "read-only"
        # SIGINT and SIGTERM stop it with 0, as they stop a worker and dev-db (Python's default
        # ends a SIGTERM'd process with 143); taken before the line that says it serves.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            print(f"trioq dashboard on http://{host}:{port}/ ({mode})", flush=True)
            async for signum in signals:
                print(f"{signal.Signals(signum).name}: stopping", file=sys.stderr, flush=True)
                break
        nursery.cancel_scope.cancel()
    return 0


__all__ = ["add_arguments", "cmd_dashboard"]
