"""What `trioq worker` does before and after running: wait for the database (with backoff,
saying so), warn about tasks no worker of this command serves, and tell a forced stop that
abandoned jobs from a clean one."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import attrs
import trio

from .app import App

log = logging.getLogger("trioq.cli")

FIRST_RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 30.0


def warn_unserved_queues(app: App, queues: Sequence[str]) -> list[str]:
    """Warn (stderr) when the app has tasks on queues this worker does not serve: their jobs
    wait for another worker. Returns the warning lines."""
    unserved: dict[str, list[str]] = {}
    for spec in app.tasks.values():
        if spec.queue not in queues:
            unserved.setdefault(spec.queue, []).append(spec.name)
    lines = [
        f"trioq: warning: tasks {', '.join(sorted(names))} are on queue {queue!r}, which this "
        f"worker does not serve (add --queue {queue}, or run another worker for it)"
        for queue, names in sorted(unserved.items())
    ]
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return lines


async def wait_for_database(app: App) -> None:
    """Return once the database accepts a connection. While it is unreachable (down, starting,
    the network away), retry with exponential backoff up to 30 s, one line per attempt on
    stderr. A URL that cannot work (bad syntax, missing database or role, bad password) raises
    at once: waiting would not fix it."""
    from ._pg.driver import open_pg_driver  # psycopg stays behind the seam
    from ._pg.errors import describe_database_error, is_unreachable

    delay = FIRST_RETRY_SECONDS
    url = app.resolve_database_url()
    while True:
        try:
            async with open_pg_driver(url, app.schema, pool_size=1):
                return
        except Exception as exc:
            if not is_unreachable(exc):
                raise
            reason = describe_database_error(exc) or str(exc)
            print(f"trioq: {reason}; retrying in {delay:g}s", file=sys.stderr, flush=True)
        await trio.sleep(delay)
        delay = min(delay * 2, MAX_RETRY_SECONDS)


@attrs.define
class StopRecord:
    """Set by the signal handler: a second signal stopped the worker with jobs still owned."""

    abandoned: int = 0
