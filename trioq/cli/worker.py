"""What `trioq worker` does before and after running: wait for the database (with backoff,
saying so), warn about tasks no worker of this command serves, and tell a forced stop that
abandoned jobs from a clean one."""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
from collections.abc import Sequence

import attrs
import trio

from .._core.identifiers import validate_name
from .._runtime.services.worker import MAX_CONCURRENCY
from ..app import App
from .errors import ABANDONED

log = logging.getLogger("trioq.cli")

FIRST_RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 30.0


QUEUE_FORM = "--queue NAME or --queue NAME=SLOTS, SLOTS a whole number from 1 to 10000"


def parse_queues(values: Sequence[str] | None, concurrency: int) -> dict[str, int]:
    """`--queue` values as {queue: slots}: `mail=2` gives mail 2 slots, a plain `default` the
    `--concurrency`. Raises a one-line ValueError naming the accepted form."""
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(
            f"--concurrency {concurrency}: must be a whole number from 1 to {MAX_CONCURRENCY}"
        )
    slots: dict[str, int] = {}
    for value in values or ["default"]:
        name, sep, count = value.partition("=")
        if not sep:
            number = concurrency
        elif count.isascii() and count.isdigit() and 1 <= int(count) <= MAX_CONCURRENCY:
            number = int(count)
        else:
            raise ValueError(f"--queue {value}: expected {QUEUE_FORM}")
        validate_name("queue", name)
        if name in slots:
            raise ValueError(f"--queue {value}: queue {name!r} is given twice")
        slots[name] = number
    return slots


def warn_unserved_queues(app: App, queues: Sequence[str]) -> list[str]:
    """Warn (stderr) when the app has tasks on queues this worker does not serve: their jobs
    wait for another worker. Returns the warning lines."""
    unserved: dict[str, list[str]] = {}
    for spec in app.tasks.values():
        if spec.queue not in queues:
            unserved.setdefault(spec.queue, []).append(spec.name)
    lines = [
        f"trioq: warning: tasks {', '.join(sorted(names))} are on queue {queue!r}, which this "
        f"worker does not serve (add --queue {queue}, or run another worker for it and pass "
        "--split)"
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
    from .._pg.driver import open_pg_driver  # psycopg stays behind the seam
    from .._pg.errors import describe_database_error, is_unreachable

    delay = FIRST_RETRY_SECONDS
    url = app.resolve_database_url()
    while True:
        try:
            async with open_pg_driver(
                url, app.schema, pool_size=1, prepared_statements=app.prepared_statements
            ):
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
    finished: bool = False  # set when the worker command returns: no hard exit after that
    started: bool = False  # set once the worker runs (registered, claim loops started)


def lost_database_while_starting(exc: BaseException, record: StopRecord) -> bool:
    """True when start-up (opening the pool, migrating, registering) failed only because the
    database went away after `wait_for_database` saw it: the command waits and starts again,
    as it does when the database is down at start. Once the worker runs, the runtime's own
    reconnects handle an outage, and an error that escapes is not this."""
    from .._pg.errors import is_unreachable

    if record.started:
        return False
    if isinstance(exc, BaseExceptionGroup):
        return all(lost_database_while_starting(inner, record) for inner in exc.exceptions)
    return is_unreachable(exc)


# A handler that ignores cancellation (a blocking call in a thread, which trio cannot
# interrupt) would keep the process alive after its drain for as long as the call lasts. Past
# the grace period plus this margin the process exits anyway: the handler's lease is no longer
# renewed once it was cancelled, so another worker retries the job after it expires.
HARD_STOP_MARGIN_SECONDS = 10.0


def exit_if_still_running(after: float, stopped: StopRecord) -> None:
    """Start a timer (a daemon OS thread: it runs even while trio's thread is blocked, and does
    not keep the process alive) that ends the process with exit status 4 `after` seconds from
    now, unless the worker command has returned by then."""

    def hard_exit() -> None:
        if stopped.finished:
            return
        print(
            f"trioq: handlers still running {after:g}s after the stop began ignore cancellation "
            "(a blocking call?): exiting without them; their leases expire and another worker "
            "retries the jobs",
            file=sys.stderr,
            flush=True,
        )
        os._exit(ABANDONED)

    if not math.isfinite(after):  # `--grace inf`: wait for the handlers, however long
        return
    timer = threading.Timer(after, hard_exit)
    timer.daemon = True
    timer.start()
