"""`trioq dev-db`: a PostgreSQL for your own app while you develop it, in the foreground.

It runs `trioq.embedded` with a socket directory named after the port (`/tmp/trioq-dev-db-P`),
so the URL it prints is the same at every start, and stops the server cleanly on Ctrl-C or
SIGTERM. `--data-dir` keeps the data between runs; without it the cluster is thrown away.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from .._pg.libpq import DATABASE_URL_ENV
from .errors import UsageError

DEFAULT_PORT = 5432


def socket_dir_for(port: int) -> Path:
    """Stable per port, short (a socket path must stay under 107 bytes), under /tmp."""
    return Path(f"/tmp/trioq-dev-db-{port}")


async def cmd_dev_db(args: argparse.Namespace) -> int:
    import trio  # here, not at the top: `trioq --help` builds this parser (docs/cli.md)

    from ..embedded import EmbeddedPostgres, EmbeddedPostgresError

    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port: {args.port} is not a port number (1 to 65535)")
    cluster = EmbeddedPostgres(
        data_dir=args.data_dir, port=args.port, socket_dir=socket_dir_for(args.port)
    )
    # Signals are caught from before the start: a Ctrl-C during initdb still stops the server.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            try:
                await trio.to_thread.run_sync(cluster.start)
            except EmbeddedPostgresError as exc:  # a busy port or data dir, initdb's complaint
                raise UsageError(str(exc)) from None
            kept = (
                f"kept in {cluster.data_dir}"
                if cluster.data_dir is not None
                else "thrown away on exit (--data-dir DIR keeps it)"
            )
            print(
                f"trioq dev-db: PostgreSQL on {cluster.log_path.parent} (unix socket only), data "
                f"{kept}, log {cluster.log_path}\n"
                f"export {DATABASE_URL_ENV}={shlex.quote(cluster.url)}\n"
                "Ctrl-C stops it.",
                flush=True,
            )
            async for signum in signals:
                print(f"{signal.Signals(signum).name}: stopping", file=sys.stderr, flush=True)
                break
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(cluster.stop)
    return 0


def add_command(
    command: Callable[[str, str], argparse.ArgumentParser],
    table: dict[str, Callable[[argparse.Namespace], Awaitable[int]]],
) -> None:
    dev_db = command(
        "dev-db", "run a PostgreSQL for development in the foreground (prints its URL)"
    )
    dev_db.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the cluster here (created if missing; default: a throwaway one)",
    )
    dev_db.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="names the socket (no TCP listener, so it cannot clash with another server's)",
    )
    table["dev-db"] = cmd_dev_db
